"""MTP draft checkpoints (vllm-specx format): config.json + model.safetensors.

config.json is a one-layer Llama config (what vLLM's draft-model plumbing parses: `model_type`
"llama", `hidden_size`, ...) with `architectures: ["SpecxMTPModel"]` and a `specx` block
`{"method": "mtp", "format_version": 1, <MTPDraftConfig fields>}`; `format_version` is required
and readers refuse versions they do not know. Tensors: `MTPDraftConfig.expected_tensors` (no
embeddings or LM head: the target's are shared; a reduced draft vocabulary carries its own
`lm_head.weight` rows, unless `lm_head_from_target`, and `d2t` / `t2d`, `vllm_specx.vocab`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from vllm_specx.checkpoint import (dtype_name, load_tensors, one_layer_llama_config, read_config_json,
                                   save_tensors, specx_block, write_config_json)
from vllm_specx import vocab
from vllm_specx.methods.mtp.config import SPECX_MTP_ARCH, MTPDraftConfig

METHOD_NAME = "mtp"
FORMAT_VERSION = 1
_FIELDS = {f.name for f in dataclasses.fields(MTPDraftConfig)} - {"source_format"}


def detect(raw: dict[str, Any]) -> str | None:
    specx = raw.get("specx")
    if (isinstance(specx, dict) and specx.get("method") == METHOD_NAME) or \
            raw.get("architectures") == [SPECX_MTP_ARCH]:
        return "specx"
    return None


def read_config(raw: dict[str, Any], where: str = "config.json") -> MTPDraftConfig:
    specx = specx_block(raw, METHOD_NAME, FORMAT_VERSION, where, "an MTP draft")
    unknown = sorted(set(specx) - _FIELDS - {"method", "format_version", "trained_by"})
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {['specx.' + u for u in unknown]} (this vllm-specx "
                         f"does not know them, so it cannot honour them)")
    missing = sorted(f.name for f in dataclasses.fields(MTPDraftConfig)
                     if f.default is dataclasses.MISSING and f.name not in specx)
    if missing:
        raise ValueError(f"{where}: missing required field(s) {['specx.' + m for m in missing]}")
    try:
        return MTPDraftConfig(**{k: v for k, v in specx.items() if k in _FIELDS})
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def config_json(cfg: MTPDraftConfig, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    return {"architectures": [SPECX_MTP_ARCH], **one_layer_llama_config(cfg), "torch_dtype": dtype_name(dtype),
            "specx": {"method": METHOD_NAME, "format_version": FORMAT_VERSION, "trained_by": "vllm-specx",
                      **_fields(cfg)}}


def _fields(cfg: MTPDraftConfig) -> dict[str, Any]:
    """The config's fields for the `specx` block; lm_head_from_target only when set, so a reader
    older than the field still reads every other checkpoint."""
    return {k: v for k, v in cfg.to_dict().items()
            if k in _FIELDS and (k != vocab.FROM_TARGET or cfg.lm_head_from_target)}


def save(draft, out: str | Path, dtype: torch.dtype = torch.float32) -> None:
    write_config_json(out, config_json(draft.cfg, dtype))
    omit = {vocab.HEAD} if draft.cfg.lm_head_from_target else set()
    save_tensors(out, {k: v.detach().to(dtype).contiguous() if v.is_floating_point() else v
                       for k, v in draft.specx_state_dict().items() if k not in omit})


def load(path: str | Path, embed: torch.Tensor, lm_head: torch.Tensor, **overrides):
    """The reference model of a checkpoint (config fields may be overridden, e.g. kv_share)."""
    from vllm_specx.methods.mtp.model import MTPDraft

    cfg = read_config(read_config_json(path), str(Path(path) / "config.json"))
    if overrides:
        cfg = MTPDraftConfig(**{**cfg.to_dict(), **overrides})
    draft = MTPDraft(cfg, embed, lm_head)
    tensors = load_tensors(path)
    if cfg.lm_head_from_target and vocab.D2T in tensors:  # the rows are the target's (`vllm_specx.vocab`)
        if vocab.HEAD in tensors:
            raise ValueError(f"{Path(path)}: tensor '{vocab.HEAD}' is present, but config.json says "
                             f"specx.{vocab.FROM_TARGET}: true (the rows come from the target)")
        tensors[vocab.HEAD] = vocab.target_rows(lm_head, tensors[vocab.D2T])
    draft.load_specx_state_dict(tensors)
    return draft


def with_options(src: str | Path, out: str | Path, **overrides) -> str:
    """A copy of checkpoint `src` at `out` with config fields changed (e.g. kv_share=False): the
    same tensors served with another option (how the ablation serves one layer both ways)."""
    raw = read_config_json(src)
    cfg = read_config(raw, str(Path(src) / "config.json"))
    cfg = MTPDraftConfig(**{**cfg.to_dict(), **overrides})
    Path(out).mkdir(parents=True, exist_ok=True)
    write_config_json(out, {**raw, "specx": {**raw["specx"], **_fields(cfg)}})
    tensors = load_tensors(src)
    save_tensors(out, tensors)
    return str(out)
