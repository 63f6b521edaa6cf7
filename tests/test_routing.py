"""Which drafts vllm-specx takes over (routing.choose) and the engine config that results."""

import pytest

from vllm_specx import registry as routing
from vllm_specx.methods.dspark import UPSTREAM_ENV

from .helpers import REF_TARGET, load_target, random_draft, write


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    target = load_target(REF_TARGET)
    d = random_draft(target)
    root = tmp_path_factory.mktemp("drafts")
    return {fmt: write(d, root / fmt, fmt) for fmt in ("specx", "speculators")}


@pytest.mark.parametrize("v2", [False, True])
def test_our_checkpoints_always_take_our_route(drafts, v2):
    route, cfg = routing.choose("dspark", drafts["specx"], v2_would_run=v2)
    assert route.proposer_cls.endswith("DSparkProposer") and cfg.source_format == "specx"


def test_upstream_checkpoints_go_to_vllm_on_v2_unless_opted_in(drafts, monkeypatch):
    assert routing.choose("dspark", drafts["speculators"], v2_would_run=False) is not None
    assert routing.choose("dspark", drafts["speculators"], v2_would_run=True) is None
    monkeypatch.setenv(UPSTREAM_ENV, "specx")
    assert routing.choose("dspark", drafts["speculators"], v2_would_run=True) is not None
    monkeypatch.setenv(UPSTREAM_ENV, "vllm")
    assert routing.choose("dspark", drafts["speculators"], v2_would_run=False) is None
    monkeypatch.setenv(UPSTREAM_ENV, "bogus")
    with pytest.raises(ValueError, match=UPSTREAM_ENV):
        routing.choose("dspark", drafts["speculators"], v2_would_run=False)


def test_other_methods_are_left_to_vllm(drafts):
    assert routing.choose("eagle3", drafts["specx"], v2_would_run=False) is None
    assert routing.choose("dspark", "some-org/some-hub-model", v2_would_run=False) is None


def _engine_config(speculative_config=None):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(REF_TARGET), dtype="float32", max_model_len=512, enforce_eager=True,
                      speculative_config=speculative_config).create_engine_config()


def test_engine_config_routes_our_drafts(drafts):
    cfg = _engine_config({"method": "dspark", "model": drafts["specx"]})
    spec = cfg.speculative_config
    assert spec.draft_model_config.hf_config.specx_route == "dspark"
    assert spec.num_speculative_tokens == 8  # defaults to the checkpoint's full block (anchor layout)
    assert spec.draft_model_config.architectures == ["SpecxDSparkModel"]
    assert any("vllm-specx" in f for f in cfg._get_v2_model_runner_unsupported_features())


@pytest.fixture
def v2_platform(monkeypatch):
    """Make this CPU process look like a platform where vLLM picks Model Runner V2: VllmConfig's
    `use_v2_model_runner` returns VLLM_USE_V2_MODEL_RUNNER when set, else False without Triton,
    else False when `_get_v2_model_runner_unsupported_features()` lists anything, else True."""
    import vllm.config.vllm
    import vllm.triton_utils

    import vllm_specx

    vllm_specx.register()  # imports the vLLM modules it patches with the real HAS_TRITON
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    monkeypatch.setattr(vllm.config.vllm, "HAS_TRITON", True)
    monkeypatch.setattr(vllm.triton_utils, "HAS_TRITON", True)  # what route.v2_would_run reads


def test_v2_platform_control_picks_v2_without_a_draft(v2_platform):
    """Negative control: the simulation really makes vLLM pick V2 (else the next test is void)."""
    assert _engine_config().use_v2_model_runner is True


def test_our_drafts_stay_on_v1_where_v2_would_run(drafts, v2_platform):
    cfg = _engine_config({"method": "dspark", "model": drafts["specx"]})
    assert cfg.speculative_config.draft_model_config.hf_config.specx_route == "dspark"
    assert cfg.use_v2_model_runner is False


def test_without_the_keep_v1_patch_our_drafts_would_go_to_v2(drafts, v2_platform, monkeypatch):
    """Negative control: the same config with the keep-v1 patch reverted runs on V2."""
    from vllm.config.vllm import VllmConfig

    patched = VllmConfig._get_v2_model_runner_unsupported_features
    monkeypatch.setattr(VllmConfig, "_get_v2_model_runner_unsupported_features", patched.__wrapped__)
    cfg = _engine_config({"method": "dspark", "model": drafts["specx"]})
    assert cfg.speculative_config.draft_model_config.hf_config.specx_route == "dspark"
    assert cfg.use_v2_model_runner is True
