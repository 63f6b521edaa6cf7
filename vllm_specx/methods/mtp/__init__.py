"""MTP: one shared multi-token-prediction layer drafting K tokens (DeepSeek-V3 / GLM-5 style:
`eh_proj(cat[enorm(embed(token)), hnorm(hidden)])`, one decoder block, the target's embeddings
and LM head), with KVShare (GLM-5.2: later draft steps attend only to the K/V step 0 computed from
the target's hidden states) - for targets without a native MTP layer, trained here.

    config.py      MTPDraftConfig, checked in __post_init__
    checkpoint.py  read + write (vllm-specx format, format_version checked)
    model.py       the PyTorch reference / trainer model; KVShare is defined in its docstring
    vllm_model.py  the same math on vLLM's Llama decoder layer (imports vLLM)
    proposer.py    MTPProposer, swapped into vLLM's V1 runner (imports vLLM)
    train.py       trainer hooks

The Kimi-K3 variant (`fusion_layer_ids` in the checkpoint): step 0's hidden input is `fc` over
several target layers' residual streams (initialised to the last one through the target's final
norm: the plain layer up to the norms' epsilon), served through vLLM's EAGLE-3 plumbing (aux hidden states).

Routing: `{"method": "mtp", "model": <a vllm-specx MTP checkpoint>}` runs our proposer; a
`method: "mtp"` config without such a checkpoint (a native DeepSeek/GLM MTP target) stays
vLLM's own MTP. Importing this package registers the method; it imports neither vLLM nor torch
models.

Speculative-config options with an MTP-specific verdict (`SPEC_OPTIONS`; every other field's
verdict is in `vllm_specx._vllm_compat.route`):

=============================  ========  ======================================================
field                          verdict   note
=============================  ========  ======================================================
index_share_for_mtp_iteration  refused   needs DSA attention in the MTP layer; this version's
                                         layers are dense (KVShare is the checkpoint's kv_share)
dspark_draft_topk              refused   DSpark only
use_local_argmax_reduction     refused   drafts are sampled from the full logits
enable_adaptive_verification   honoured  the same switch as vllm-specx's `adaptive: true`
=============================  ========  ======================================================

Adaptive drafting (`adaptive: true`, `vllm_specx.adaptive`): per-request cuts, fewer chain steps
when the scheduler's horizon is short, and skipped passes whose step-0 K/V are deferred and
written exactly (`proposer.py`); the confidence is the online estimator's (no confidence head).
"""

from __future__ import annotations

from vllm_specx import registry
from vllm_specx.checkpoint import to_aux_ids
from vllm_specx.methods.mtp.checkpoint import METHOD_NAME, detect, read_config
from vllm_specx.methods.mtp.config import SPECX_MTP_ARCH, MTPDraftConfig


def internal_method_for(cfg: MTPDraftConfig) -> str:
    """vLLM's EAGLE plumbing hands the drafter the target's final hidden states; its EAGLE-3
    plumbing (the K3 variant, `fusion_layer_ids`) the residual streams of the fused layers."""
    return "eagle3" if cfg.fusion_layer_ids else "eagle"


def finish_hf(hf, cfg: MTPDraftConfig) -> None:
    """The keys vLLM's EAGLE-3 plumbing reads: which target layers to capture (aux ids = layer + 1)."""
    if cfg.fusion_layer_ids:
        hf.eagle_aux_hidden_state_layer_ids = to_aux_ids(cfg.fusion_layer_ids)
        hf.target_hidden_size = cfg.target_hidden_size

SPEC_OPTIONS = (
    ("index_share_for_mtp_iteration", "refused", "IndexShare needs DSA attention in the MTP layer; "
     "vllm-specx's MTP layers are dense in this version (KVShare is the checkpoint's 'kv_share')"),
    ("dspark_draft_topk", "refused", "it configures DSpark drafts only"),
    ("use_local_argmax_reduction", "refused", "vllm-specx's MTP drafts are picked from the full "
     "logits (greedy or sampled with their exact distribution)"),
    ("enable_adaptive_verification", "honoured", "the same switch as vllm-specx's `adaptive: true` "
     "(confidence-scheduled drafting on the V1 runner)"),
)

METHOD = registry.register(registry.Method(
    name=METHOD_NAME,
    config_cls=MTPDraftConfig,
    detect=detect,
    read_config=read_config,
    internal_method="eagle",
    internal_method_for=internal_method_for,
    arch=SPECX_MTP_ARCH,
    # vLLM's EAGLEConfig renames draft archs to "Eagle<arch>" / "Eagle3<arch>".
    vllm_archs=("Eagle" + SPECX_MTP_ARCH, "Eagle3" + SPECX_MTP_ARCH),
    finish_hf=finish_hf,
    model_cls="vllm_specx.methods.mtp.vllm_model:SpecxMTPForCausalLM",
    proposer_cls="vllm_specx.methods.mtp.proposer:MTPProposer",
    trainer="vllm_specx.methods.mtp.train",
    vllm_internals=(
        "vllm.model_executor.models.llama:LlamaDecoderLayer",
        "vllm.model_executor.models.llama_eagle3:Eagle3LlamaForCausalLM",
        "vllm.model_executor.layers.layernorm:RMSNorm",
        "vllm.model_executor.layers.linear:ReplicatedLinear",
        "vllm.model_executor.layers.logits_processor:LogitsProcessor",
        "vllm.model_executor.layers.vocab_parallel_embedding:ParallelLMHead",
        "vllm.model_executor.layers.vocab_parallel_embedding:VocabParallelEmbedding",
        "vllm.model_executor.model_loader.weight_utils:default_weight_loader",
        "vllm.v1.spec_decode.eagle:EagleProposer",
        # lm_head_from_target: the target's rows copied in (`vocab.TargetHeadRows`)
        "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer._maybe_share_lm_head",
        "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.propose",
        "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer._update_positions_dependent_metadata",
        "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer._sample_draft_tokens",
        "vllm.v1.spec_decode.utils:PADDING_SLOT_ID",
        "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.set_inputs_first_pass",
        "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.prepare_next_token_ids_padded",
        "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.dummy_run",
        "vllm.v1.sample.sampler:_SAMPLING_EPS",
    ),
    description="one shared MTP layer (DeepSeek/GLM style) with KVShare, for targets without "
                "a native MTP layer",
    spec_options=SPEC_OPTIONS,
    adaptive_drafting=True,
))
