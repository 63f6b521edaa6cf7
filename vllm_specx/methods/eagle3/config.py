"""The EAGLE-3 draft's config: vLLM's `Eagle3LlamaForCausalLM` fields, checked on construction."""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm_specx.checkpoint import decoder_block_fields, from_aux_ids, one_layer_llama_config, to_aux_ids


@dataclasses.dataclass(frozen=True)
class Eagle3Config:
    """One Llama decoder layer over [embed(token); fused taps] (vLLM's llama_eagle3 with its
    defaults: no norm before fc, no fc norms, residual taken before the hidden norm, the next
    step's hidden = the pre-norm output). Embeddings and lm_head are the target's (full vocab),
    or with `draft_vocab_size` < `vocab_size` a reduced draft vocabulary (`vllm_specx.vocab`):
    its own `lm_head.weight` rows and `d2t` (`t2d` optional), which vLLM's llama_eagle3 reads.

    Attributes as in vLLM's draft config.json; `target_layer_ids` are 0-based target layers
    (vLLM's `eagle_aux_hidden_state_layer_ids` = these + 1).
    """

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int
    rope_theta: float
    max_position_embeddings: int
    target_hidden_size: int
    target_layer_ids: tuple[int, ...]
    draft_vocab_size: int = 0

    def __post_init__(self):
        object.__setattr__(self, "target_layer_ids", tuple(int(t) for t in self.target_layer_ids))
        v = self.draft_vocab_size
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= self.vocab_size:
            raise ValueError(f"EAGLE-3 config: draft_vocab_size must be an integer in [1, vocab_size "
                             f"{self.vocab_size}] (0: the full vocabulary), got {v!r}")
        object.__setattr__(self, "draft_vocab_size", v or self.vocab_size)
        for f in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "intermediate_size", "vocab_size", "target_hidden_size", "max_position_embeddings"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) <= 0:
                raise ValueError(f"EAGLE-3 config: {f} must be a positive integer, got {getattr(self, f)!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"EAGLE-3 config: num_attention_heads ({self.num_attention_heads}) is not a "
                             f"multiple of num_key_value_heads ({self.num_key_value_heads})")
        if not self.target_layer_ids or sorted(set(self.target_layer_ids)) != list(self.target_layer_ids) \
                or min(self.target_layer_ids) < 0:
            raise ValueError(f"EAGLE-3 config: target_layer_ids {list(self.target_layer_ids)} must be "
                             "distinct ascending 0-based layers")
        if self.hidden_size != self.target_hidden_size:
            raise ValueError(f"EAGLE-3 config: hidden_size ({self.hidden_size}) must equal the target's "
                             f"({self.target_hidden_size}): the draft shares its embeddings and lm_head")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError("EAGLE-3 config: rms_norm_eps and rope_theta must be > 0")

    @property
    def reduced_vocab(self) -> bool:
        """A reduced draft vocabulary (own lm_head rows and `d2t`)."""
        return self.draft_vocab_size < self.vocab_size

    @classmethod
    def for_target(cls, target: dict[str, Any], target_layer_ids, draft_vocab_size: int = 0) -> Eagle3Config:
        """A draft layer with the target's shapes (`target`: its HF config as a dict)."""
        return cls(**decoder_block_fields(target), target_layer_ids=tuple(target_layer_ids),
                   draft_vocab_size=draft_vocab_size)

    def check_target(self, target: dict[str, Any]) -> None:
        """ValueError naming the field when this draft cannot serve `target` (as
        `registry.target_dims` returns it)."""
        layers = int(target["num_hidden_layers"])
        bad = [t for t in self.target_layer_ids if t >= layers]
        if bad:
            raise ValueError(f"EAGLE-3 draft target_layer_ids {list(self.target_layer_ids)}: layer(s) "
                             f"{bad} outside the target's {layers} layers (valid: 0..{layers - 1})")
        for mine, theirs in (("target_hidden_size", "hidden_size"), ("hidden_size", "hidden_size"),
                             ("vocab_size", "vocab_size")):
            if getattr(self, mine) != int(target[theirs]):
                raise ValueError(f"EAGLE-3 draft {mine} {getattr(self, mine)} != target {theirs} "
                                 f"{target[theirs]} (the draft shares the target's embeddings and lm_head)")

    def expected_tensors(self) -> dict[str, tuple[int, ...]]:
        """The tensors vLLM's `Eagle3LlamaForCausalLM` loads from this draft (`model.py`'s
        `vllm_state_dict`): no embeddings or lm_head, the target's are shared (a reduced draft
        vocabulary: its lm_head rows and maps)."""
        h, hd, inter = self.hidden_size, self.head_dim, self.intermediate_size
        q, kv, m = self.num_attention_heads * hd, self.num_key_value_heads * hd, "midlayer."
        return {"fc.weight": (h, self.target_hidden_size * len(self.target_layer_ids)),
                "norm.weight": (h,), m + "input_layernorm.weight": (h,), m + "hidden_norm.weight": (h,),
                m + "post_attention_layernorm.weight": (h,),
                m + "self_attn.q_proj.weight": (q, 2 * h), m + "self_attn.k_proj.weight": (kv, 2 * h),
                m + "self_attn.v_proj.weight": (kv, 2 * h), m + "self_attn.o_proj.weight": (h, q),
                m + "mlp.gate_proj.weight": (inter, h), m + "mlp.up_proj.weight": (inter, h),
                m + "mlp.down_proj.weight": (h, inter),
                **({"lm_head.weight": (self.draft_vocab_size, h), "d2t": (self.draft_vocab_size,),
                    "t2d": (self.vocab_size,)} if self.reduced_vocab else {})}

    def vllm_config_json(self) -> dict[str, Any]:
        """The config.json vLLM's built-in `eagle3` method loads (`LlamaForCausalLMEagle3`)."""
        return {"architectures": ["LlamaForCausalLMEagle3"], **one_layer_llama_config(self),
                "draft_vocab_size": self.draft_vocab_size, "target_hidden_size": self.target_hidden_size,
                "num_aux_hidden_states": len(self.target_layer_ids),
                "eagle_aux_hidden_state_layer_ids": to_aux_ids(self.target_layer_ids),
                "specx": {"trained_by": "vllm-specx", "target_layer_ids": list(self.target_layer_ids)}}

    @classmethod
    def from_vllm_config_json(cls, raw: dict[str, Any]) -> Eagle3Config:
        taps = raw.get("specx", {}).get("target_layer_ids") or from_aux_ids(raw["eagle_aux_hidden_state_layer_ids"])
        fields = {f.name for f in dataclasses.fields(cls)} - {"target_layer_ids", "draft_vocab_size"}
        return cls(**{k: raw[k] for k in fields}, target_layer_ids=tuple(taps),
                   draft_vocab_size=raw.get("draft_vocab_size") or 0)
