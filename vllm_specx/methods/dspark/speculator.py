"""DSpark on vLLM >= 0.34: its `SpeculatorConfig` for vLLM's speculator plugin API.

vLLM 0.34 serves speculative decoding on its V2 model runner only; a plugin adds a method with
`register_speculative_method(name, config_cls)` (`vllm_specx.speculator_api` does it in every
vLLM process). This module is that config; as vLLM asks of config modules, it imports no
speculator or model (those are in `vllm_model_v2.py`, named here by qualified name).

`SpecxDSparkSpeculatorConfig` subclasses vLLM's own `DSparkSpeculatorConfig` (`base_method`
"dspark"), so it inherits vLLM's DSpark setup (context-K/V precompute and draft KV cache from
the runner, the anchor-layout lookahead, adaptive verification, the CUDA-graph manager) and
changes only what our checkpoint needs:

* it is reached two ways: by our own method name `specx_dspark`, and by vLLM's built-in
  `"dspark"` (or no `method`) for a checkpoint whose architecture is `SpecxDSparkModel`: that
  architecture's registered model class declares this config (`speculator_config_class`,
  vLLM's `SpeculativeDraftModel` interface), and vLLM then uses it for such drafts;
* `apply_options` (run by vLLM's `SpeculativeConfig.__post_init__` on both routes) reads the
  checkpoint with vllm-specx's reader, runs every pre-engine check (`registry.check_draft`:
  config against the target, drafts per pass, tensors) and mirrors the config into the HF-config
  keys vLLM's DSpark plumbing reads; a ValueError names the field or file, prefixed
  `vllm-specx:`;
* `supported_options` is empty: vLLM itself refuses `dspark_draft_topk` (its top-k Markov
  projection; our head scores the whole draft vocabulary), `draft_lm_head_quantization` and
  `speculator_options`, naming the option;
* the draft features our V2 model does not implement yet (`V2_UNSUPPORTED`) are refused by
  name, so no engine serves them wrongly; they stay served on vLLM 0.32 / 0.33.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.v1.worker.gpu.spec_decode.dspark.config import DSparkSpeculatorConfig

from vllm_specx.methods.dspark.config import SPECX_DSPARK_ARCH
from vllm_specx.speculator_api import SpecxSpeculatorConfig, V2Method, checked_draft

if TYPE_CHECKING:
    from vllm.config import SpeculativeConfig

METHOD_NAME = "specx_dspark"
SPECULATOR = "vllm_specx.methods.dspark.vllm_model_v2.SpecxDSparkSpeculator"
# How `vllm_specx.speculator_api` registers this method with vLLM 0.34.
V2_METHOD = V2Method(METHOD_NAME, "dspark", SPECX_DSPARK_ARCH,
                     "vllm_specx.methods.dspark.vllm_model_v2:SpecxDSparkForCausalLM",
                     "vllm_specx.methods.dspark.speculator.SpecxDSparkSpeculatorConfig")
# vLLM internals this module imports or overrides (checked against vLLM 0.34 by tests/test_vllm034.py).
VLLM_INTERNALS_V2 = (
    "vllm.v1.worker.gpu.spec_decode.dspark.config:DSparkSpeculatorConfig",
    "vllm.v1.worker.gpu.spec_decode.dspark.config:DSparkSpeculatorConfig.apply_options",
    "vllm.v1.worker.gpu.spec_decode.dspark.config:DSparkSpeculatorConfig.resolve_num_speculative_tokens",
    "vllm.v1.worker.gpu.spec_decode.dspark.config:DSparkSpeculatorConfig.matches",
    "vllm.config:SpeculativeConfig",
)

# Draft-config fields whose V2 serving is not written yet: (field, is it set?, why).
V2_UNSUPPORTED = (
    ("final_layer_tap", lambda c: c.final_layer_tap, "the recipe's final-layer tap"),
    ("per_layer_fusion", lambda c: c.per_layer_fusion, "per-layer context mixtures"),
    ("slot_queries", lambda c: c.slot_queries, "learned query-slot embeddings"),
    ("markov_head_type", lambda c: c.markov_head_type == "rnn" and not c.sample_from_anchor,
     "a recurrent Markov head in the fill-in layout (its state runs over the anchor slot first; "
     "vLLM's DSpark loop starts it at the first sample slot)"),
)


def draft_config(spec: SpeculativeConfig):
    """The validated DSparkDraftConfig of the speculative config's draft checkpoint; ValueError
    (`vllm-specx: ...`) naming the file or field when it is not a good vllm-specx DSpark draft
    for this target and `num_speculative_tokens` (`speculator_api.checked_draft`)."""
    return checked_draft(spec, "dspark", "DSpark draft checkpoint (vllm-specx's `specx` block or "
                         "speculators_model_type 'dspark')", V2_UNSUPPORTED)


def mirror_hf(hf: Any, cfg) -> None:
    """Write the draft config into the HF-config keys vLLM's DSpark plumbing and our V2 model
    read (DFlash's keys as on 0.32/0.33, plus DSpark's block and head fields)."""
    from vllm_specx.methods.dspark import finish_hf

    finish_hf(hf, cfg)
    hf.block_size = cfg.block_size
    hf.markov_rank = cfg.markov_rank
    hf.markov_head_type = cfg.markov_head_type
    hf.sample_from_anchor = cfg.sample_from_anchor
    hf.next_token_stream = cfg.next_token_stream
    hf.enable_confidence_head = cfg.confidence_head is not None
    hf.confidence_head_with_markov = cfg.confidence_head == "hidden+markov"
    hf.specx_route = "dspark"
    hf.specx_config = cfg.to_dict()


class SpecxDSparkSpeculatorConfig(SpecxSpeculatorConfig, DSparkSpeculatorConfig):
    """vllm-specx DSpark on vLLM's V2 runner (see the module docstring)."""

    base_method = "dspark"
    speculator_class = SPECULATOR
    read_draft = staticmethod(draft_config)
    mirror = staticmethod(mirror_hf)
