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

The vLLM internals used and overridden here are listed in this method's `vllm_internals`.
"""

from __future__ import annotations

import logging
import os

import torch
from vllm.v1.spec_decode.dflash import DFlashProposer

from vllm_specx import registry
from vllm_specx.methods.dspark.model import greedy_pick, reads_anchor_slot, sequential_drafts
from vllm_specx.sample.draft_sampling import hands_draft_probs, probabilistic_pick

logger = logging.getLogger("vllm.specx")
_VLLM_SLOT_OFFSET = 1  # DFlash's sample_idx points at slots 1..N (the fill-in layout)


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
        base = self.model.compute_logits(slots.reshape(batch * n, -1)).view(batch, n, -1)
        probabilistic = self._enable_probabilistic_draft_probs and not sampling_metadata.all_greedy
        if probabilistic:
            self.stats["probabilistic_calls"] += 1
            pick = probabilistic_pick(sampling_metadata, batch)
        else:
            pick = greedy_pick
        tokens, probs = sequential_drafts(base, anchors, self.model.markov_stepper(slots), pick, state)
        return tokens.reshape(-1), (probs.reshape(batch * n, -1) if probs is not None else None)
