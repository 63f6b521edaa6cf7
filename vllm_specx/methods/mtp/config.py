"""The MTP draft's config: one shared DeepSeek-style MTP layer, checked on construction."""

from __future__ import annotations

import dataclasses
from typing import Any

SPECX_MTP_ARCH = "SpecxMTPModel"
ATTENTIONS = ("dense",)  # "dsa" (DSA indexer + IndexShare) is not served yet: refused, not ignored


@dataclasses.dataclass(frozen=True)
class MTPDraftConfig:
    """One MTP layer (`model.py`) whose parameters every draft step shares.

    Attributes:
        hidden_size, num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
        rms_norm_eps, rope_theta, max_position_embeddings: the layer's Llama decoder block.
        vocab_size: the target's (embeddings and LM head are the target's own).
        target_hidden_size: the target's hidden size (= hidden_size: the layer reads the
            target's final hidden state and shares its embeddings).
        target_num_hidden_layers: the target's layer count (the layer's index in vLLM's KV cache
            is this number, as a native MTP layer's is).
        kv_share: KVShare (module docstring of `model.py`): draft steps >= 1 attend only to the
            keys/values step 0 computed from the target's hidden states and write none.
        attention: "dense" (DSA with IndexShare is refused until it is served).
        max_drafts: drafts per pass when the user gives no `num_speculative_tokens`.
        trained_steps: draft steps the layer was trained unrolled for (information only).
        draft_vocab_size: 0 (the default) or vocab_size: the target's LM head scores every token.
            Below vocab_size, a reduced draft vocabulary (`vllm_specx.vocab`): the checkpoint
            carries its own `lm_head.weight` [draft_vocab_size, H] (rows of the target's) and the
            map `d2t` [draft_vocab_size] (optionally `t2d` [vocab_size]); the embeddings stay the
            target's (a step's input token is always a target token).
        lm_head_from_target: a reduced draft vocabulary whose `lm_head` rows are exactly the
            target's at `d2t` leaves them out of the checkpoint; loaders take them from the
            target's LM head (`vllm_specx.vocab.TargetHeadRows`). Refused without one.
        fusion_layer_ids: empty for a plain MTP layer (step 0 reads the target's final hidden
            state H_p); the Kimi-K3 variant: 0-based target layers whose residual streams
            (vLLM's EAGLE-3 aux hidden states) `fc` fuses into step 0's hidden input.
        source_format: "specx" (the only format).
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
    target_num_hidden_layers: int
    kv_share: bool = True
    attention: str = "dense"
    max_drafts: int = 7
    trained_steps: int = 7
    fusion_layer_ids: tuple[int, ...] = ()
    draft_vocab_size: int = 0
    lm_head_from_target: bool = False
    source_format: str = "specx"

    def __post_init__(self):
        for f in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "intermediate_size", "vocab_size", "target_hidden_size", "target_num_hidden_layers",
                  "max_position_embeddings", "max_drafts", "trained_steps"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"MTP draft config: {f} must be a positive integer, got {v!r}")
        if not isinstance(self.kv_share, bool):
            raise ValueError(f"MTP draft config: kv_share must be true or false, got {self.kv_share!r}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"MTP draft config: attention {self.attention!r} is not supported by this "
                             f"vllm-specx (supported: {list(ATTENTIONS)}; DSA with IndexShare is not "
                             f"served yet)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"MTP draft config: num_attention_heads ({self.num_attention_heads}) is "
                             f"not a multiple of num_key_value_heads ({self.num_key_value_heads})")
        if self.hidden_size != self.target_hidden_size:
            raise ValueError(f"MTP draft config: hidden_size ({self.hidden_size}) must equal "
                             f"target_hidden_size ({self.target_hidden_size}): the layer shares the "
                             f"target's embeddings and LM head")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError("MTP draft config: rms_norm_eps and rope_theta must be > 0")
        if not isinstance(self.fusion_layer_ids, (list, tuple)) or \
                not all(isinstance(i, int) and not isinstance(i, bool) for i in self.fusion_layer_ids):
            raise ValueError(f"MTP draft config: fusion_layer_ids must be a list of layer indices, "
                             f"got {self.fusion_layer_ids!r}")
        object.__setattr__(self, "fusion_layer_ids", tuple(self.fusion_layer_ids))
        ids = list(self.fusion_layer_ids)
        if ids and (sorted(set(ids)) != ids or ids[0] < 0 or ids[-1] >= self.target_num_hidden_layers):
            raise ValueError(f"MTP draft config: fusion_layer_ids {ids} must be distinct ascending "
                             f"layers of the target (0..{self.target_num_hidden_layers - 1})")
        v = self.draft_vocab_size
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= self.vocab_size:
            raise ValueError(f"MTP draft config: draft_vocab_size must be an integer in [1, vocab_size "
                             f"{self.vocab_size}] (0: the full vocabulary), got {v!r}")
        object.__setattr__(self, "draft_vocab_size", v or self.vocab_size)
        if not isinstance(self.lm_head_from_target, bool):
            raise ValueError(f"MTP draft config: lm_head_from_target must be true or false, got "
                             f"{self.lm_head_from_target!r}")
        if self.lm_head_from_target and not self.reduced_vocab:
            raise ValueError("MTP draft config: lm_head_from_target needs a reduced draft vocabulary "
                             "(draft_vocab_size below vocab_size): a full-vocabulary draft always "
                             "scores with the target's LM head")
        if self.source_format != "specx":
            raise ValueError(f"MTP draft config: source_format {self.source_format!r} is not 'specx'")

    @classmethod
    def for_target(cls, target: dict[str, Any], **kw) -> MTPDraftConfig:
        """A layer with the target's block shapes (`target`: its HF config as a dict)."""
        from vllm_specx.checkpoint import decoder_block_fields

        return cls(**decoder_block_fields(target), target_num_hidden_layers=target["num_hidden_layers"], **kw)

    def check_target(self, target: dict[str, Any], num_speculative_tokens: int | None) -> None:
        for mine, theirs in (("target_hidden_size", "hidden_size"), ("vocab_size", "vocab_size"),
                             ("target_num_hidden_layers", "num_hidden_layers")):
            if getattr(self, mine) != target[theirs]:
                raise ValueError(f"MTP draft: {mine} = {getattr(self, mine)} but the target's "
                                 f"{theirs} is {target[theirs]}: this draft was built for another target")
        if num_speculative_tokens is not None and num_speculative_tokens < 1:
            raise ValueError(f"MTP draft: num_speculative_tokens must be >= 1, got {num_speculative_tokens}")

    @property
    def reduced_vocab(self) -> bool:
        """A reduced draft vocabulary (own lm_head rows and `d2t`)."""
        return self.draft_vocab_size < self.vocab_size

    @property
    def max_drafts_source(self) -> str:
        """Where `max_drafts` (the default drafts per pass) comes from, for messages."""
        return f"specx.max_drafts {self.max_drafts}"

    def expected_tensors(self) -> dict[str, tuple[int, ...]]:
        h, hd = self.hidden_size, self.head_dim
        q, kv, i = self.num_attention_heads * hd, self.num_key_value_heads * hd, self.intermediate_size
        b = "mtp_block."
        return {"enorm.weight": (h,), "hnorm.weight": (h,), "eh_proj.weight": (h, 2 * h),
                b + "input_layernorm.weight": (h,), b + "post_attention_layernorm.weight": (h,),
                b + "self_attn.q_proj.weight": (q, h), b + "self_attn.k_proj.weight": (kv, h),
                b + "self_attn.v_proj.weight": (kv, h), b + "self_attn.o_proj.weight": (h, q),
                b + "mlp.gate_proj.weight": (i, h), b + "mlp.up_proj.weight": (i, h),
                b + "mlp.down_proj.weight": (h, i), "shared_head.norm.weight": (h,),
                **({"fc.weight": (h, h * len(self.fusion_layer_ids))} if self.fusion_layer_ids else {}),
                **({"d2t": (self.draft_vocab_size,), "t2d": (self.vocab_size,)} if self.reduced_vocab else {}),
                **({"lm_head.weight": (self.draft_vocab_size, h)}
                   if self.reduced_vocab and not self.lm_head_from_target else {})}

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["fusion_layer_ids"] = list(self.fusion_layer_ids)
        return out

    def summary(self) -> str:
        k3 = f", K3 fusion of target layers {list(self.fusion_layer_ids)}" if self.fusion_layer_ids else ""
        k3 += f", draft vocabulary {self.draft_vocab_size} of {self.vocab_size}" if self.reduced_vocab else ""
        k3 += " (LM head rows from the target)" if self.lm_head_from_target else ""
        return (f"MTP layer (shared across draft steps, {self.attention} attention{k3}), hidden "
                f"{self.hidden_size}, kv_share {'on' if self.kv_share else 'off'}, trained for "
                f"{self.trained_steps} steps, {self.max_drafts} drafts by default")
