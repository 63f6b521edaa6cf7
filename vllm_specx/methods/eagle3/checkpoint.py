"""Write and read EAGLE-3 drafts in the format vLLM's built-in `eagle3` method loads: config.json
(`LlamaForCausalLMEagle3`, `eagle_aux_hidden_state_layer_ids`) and model.safetensors with
`fc`, `norm` and `midlayer.*` tensors; no embed_tokens / lm_head (vLLM shares the target's)."""

from __future__ import annotations

from pathlib import Path

import torch

from vllm_specx.checkpoint import dtype_name, load_tensors, read_config_json, save_tensors, write_config_json
from vllm_specx.methods.eagle3.config import Eagle3Config


def save(draft, out: str | Path, dtype: torch.dtype = torch.float32) -> None:
    write_config_json(out, {**draft.cfg.vllm_config_json(), "torch_dtype": dtype_name(dtype)})
    save_tensors(out, {k: v.to(dtype) for k, v in draft.vllm_state_dict().items()})


def load(path: str | Path, embed: torch.Tensor, lm_head: torch.Tensor):
    from vllm_specx.methods.eagle3.model import Eagle3Draft

    cfg = Eagle3Config.from_vllm_config_json(read_config_json(path))
    draft = Eagle3Draft(cfg, embed, lm_head)
    draft.load_vllm_state_dict(load_tensors(path))
    return draft
