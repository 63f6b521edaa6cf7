"""MTPProposer: vLLM's V1 EAGLE proposer driving one shared MTP layer, with KVShare and exact
probabilistic drafting.

The runner's drafting loop (`SpecDecodeBaseProposer.propose`) is vLLM's: a first pass over every
token the target just verified (row p consumes token p + 1 and the target's hidden state at p,
writing the layer's K/V for every verified position), then one step per further draft, fed the
previous draft and the layer's own output. Two things are ours (`model.py` is the contract):

* **KVShare** (`kv_share` in the checkpoint): for steps >= 1 `_update_positions_dependent_metadata`
  advances only the RoPE position; the sequence length stays step 0's (so the step's query
  attends to exactly K_0..K_{a-1}) and the slot mapping is padding (the step writes no K/V).
  With `kv_share` off, vLLM's own update runs (mixed KV).
* **drafts**: greedy, or with `draft_sample_method: "probabilistic"` sampled at the request's
  temperature by `sample.draft_sampling.probabilistic_pick` (per-request seeded noise), their
  distributions handed to our rejection sampler for "standard" and "block" verification. A
  reduced draft vocabulary picks in draft ids and hands on target ids and q scattered to the
  target vocabulary (zero outside the draft vocabulary: `vllm_specx.vocab`).

With `adaptive: true` (`vllm_specx.adaptive`, the drafting controller DSpark uses too): a draft
pass runs only as many chain steps as the scheduler's horizon (vLLM's loop for m <= K drafts; the
rest padded and never verified), scores each drafted slot with the online estimator over the
draft distribution's top probability, and the controller cuts each request's drafts to the prefix
whose survival clears the level fixed before the pass. A **skipped pass** runs no layer: step 0's
K/V for the verified tokens depend only on (the next token, the target's hidden state, the
position), so they are queued with the draft-cache slots vLLM's first pass would write
(`set_inputs_first_pass`, `cad.slot_mapping`) and written by `store_context_kv` (the layer's
projections up to K/V, no attention, no MLP, no logits) before the next draft pass, last write of
a slot winning: the draft pass then attends to exactly the K/V eager step-0 passes would have
left (`tests/e2e/test_mtp_adaptive_vllm.py`).

Counters in `stats` (read through `LLM.collective_rpc`): propose calls, draft steps run, the
KV writes KVShare skipped, probabilistic passes, deferred tokens and flushes.
"""

from __future__ import annotations

import logging
import os

import torch
from vllm.v1.spec_decode.eagle import EagleProposer
from vllm.v1.spec_decode.utils import PADDING_SLOT_ID

from vllm_specx import registry, vocab
from vllm_specx.adaptive.estimator import feature
from vllm_specx.adaptive.proposer import AdaptiveProposer, drain_writes, make_adaptive, top_probability
from vllm_specx.sample.draft_sampling import hands_draft_probs, probabilistic_pick

logger = logging.getLogger("vllm.specx")


