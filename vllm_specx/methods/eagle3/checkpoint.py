"""Write and read EAGLE-3 drafts in the format vLLM's built-in `eagle3` method loads: config.json
(`LlamaForCausalLMEagle3`, `eagle_aux_hidden_state_layer_ids`) and model.safetensors with
`fc`, `norm` and `midlayer.*` tensors; no embed_tokens / lm_head (vLLM shares the target's),
except a reduced draft vocabulary's own `lm_head.weight` rows and `d2t` / `t2d` (vLLM's names)."""

from __future__ import annotations

from pathlib import Path

import torch

from vllm_specx.checkpoint import (check_tensors, check_vocab_maps, dtype_name, load_tensors, read_config_json, save_tensors,
                                   to_aux_ids, write_config_json)
from vllm_specx.methods.eagle3.config import Eagle3Config

TRAINED_BY = "vllm-specx"  # `specx.trained_by` of the drafts this trainer writes


def save(draft, out: str | Path, dtype: torch.dtype = torch.float32) -> None:
    write_config_json(out, {**draft.cfg.vllm_config_json(), "torch_dtype": dtype_name(dtype)})
    save_tensors(out, {k: v.to(dtype) if v.is_floating_point() else v for k, v in draft.vllm_state_dict().items()})


def load(path: str | Path, embed: torch.Tensor, lm_head: torch.Tensor):
    from vllm_specx.methods.eagle3.model import Eagle3Draft

    cfg = Eagle3Config.from_vllm_config_json(read_config_json(path))
    draft = Eagle3Draft(cfg, embed, lm_head)
    draft.load_vllm_state_dict(load_tensors(path))
    return draft


def check_vllm_draft(path: str | Path, target: dict, num_speculative_tokens: int | None) -> None:
    """The checks vllm-specx runs on a local EAGLE-3 draft directory before vLLM's built-in
    `eagle3` serves it (`Baseline.check_draft`); ValueError naming the field or file.

    Any EAGLE-3 draft: its aux-hidden-state ids must be layers vLLM's target can capture, its
    `target_hidden_size` the target's, every tensor floating point and finite. A draft written by
    this trainer (`specx.trained_by`) also: its config as `Eagle3Config` reads it, against the
    target, and exactly the tensors it names, with their shapes.
    """
    from vllm_specx import registry

    where = str(Path(path) / "config.json")
    raw = read_config_json(path)
    layers = int(target["num_hidden_layers"])
    aux = raw.get("eagle_aux_hidden_state_layer_ids")
    if aux is not None:
        if not isinstance(aux, list) or not aux or \
                not all(isinstance(a, int) and not isinstance(a, bool) for a in aux):
            raise ValueError(f"{where}: eagle_aux_hidden_state_layer_ids must be a non-empty list of "
                             f"integers, got {aux!r}")
        bad = [a for a in aux if not 0 <= a <= layers]
        if bad:
            raise ValueError(f"{where}: eagle_aux_hidden_state_layer_ids {aux}: id(s) {bad} outside the "
                             f"target's {layers} layers (an aux id is the residual stream after that "
                             f"many layers: 0..{layers})")
    th = raw.get("target_hidden_size")
    if th is not None and th != target["hidden_size"]:
        raise ValueError(f"{where}: target_hidden_size {th!r} != target hidden_size {target['hidden_size']}")
    if num_speculative_tokens is not None:
        registry.check_num_drafts(None, path, num_speculative_tokens)
    expected = None
    specx = raw.get("specx")
    if isinstance(specx, dict) and specx.get("trained_by") == TRAINED_BY:
        try:
            cfg = Eagle3Config.from_vllm_config_json(raw)
        except KeyError as e:
            raise ValueError(f"{where}: missing required field {e}") from e
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from e
        if aux is not None and to_aux_ids(cfg.target_layer_ids) != aux:
            raise ValueError(f"{where}: eagle_aux_hidden_state_layer_ids {aux} disagree with "
                             f"specx.target_layer_ids {list(cfg.target_layer_ids)} (aux id = layer + 1)")
        try:
            cfg.check_target(target)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e
        expected = cfg.expected_tensors()
    check_tensors(path, expected)
    if expected is not None and cfg.reduced_vocab:
        check_vocab_maps(path, cfg.vocab_size, cfg.draft_vocab_size)
