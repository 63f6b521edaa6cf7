"""What vllm-specx relies on across the supported vLLM versions (0.32, 0.33), checked without an
engine: the patch targets' and overridden methods' signatures, the rejection_sample() keywords our
acceptance op receives, and the engine-config facts that changed in 0.33 for DFlash-based routes.
`scripts/check_vllm033.sh` runs this file (and the other engine-free tests) against vLLM 0.33."""

from __future__ import annotations

import inspect
import json
import shutil

import pytest

import vllm_specx
from vllm_specx import _vllm_compat

from .helpers import REF_TARGET, load_target, random_draft, write

K = 7


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    return write(random_draft(load_target(REF_TARGET)), tmp_path_factory.mktemp("v033") / "d")


def _engine_config(draft, **engine):
    from vllm.engine.arg_utils import EngineArgs

    spec = {"method": "dspark", "model": str(draft), "num_speculative_tokens": K}
    return EngineArgs(model=str(REF_TARGET), dtype="float32", max_model_len=512, enforce_eager=True,
                      speculative_config=spec, **engine).create_engine_config()


def _vllm_minor() -> tuple[int, int]:
    import vllm

    return tuple(int(p) for p in vllm.__version__.split("+")[0].split(".")[:2])


# Leading parameters of every vLLM callable we replace or override (what our code calls with).
SIGNATURES = {
    "vllm.config.speculative:SpeculativeConfig.__post_init__": ("self",),
    "vllm.config.vllm:VllmConfig._get_v2_model_runner_unsupported_features": ("self",),
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner.__init__": ("self", "vllm_config", "device"),
    "vllm.utils.cpu_triton_utils:_expand_kernel_impl": (
        "output", "input_val", "cu_num_tokens", "replace_from", "replace_to", "MAX_NUM_TOKENS"),
    "vllm.v1.sample.rejection_sampler:RejectionSampler.__init__": (
        "self", "sampler", "spec_config", "device"),
    "vllm.v1.sample.rejection_sampler:RejectionSampler.forward": (
        "self", "metadata", "draft_probs", "logits", "sampling_metadata"),
    "vllm.v1.sample.rejection_sampler:generate_uniform_probs": (
        "num_tokens", "num_draft_tokens", "generators", "device"),
    "vllm.v1.spec_decode.dflash:DFlashProposer.__init__": ("self", "vllm_config", "device", "runner"),
    "vllm.v1.spec_decode.dflash:DFlashProposer.set_inputs_first_pass": (
        "self", "target_token_ids", "next_token_ids"),
    "vllm.v1.spec_decode.dflash:DFlashProposer._sample_draft_tokens": (
        "self", "hidden_states", "sampling_metadata"),
    "vllm.v1.spec_decode.llm_base_proposer:compute_probs_and_sample_next_token": (
        "logits", "sampling_metadata", "use_fp64_gumbel"),
    "vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM.load_weights": (
        "self", "weights"),
}


@pytest.mark.parametrize("target", list(SIGNATURES))
def test_replaced_and_overridden_vllm_callables_keep_their_signature(target):
    vllm_specx.register()
    fn = _vllm_compat.resolve(target)[2]
    fn = inspect.unwrap(fn)
    params = tuple(inspect.signature(fn).parameters)[:len(SIGNATURES[target])]
    assert params == SIGNATURES[target]


# rejection_sample() keywords beyond the positional contract, and why our op may ignore each
# (vllm_specx.sample.rejection_sampler.specx_rejection_sample swallows them): a new one in a
# newer vLLM would be silently dropped, so it must be added here with a reason first.
KNOWN_KWARGS = {
    "synthetic_mode": "synthetic acceptance never reaches our sampler (swap_drafter)",
    "synthetic_conditional_rates": "as synthetic_mode",
    "use_fp64_gumbel": "our noise is always drawn from float64 uniforms",
    "fly_window_size": "0.33: FLy is refused at config time (route) and by swap_drafter",
    "fly_entropy_threshold": "0.33: as fly_window_size",
    "fly_entropy_top_k": "0.33: as fly_window_size",
}


