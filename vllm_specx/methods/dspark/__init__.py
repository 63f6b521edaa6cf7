"""DSpark: a parallel block drafter (DFlash-style: fused target taps -> context K/V, one
bidirectional pass over `[anchor, mask, ...]`) with a sequential low-rank Markov head.

    config.py      DSparkDraftConfig, checked in __post_init__
    checkpoint.py  read + write, vllm-specx and speculators formats (format_version checked)
    model.py       the PyTorch reference / trainer model (MarkovHead, sequential_drafts)
    vllm_model.py  the same math on vLLM's DFlash Qwen3 backbone (imports vLLM)
    proposer.py    DSparkProposer, swapped into vLLM's V1 runner (imports vLLM)
    train.py       trainer hooks

Importing this package registers the method; it imports neither vLLM nor torch models.

Speculative-config options with a DSpark-specific verdict (`SPEC_OPTIONS`; every other field's
verdict is in `vllm_specx._vllm_compat.route`):

===========================  ========  ========================================================
field                        verdict   note
===========================  ========  ========================================================
dspark_draft_topk            refused   vLLM's top-k Markov projection for its Qwen3DSparkModel;
                                       this head scores the full vocabulary
use_local_argmax_reduction   refused   the Markov head corrects the full base logits, so the
                                       drafts cannot come from a vocab-parallel local argmax
enable_adaptive_verification honoured  vLLM's switch for confidence-scheduled drafting, the
                                       same as vllm-specx's `adaptive: true` (`vllm_specx.adaptive`,
                                       on the V1 runner)
===========================  ========  ========================================================

vllm-specx's own adaptive-drafting options (`adaptive`, `adaptive_confidence`, `adaptive_threshold`,
`adaptive_cost_model`, `adaptive_max_skip`) are not vLLM fields; `_vllm_compat/spec_fields.py`
takes them out before vLLM's validation (`vllm_specx.adaptive.config`).
"""

from __future__ import annotations

from vllm_specx import envs, registry
from vllm_specx.methods.dspark.checkpoint import METHOD_NAME, detect, read_config
from vllm_specx.methods.dspark.config import SPECX_DSPARK_ARCH, DSparkDraftConfig

UPSTREAM_ENV = "VLLM_SPECX_UPSTREAM_DSPARK"  # "auto" (default) | "specx" | "vllm"
envs.register(UPSTREAM_ENV, envs.Switch(
    "auto", ("auto", "specx", "vllm"), "who serves a speculators-format DSpark checkpoint: auto (ours "
    "on vLLM's V1 runner, vLLM's own on V2), always ours, always vLLM's", "vllm_specx.methods.dspark"))


def defer_to_vllm(fmt: str, requested: str | None, v2_would_run: bool) -> bool:
    """Our own checkpoints always take our route. Upstream (speculators-format) DSpark checkpoints
    take it when vLLM would run the V1 model runner (where vLLM cannot run them at all), and stay
    with vLLM's built-in DSpark on the V2 runner unless `VLLM_SPECX_UPSTREAM_DSPARK=specx`; with
    no `method` given, vLLM's own detection keeps them."""
    if fmt != "speculators":
        return False
    choice = envs.get(UPSTREAM_ENV)
    return requested is None or choice == "vllm" or (choice == "auto" and v2_would_run)


def finish_hf(hf, cfg: DSparkDraftConfig) -> None:
    """Mirror the config into the keys vLLM's DFlash plumbing reads from the draft's HF config."""
    hf.eagle_aux_hidden_state_layer_ids = cfg.aux_layer_ids
    hf.target_hidden_size = cfg.target_hidden_size
    hf.mask_token_id = cfg.mask_token_id
    hf.draft_vocab_size = cfg.draft_vocab_size  # below vocab_size: vLLM builds lm_head and d2t at it
    hf.dflash_config = {**(getattr(hf, "dflash_config", None) or {}),
                        "mask_token_id": cfg.mask_token_id, "causal": cfg.causal,
                        "target_layer_ids": list(cfg.target_layer_ids), "use_aux_hidden_state": True}
    # Every draft layer: vLLM's DFlash attention reads the window from layer_types/sliding_window
    # (and the causality from dflash_config.causal, above).
    if cfg.sliding_window is None:
        hf.layer_types = ["full_attention"] * cfg.num_hidden_layers
    else:
        hf.layer_types = ["sliding_attention"] * cfg.num_hidden_layers
        hf.sliding_window = cfg.sliding_window
    hf.dflash_config.pop("use_swa", None)
    hf.dflash_config.pop("swa_window_size", None)


SPEC_OPTIONS = (
    ("dspark_draft_topk", "refused", "it configures vLLM's top-k Markov projection for its "
     "Qwen3DSparkModel; vllm-specx's DSpark head scores the full vocabulary"),
    ("use_local_argmax_reduction", "refused", "DSpark's Markov head corrects the full base "
     "logits, so its drafts cannot come from a vocab-parallel local argmax"),
    ("enable_adaptive_verification", "honoured", "the same switch as vllm-specx's `adaptive: true` "
     "(confidence-scheduled drafting on the V1 runner)"),
)

METHOD = registry.register(registry.Method(
    name=METHOD_NAME,
    config_cls=DSparkDraftConfig,
    detect=detect,
    read_config=read_config,
    internal_method="dflash",
    arch=SPECX_DSPARK_ARCH,
    # vLLM's EAGLEConfig renames draft archs to "DFlash<arch>" for method dflash.
    vllm_archs=("DFlash" + SPECX_DSPARK_ARCH,),
    model_cls="vllm_specx.methods.dspark.vllm_model:SpecxDSparkForCausalLM",
    proposer_cls="vllm_specx.methods.dspark.proposer:DSparkProposer",
    finish_hf=finish_hf,
    defer_to_vllm=defer_to_vllm,
    trainer="vllm_specx.methods.dspark.train",
    vllm_internals=(
        "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM",
        "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.load_weights",
        "vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._normalize_context_k",
        "vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._project_context_kv",
        "vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model.embed_input_ids",
        "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.combine_hidden_states",
        "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.precompute_and_store_context_kv",
        "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.forward",
        "vllm._custom_ops:rms_norm",
        "vllm.platforms:current_platform",  # cpu_k_norm: the repair is for CPU kernels only
        "vllm.v1.spec_decode.dflash:DFlashProposer",
        # lm_head_from_target: the target's rows copied in (`vocab.TargetHeadRows`)
        "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer._maybe_share_lm_head",
        "vllm.v1.spec_decode.dflash:DFlashProposer.set_inputs_first_pass",
        "vllm.v1.spec_decode.dflash:DFlashProposer._sample_draft_tokens",
        "vllm.v1.spec_decode.llm_base_proposer:compute_probs_and_sample_next_token",
        "vllm.v1.sample.sampler:_SAMPLING_EPS",
        # adaptive drafting (`adaptive: true`)
        "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.propose",
        "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.prepare_next_token_ids_padded",
        "vllm.v1.spec_decode.dflash:DFlashProposer.build_model_inputs_first_pass",
        "vllm.v1.spec_decode.dflash:DFlashProposer.dummy_run",
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner._dummy_run",
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner._get_draft_token_ids_cpu",
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner.initialize_kv_cache",
    ),
    description="parallel block drafter + sequential low-rank Markov head (vllm-specx and "
                "speculators checkpoints)",
    spec_options=SPEC_OPTIONS,
    adaptive_drafting=True,
))
