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
* `SpecxMTPSpeculator` is vLLM's `MTPSpeculator` unchanged but for its name (its loop runs
  `model.py`'s chain with `kv_share` off; `speculator.py` refuses KVShare).
"""

from __future__ import annotations

import torch
from vllm.v1.worker.gpu.spec_decode.mtp.speculator import MTPSpeculator

from vllm_specx.methods.mtp.speculator import SpecxMTPSpeculatorConfig
from vllm_specx.methods.mtp.vllm_model import SpecxMTPForCausalLM

# vLLM internals this module imports, overrides or relies on (checked against vLLM 0.34 by
# tests/test_vllm034.py).
VLLM_INTERNALS_V2 = (
    "vllm.v1.worker.gpu.spec_decode.mtp.speculator:MTPSpeculator",
    "vllm.v1.worker.gpu.spec_decode.mtp.speculator:MTPSpeculator.load_draft_model",
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:TargetDependentARSpeculator._prefill",
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:TargetDependentARSpeculator._decode",
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:TargetDependentARSpeculator._run_model",
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:prepare_prefill_inputs",
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:update_draft_inputs",
    "vllm.v1.worker.gpu.spec_decode.eagle.utils:load_eagle_model",
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


class SpecxMTPSpeculator(MTPSpeculator):
    """vLLM's MTP speculator, run on `SpecxMTPV2ForCausalLM`."""

    _speculator_name = "vllm-specx MTP"
