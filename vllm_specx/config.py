"""DSpark draft configuration: one parser for both checkpoint formats, and the checks against a target.

A DSpark draft checkpoint is a directory with `config.json` and `*.safetensors`. Two formats load:

* **vllm-specx** (ours): a Qwen3 layer config (`model_type: "qwen3"`, `hidden_size`, ...) with
  `architectures: ["SpecxDSparkModel"]` and a `specx` block:
  `{"method": "dspark", "target_layer_ids": [...], "target_hidden_size": H, "block_size": B,
  "mask_token_id": m, "markov_rank": r, "sample_from_anchor": true, "causal": false}`.
* **speculators** (`speculators_model_type: "dspark"`): the Qwen3 layer config sits in
  `transformer_layer_config`, taps in `aux_hidden_state_layer_ids` (aux ids = layer index + 1).

This module reads plain dicts and never imports vLLM, so the trainer and the front-end checks share it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

SPECX_DSPARK_ARCH = "SpecxDSparkModel"


@dataclasses.dataclass(frozen=True)
class DSparkDraftConfig:
    """Everything the DSpark head needs beyond its Qwen3 layer shapes.

    Attributes:
        source_format: "specx" or "speculators".
        target_layer_ids: 0-based target layers whose outputs are tapped, ascending.
        target_hidden_size: hidden size of each tap.
        hidden_size, vocab_size, draft_vocab_size, num_hidden_layers: draft shapes.
        block_size: query slots of one parallel pass, the anchor slot included; vLLM's V1 runner
            drafts at most `block_size - 1` tokens per pass.
        mask_token_id: token fed to the non-anchor slots.
        markov_rank: rank r of the Markov head (W1: [vocab, r], W2: [draft_vocab, r]).
        sample_from_anchor: True: slot k predicts the token after slot k (anchor layout);
            False: slot k >= 1 predicts its own position (fill-in layout, DFlash's).
        causal: attention inside the query block is causal (False: bidirectional).
    """

    source_format: str
    target_layer_ids: tuple[int, ...]
    target_hidden_size: int
    hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    block_size: int
    mask_token_id: int
    markov_rank: int
    sample_from_anchor: bool
    causal: bool

    @property
    def max_drafts(self) -> int:
        return self.block_size - 1

    @property
    def aux_layer_ids(self) -> list[int]:
        """vLLM's aux-hidden-state ids: id k is the residual stream after k decoder layers."""
        return [i + 1 for i in self.target_layer_ids]

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config.json") -> DSparkDraftConfig:
        if raw.get("speculators_model_type") == "dspark":
            return cls._from_speculators(raw, where)
        specx = raw.get("specx")
        if not isinstance(specx, dict) or specx.get("method") != "dspark":
            raise ValueError(
                f"{where}: not a DSpark draft (needs a 'specx' block with method 'dspark', "
                "or speculators_model_type 'dspark')"
            )
        return cls._build(raw, specx, "specx", where, specx.get("target_layer_ids"))

    @classmethod
    def for_target(cls, target: dict[str, Any], *, target_layer_ids, num_hidden_layers: int,
                   block_size: int, mask_token_id: int, markov_rank: int,
                   sample_from_anchor: bool = True, causal: bool = False) -> DSparkDraftConfig:
        """A new draft whose layers copy the target's shapes (`target`: its HF config as a dict)."""
        layer = {**target, "num_hidden_layers": num_hidden_layers}
        opts = {"block_size": block_size, "mask_token_id": mask_token_id, "markov_rank": markov_rank,
                "sample_from_anchor": sample_from_anchor, "causal": causal}
        return cls._build(layer, opts, "specx", "new draft", target_layer_ids)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> DSparkDraftConfig:
        return cls.from_dict(read_config_json(path), str(Path(path) / "config.json"))

    @classmethod
    def _from_speculators(cls, raw: dict[str, Any], where: str) -> DSparkDraftConfig:
        layer = raw.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise ValueError(f"{where}: speculators DSpark needs a 'transformer_layer_config' dict")
        aux = raw.get("aux_hidden_state_layer_ids")
        if not aux:
            raise ValueError(f"{where}: speculators DSpark needs 'aux_hidden_state_layer_ids'")
        opts = dict(raw)
        # speculators' own default is the 1+N fill-in layout (vLLM's translator agrees).
        opts.setdefault("sample_from_anchor", False)
        return cls._build(layer, opts, "speculators", where, [int(i) - 1 for i in aux])

    @classmethod
    def _build(cls, layer: dict, opts: dict, fmt: str, where: str, taps) -> DSparkDraftConfig:
        def need(d: dict, key: str, field: str | None = None):
            if d.get(key) is None:
                raise ValueError(f"{where}: missing required field '{field or key}'")
            return d[key]

        hidden = int(need(layer, "hidden_size"))
        heads = int(need(layer, "num_attention_heads"))
        if not taps:
            raise ValueError(f"{where}: missing required field 'target_layer_ids'")
        taps = tuple(sorted(int(t) for t in taps))
        if len(set(taps)) != len(taps) or taps[0] < 0:
            raise ValueError(f"{where}: target_layer_ids {list(taps)} must be distinct and >= 0")
        vocab = int(need(layer, "vocab_size"))
        cfg = cls(
            source_format=fmt,
            target_layer_ids=taps,
            target_hidden_size=int(opts.get("target_hidden_size") or hidden),
            hidden_size=hidden,
            vocab_size=vocab,
            draft_vocab_size=int(opts.get("draft_vocab_size") or vocab),
            num_hidden_layers=int(need(layer, "num_hidden_layers")),
            num_attention_heads=heads,
            num_key_value_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(layer.get("head_dim") or hidden // heads),
            intermediate_size=int(need(layer, "intermediate_size")),
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
            rope_theta=float(_rope_theta(layer)),
            block_size=int(need(opts, "block_size")),
            mask_token_id=int(need(opts, "mask_token_id")),
            markov_rank=int(need(opts, "markov_rank")),
            sample_from_anchor=bool(opts.get("sample_from_anchor", True)),
            causal=bool(opts.get("causal", False)),
        )
        if cfg.block_size < 2:
            raise ValueError(f"{where}: block_size must be >= 2 (anchor + at least one slot)")
        if not 0 <= cfg.mask_token_id < vocab:
            raise ValueError(f"{where}: mask_token_id {cfg.mask_token_id} outside vocab_size {vocab}")
        if cfg.draft_vocab_size != vocab:
            raise ValueError(
                f"{where}: draft_vocab_size {cfg.draft_vocab_size} != vocab_size {vocab}: "
                "reduced draft vocabularies are not supported yet"
            )
        return cfg

    def check_target(self, target: dict[str, Any], num_speculative_tokens: int | None) -> None:
        """Raise ValueError naming the field when this draft cannot serve `target`.

        Args:
            target: the target's HF config as a dict (hidden_size, num_hidden_layers, vocab_size).
            num_speculative_tokens: requested drafts per pass, or None.
        """
        layers = int(target["num_hidden_layers"])
        bad = [t for t in self.target_layer_ids if t >= layers]
        if bad:
            raise ValueError(
                f"DSpark draft target_layer_ids {list(self.target_layer_ids)}: layer(s) {bad} "
                f"outside the target's {layers} layers (valid: 0..{layers - 1})"
            )
        if self.target_hidden_size != int(target["hidden_size"]):
            raise ValueError(
                f"DSpark draft target_hidden_size {self.target_hidden_size} != target "
                f"hidden_size {target['hidden_size']}"
            )
        if self.hidden_size != int(target["hidden_size"]):
            raise ValueError(
                f"DSpark draft hidden_size {self.hidden_size} != target hidden_size "
                f"{target['hidden_size']} (the draft shares the target's embeddings and lm_head)"
            )
        if self.vocab_size != int(target["vocab_size"]):
            raise ValueError(
                f"DSpark draft vocab_size {self.vocab_size} != target vocab_size {target['vocab_size']}"
            )
        if num_speculative_tokens is not None and num_speculative_tokens > self.max_drafts:
            raise ValueError(
                f"num_speculative_tokens {num_speculative_tokens} exceeds this DSpark draft's "
                f"block: block_size {self.block_size} gives at most {self.max_drafts} drafts per pass"
            )

    def expected_tensors(self) -> dict[str, tuple[int, ...]]:
        """Checkpoint tensor names and shapes, as vLLM's DFlash/DSpark loaders name them."""
        h, hd, inter = self.hidden_size, self.head_dim, self.intermediate_size
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        shapes: dict[str, tuple[int, ...]] = {
            "fc.weight": (h, self.target_hidden_size * len(self.target_layer_ids)),
            "hidden_norm.weight": (h,),
            "norm.weight": (h,),
            "markov_head.markov_w1.weight": (self.vocab_size, self.markov_rank),
            "markov_head.markov_w2.weight": (self.draft_vocab_size, self.markov_rank),
        }
        for i in range(self.num_hidden_layers):
            p = f"layers.{i}."
            shapes.update({
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "self_attn.q_norm.weight": (hd,),
                p + "self_attn.k_norm.weight": (hd,),
                p + "mlp.gate_proj.weight": (inter, h),
                p + "mlp.up_proj.weight": (inter, h),
                p + "mlp.down_proj.weight": (h, inter),
            })
        return shapes


def _rope_theta(layer: dict) -> float:
    rope = layer.get("rope_parameters") or layer.get("rope_scaling") or {}
    return rope.get("rope_theta") or layer.get("rope_theta") or 1e6


def read_config_json(path: str | Path) -> dict[str, Any]:
    """Read `<path>/config.json`, with errors that name the file."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise ValueError(f"draft checkpoint {path}: no config.json")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{file}: invalid JSON ({e})") from e


def is_dspark_checkpoint(raw: dict[str, Any]) -> str | None:
    """'specx' or 'speculators' when `raw` is a DSpark draft config, else None."""
    if raw.get("speculators_model_type") == "dspark":
        return "speculators"
    if isinstance(raw.get("specx"), dict) and raw["specx"].get("method") == "dspark":
        return "specx"
    return None