class MTPProposer(vocab.TargetHeadRows, AdaptiveProposer, EagleProposer):
    def __init__(self, vllm_config, device, runner=None):
        super().__init__(vllm_config, device, runner)
        _, self.mtp = registry.config_of(self.draft_model_config.hf_config)  # validated
        self.kv_share = self.mtp.kv_share
        self._enable_probabilistic_draft_probs = hands_draft_probs(vllm_config.speculative_config)
        self.stats = {"propose_calls": 0, "draft_steps": 0, "kv_writes_skipped": 0,
                      "probabilistic_calls": 0, "kv_share": self.kv_share}
        self._runner = runner
        self.adaptive = make_adaptive(vllm_config, self.num_speculative_tokens, has_head=False)
        self._deferred: list[tuple[torch.Tensor, ...]] = []  # skipped passes' step-0 inputs
        self._qmax: list[torch.Tensor] | None = None  # per drafted slot, for the estimator
        logger.info("vllm-specx: MTPProposer active in pid %d (one shared MTP layer, kv_share %s, "
                    "%d drafts)", os.getpid(), self.kv_share, self.num_speculative_tokens)

    def propose(self, *args, **kwargs):
        self.stats["propose_calls"] += 1
        return super().propose(*args, **kwargs)

    # ---- adaptive drafting (`adaptive: true`; `vllm_specx.adaptive.proposer`) ---------------
    def _draft_pass(self, k, kw):
        """Run vLLM's chain for m = min(k, horizon) drafts, decide the verified lengths; drafts
        [batch, k] and the draft distributions padded past m (never verified)."""
        a = self.adaptive
        m = max(1, min(k, a.scheduler.horizon))
        self._drafted_slots = m
        self._qmax = []
        try:
            drafts = super()._draft_pass(m, kw)  # vLLM's propose with m drafts
        finally:
            self.num_speculative_tokens = k
            qmax, self._qmax = self._qmax, None
        batch = drafts.shape[0]
        feats = feature(torch.stack(qmax[:m], 1))
        a.decide(self._adaptive_req_ids[:batch], a.estimator.confidences(feats), feats)
        if m < k:
            drafts = torch.cat([drafts, drafts.new_zeros(batch, k - m)], 1)
            p = self._last_draft_probs
            if p is not None:
                self._last_draft_probs = torch.cat([p, p.new_zeros(batch, k - m, p.shape[-1])], 1)
        return drafts

    def _defer_context(self, k, batch, kw) -> None:
        """Queue what step 0 of a skipped pass would write: its inputs (next token, hidden
        state, position) built by vLLM's own `set_inputs_first_pass`, and the draft-cache slots
        of its first pass (`cad.slot_mapping`, rejected positions included as vLLM writes them)."""
        hidden = kw["target_hidden_states"]
        if self.method == "eagle3":  # the K3 variant: the fused step-0 input
            hidden = self.model.combine_hidden_states(hidden)
        n, _, cad = self.set_inputs_first_pass(
            target_token_ids=kw["target_token_ids"], next_token_ids=kw["next_token_ids"],
            target_positions=kw["target_positions"], target_hidden_states=hidden,
            token_indices_to_sample=kw["token_indices_to_sample"], cad=kw["common_attn_metadata"],
            num_rejected_tokens_gpu=kw["num_rejected_tokens_gpu"])
        if n == 0:
            return
        self._deferred.append((self.input_ids[:n].clone(), self.positions[:n].clone(),
                               self.hidden_states[:n].clone(), cad.slot_mapping[:n].long().clone()))
        self.stats["deferred_tokens"] = self.stats.get("deferred_tokens", 0) + n

    def _flush_context(self) -> None:
        """Write the queued step-0 K/V in one batch (`store_context_kv`), the last queued write
        of a slot winning (the order the skipped passes would have written in)."""
        writes, self._deferred = drain_writes(self._deferred), []
        if writes is None:
            return
        ids, pos, hidden, slots = writes
        self.model.store_context_kv(ids, pos, hidden, slots)
        self.stats["context_flushes"] = self.stats.get("context_flushes", 0) + 1

    def _draft_costs(self, runner):
        """(backbone, slot, skip) tables for `costs.CostModel`: one layer step over R rows, one
        draft step (layer + logits) over R rows, the deferred K/V projection of R rows."""
        from vllm_specx.adaptive.costs import grid, time_call

        dev, dtype = self.device, runner.model_config.dtype
        h = self.hidden_size
        backbone, slot, skip = {}, {}, {}
        for r in grid(self.max_profiled_requests(runner)):
            ids = torch.zeros(r, dtype=torch.long, device=dev)
            pos = torch.arange(r, device=dev)
            x = torch.randn(r, h, device=dev, dtype=dtype)
            # vLLM's dummy run is K layer steps over r rows
            backbone[r] = time_call(lambda: self.dummy_run(r, use_cudagraphs=False), dev) / self.num_speculative_tokens
            slot[r] = backbone[r] + time_call(lambda: self.model.compute_logits(x).argmax(-1), dev)
            skip[r] = time_call(lambda: self.model.store_context_kv(ids, pos, x, None), dev)
        return backbone, slot, skip

    def _update_positions_dependent_metadata(self, positions, common_attn_metadata, batch_size,
                                             input_batch_size, block_size):
        if not self.kv_share:
            return super()._update_positions_dependent_metadata(
                positions, common_attn_metadata, batch_size, input_batch_size, block_size)
        # KVShare: the next position for RoPE (clamped like vLLM's step update), no K/V write,
        # sequence lengths unchanged (attend to step 0's key set).
        nxt = positions + 1
        nxt = torch.where(nxt >= self.max_model_len, torch.zeros_like(nxt), nxt)
        self.positions[:batch_size] = nxt
        self._slot_mapping_buffer[:input_batch_size].fill_(PADDING_SLOT_ID)
        common_attn_metadata.slot_mapping = self._slot_mapping_buffer[:batch_size]
        self.stats["kv_writes_skipped"] += batch_size
        return self.positions[:batch_size]

    def _sample_draft_tokens(self, hidden_states, sampling_metadata):
        """Drafts [batch] and, when probabilistic, their distributions [batch, vocab]."""
        self.stats["draft_steps"] += 1
        logits = self.model.compute_logits(hidden_states)  # [batch, Vd] (draft ids)
        ids = self.model.draft_target_ids  # None: the full vocabulary
        if self._enable_probabilistic_draft_probs and not sampling_metadata.all_greedy:
            self.stats["probabilistic_calls"] += 1
            drafts, probs = probabilistic_pick(sampling_metadata, logits.shape[0])(logits)
            if self._qmax is not None:
                self._qmax.append(top_probability(logits, probs))
            return vocab.to_target(drafts, ids), vocab.scatter_to_target(probs, ids, self.mtp.vocab_size)
        if self._qmax is not None:
            self._qmax.append(top_probability(logits, None))
        return vocab.to_target(logits.argmax(-1), ids), None
