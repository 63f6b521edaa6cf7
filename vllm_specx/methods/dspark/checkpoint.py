"""DSpark checkpoints, read and write, in both formats vllm-specx serves.

A DSpark draft checkpoint is a directory with `config.json` and `*.safetensors`. Both formats store
the same tensors (the names vLLM's DFlash/DSpark loaders use, `DSparkDraftConfig.expected_tensors`);
they differ only in config.json:

* **vllm-specx** (ours): a Qwen3 layer config (`model_type: "qwen3"`, `hidden_size`, ...) with
  `architectures: ["SpecxDSparkModel"]` and a `specx` block:
  `{"method": "dspark", "format_version": 1, "target_layer_ids": [...], "target_hidden_size": H,
  "block_size": B, "mask_token_id": m, "markov_rank": r, "sample_from_anchor": true,
  "causal": false}`, optionally `"markov_head_type"` ("vanilla"), `"confidence_head"` (null) and
  `"sliding_window"` (null). `format_version` is required; readers refuse versions they do not know.
* **speculators** (`speculators_model_type: "dspark"`, as speculators 0.9.0's trainer writes it):
  the Qwen3 layer config sits in `transformer_layer_config`, taps in `aux_hidden_state_layer_ids`
  (aux ids = layer index + 1). Attention follows speculators' training mask: `layer_types` all
  `sliding_attention` (speculators' default) means a context window of `sliding_window` and causal
  attention inside the block unless `sliding_window_non_causal`; all `full_attention` (or no
  `layer_types`) means bidirectional over the whole context; a mix is refused (vLLM's V1 runner
  cannot run it). `markov_head_type`, `enable_confidence_head` and `confidence_head_with_markov`
  are read with speculators' defaults; `sample_from_anchor` must be present (speculators
  defaults it to true, vLLM's translator to false).
"""

from __future__ import annotations

import torch

from pathlib import Path
from typing import Any

from vllm_specx.checkpoint import (
    check_tensors,
    check_vocab_maps,
    dtype_name,
    from_aux_ids,
    load_tensors,
    read_config_json,
    save_tensors,
    specx_block,
    to_aux_ids,
    write_config_json,
)
from vllm_specx import vocab
from vllm_specx.methods.dspark.config import (
    DRAFT_OPTIONS,
    RECIPE_SWITCHES,
    SPECX_DSPARK_ARCH,
    DSparkDraftConfig,
    build_config,
)

METHOD_NAME = "dspark"
# Of the vllm-specx format; bump when its meaning changes, and read every version. 2 added the
# full recipe's switches (`RECIPE_SWITCHES`); a version-1 block must not carry them. 3 added the
# next-token stream (`next_token_stream`): a block below 3 must not carry it, and a draft without
# the stream is still written as version 2 (so a reader that predates version 3 reads it).
FORMAT_VERSION = 3
READS_VERSIONS = (1, 2, 3)
_SINCE = {"next_token_stream": 3, **{k: 2 for k in RECIPE_SWITCHES}}
SPECX_FIELDS = ("method", "format_version", "target_layer_ids", "target_hidden_size", *DRAFT_OPTIONS,
                "draft_vocab_size")


def detect(raw: dict[str, Any]) -> str | None:
    """'specx' or 'speculators' when `raw` (a config.json) claims to be a DSpark draft, else None."""
    if raw.get("speculators_model_type") == METHOD_NAME:
        return "speculators"
    specx = raw.get("specx")
    if (isinstance(specx, dict) and specx.get("method") == METHOD_NAME) or \
            raw.get("architectures") == [SPECX_DSPARK_ARCH]:
        return "specx"
    return None


