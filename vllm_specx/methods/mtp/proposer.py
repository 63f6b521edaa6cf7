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

Counters in `stats` (read through `LLM.collective_rpc`): propose calls, draft steps run, the
KV writes KVShare skipped, probabilistic passes.
"""

from __future__ import annotations

import logging
import os

import torch
from vllm.v1.spec_decode.eagle import EagleProposer
from vllm.v1.spec_decode.utils import PADDING_SLOT_ID

from vllm_specx import registry, vocab
from vllm_specx.sample.draft_sampling import hands_draft_probs, probabilistic_pick

logger = logging.getLogger("vllm.specx")


class MTPProposer(EagleProposer):
    def __init__(self, vllm_config, device, runner=None):
        super().__init__(vllm_config, device, runner)
        _, self.mtp = registry.config_of(self.draft_model_config.hf_config)  # validated
        self.kv_share = self.mtp.kv_share
        self._enable_probabilistic_draft_probs = hands_draft_probs(vllm_config.speculative_config)
        self.stats = {"propose_calls": 0, "draft_steps": 0, "kv_writes_skipped": 0,
                      "probabilistic_calls": 0, "kv_share": self.kv_share}
        logger.info("vllm-specx: MTPProposer active in pid %d (one shared MTP layer, kv_share %s, "
                    "%d drafts)", os.getpid(), self.kv_share, self.num_speculative_tokens)

    def propose(self, *args, **kwargs):
        self.stats["propose_calls"] += 1
        return super().propose(*args, **kwargs)

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
            return vocab.to_target(drafts, ids), vocab.scatter_to_target(probs, ids, self.mtp.vocab_size)
        return vocab.to_target(logits.argmax(-1), ids), None
