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

import torch
from vllm.v1.spec_decode.dflash import DFlashProposer

from vllm_specx import registry, vocab
from vllm_specx.adaptive.estimator import feature
from vllm_specx.adaptive.proposer import AdaptiveProposer, drain_writes, make_adaptive, top_probability
from vllm_specx.methods.dspark.model import context_next_ids, greedy_pick, reads_anchor_slot, sequential_drafts
from vllm_specx.sample.draft_sampling import hands_draft_probs, probabilistic_pick

logger = logging.getLogger("vllm.specx")
_VLLM_SLOT_OFFSET = 1  # DFlash's sample_idx points at slots 1..N (the fill-in layout)


class DSparkProposer(vocab.TargetHeadRows, AdaptiveProposer, DFlashProposer):
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
        self.adaptive = make_adaptive(vllm_config, self.num_speculative_tokens,
                                      has_head=self.dspark.confidence_head is not None)
        self._deferred: list[tuple[torch.Tensor, ...]] = []  # skipped passes' context writes
        logger.info("vllm-specx: DSparkProposer active in pid %d (block %d, %s layout, %d query "
                    "slots for %d drafts, %s Markov head of rank %d, recipe: %s)", os.getpid(),
                    self.dspark.block_size, self.dspark.layout,
                    self.dspark.query_slots(self.num_speculative_tokens), self.num_speculative_tokens,
                    self.dspark.markov_head_type, self.dspark.markov_rank,
                    ", ".join(self.dspark.recipe) or "baseline")

    def set_inputs_first_pass(self, target_token_ids, next_token_ids, *args, **kwargs):
        self._anchor_ids = next_token_ids  # [batch] last verified token per request
        if self.dspark.next_token_stream is not None:  # the context rows' x_{t+1}, written with them
            cad = kwargs.get("cad", args[3] if len(args) > 3 else None)
            rejected = kwargs.get("num_rejected_tokens_gpu", args[4] if len(args) > 4 else None)
            self.model._next_ids = context_next_ids(target_token_ids, next_token_ids, cad.query_start_loc,
                                                    rejected, cad.batch_size())
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
    def _defer_context(self, num_speculative_tokens, batch, kw) -> None:
        """A skipped pass's context writes, queued: the raw taps, positions, and the draft-cache
        slots vLLM's DFlash input kernel would give them (`slot = block_table[req, pos // bs] * bs
        + pos % bs` for every scheduled token, rejected ones included, as the kernel writes them),
        with the block table read now."""
        cad, target_positions = kw["common_attn_metadata"], kw["target_positions"]
        target_hidden_states = kw["target_hidden_states"]
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
        nxt = context_next_ids(kw["target_token_ids"][:n], kw["next_token_ids"], cad.query_start_loc,
                               kw.get("num_rejected_tokens_gpu"), batch)
        self._deferred.append((target_hidden_states[:n].clone(), pos.clone(), nxt, slots))
        self.stats["deferred_tokens"] = self.stats.get("deferred_tokens", 0) + n

    def _flush_context(self) -> None:
        """Write the queued context K/V (`_defer_context`) in one batch: the fusion of the raw
        taps, then `precompute_and_store_context_kv`, as the skipped passes would have, with the
        last queued write of a slot winning (the order those passes would have written in; a
        slot recurs when a rejected token's position is verified again, or a freed block was
        reused)."""
        writes, self._deferred = drain_writes(self._deferred), []
        if writes is None:
            return
        taps, pos, nxt, slots = writes
        fused = self.model.combine_hidden_states(taps)
        if self.dspark.next_token_stream is not None:
            self.model._next_ids = nxt
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
                qmax.append(top_probability(logits, p))
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

    def _draft_costs(self, runner):
        """(backbone, slot, skip) tables for `costs.CostModel`: the draft's forward over R
        requests' query slots, one slot's logits for R rows, one fusion of R rows' taps."""
        from vllm_specx.adaptive.costs import grid, time_call

        dev, dtype = self.device, runner.model_config.dtype
        slots = max(self.dspark.query_slots(self.num_speculative_tokens), 1)
        backbone, slot, skip = {}, {}, {}
        dh = self.hidden_size
        for r in grid(self.max_profiled_requests(runner)):
            backbone[r] = time_call(lambda: self.dummy_run(r * slots, use_cudagraphs=False), dev)
            h = torch.randn(r, dh, device=dev, dtype=dtype)
            slot[r] = time_call(lambda: self.model.draft_logits(h).argmax(-1), dev)
            taps = torch.randn(r, self.dspark.target_hidden_size * len(self.dspark.target_layer_ids),
                               device=dev, dtype=dtype)
            skip[r] = time_call(lambda: self.model.combine_hidden_states(taps), dev)
        return backbone, slot, skip
