"""MTP on vLLM >= 0.34: its `SpeculatorConfig` for vLLM's speculator plugin API.

vLLM 0.34 serves speculative decoding on its V2 model runner only; a plugin adds a method with
`register_speculative_method(name, config_cls)` (`vllm_specx.speculator_api` does it in every
vLLM process). This module is that config; as vLLM asks of config modules, it imports no
speculator or model (those are in `vllm_model_v2.py`, named here by qualified name).

`SpecxMTPSpeculatorConfig` subclasses vLLM's own `MTPSpeculatorConfig` (`base_method` "mtp"), so
vLLM's MTP runs our layer: `MTPSpeculator` (a `TargetDependentARSpeculator`: draft prefill on
the target's batch with the target's attention metadata and slot mappings, the draft token ids
shifted by one, then one decode step per further draft that feeds the model's second output
back as the next hidden state), its draft KV cache and CUDA-graph managers. What that loop
computes is `model.py`'s chain with `kv_share` off (each step writes its K/V at its position and
the sequence grows by one: "mixed KV"). The config changes only what our checkpoint needs:

* it is reached three ways: our own method name `specx_mtp`; vLLM's built-in `"mtp"`; and no
  `method` - the last two because the `SpecxMTPModel` architecture's registered model class
  declares this config (`speculator_config_class`, vLLM's `SpeculativeDraftModel` interface).
  Under `"mtp"` vLLM's own MTP config sets the draft up before ours is picked, and it needs
  `num_speculative_tokens` (it reads `n_predict`, which our checkpoint has not: without the
  option it fails comparing None with 1); the other two spellings default it to `max_drafts`;
* `apply_options` (run by vLLM's `SpeculativeConfig.__post_init__` on every route) reads the
  checkpoint with vllm-specx's reader, runs every pre-engine check (`registry.check_draft`) and
  stores the validated config on the draft's HF config for the worker (`specx_route`,
  `specx_config`); a ValueError names the field or file, prefixed `vllm-specx:`;
* `supported_options` is empty: vLLM itself refuses, naming the option,
  `index_share_for_mtp_iteration` (IndexShare needs DSA attention; our layer is dense) and
  `draft_lm_head_quantization` (a quantized copy of the target's LM head would change the drafts
  away from the reference's);
* KVShare (`kv_share`, both committed MTP drafts) is served: `vllm_model_v2.SpecxMTPSpeculator`
  holds the sequence length at step 0's through vLLM's decode steps; so is a reduced vocabulary
  whose LM-head rows come from the target (`lm_head_from_target`, the committed SmolLM2 draft):
  copied in after vLLM's loader runs;
* the draft features vLLM's MTP loop cannot serve as trained (`V2_UNSUPPORTED`) are refused by
  name, so no engine serves them wrongly; they stay served on vLLM 0.32 / 0.33:
  - `fusion_layer_ids` (the Kimi-K3 fusion): vLLM's loop hands aux hidden states only to an
    "eagle3" speculator (`TargetDependentARSpeculator.propose` asserts it), and MTP's config
    requests none;
  A reduced draft vocabulary with its own `lm_head` rows is served: the model scores the draft
  vocabulary and scatters it into the target's (-inf elsewhere), as vLLM's EAGLE-3 does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm.v1.worker.gpu.spec_decode.mtp.config import MTPSpeculatorConfig

from vllm_specx.methods.mtp.config import SPECX_MTP_ARCH
from vllm_specx.speculator_api import SpecxSpeculatorConfig, V2Method, checked_draft

if TYPE_CHECKING:
    from vllm.config import SpeculativeConfig

METHOD_NAME = "specx_mtp"
SPECULATOR = "vllm_specx.methods.mtp.vllm_model_v2.SpecxMTPSpeculator"
# How `vllm_specx.speculator_api` registers this method with vLLM 0.34.
V2_METHOD = V2Method(METHOD_NAME, "mtp", SPECX_MTP_ARCH,
                     "vllm_specx.methods.mtp.vllm_model_v2:SpecxMTPV2ForCausalLM",
                     "vllm_specx.methods.mtp.speculator.SpecxMTPSpeculatorConfig")
# vLLM internals this module imports or overrides (checked against vLLM 0.34 by tests/test_vllm034.py).
VLLM_INTERNALS_V2 = (
    "vllm.v1.worker.gpu.spec_decode.mtp.config:MTPSpeculatorConfig",
    "vllm.v1.worker.gpu.spec_decode.mtp.config:MTPSpeculatorConfig.apply_options",
    "vllm.v1.worker.gpu.spec_decode.mtp.config:MTPSpeculatorConfig.adapt_draft_model_config",
    "vllm.v1.worker.gpu.spec_decode.mtp.config:MTPSpeculatorConfig.resolve_num_speculative_tokens",
    "vllm.v1.worker.gpu.spec_decode.mtp.config:MTPSpeculatorConfig.matches",
    "vllm.v1.worker.gpu.spec_decode.speculator_config:_resolve_checkpoint_config_class",
    "vllm.config:SpeculativeConfig",
)

# Draft-config fields vLLM's MTP loop does not serve as trained: (field, is it set?, why).
V2_UNSUPPORTED = (
    ("fusion_layer_ids", lambda c: bool(c.fusion_layer_ids),
     "the Kimi-K3 fusion of several target layers: vLLM's MTP loop hands no aux hidden states "
     "to an MTP drafter"),
)


def draft_config(spec: SpeculativeConfig):
    """The validated MTPDraftConfig of the speculative config's draft checkpoint; ValueError
    (`vllm-specx: ...`) naming the file or field when it is not a vllm-specx MTP draft this
    path serves for this target and `num_speculative_tokens` (`speculator_api.checked_draft`)."""
    return checked_draft(spec, "mtp", "vllm-specx MTP draft checkpoint (its `specx` block with method "
                         "'mtp')", V2_UNSUPPORTED)


def mirror_hf(hf, cfg) -> None:
    """Store the validated config on the draft's HF config, where the worker's model reads it
    (`registry.config_of`)."""
    hf.specx_route = "mtp"
    hf.specx_config = cfg.to_dict()


class SpecxMTPSpeculatorConfig(SpecxSpeculatorConfig, MTPSpeculatorConfig):
    """vllm-specx MTP on vLLM's V2 runner (see the module docstring)."""

    base_method = "mtp"
    speculator_class = SPECULATOR
    read_draft = staticmethod(draft_config)
    mirror = staticmethod(mirror_hf)

    @classmethod
    def adapt_draft_model_config(cls, spec: SpeculativeConfig) -> None:
        # vLLM's MTP check here compares num_speculative_tokens with 1 before vLLM resolves it
        # (`DraftModelSpeculatorConfig.configure`): resolve our default first.
        cls.resolve_num_speculative_tokens(spec)
        super().adapt_draft_model_config(spec)
