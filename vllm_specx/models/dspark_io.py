"""Save and load DSpark drafts: our checkpoint format and the speculators format.

Both store the same tensor names (those vLLM's DFlash/DSpark loaders use, listed by
`DSparkDraftConfig.expected_tensors`); they differ only in config.json (see `vllm_specx.config`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vllm_specx.checkpoint import check_tensors, load_tensors, save_tensors
from vllm_specx.config import SPECX_DSPARK_ARCH, DSparkDraftConfig, read_config_json
from vllm_specx.models.dspark_torch import DSparkDraft


def layer_config(cfg: DSparkDraftConfig) -> dict:
    """The Qwen3 layer config of the draft, as transformers and vLLM read it."""
    return {
        "model_type": "qwen3", "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "intermediate_size": cfg.intermediate_size, "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps, "vocab_size": cfg.vocab_size, "max_position_embeddings": 4096,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": False, "attention_bias": False,
    }


def save_specx(draft: DSparkDraft, path: str | Path, extra: dict | None = None) -> None:
    """Write `draft` in vllm-specx format: config.json + model.safetensors (fp32)."""
    c = draft.cfg
    config = {
        "architectures": [SPECX_DSPARK_ARCH], **layer_config(c), "torch_dtype": "float32",
        "specx": {
            "method": "dspark", "format_version": 1, "target_layer_ids": list(c.target_layer_ids),
            "target_hidden_size": c.target_hidden_size, "block_size": c.block_size,
            "mask_token_id": c.mask_token_id, "markov_rank": c.markov_rank,
            "sample_from_anchor": c.sample_from_anchor, "causal": c.causal, **(extra or {}),
        },
    }
    _write(draft, path, config)


def save_speculators(draft: DSparkDraft, path: str | Path, verifier: str) -> None:
    """Write `draft` as a speculators-format DSpark checkpoint (the fields vLLM's translator reads)."""
    c = draft.cfg
    config = {
        "speculators_model_type": "dspark", "architectures": ["Qwen3DSparkModel"],
        "speculators_config": {"proposal_methods": [{"speculative_tokens": c.block_size - 1}],
                               "verifier": {"name_or_path": verifier}},
        "transformer_layer_config": layer_config(c),
        "aux_hidden_state_layer_ids": [i + 1 for i in c.target_layer_ids],
        "mask_token_id": c.mask_token_id, "markov_rank": c.markov_rank, "block_size": c.block_size,
        "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size,
        "sample_from_anchor": c.sample_from_anchor, "causal": c.causal,
        "enable_confidence_head": False, "torch_dtype": "float32",
    }
    _write(draft, path, config)


def _write(draft: DSparkDraft, path, config: dict) -> None:
    Path(path).mkdir(parents=True, exist_ok=True)
    (Path(path) / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_tensors(path, {k: v.float() for k, v in draft.state_dict().items()})


def load_draft(path: str | Path, embed: torch.Tensor, lm_head: torch.Tensor) -> DSparkDraft:
    """Load either format into the PyTorch model (checked against config.json first)."""
    cfg = DSparkDraftConfig.from_dict(read_config_json(path), f"{path}/config.json")
    check_tensors(path, cfg.expected_tensors())
    draft = DSparkDraft(cfg, embed, lm_head)
    draft.load_state_dict(load_tensors(path), strict=True)
    return draft