def test_rejection_sample_keywords_are_all_known():
    from vllm.v1.sample import rejection_sampler

    from vllm_specx._vllm_compat.acceptance import REJECTION_SAMPLE_PARAMS

    fn = inspect.unwrap(rejection_sampler.rejection_sample)
    extra = [p for p in inspect.signature(fn).parameters if p not in REJECTION_SAMPLE_PARAMS]
    assert set(extra) <= set(KNOWN_KWARGS), sorted(set(extra) - set(KNOWN_KWARGS))


def test_draft_pass_fits_the_scheduled_batch(draft):
    """The DFlash pass our proposer runs has K + 1 query rows per request. vLLM 0.32 reserves K
    draft slots per request in the token budget; 0.33 reserves none and instead caps the active
    sequences at max_num_batched_tokens // (K + 1)."""
    cfg = _engine_config(draft, max_num_batched_tokens=512, max_num_seqs=256)
    spec, sched = cfg.speculative_config, cfg.scheduler_config
    assert spec.draft_model_config.hf_config.specx_route == "dspark"
    assert cfg.num_lookahead_tokens == K + 1
    if _vllm_minor() >= (0, 33):
        assert spec.max_num_new_slots_for_drafting == 0
        assert sched.max_num_active_seqs == 512 // (K + 1)
    else:
        assert spec.max_num_new_slots_for_drafting == K


def test_a_short_draft_keeps_the_v1_runners_drafting_limit(draft, tmp_path):
    """A draft whose max_position_embeddings (256) is below the served max_model_len (512): the
    draft's max_model_len is 256 on both versions, so the V1 runner stops drafting for batches
    longer than that (`_input_fits_in_drafter`) and never indexes its rotary cache past 256.
    vLLM 0.33 also raises the draft's max_position_embeddings to 512 for DFlash-based routes
    (0.32: EAGLE only); on the V1 runner that only grows the rotary cache."""
    short = tmp_path / "short"
    shutil.copytree(draft, short)
    cfg = json.loads((short / "config.json").read_text())
    cfg["max_position_embeddings"] = 256
    (short / "config.json").write_text(json.dumps(cfg))
    spec = _engine_config(short).speculative_config
    assert spec.draft_model_config.hf_config.specx_route == "dspark"
    assert spec.draft_model_config.max_model_len == 256
    raised = 512 if _vllm_minor() >= (0, 33) else 256
    assert spec.draft_model_config.hf_config.max_position_embeddings == raised


def test_gen_data_engine_args_reach_vllms_engine_config():
    """`gen-data --engine-args` (any EngineArgs field over vllm-specx's CPU defaults) is what vLLM's
    engine config receives, on each supported vLLM (0.33 by scripts/check_vllm033.sh); a field
    the installed vLLM does not have is refused by name."""
    import torch
    from vllm.engine.arg_utils import EngineArgs

    from vllm_specx.engine import CPU_ENGINE_ARGS, engine_args

    args = engine_args({"dtype": "bfloat16", "max_model_len": 256, "gpu_memory_utilization": 0.25,
                        "max_num_seqs": 7})
    assert args["enforce_eager"] == CPU_ENGINE_ARGS["enforce_eager"]  # the defaults stay under
    cfg = EngineArgs(model=str(REF_TARGET), **args).create_engine_config()
    assert cfg.model_config.dtype == torch.bfloat16 and cfg.model_config.max_model_len == 256
    assert cfg.cache_config.gpu_memory_utilization == 0.25 and cfg.scheduler_config.max_num_seqs == 7
    assert engine_args({"tensor_parallel_size": 2})["tensor_parallel_size"] == 2  # passed through as given
    with pytest.raises(ValueError, match=r"\['not_an_engine_arg'\] are not fields of this vLLM's EngineArgs"):
        engine_args({"not_an_engine_arg": 1})


def test_gen_data_refuses_bad_device_and_engine_args_before_any_work(tmp_path, capsys):
    import torch

    from vllm_specx.training.data import main

    base = ["--target", str(REF_TARGET), "--prompts", "train", "--limit", "2", "--out", str(tmp_path / "d")]
    with pytest.raises(SystemExit):
        main(base + ["--engine-args", '{"max_num_seqz": 4}'])
    assert "--engine-args: engine argument(s) ['max_num_seqz']" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            main(base + ["--device", "cuda", "--taps", "1"])
        assert "--device cuda: this torch build sees no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "d" / "tokens.jsonl").exists()
