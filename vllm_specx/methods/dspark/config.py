"""DSpark draft configuration and its checks (on every construction path) against a target.

The two checkpoint formats that produce it are read and written in `checkpoint.py`; this module
knows only the fields. Plain Python: no vLLM, no torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm_specx.checkpoint import to_aux_ids

SPECX_DSPARK_ARCH = "SpecxDSparkModel"
SOURCE_FORMATS = ("specx", "speculators")
MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
CONFIDENCE_HEADS = (None, "hidden", "hidden+markov")
# How a context row carries the realised next token x_{t+1} (`model.py`): not at all (None, every
# draft before the field), inside the context projection ("fused", before hidden_norm) or added to
# the normed context ("added").
NEXT_TOKEN_STREAMS = (None, "fused", "added")
# The full recipe: each switch on, plus the recurrent Markov head (see `RECIPE`).
RECIPE_SWITCHES = ("final_layer_tap", "per_layer_fusion", "slot_queries")
REQUIRED = object()
# The DSpark options beside the layer shapes, spelled once: name -> default (`REQUIRED`: no
# default). The checkpoint readers (`build_config`), `DSparkDraftConfig.for_target` and the
# vllm-specx format's `specx` block use these names.
DRAFT_OPTIONS: dict[str, Any] = {
    "block_size": REQUIRED, "mask_token_id": REQUIRED, "markov_rank": REQUIRED,
    "sample_from_anchor": True, "causal": False, "markov_head_type": "vanilla", "confidence_head": None,
    "sliding_window": None, **{k: False for k in RECIPE_SWITCHES}, "lm_head_from_target": False,
    "next_token_stream": None,
}
RECIPE = {"final_layer_tap": True, "per_layer_fusion": True, "slot_queries": True,
          "markov_head_type": "rnn"}
BASELINE = {"final_layer_tap": False, "per_layer_fusion": False, "slot_queries": False,
            "markov_head_type": "vanilla"}

_INT_FIELDS = ("target_hidden_size", "hidden_size", "vocab_size", "draft_vocab_size",
               "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "intermediate_size", "block_size", "mask_token_id", "markov_rank")


@dataclasses.dataclass(frozen=True)
class DSparkDraftConfig:
    """Everything the DSpark head needs beyond its Qwen3 layer shapes.

    Every construction path (`checkpoint.read_config`, `for_target`, `DSparkDraftConfig(**d)` in a
    vLLM worker) runs the same checks in `__post_init__`.

    Attributes:
        source_format: "specx" or "speculators".
        target_layer_ids: 0-based target layers whose outputs are tapped, ascending.
        target_hidden_size: hidden size of each tap.
        hidden_size, vocab_size, draft_vocab_size, num_hidden_layers: draft shapes. A
            draft_vocab_size below vocab_size is a reduced draft vocabulary (`vllm_specx.vocab`):
            the checkpoint then carries its own `lm_head.weight` [draft_vocab_size, H] and the
            maps `d2t` [draft_vocab_size] (and optionally `t2d` [vocab_size]).
        block_size: query slots of one parallel pass (training), the anchor slot included. The
            anchor layout drafts up to `block_size` tokens per pass (slot k predicts the token
            after it), the fill-in layout up to `block_size - 1` (slot 0 is the bonus anchor).
        mask_token_id: token fed to the non-anchor slots.
        markov_rank: rank r of the Markov head (W1: [vocab, r], W2: [draft_vocab, r]: the previous
            token is a target token, the bias is over the draft vocabulary).
        sample_from_anchor: True: slot k predicts the token after slot k (anchor layout);
            False: slot k >= 1 predicts its own position (fill-in layout, DFlash's).
        causal: attention inside the query block is causal (False: bidirectional), every layer.
        markov_head_type: the Markov head (speculators' `markov_head_type`; `model.MarkovHead`):
            "vanilla" `W2 W1[prev]`, "gated" (a gate on W1[prev] from the slot's hidden state) or
            "rnn" (a gated recurrent state over the block's slots).
        confidence_head: None, or the input of the per-slot acceptance-probability head
            (speculators' `enable_confidence_head`): "hidden" (the slot's hidden state) or
            "hidden+markov" (also W1[prev]). Loaded and computable (`DSparkDraft.confidence_logits`);
            drafting does not use it yet.
        sliding_window: None (every draft layer attends to the whole context), or W: a query
            block anchored at a sees context positions a - W .. a - 1 (speculators'
            sliding-attention layers; every layer).

    The full recipe's switches (`RECIPE`; off in a checkpoint that does not name them; the
    formulas are in `model.py`'s docstring):
        final_layer_tap: the last tap is the target's final residual state (its last layer,
            before the final norm); `check_target` holds the target to it.
        per_layer_fusion: each draft layer mixes the fc's per-tap contributions with its own
            softmax weights (`fusion_logits` [num_hidden_layers, n_taps]) before its context K/V.
        slot_queries: query slot j >= 1 starts from its own learned embedding
            (`slot_queries` [block_size - 1, hidden_size]) instead of the mask token's.
        The recurrent head is `markov_head_type: "rnn"`.
        lm_head_from_target: a reduced draft vocabulary whose `lm_head` rows are exactly the
            target's at `d2t` leaves them out of the checkpoint; loaders take them from the
            target's LM head (`vllm_specx.vocab`). Refused without a reduced vocabulary.
        next_token_stream: None, "fused" or "added": each context row t also carries the realised
            next token x_{t+1} (EAGLE-3's and MTP's copy path), as s_t = W_e tn(embed(x_{t+1}))
            (`next_token_norm`, `next_token_proj`; the target's frozen embedding): "fused" adds s_t
            to fc(taps_t) before hidden_norm, "added" to hn(fc(taps_t)) after it. None: the rows
            hold the taps alone (every draft written before the field).
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
    markov_head_type: str = "vanilla"
    confidence_head: str | None = None
    sliding_window: int | None = None
    final_layer_tap: bool = False
    per_layer_fusion: bool = False
    slot_queries: bool = False
    lm_head_from_target: bool = False
    next_token_stream: str | None = None

    def __post_init__(self) -> None:
        def fail(msg: str):
            raise ValueError(f"DSpark draft config: {msg}")

        if self.source_format not in SOURCE_FORMATS:
            fail(f"source_format {self.source_format!r} not one of {SOURCE_FORMATS}")
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                fail(f"{name} must be an integer, got {value!r}")
            if value < 0 or (value == 0 and name != "mask_token_id"):
                fail(f"{name} must be positive, got {value}")
        for name in ("sample_from_anchor", "causal", "lm_head_from_target") + RECIPE_SWITCHES:
            if not isinstance(getattr(self, name), bool):
                fail(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            fail(f"markov_head_type {self.markov_head_type!r} not one of {list(MARKOV_HEAD_TYPES)}")
        if self.next_token_stream not in NEXT_TOKEN_STREAMS:
            fail(f"next_token_stream {self.next_token_stream!r} not one of {list(NEXT_TOKEN_STREAMS)}")
        if self.confidence_head not in CONFIDENCE_HEADS:
            fail(f"confidence_head {self.confidence_head!r} not one of {list(CONFIDENCE_HEADS)}")
        w = self.sliding_window
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            fail(f"sliding_window must be a positive integer or null, got {w!r}")
        taps = self.target_layer_ids
        if isinstance(taps, (str, bytes)) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                     for t in taps):
            fail(f"target_layer_ids must be a list of integers, got {taps!r}")
        taps = tuple(taps)
        if not taps:
            fail("missing required field 'target_layer_ids'")
        if taps != tuple(sorted(set(taps))) or taps[0] < 0:
            fail(f"target_layer_ids {list(taps)} must be distinct, ascending and >= 0")
        object.__setattr__(self, "target_layer_ids", taps)  # a list from JSON becomes a tuple
        if self.num_attention_heads % self.num_key_value_heads:
            fail(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                 f"num_key_value_heads {self.num_key_value_heads}")
        if self.block_size < 2:
            fail("block_size must be >= 2 (anchor + at least one slot)")
        if not 0 <= self.mask_token_id < self.vocab_size:
            fail(f"mask_token_id {self.mask_token_id} outside vocab_size {self.vocab_size}")
        if self.draft_vocab_size > self.vocab_size:
            fail(f"draft_vocab_size {self.draft_vocab_size} exceeds vocab_size {self.vocab_size} (a "
                 "draft vocabulary is a subset of the target's)")
        if self.lm_head_from_target and not self.reduced_vocab:
            fail("lm_head_from_target needs a reduced draft vocabulary (draft_vocab_size below "
                 "vocab_size): a full-vocabulary draft always scores with the target's LM head")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            fail(f"rms_norm_eps ({self.rms_norm_eps}) and rope_theta ({self.rope_theta}) must be > 0")

    @property
    def reduced_vocab(self) -> bool:
        """Whether the draft scores a subset of the target vocabulary (`vllm_specx.vocab`)."""
        return self.draft_vocab_size < self.vocab_size

    @property
    def max_drafts(self) -> int:
        """Most drafts per pass: block_size (anchor layout), block_size - 1 (fill-in)."""
        return self.block_size - self.slot_offset

    @property
    def max_drafts_source(self) -> str:
        """Where `max_drafts` comes from (for messages): the block size."""
        return f"block_size {self.block_size} ({self.layout} layout)"

    def query_slots(self, num_drafts: int) -> int:
        """Query slots of a pass that drafts `num_drafts` tokens: num_drafts + slot_offset."""
        return num_drafts + self.slot_offset

    @property
    def slot_offset(self) -> int:
        """Draft k (0-based) is read from query slot k + slot_offset: 0 in the anchor layout (slot
        k predicts the token after it), 1 in the fill-in layout (mask slots predict themselves)."""
        return 0 if self.sample_from_anchor else 1

    @property
    def layout(self) -> str:
        return "anchor" if self.sample_from_anchor else "fill-in"

    @property
    def aux_layer_ids(self) -> list[int]:
        """vLLM's aux-hidden-state ids of the taps."""
        return to_aux_ids(self.target_layer_ids)

    @classmethod
    def for_target(cls, target: dict[str, Any], *, target_layer_ids, num_hidden_layers: int,
                   **options) -> DSparkDraftConfig:
        """A new draft whose layers copy the target's shapes (`target`: its HF config as a dict);
        `options`: the DSpark options (`DRAFT_OPTIONS`, unknown names refused)."""
        unknown = sorted(set(options) - set(DRAFT_OPTIONS))
        if unknown:
            raise TypeError(f"DSparkDraftConfig.for_target: unknown option(s) {unknown}; the options "
                            f"are {list(DRAFT_OPTIONS)}")
        layer = {**target, "num_hidden_layers": num_hidden_layers}
        return build_config(layer, options, "specx", "new draft", target_layer_ids)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "target_layer_ids": list(self.target_layer_ids)}

    @property
    def recipe(self) -> list[str]:
        """The full recipe's changes this draft has, by name (empty: the baseline)."""
        on = [name for name in RECIPE_SWITCHES if getattr(self, name)]
        return on + (["recurrent head"] if self.markov_head_type == "rnn" else [])

    def summary(self) -> str:
        return (f"{self.source_format} DSpark draft, block {self.block_size} ({self.layout} layout), "
                f"taps {list(self.target_layer_ids)}, {self.markov_head_type} Markov head"
                + (f", draft vocabulary {self.draft_vocab_size} of {self.vocab_size}" if self.reduced_vocab else "")
                + (" (LM head rows from the target)" if self.lm_head_from_target else "")
                + (f", next-token stream ({self.next_token_stream})" if self.next_token_stream else "")
                + (f", recipe: {', '.join(self.recipe)}" if self.recipe else ""))

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
        if self.final_layer_tap and self.target_layer_ids[-1] != layers - 1:
            raise ValueError(
                f"DSpark draft final_layer_tap: its last tap is layer {self.target_layer_ids[-1]}, "
                f"not the target's last layer {layers - 1} (target_layer_ids {list(self.target_layer_ids)})")
        shared = " (the draft shares the target's embeddings and lm_head)"
        for mine, theirs, value, why in (
                ("target_hidden_size", "hidden_size", self.target_hidden_size, ""),
                ("hidden_size", "hidden_size", self.hidden_size, shared),
                ("vocab_size", "vocab_size", self.vocab_size, shared)):
            if value != int(target[theirs]):
                raise ValueError(f"DSpark draft {mine} {value} != target {theirs} {target[theirs]}{why}")
        if num_speculative_tokens is not None and num_speculative_tokens > self.max_drafts:
            raise ValueError(
                f"num_speculative_tokens {num_speculative_tokens} exceeds this DSpark draft's "
                f"block: block_size {self.block_size} ({self.layout} layout) gives at most "
                f"{self.max_drafts} drafts per pass"
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
        r = self.markov_rank
        if self.markov_head_type == "gated":
            shapes.update({"markov_head.gate_proj.weight": (r, h + r), "markov_head.gate_proj.bias": (r,)})
        elif self.markov_head_type == "rnn":
            shapes.update({"markov_head.joint_proj.weight": (3 * r, 2 * r + h),
                           "markov_head.joint_proj.bias": (3 * r,)})
        if self.confidence_head is not None:
            width = h + (r if self.confidence_head == "hidden+markov" else 0)
            shapes.update({"confidence_head.proj.weight": (1, width), "confidence_head.proj.bias": (1,)})
        if self.reduced_vocab:  # its own output rows (unless the target's), and the maps (`vllm_specx.vocab`)
            shapes.update({"d2t": (self.draft_vocab_size,), "t2d": (self.vocab_size,)})
            if not self.lm_head_from_target:
                shapes["lm_head.weight"] = (self.draft_vocab_size, h)
        if self.next_token_stream:
            shapes.update({"next_token_norm.weight": (h,), "next_token_proj.weight": (h, h)})
        if self.per_layer_fusion:
            shapes["fusion_logits"] = (self.num_hidden_layers, len(self.target_layer_ids))
        if self.slot_queries:
            shapes["slot_queries"] = (self.block_size - 1, h)
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


def build_config(layer: dict, opts: dict, fmt: str, where: str, taps) -> DSparkDraftConfig:
    """A config from a Qwen3 layer dict and the DSpark options; errors name `where`."""
    def need(d: dict, key: str) -> int:
        if d.get(key) is None:
            raise ValueError(f"{where}: missing required field '{key}'")
        return _cast(d[key], key, int, where)

    hidden = need(layer, "hidden_size")
    heads = need(layer, "num_attention_heads")
    if not taps:
        raise ValueError(f"{where}: missing required field 'target_layer_ids'")
    vocab = need(layer, "vocab_size")
    try:
        return DSparkDraftConfig(
            source_format=fmt,
            target_layer_ids=_layer_ids(taps, where),
            target_hidden_size=_cast(opts.get("target_hidden_size") or hidden, "target_hidden_size", int, where),
            hidden_size=hidden,
            vocab_size=vocab,
            draft_vocab_size=_cast(opts.get("draft_vocab_size") or vocab, "draft_vocab_size", int, where),
            num_hidden_layers=need(layer, "num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(layer.get("head_dim") or hidden // heads),
            intermediate_size=need(layer, "intermediate_size"),
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
            rope_theta=float(_rope_theta(layer)),
            **_draft_options(opts, need),
        )
    except (TypeError, ValueError) as e:
        if str(e).startswith(where):
            raise
        raise ValueError(f"{where}: {e}") from e


def _draft_options(opts: dict, need) -> dict[str, Any]:
    """The DSpark options (`DRAFT_OPTIONS`) from `opts`: required ones through `need`, flags
    checked as booleans, the rest their value or default."""
    out = {}
    for key, default in DRAFT_OPTIONS.items():
        if default is REQUIRED:
            out[key] = need(opts, key)
        elif isinstance(default, bool):
            out[key] = _flag(opts, key, default)
        else:
            out[key] = default if opts.get(key) is None else opts[key]
    return out


def _cast(value, key: str, cast, where: str):
    """`cast(value)` for an integer field; ValueError naming `where` and `key` when it is not a
    whole number (a bool, a fraction, text: int() would truncate or fail without naming it)."""
    if cast is int and (isinstance(value, bool) or not isinstance(value, (int, float, str))
                        or (isinstance(value, float) and not value.is_integer())):
        raise ValueError(f"{where}: field '{key}' must be an integer, got {value!r}")
    try:
        return cast(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: field '{key}' must be an integer, got {value!r}") from None


def _layer_ids(taps, where: str) -> tuple[int, ...]:
    """The tap layers, ascending (`fc` fuses them in that order; the config refuses duplicates)."""
    if isinstance(taps, (str, bytes, dict)) or not hasattr(taps, "__iter__"):
        raise ValueError(f"{where}: field 'target_layer_ids' must be a list of integers, got {taps!r}")
    return tuple(sorted(_cast(t, "target_layer_ids", int, where) for t in taps))


def _flag(opts: dict, key: str, default: bool) -> bool:
    value = opts.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return value


def _rope_theta(layer: dict) -> float:
    rope = layer.get("rope_parameters") or layer.get("rope_scaling") or {}
    return rope.get("rope_theta") or layer.get("rope_theta") or 1e6
