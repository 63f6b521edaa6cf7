"""DSparkProposer: vLLM's V1 DFlash proposer plus DSpark's sequential Markov sampling.

One draft pass, as the V1 runner drives it (`SpecDecodeBaseProposer.propose`):
1. the fused taps of the tokens the target just verified become context K/V in every draft layer;
2. one non-causal forward over the query block `[anchor, mask, ..., mask]` (N + slot_offset
   slots) gives a hidden state per slot;
3. here: base logits for the N sample slots, then left to right `logits_i = base_i +
   markov_bias(prev)` (`model.sequential_drafts`), where prev is the anchor for i = 0 and draft
   i-1 after that. Drafts are greedy (argmax) or, with `draft_sample_method: "probabilistic"`,
   sampled at the request's temperature (`probabilistic_pick`); then the draft probabilities go
   to the rejection sampler.

Which slots run and are sampled depends on the checkpoint's layout (`DSparkDraftConfig.slot_offset`):
fill-in (slot k predicts its own position; DFlash's V1 block, which vLLM's input preparation
builds) runs 1 + N slots and samples 1..N; the anchor layout (slot k predicts the token after it)
runs N slots and samples all of them, so a block of B slots drafts B tokens. vLLM's input
preparation (`_copy_and_expand_dflash_inputs`) takes the query count per request as a
parameter, derived from `num_speculative_tokens`; `set_inputs_first_pass` asks it for N slots.

With `adaptive: true` in the speculative config (`vllm_specx.adaptive`), each pass also gives
every drafted slot a confidence (the draft's confidence head, or the online estimator over the
draft distribution's top probability), decides how many drafts of each request go to
verification (the rest are cut in vLLM's runner, `_vllm_compat/adaptive_lengths.py`), computes
only as many slots as the last pass verified plus one, and skips whole passes while drafting does
not pay. A skipped pass computes nothing: the context K/V it owes the draft's cache are queued and
written in one batch before the next draft pass (`_defer_context`, `_flush_context`), and vLLM's
verification of a step without drafts is plain sampling (`SpecxRejectionSampler.forward`).

The vLLM internals used and overridden here are listed in this method's `vllm_internals`.
"""

from __future__ import annotations

import logging
import os
import time

import torch
from vllm.v1.spec_decode.dflash import DFlashProposer

from vllm_specx import registry
from vllm_specx.adaptive.config import AdaptiveConfig
from vllm_specx.adaptive.controller import AdaptiveDrafting
from vllm_specx.adaptive.estimator import feature
from vllm_specx.methods.dspark.model import greedy_pick, reads_anchor_slot, sequential_drafts
from vllm_specx.sample.draft_sampling import hands_draft_probs, probabilistic_pick

logger = logging.getLogger("vllm.specx")
_VLLM_SLOT_OFFSET = 1  # DFlash's sample_idx points at slots 1..N (the fill-in layout)
_FLUSH_TOKENS = 512  # skipped passes' context K/V are written once this many tokens are queued


def last_writes(slots: torch.Tensor) -> torch.Tensor | None:
    """Indices (ascending) of the last occurrence of every slot in `slots` [n]; None when no
    slot repeats (keep everything)."""
    uniq, inv = torch.unique(slots, return_inverse=True)
    if uniq.numel() == slots.numel():
        return None
    last = torch.full((uniq.numel(),), -1, dtype=torch.long, device=slots.device)
    last.scatter_reduce_(0, inv, torch.arange(slots.numel(), device=slots.device), "amax")
    return last.sort().values


