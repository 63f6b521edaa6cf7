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


def test_engine_config_keeps_our_drafts_on_the_v1_runner(drafts):
    from vllm.engine.arg_utils import EngineArgs

    cfg = EngineArgs(model=str(REF_TARGET), dtype="float32", max_model_len=512, enforce_eager=True,
                     speculative_config={"method": "dspark", "model": drafts["specx"]}
                     ).create_engine_config()
    spec = cfg.speculative_config
    assert spec.draft_model_config.hf_config.specx_route == "dspark"
    assert spec.num_speculative_tokens == 7  # defaults to the checkpoint's block - 1
    assert spec.draft_model_config.architectures == ["SpecxDSparkModel"]
    assert any("vllm-specx" in f for f in cfg._get_v2_model_runner_unsupported_features())
    assert cfg.use_v2_model_runner is False
