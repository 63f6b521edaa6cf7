"""The drafting controller's side inside a proposer: what any of our proposers shares to draft
with `adaptive: true` on vLLM's V1 runner (`AdaptiveProposer`), and the small interface a method
implements for it.

Per engine step (`AdaptiveProposer.propose`): `AdaptiveDrafting.begin_pass`; then either a
**skipped pass** (`draft_now` is false: no drafts, every request's are cut to 0) whose context
writes to the draft's KV cache are queued by the method (`_defer_context`), or a **draft pass**:
the queue is written first (`_flush_context`, last write of a slot wins), then the method drafts
(`_draft_pass`), scores its drafted slots and calls `AdaptiveDrafting.decide`; `end_pass` times
it. The next step's `prepare_next_token_ids_padded` tells the controller what each request kept
(`observe`). The runner cuts each request's drafts to the decided prefix
(`_vllm_compat/adaptive_lengths.py`); verification is vLLM's, untouched (lossless whatever is cut).

A method implements:

    _draft_pass(k, kw)          draft (at most the scheduler's horizon of the k slots), call
                                `self.adaptive.decide`, return drafts [batch, k] (padding past
                                what was drafted; the padding is never verified)
    _defer_context(k, batch, kw)  queue what the skipped pass owes the draft's cache
    _flush_context()            write the queue (`drain_writes` gives it in order, deduplicated)
    _draft_costs(runner)        (backbone, slot, skip) timing tables for `costs.CostModel`

Each method's registry entry says whether it supports adaptive drafting
(`registry.Method.adaptive_drafting`); options are refused by name where not
(`_vllm_compat/spec_fields.py`) and here (`make_adaptive`) for settings an engine cannot honour.
"""

from __future__ import annotations

import logging
import time

import torch

from vllm_specx.adaptive.config import AdaptiveConfig
from vllm_specx.adaptive.controller import AdaptiveDrafting

logger = logging.getLogger("vllm.specx")
FLUSH_TOKENS = 512  # skipped passes' context writes are flushed once this many tokens are queued
_PROPOSE_KEYS = ("target_token_ids", "target_positions", "target_hidden_states", "next_token_ids",
                 "token_indices_to_sample", "common_attn_metadata", "sampling_metadata",
                 "mm_embed_inputs", "num_rejected_tokens_gpu", "slot_mappings")


def last_writes(slots: torch.Tensor) -> torch.Tensor | None:
    """Indices (ascending) of the last occurrence of every slot in `slots` [n]; None when no
    slot repeats (keep everything)."""
    uniq, inv = torch.unique(slots, return_inverse=True)
    if uniq.numel() == slots.numel():
        return None
    last = torch.full((uniq.numel(),), -1, dtype=torch.long, device=slots.device)
    last.scatter_reduce_(0, inv, torch.arange(slots.numel(), device=slots.device), "amax")
    return last.sort().values


def queued_tokens(queue: list[tuple[torch.Tensor, ...]]) -> int:
    return sum(int(entry[-1].numel()) for entry in queue)