class DSparkProposer(DFlashProposer):
    def __init__(self, vllm_config, device, runner=None):
        super().__init__(vllm_config, device, runner)
        _, self.dspark = registry.config_of(self.draft_model_config.hf_config)  # validated
        self._anchor_ids: torch.Tensor | None = None
        self._reads_anchor_slot = reads_anchor_slot(self.dspark)
        self._rows = self.num_speculative_tokens  # hidden-state rows per request in a pass
        spec = vllm_config.speculative_config
        # vLLM keeps draft probabilities only for "standard"; our sampler's block verification
        # needs them as well.
        self._enable_probabilistic_draft_probs = hands_draft_probs(spec)
        # Counters a test or a user can read through `LLM.collective_rpc`.
        self.stats = {"propose_calls": 0, "probabilistic_calls": 0}
        self._runner = runner
        self.adaptive = make_adaptive(vllm_config, self.dspark, self.num_speculative_tokens)
        self._deferred: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # skipped passes' context
        logger.info("vllm-specx: DSparkProposer active in pid %d (block %d, %s layout, %d query "
                    "slots for %d drafts, %s Markov head of rank %d, recipe: %s)", os.getpid(),
                    self.dspark.block_size, self.dspark.layout,
                    self.dspark.query_slots(self.num_speculative_tokens), self.num_speculative_tokens,
                    self.dspark.markov_head_type, self.dspark.markov_rank,
                    ", ".join(self.dspark.recipe) or "baseline")

    def set_inputs_first_pass(self, target_token_ids, next_token_ids, *args, **kwargs):
        self._anchor_ids = next_token_ids  # [batch] last verified token per request
        self.stats["propose_calls"] += 1
        n = self.num_speculative_tokens
        slots = max(self.dspark.query_slots(n), 1)
        self.model.query_slots = slots  # per-slot learned queries are picked by slot index
        # vLLM builds 1 + num_speculative_tokens query slots per request; ask for `slots`.
        self.num_speculative_tokens = slots - _VLLM_SLOT_OFFSET
        try:
            num_tokens, sample_idx, cad = super().set_inputs_first_pass(
                target_token_ids, next_token_ids, *args, **kwargs)
        finally:
            self.num_speculative_tokens = n
        self._rows = n
        if self.dspark.slot_offset != _VLLM_SLOT_OFFSET or self._reads_anchor_slot:
            # Anchor layout: every query slot is a sample slot; the recurrent head in the
            # fill-in layout also reads slot 0's state. Request-major.
            sample_idx = torch.arange(num_tokens, dtype=sample_idx.dtype, device=sample_idx.device)
            self._rows = slots
        self.stats["query_slots"] = slots
        return num_tokens, sample_idx, cad

    def _sample_draft_tokens(self, hidden_states, sampling_metadata):
        """Sample N drafts per request left to right with the Markov correction.

        Args:
            hidden_states: [batch * rows, hidden], request-major post-norm slot states: the N
                sample slots, preceded by the anchor slot when the head reads it (rows = N + 1).
        Returns:
            draft ids [batch * N] and, for probabilistic drafting, their distributions
            [batch * N, vocab] (None when greedy).
        """
        n, rows = self.num_speculative_tokens, self._rows
        batch = hidden_states.shape[0] // rows
        h = hidden_states.view(batch, rows, -1)
        slots = h[:, rows - n:]
        anchors = self._anchor_ids[:batch]
        state = self.model.initial_state(anchors, h[:, 0] if rows > n else None)
        probabilistic = self._enable_probabilistic_draft_probs and not sampling_metadata.all_greedy
        if probabilistic:
            self.stats["probabilistic_calls"] += 1
            pick = probabilistic_pick(sampling_metadata, batch)
        else:
            pick = greedy_pick

        def base_fn(s):  # base logits [batch, slots, Vd] of the sample slots s [batch, slots, H]
            return self.model.draft_logits(s.reshape(-1, s.shape[-1])).view(batch, s.shape[1], -1)

        if getattr(self, "adaptive", None) is not None:
            tokens, probs = self._adaptive_drafts(base_fn, slots, anchors, state, pick)
        else:
            tokens, probs = sequential_drafts(base_fn(slots), anchors, self.model.markov_stepper(slots),
                                              pick, state, *self._vocab_map())
        return tokens.reshape(-1), (probs.reshape(batch * n, -1) if probs is not None else None)

    def _vocab_map(self):
        """(target id per draft id, V) for `sequential_drafts`: drafts leave as target ids, their
        distributions over the target vocabulary (a full vocabulary: (None, V), unchanged)."""
        return self.model.draft_target_ids, self.dspark.vocab_size

    # ---- confidence-scheduled drafting (`adaptive: true`) -----------------------------------
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
        out = super().propose(num_speculative_tokens, **kw)
        a.end_pass(batch, self._drafted_slots, drafted=True)
        return out

    def _context_only(self, num_speculative_tokens, batch, *, target_positions, target_hidden_states,
                      common_attn_metadata, **_):
        """A skipped pass: no query block, no drafts (all cut). The verified tokens' context K/V
        are owed to the draft's cache (later passes attend to the whole prefix); they are queued
        (`_defer_context`) and written in one batch before the next draft pass, or once
        `_FLUSH_TOKENS` are queued."""
        self._last_draft_probs = None
        self._defer_context(target_positions, target_hidden_states, common_attn_metadata, batch)
        return torch.zeros(batch, num_speculative_tokens, dtype=torch.int64, device=self.device)

    def _defer_context(self, target_positions, target_hidden_states, cad, batch) -> None:
        """Queue this step's context writes: the raw taps, positions, and the draft-cache slots
        vLLM's DFlash input kernel would give them (`slot = block_table[req, pos // bs] * bs +
        pos % bs` for every scheduled token, rejected ones included, as the kernel writes them),
        with the block table read now."""
        qsl = cad.query_start_loc_cpu[: batch + 1]
        n = int(qsl[-1])
        if n == 0:
            return
        dev = target_hidden_states.device
        counts = qsl.diff().to(dev)
        req = torch.repeat_interleave(torch.arange(batch, device=dev), counts, output_size=n)
        pos = target_positions[:n].long()
        bt = cad.block_table_tensor
        block = (pos // self.block_size).clamp(max=bt.stride(0) - 1)
        slots = bt[req, block].long() * self.block_size + pos % self.block_size
        self._deferred.append((target_hidden_states[:n].clone(), pos.clone(), slots))
        self.stats["deferred_tokens"] = self.stats.get("deferred_tokens", 0) + n
        if sum(len(p) for _, p, _ in self._deferred) >= _FLUSH_TOKENS:
            self._flush_context()

    def _flush_context(self) -> None:
        """Write the queued context K/V (`_defer_context`) in one batch: the fusion of the raw
        taps, then `precompute_and_store_context_kv`, as the skipped passes would have, with the
        last queued write of a slot winning (the order those passes would have written in; a
        slot recurs when a rejected token's position is verified again, or a freed block was
        reused)."""
        if not self._deferred:
            return
        taps, pos, slots = (torch.cat(x) for x in zip(*self._deferred))
        self._deferred = []
        keep = last_writes(slots)
        if keep is not None:
            taps, pos, slots = taps[keep], pos[keep], slots[keep]
        fused = self.model.combine_hidden_states(taps)
        self.model.precompute_and_store_context_kv(fused, pos, slots)
        self.stats["context_flushes"] = self.stats.get("context_flushes", 0) + 1

    def _adaptive_drafts(self, base_fn, slots, anchors, state, pick):
        """Draft the first `horizon` slots, score them, decide the verified lengths; drafts and
        distributions padded to N (the padding is never verified)."""
        a = self.adaptive
        batch, n = slots.shape[0], self.num_speculative_tokens
        m = max(1, min(n, a.scheduler.horizon))
        self._drafted_slots = m
        slots_m = slots[:, :m]
        base = base_fn(slots_m)
        qmax = []
        if a.source == "estimator":
            inner = pick

            def pick(logits):
                tok, p = inner(logits)
                if p is not None:
                    qmax.append(p.max(-1).values.float())
                else:
                    qmax.append((logits.max(-1).values - logits.float().logsumexp(-1)).exp())
                return tok, p
        tokens, probs = sequential_drafts(base, anchors, self.model.markov_stepper(slots_m), pick, state,
                                          *self._vocab_map())
        if a.source == "head":
            prev = torch.cat([anchors.view(-1, 1).to(tokens.dtype), tokens[:, :-1]], 1)
            conf = torch.sigmoid(self.model.confidence_logits(slots_m, prev).float())
            feats = None
        else:
            feats = feature(torch.stack(qmax, 1))
            conf = a.estimator.confidences(feats)
        a.decide(self._adaptive_req_ids[:batch], conf, feats)
        if m < n:
            tokens = torch.cat([tokens, tokens.new_zeros(batch, n - m)], 1)
            if probs is not None:
                probs = torch.cat([probs, probs.new_zeros(batch, n - m, probs.shape[-1])], 1)
        return tokens, probs

    def prepare_next_token_ids_padded(self, sampled_token_ids, requests, gpu_input_batch,
                                      discard_request_mask):
        out = super().prepare_next_token_ids_padded(sampled_token_ids, requests, gpu_input_batch,
                                                    discard_request_mask)
        if self.adaptive is not None:
            kept = out[1].tolist()
            self.adaptive.observe(list(gpu_input_batch.req_ids[:len(kept)]), kept)
        return out

    def profile_costs(self, runner) -> None:
        """Start-up cost tables for the adaptive policy (`adaptive.costs`), timed on this
        machine once the KV cache exists; called by `_vllm_compat/adaptive_profile.py`."""
        a = self.adaptive
        if a is None or not a.cfg.cost_model:
            return
        from vllm_specx.adaptive.costs import CostModel, grid, time_call

        t0 = time.perf_counter()
        dev, dtype = self.device, runner.model_config.dtype
        sched = runner.scheduler_config
        max_tokens = max(2, min(sched.max_num_batched_tokens, 512))
        max_reqs = max(2, min(sched.max_num_seqs, 128))
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
        slots = max(self.dspark.query_slots(self.num_speculative_tokens), 1)
        backbone, slot, skip = {}, {}, {}
        dh = self.hidden_size
        for r in grid(max_reqs):
            backbone[r] = time_call(lambda: self.dummy_run(r * slots, use_cudagraphs=False), dev)
            h = torch.randn(r, dh, device=dev, dtype=dtype)
            slot[r] = time_call(lambda: self.model.draft_logits(h).argmax(-1), dev)
            taps = torch.randn(r, self.dspark.target_hidden_size * len(self.dspark.target_layer_ids),
                               device=dev, dtype=dtype)
            skip[r] = time_call(lambda: self.model.combine_hidden_states(taps), dev)
        a.costs = CostModel(target, backbone, slot, skip)
        logger.info("vllm-specx adaptive drafting: cost tables profiled in %.1f s: %s",
                    time.perf_counter() - t0, a.costs.summary())


def make_adaptive(vllm_config, dspark, num_speculative_tokens: int) -> AdaptiveDrafting | None:
    """The proposer's adaptive-drafting state, or None when `adaptive` is off; ValueError naming
    the option for a setting this engine cannot honour."""
    spec = vllm_config.speculative_config
    cfg = AdaptiveConfig.from_options(getattr(spec, "specx_adaptive", None) or {},
                                      getattr(spec, "enable_adaptive_verification", False))
    if not cfg.enabled:
        return None
    if cfg.confidence == "head" and dspark.confidence_head is None:
        raise ValueError(f"vllm-specx: speculative_config option 'adaptive_confidence' = 'head': the "
                         f"draft {spec.model} has no confidence head (use 'auto' or 'estimator')")
    if getattr(vllm_config.scheduler_config, "async_scheduling", False):
        raise ValueError("vllm-specx: speculative_config option 'adaptive' needs synchronous scheduling "
                         "(the runner cuts drafts before the scheduler sees them): pass "
                         "--no-async-scheduling (async_scheduling=False)")
    if vllm_config.parallel_config.tensor_parallel_size > 1:
        raise ValueError("vllm-specx: speculative_config option 'adaptive' is not supported with "
                         "tensor_parallel_size > 1 yet (each rank would decide on its own timings)")
    source = "head" if cfg.confidence != "estimator" and dspark.confidence_head is not None else "estimator"
    logger.info("vllm-specx: adaptive drafting on (confidence from the %s, %s)", source,
                "cost model" if cfg.cost_model else f"threshold {cfg.threshold} only")
    return AdaptiveDrafting(cfg, num_speculative_tokens, source)