def read_config(raw: dict[str, Any], where: str = "config.json") -> DSparkDraftConfig:
    """Parse either format; ValueError naming `where` and the field on a bad config."""
    if raw.get("speculators_model_type") == METHOD_NAME:
        return _from_speculators(raw, where)
    specx = specx_block(raw, METHOD_NAME, READS_VERSIONS, where, "a DSpark draft",
                        f", or speculators_model_type '{METHOD_NAME}'")
    unknown = sorted(set(specx) - set(SPECX_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {['specx.' + k for k in unknown]} in a DSpark "
                         f"draft (known: {list(SPECX_FIELDS)})")
    newer = [k for k in _SINCE if k in specx and specx["format_version"] < _SINCE[k]]
    if newer:
        raise ValueError(f"{where}: specx.{newer[0]} needs format_version {_SINCE[newer[0]]} (version "
                         f"{specx['format_version']} has no such field)")
    return build_config(raw, specx, "specx", where, specx.get("target_layer_ids"))


def read_pretrained(path: str | Path) -> DSparkDraftConfig:
    return read_config(read_config_json(path), str(Path(path) / "config.json"))


def _from_speculators(raw: dict[str, Any], where: str) -> DSparkDraftConfig:
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError(f"{where}: speculators DSpark needs a 'transformer_layer_config' dict")
    aux = raw.get("aux_hidden_state_layer_ids")
    if not aux:
        raise ValueError(f"{where}: speculators DSpark needs 'aux_hidden_state_layer_ids'")
    if "sample_from_anchor" not in raw:
        raise ValueError(
            f"{where}: missing required field 'sample_from_anchor' (speculators 0.9.0 defaults it "
            f"to true, vLLM's speculators translator to false; set it explicitly)")
    opts = {k: v for k, v in raw.items()
            if k not in ("causal", "confidence_head", "sliding_window", "next_token_stream") + RECIPE_SWITCHES}
    opts["causal"], opts["sliding_window"] = _speculators_attention(layer, raw, where)
    if raw.get("enable_confidence_head", True):
        opts["confidence_head"] = ("hidden+markov" if raw.get("confidence_head_with_markov", True)
                                   else "hidden")
    return build_config(layer, opts, "speculators", where, from_aux_ids(aux))


def _speculators_attention(layer: dict, raw: dict, where: str) -> tuple[bool, int | None]:
    """(causal, sliding_window) of a speculators DFlash-family draft, as its trainer masks it
    (`speculators.models.dflash.attention.create_anchor_block_mask_mod`)."""
    types = layer.get("layer_types")
    if not types:
        return False, None
    n = layer.get("num_hidden_layers")
    if n is not None and len(types) != int(n):
        raise ValueError(f"{where}: transformer_layer_config.layer_types has {len(types)} entries "
                         f"for {n} layers")
    kinds = set(types)
    if kinds == {"full_attention"}:
        return False, None
    if kinds == {"sliding_attention"}:
        window = layer.get("sliding_window")
        if window is None:
            raise ValueError(f"{where}: sliding_attention layers need "
                             "transformer_layer_config.sliding_window")
        return not bool(raw.get("sliding_window_non_causal", False)), int(window)
    raise ValueError(
        f"{where}: transformer_layer_config.layer_types {types} mixes or names unknown attention "
        f"types; vllm-specx serves drafts whose layers are all 'sliding_attention' or all "
        f"'full_attention' (vLLM's V1 runner cannot run mixed DFlash layers)")


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


def save_specx(draft, path: str | Path, extra: dict | None = None, dtype: torch.dtype = torch.float32) -> None:
    """Write `draft` (a `model.DSparkDraft`) in vllm-specx format: config.json + model.safetensors
    (float32, or `dtype`, e.g. bfloat16 to halve the file; vLLM casts to the engine's dtype)."""
    c = draft.cfg
    config = {
        "architectures": [SPECX_DSPARK_ARCH], **layer_config(c), "torch_dtype": dtype_name(dtype),
        "specx": {
            "method": METHOD_NAME, "format_version": FORMAT_VERSION if c.next_token_stream else 2,
            "target_layer_ids": list(c.target_layer_ids),
            "target_hidden_size": c.target_hidden_size,
            # lm_head_from_target and next_token_stream only when set: a reader older than the
            # field still reads the rest
            **{k: getattr(c, k) for k in DRAFT_OPTIONS
               if k not in (vocab.FROM_TARGET, "next_token_stream") or getattr(c, k)},
            **({"draft_vocab_size": c.draft_vocab_size} if c.reduced_vocab else {}),
            **(extra or {}),
        },
    }
    _write(draft, path, config, dtype, omit=("lm_head",) if c.lm_head_from_target else ())


def save_speculators(draft, path: str | Path, verifier: str) -> None:
    """Write `draft` as a speculators-format DSpark checkpoint (the fields vLLM's translator reads)."""
    c = draft.cfg
    if [k for k in RECIPE_SWITCHES if getattr(c, k)]:
        raise ValueError(f"the speculators format has no field for {', '.join(c.recipe)}: save this "
                         "draft in the vllm-specx format")
    if c.next_token_stream:
        raise ValueError("the speculators format has no next-token stream (its DSpark context rows "
                         "hold the fused taps alone; speculators and vLLM's own DSpark would load the "
                         "draft without it and draft wrongly): save this draft in the vllm-specx format")
    layer = layer_config(c)
    if c.sliding_window is not None:
        layer.update(layer_types=["sliding_attention"] * c.num_hidden_layers,
                     sliding_window=c.sliding_window)
    elif c.causal:
        raise ValueError("the speculators format expresses causal draft attention only as "
                         "sliding-window layers: give the draft a sliding_window, or save it in "
                         "the vllm-specx format")
    else:
        layer["layer_types"] = ["full_attention"] * c.num_hidden_layers
    config = {
        "speculators_model_type": METHOD_NAME, "architectures": ["Qwen3DSparkModel"],
        "speculators_config": {"proposal_methods": [{"speculative_tokens": c.max_drafts}],
                               "verifier": {"name_or_path": verifier}},
        "transformer_layer_config": layer,
        "aux_hidden_state_layer_ids": to_aux_ids(c.target_layer_ids),
        "mask_token_id": c.mask_token_id, "markov_rank": c.markov_rank,
        "markov_head_type": c.markov_head_type, "block_size": c.block_size,
        "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size,
        "sample_from_anchor": c.sample_from_anchor, "sliding_window_non_causal": not c.causal,
        "enable_confidence_head": c.confidence_head is not None,
        "confidence_head_with_markov": c.confidence_head == "hidden+markov", "torch_dtype": "float32",
    }
    _write(draft, path, config)


def save(draft, path: str | Path, fmt: str = "specx", **kw) -> None:
    """Write `draft` in format `fmt` ("specx" or "speculators"; the latter needs `verifier=`)."""
    {"specx": save_specx, "speculators": save_speculators}[fmt](draft, path, **kw)


def _write(draft, path, config: dict, dtype: torch.dtype = torch.float32, omit: tuple[str, ...] = ()) -> None:
    """config.json and the draft's tensors but `omit` (the speculators format always writes a
    reduced vocabulary's lm_head rows: it has no `lm_head_from_target`)."""
    write_config_json(path, config)
    save_tensors(path, {_ON_DISK.get(k, k): v.to(dtype) if v.is_floating_point() else v
                        for k, v in draft.state_dict().items() if k not in omit})


# A reduced draft vocabulary's own lm_head rows: a plain tensor in the model, vLLM's name on disk.
_ON_DISK = {"lm_head": "lm_head.weight"}


def load_draft(path: str | Path, embed, lm_head):
    """Load either format into the PyTorch model (checked against config.json first)."""
    from vllm_specx.methods.dspark.model import DSparkDraft

    cfg = read_pretrained(path)
    check_tensors(path, cfg.expected_tensors())
    tensors = {next((k for k, v in _ON_DISK.items() if v == name), name): t
               for name, t in load_tensors(path).items()}
    if cfg.reduced_vocab:
        check_vocab_maps(path, cfg.vocab_size, cfg.draft_vocab_size)  # names the file
        tensors = vocab.loaded_maps(tensors, cfg.vocab_size, cfg.draft_vocab_size, None)
        if cfg.lm_head_from_target:  # the rows are the target's (`vllm_specx.vocab`)
            tensors["lm_head"] = vocab.target_rows(lm_head, tensors[vocab.D2T])
    draft = DSparkDraft(cfg, embed, lm_head)
    draft.load_state_dict(tensors, strict=True)
    return draft