def drain_writes(queue: list[tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...] | None:
    """The queued writes (tuples of row-aligned tensors, the cache slots last) concatenated in
    queue order, keeping only the last write of every slot: the order the skipped passes would
    have written in (a slot recurs when a rejected token's position is verified again, or a freed
    block was reused). None for an empty queue."""
    if not queue:
        return None
    cols = tuple(torch.cat(x) for x in zip(*queue))
    keep = last_writes(cols[-1])
    return cols if keep is None else tuple(c[keep] for c in cols)


def make_adaptive(vllm_config, num_speculative_tokens: int, has_head: bool) -> AdaptiveDrafting | None:
    """The proposer's adaptive-drafting state, or None when `adaptive` is off; ValueError naming
    the option for a setting this engine or draft cannot honour."""
    spec = vllm_config.speculative_config
    cfg = AdaptiveConfig.from_options(getattr(spec, "specx_adaptive", None) or {},
                                      getattr(spec, "enable_adaptive_verification", False))
    if not cfg.enabled:
        return None
    if cfg.confidence == "head" and not has_head:
        raise ValueError(f"vllm-specx: speculative_config option 'adaptive_confidence' = 'head': the "
                         f"draft {spec.model} has no confidence head (use 'auto' or 'estimator')")
    if getattr(vllm_config.scheduler_config, "async_scheduling", False):
        raise ValueError("vllm-specx: speculative_config option 'adaptive' needs synchronous scheduling "
                         "(the runner cuts drafts before the scheduler sees them): pass "
                         "--no-async-scheduling (async_scheduling=False)")
    if vllm_config.parallel_config.tensor_parallel_size > 1:
        raise ValueError("vllm-specx: speculative_config option 'adaptive' is not supported with "
                         "tensor_parallel_size > 1 yet (each rank would decide on its own timings)")
    source = "head" if cfg.confidence != "estimator" and has_head else "estimator"
    logger.info("vllm-specx: adaptive drafting on (confidence from the %s, %s)", source,
                "cost model" if cfg.cost_model else f"threshold {cfg.threshold} only")
    return AdaptiveDrafting(cfg, num_speculative_tokens, source)


def top_probability(logits: torch.Tensor, probs: torch.Tensor | None) -> torch.Tensor:
    """The online estimator's input for one drafted slot [rows]: the draft distribution's top
    probability (of the sampled distribution when drafts are sampled)."""
    if probs is not None:
        return probs.max(-1).values.float()
    return (logits.max(-1).values - logits.float().logsumexp(-1)).exp()


class AdaptiveProposer:
    """Mixin before vLLM's proposer class: `class P(AdaptiveProposer, EagleProposer)`. The
    proposer sets `self.adaptive` (`make_adaptive`), `self._runner` and `self._deferred = []`."""

    adaptive: AdaptiveDrafting | None = None

    def propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None):
        kw = dict(target_token_ids=target_token_ids, target_positions=target_positions,
                  target_hidden_states=target_hidden_states, next_token_ids=next_token_ids,
                  token_indices_to_sample=token_indices_to_sample,
                  common_attn_metadata=common_attn_metadata, sampling_metadata=sampling_metadata,
                  mm_embed_inputs=mm_embed_inputs, num_rejected_tokens_gpu=num_rejected_tokens_gpu,
                  slot_mappings=slot_mappings)
        a = self.adaptive
        if a is None:
            return super().propose(num_speculative_tokens, **kw)
        batch = common_attn_metadata.batch_size()
        a.begin_pass(int(common_attn_metadata.num_actual_tokens))
        self._adaptive_req_ids = list(self._runner.input_batch.req_ids[:batch])
        if not a.draft_now(batch):
            out = self._context_only(num_speculative_tokens, batch, **kw)
            a.skipped(self._adaptive_req_ids)
            a.end_pass(batch, 0, drafted=False)
            return out
        self._flush_context()
        self._drafted_slots = num_speculative_tokens
        out = self._draft_pass(num_speculative_tokens, kw)
        a.end_pass(batch, self._drafted_slots, drafted=True)
        return out

    def _context_only(self, num_speculative_tokens, batch, **kw):
        """A skipped pass: no drafts (all cut); the context the draft's cache is owed is queued
        (`_defer_context`) and written before the next draft pass or once `FLUSH_TOKENS` wait."""
        self._last_draft_probs = None
        self._defer_context(num_speculative_tokens, batch, kw)
        if queued_tokens(self._deferred) >= FLUSH_TOKENS:
            self._flush_context()
        return torch.zeros(batch, num_speculative_tokens, dtype=torch.int64, device=self.device)

    def _draft_pass(self, num_speculative_tokens, kw):
        return super().propose(num_speculative_tokens, **kw)

    def prepare_next_token_ids_padded(self, sampled_token_ids, requests, gpu_input_batch,
                                      discard_request_mask):
        out = super().prepare_next_token_ids_padded(sampled_token_ids, requests, gpu_input_batch,
                                                    discard_request_mask)
        if self.adaptive is not None:
            kept = out[1].tolist()
            self.adaptive.observe(list(gpu_input_batch.req_ids[:len(kept)]), kept)
        return out

    def profile_costs(self, runner) -> None:
        """Start-up cost tables for the adaptive policy (`adaptive.costs`), timed on this machine
        once the KV cache exists (`_vllm_compat/adaptive_profile.py` calls it): the target's
        forward + logits per token count, and the method's draft tables (`_draft_costs`)."""
        a = self.adaptive
        if a is None or not a.cfg.cost_model:
            return
        from vllm_specx.adaptive.costs import CostModel, grid, time_call

        t0 = time.perf_counter()
        dev, dtype = self.device, runner.model_config.dtype
        max_tokens = max(2, min(runner.scheduler_config.max_num_batched_tokens, 512))
        hidden = runner.model_config.get_hidden_size()
        saved = self.__dict__.get("dummy_run")
        self.dummy_run = lambda *args, **kwargs: None  # the target's dummy run also drafts
        target = {}
        try:
            for t in grid(max_tokens):
                h = torch.randn(t, hidden, device=dev, dtype=dtype)
                target[t] = time_call(lambda: (runner._dummy_run(t, force_attention=True),
                                               runner.model.compute_logits(h)), dev)
        finally:
            if saved is None:
                del self.dummy_run
            else:
                self.dummy_run = saved
        a.costs = CostModel(target, *self._draft_costs(runner))
        logger.info("vllm-specx adaptive drafting: cost tables profiled in %.1f s: %s",
                    time.perf_counter() - t0, a.costs.summary())

    def max_profiled_requests(self, runner) -> int:
        return max(2, min(runner.scheduler_config.max_num_seqs, 128))
