"""MTP on vLLM >= 0.34's V2 model runner: the draft model and the speculator (imports vLLM).

Both reuse what exists rather than copying it:

* `SpecxMTPV2ForCausalLM` is the 0.32 / 0.33 model (`vllm_model.SpecxMTPForCausalLM`: our layer
  on vLLM's Llama decoder block, its KV-cache layer named as a native MTP layer's, the target's
  embeddings and LM head shared by vLLM's loader, `forward` returning (g, g): the post-norm
  output both scored and fed back) with two V2 changes: it declares `SpecxMTPSpeculatorConfig`
  (vLLM's `SpeculativeDraftModel` interface), so a `SpecxMTPModel` checkpoint selects our config
  under `"method": "mtp"` and with no method; and `compute_logits` returns logits over the
  target's vocabulary (vLLM's V2 MTP loop samples token ids straight from them, with no draft ->
  target map): a reduced draft vocabulary's logits are scattered to their target ids, -inf
  elsewhere (what vLLM's EAGLE-3 does), so greedy and sampled drafts are the reduced draft's.
* `SpecxMTPSpeculator` is vLLM's `MTPSpeculator`. Its loop runs `model.py`'s chain with
  `kv_share` off (each decode step advances position, sequence length and slot: mixed KV). For a
  KVShare draft it holds every request's sequence length at step 0's (the verified length a)
  through the decode steps while positions still advance: `_prepare_decode_inputs` and each
  `_decode` (the step the FULL CUDA graph captures) reset `seq_lens` from a fixed buffer, so step
  j >= 1 attends to K_0 .. K_{a-1} only, at RoPE position a - 1 + j. vLLM still writes the step's
  K/V at its position (>= a): nothing reads it (sequence length a), and the next pass's draft
  prefill rewrites every verified position before it is read.
"""

from __future__ import annotations

import torch
from vllm.v1.worker.gpu.spec_decode.mtp.speculator import MTPSpeculator

from vllm_specx import vocab
from vllm_specx.methods.mtp.speculator import SpecxMTPSpeculatorConfig
from vllm_specx.methods.mtp.vllm_model import SpecxMTPForCausalLM

# vLLM internals this module imports, overrides or relies on (checked against vLLM 0.34 by
# tests/test_vllm034.py).
VLLM_INTERNALS_V2 = (
    "vllm.v1.worker.gpu.spec_decode.mtp.speculator:MTPSpeculator",
    "vllm.v1.worker.gpu.spec_decode.mtp.speculator:MTPSpeculator.load_draft_model",
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:TargetDependentARSpeculator._prefill",
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:TargetDependentARSpeculator._decode",
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:TargetDependentARSpeculator._prepare_decode_inputs",
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:TargetDependentARSpeculator._run_model",
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:prepare_prefill_inputs",
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:update_draft_inputs",
    "vllm.v1.worker.gpu.spec_decode.eagle.utils:load_eagle_model",
    "vllm.v1.worker.gpu.spec_decode.eagle.utils:get_target_lm_head",
    "vllm.model_executor.models.llama:LlamaDecoderLayer",
    "vllm.model_executor.models.llama_eagle3:Eagle3LlamaForCausalLM",
)


def scatter_to_target(logits: torch.Tensor, d2t: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Draft-vocabulary logits [N, Vd] -> target-vocabulary logits [N, V] (draft id i at target
    id i + d2t[i], -inf elsewhere); unchanged for a full vocabulary (d2t None)."""
    if d2t is None:
        return logits
    out = logits.new_full((logits.shape[0], vocab_size), float("-inf"))
    out[:, torch.arange(d2t.shape[0], device=d2t.device) + d2t] = logits
    return out


class SpecxMTPV2ForCausalLM(SpecxMTPForCausalLM):
    """The `SpecxMTPModel` architecture on vLLM >= 0.34."""

    speculator_config_class = SpecxMTPSpeculatorConfig

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary [N, V] (see the module docstring)."""
        d2t = self.draft_id_to_target_id
        return scatter_to_target(super().compute_logits(hidden_states),
                                 None if d2t is None else d2t.data, self.mtp.vocab_size)


class SpecxMTPSpeculator(vocab.TargetHeadRowsV2, MTPSpeculator):
    """vLLM's MTP speculator, run on `SpecxMTPV2ForCausalLM`; KVShare as the module docstring says;
    a reduced draft saved with `lm_head_from_target` gets the target's rows (`vocab.TargetHeadRowsV2`)."""

    _speculator_name = "vllm-specx MTP"

    def __init__(self, vllm_config, device: torch.device):
        super().__init__(vllm_config, device)
        hf = self.draft_model_config.hf_config
        self.kv_share = bool((getattr(hf, "specx_config", None) or {}).get("kv_share"))
        # step 0's sequence length per request (a: the verified tokens), held through the steps
        self._shared_seq_lens = torch.zeros(self.max_num_reqs, dtype=torch.int32, device=device)

    def _prepare_decode_inputs(self, input_batch, num_rejected, num_reqs, skip_attn, batch_desc) -> None:
        super()._prepare_decode_inputs(input_batch, num_rejected, num_reqs, skip_attn, batch_desc)
        if self.kv_share:
            self._shared_seq_lens[:num_reqs].copy_(input_batch.seq_lens[:num_reqs] - num_rejected[:num_reqs])
            self.input_buffers.seq_lens[:num_reqs].copy_(self._shared_seq_lens[:num_reqs])

    def _decode(self, num_reqs: int, *args, **kwargs) -> None:
        super()._decode(num_reqs, *args, **kwargs)
        if self.kv_share:  # the step advanced it with the position: back to a
            self.input_buffers.seq_lens[:num_reqs].copy_(self._shared_seq_lens[:num_reqs])
