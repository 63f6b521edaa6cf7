"""The DSpark draft on vLLM's layers: vLLM's DFlash Qwen3 backbone plus the low-rank Markov head.

The backbone (tap fusion `fc`, context K/V projected from the fused taps into every draft layer's
cache, one non-causal pass over the query block) is vLLM's `DFlashQwen3ForCausalLM`, used as is.
This class adds what makes it DSpark: the Markov head (`model.MarkovHead`: vanilla, gated or
rnn), the logit correction that depends on the previously sampled token, which `DSparkProposer`
applies left to right, the confidence head when the checkpoint has one (read by adaptive
drafting), and the full recipe's per-layer tap fusion (each layer's context K/V from its own mixture
of the fc's per-tap parts, `model.layer_contexts`) and per-slot learned queries
(`model.with_slot_queries`). The final-layer tap needs nothing here: vLLM captures the target's
aux hidden state L (after its last layer, before the final norm) like any other. The heads and
formulas are those of `model.py`, the PyTorch reference, so both load the same tensors under the
same names; tests check the two models agree token for token.

Imported only inside vLLM processes (it imports vLLM; the internals it uses are listed in this
method's `vllm_internals`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

from vllm_specx import registry, vocab
from vllm_specx.layers import RMSNorm, rms_norm
from vllm_specx.methods.dspark.cpu_k_norm import needs_per_layer_k_norm, normalize_context_k_per_layer
from vllm_specx.methods.dspark.model import (
    ConfidenceHead,
    MarkovHead,
    head_stepper,
    initial_state,
    layer_contexts,
    tap_contributions,
    with_slot_queries,
)

_OURS = ("markov_head.", "confidence_head.", "fusion_logits", "slot_queries", "next_token_norm.",
         "next_token_proj.")


def _project_context_kv_per_layer(model, contexts: torch.Tensor, nkv: int, hd: int,
                                  added: torch.Tensor | None = None):
    """`DFlashQwen3Model._project_context_kv` for per-layer contexts [L, num_ctx, H] (before
    hidden_norm): layer l's K/V come from hn(contexts[l]) (+ `added` [num_ctx, H], the "added"
    next-token stream) -> ([L, num_ctx, nkv, hd] K, V)."""
    normed = rms_norm(contexts, model.hidden_norm.weight, model.hidden_norm.variance_epsilon)
    normed = normed.to(contexts.dtype)
    if added is not None:
        normed = normed + added.to(normed.dtype)
    kv = []
    for layer, x in zip(model.layers, normed):
        attn = layer.self_attn
        qkv, _ = attn.qkv_proj(x)
        kv.append(qkv[:, attn.q_size:].view(x.shape[0], 2, nkv, hd))
    all_kv = torch.stack(kv, 0).permute(2, 0, 1, 3, 4).contiguous()  # [2, L, num_ctx, nkv, hd]
    return all_kv[0], all_kv[1]


class SpecxDSparkForCausalLM(vocab.ServedVocabMap, DFlashQwen3ForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        if needs_per_layer_k_norm():  # vLLM's CPU rms_norm: one K-norm for every layer (cpu_k_norm.py)
            model = self.model
            model._normalize_context_k = lambda all_k: normalize_context_k_per_layer(model, all_k)
        _, cfg = registry.config_of(self.config)  # validated again here, in the worker
        self.dspark = cfg
        # A reduced draft vocabulary brings its own lm_head rows (vLLM's DFlash model builds it at
        # draft_vocab_size), or, with lm_head_from_target, the proposer copies the target's rows
        # into it; vLLM must not swap in the target's [V, H] head.
        self.has_own_lm_head = cfg.reduced_vocab
        dtype = vllm_config.model_config.dtype
        self.markov_head = MarkovHead(cfg.vocab_size, cfg.draft_vocab_size, cfg.markov_rank,
                                      cfg.hidden_size, cfg.markov_head_type).to(dtype).requires_grad_(False)
        if cfg.confidence_head is not None:  # read by adaptive drafting (`adaptive: true`)
            width = cfg.hidden_size + (cfg.markov_rank if cfg.confidence_head == "hidden+markov" else 0)
            self.confidence_head = ConfidenceHead(width).to(dtype).requires_grad_(False)
        if cfg.per_layer_fusion:
            self.fusion_logits = torch.nn.Parameter(
                torch.zeros(cfg.num_hidden_layers, len(cfg.target_layer_ids), dtype=dtype), requires_grad=False)
            self._context_taps = None  # (fused context, raw taps) of the pass being drafted
            self._active_taps = None
        if cfg.slot_queries:
            self.slot_queries = torch.nn.Parameter(
                torch.zeros(cfg.block_size - 1, cfg.hidden_size, dtype=dtype), requires_grad=False)
        self._next_ids = None  # x_{t+1} of the context rows about to be written (`DSparkProposer`)
        self._active_next = None  # s_t of the rows being projected
        if cfg.next_token_stream is not None:
            self.next_token_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps).to(dtype).requires_grad_(False)
            self.next_token_proj = torch.nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False,
                                                   dtype=dtype).requires_grad_(False)
        if cfg.per_layer_fusion or cfg.next_token_stream is not None:
            self._install_context_projection()
        # Query slots per request in a pass; DSparkProposer sets it before every draft forward.
        self.query_slots = cfg.query_slots(vllm_config.speculative_config.num_speculative_tokens)

    # ---- per-layer tap fusion --------------------------------------------------------------
    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """vLLM's fc fusion (the runner checks its width); with per_layer_fusion the raw taps are
        kept for `precompute_and_store_context_kv`, which builds each layer's own context."""
        fused = super().combine_hidden_states(hidden_states)
        if self.dspark.per_layer_fusion:
            self._context_taps = (fused, hidden_states)
        return fused

    def precompute_and_store_context_kv(self, context_states, context_positions, context_slot_mapping=None):
        """vLLM's context K/V write, with this draft's own context rows: per-layer tap mixtures
        (per_layer_fusion) and the next-token stream (s_t of `self._next_ids`, which the proposer
        sets before every write; `model.py`)."""
        c = self.dspark
        pending_next, self._next_ids = self._next_ids, None
        if c.next_token_stream is not None and context_slot_mapping is not None:
            if pending_next is None or pending_next.shape[0] != context_states.shape[0]:
                raise RuntimeError("vllm-specx DSpark next_token_stream: context rows reached the draft "
                                   "without their next tokens; cannot build the context")
            self._active_next = self.next_token_state(pending_next)
        taps = None
        if c.per_layer_fusion:
            pending, self._context_taps = self._context_taps, None
            if pending is not None and pending[0] is context_states:
                taps = pending[1]
            elif context_slot_mapping is not None:  # a real pass whose taps we did not see: refuse
                raise RuntimeError("vllm-specx DSpark per_layer_fusion: context states reached the draft "
                                   "without passing combine_hidden_states; cannot build per-layer contexts")
        self._active_taps = taps
        try:  # without taps / next tokens (vLLM's dummy run: nothing is written) vLLM's projection runs
            return super().precompute_and_store_context_kv(context_states, context_positions,
                                                           context_slot_mapping)
        finally:
            self._active_taps = self._active_next = None

    def next_token_state(self, next_ids: torch.Tensor) -> torch.Tensor:
        """s_t = W_e tn(embed(x_{t+1})) [n, H] of the next-token stream (`model.DSparkDraft`)."""
        e = self.model.embed_input_ids(next_ids.long())
        return self.next_token_proj(self.next_token_norm(e).to(self.next_token_proj.weight.dtype))

    def _install_context_projection(self):
        """Replace vLLM's fused context projection by one that builds this draft's rows (only
        while `precompute_and_store_context_kv` has taps or next tokens for them)."""
        model, shared = self.model, self.model._project_context_kv
        n_taps, mode = len(self.dspark.target_layer_ids), self.dspark.next_token_stream

        def project(context_states, num_ctx, num_layers, num_kv_heads, head_dim):
            taps, s = self._active_taps, self._active_next
            if taps is None and s is None:
                return shared(context_states, num_ctx, num_layers, num_kv_heads, head_dim)
            if taps is not None:
                c = tap_contributions(taps.to(context_states.dtype), self._fc_taps_weight, n_taps)
                contexts = layer_contexts(c, self.fusion_logits)
            else:
                contexts = context_states[None].expand(num_layers, *context_states.shape)
            if s is not None and mode == "fused":
                contexts = contexts + s.to(contexts.dtype)
            return _project_context_kv_per_layer(model, contexts, num_kv_heads, head_dim,
                                                 s if mode == "added" else None)
        model._project_context_kv = project

    # ---- per-slot learned queries ----------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        if self.dspark.slot_queries and inputs_embeds is None:
            inputs_embeds = with_slot_queries(self.model.embed_input_ids(input_ids), self.slot_queries,
                                              self.query_slots)
        return super().forward(input_ids, positions, inputs_embeds)

    def draft_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Base logits over the draft vocabulary [.., Vd] (vLLM's `compute_logits` would scatter a
        reduced vocabulary's to [.., V] with -inf; the draft loop maps its picks instead)."""
        return self.logits_processor(self.lm_head, hidden_states)

    def markov_stepper(self, slot_hidden: torch.Tensor):
        """`markov_step` for `model.sequential_drafts` over the sample slots' post-norm states
        slot_hidden [B, N, H]; the bias is scaled like the base logits."""
        return head_stepper(self.markov_head, slot_hidden, self.logits_processor.scale)

    def confidence_logits(self, h: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """`DSparkDraft.confidence_logits` on the served head: h [..., H] post-norm slot states,
        prev [...] the token each slot's draft follows (the anchor, then the previous draft)."""
        if self.dspark.confidence_head is None:
            raise ValueError("this DSpark draft has no confidence head")
        if self.dspark.confidence_head == "hidden+markov":
            h = torch.cat([h, self.markov_head.markov_w1(prev.long()).to(h.dtype)], -1)
        return self.confidence_head(h)

    def initial_state(self, anchor_ids: torch.Tensor, slot0: torch.Tensor | None):
        return initial_state(self.markov_head, self.dspark, anchor_ids, slot0)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        params = {n: p for n, p in self.named_parameters() if n.startswith(_OURS)}
        rest, seen = [], set()
        for name, w in weights:
            if name == "fc.weight" and self.dspark.per_layer_fusion:
                # vLLM's CPU GEMM may repack fc.weight after loading; the per-tap parts need it as is.
                self._fc_taps_weight = w.detach().to(self.fusion_logits.device, self.fusion_logits.dtype).clone()
            if name.startswith(_OURS):
                param = params.get(name)
                if param is None:
                    raise ValueError(f"DSpark checkpoint: tensor '{name}' does not belong to this "
                                     f"draft's config ({self.dspark.markov_head_type} Markov head, "
                                     f"confidence head {self.dspark.confidence_head})")
                if tuple(w.shape) != tuple(param.shape):
                    raise ValueError(f"DSpark checkpoint: '{name}' has shape {list(w.shape)}, "
                                     f"expected {list(param.shape)}")
                param.data.copy_(w)
                seen.add(name)
            else:
                rest.append((name, w))
        missing = sorted(set(params) - seen)
        if missing:
            raise ValueError(f"DSpark checkpoint: missing tensors {missing}")
        if self.dspark.lm_head_from_target and any(name == vocab.HEAD for name, _ in rest):
            raise ValueError(f"DSpark checkpoint: tensor '{vocab.HEAD}' is present, but the config says "
                             f"{vocab.FROM_TARGET}: true (the rows come from the target)")
        loaded = super().load_weights(rest)
        # lm_head_from_target: DSparkProposer copies the target's rows in (`vocab.TargetHeadRows`)
        head = {vocab.HEAD} if self.dspark.lm_head_from_target else set()
        return loaded | set(params) | head if isinstance(loaded, set) else loaded
