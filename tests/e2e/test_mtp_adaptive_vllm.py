"""MTP with adaptive drafting (`adaptive: true`) end to end in vLLM on CPU, reference target and
its committed MTP draft: greedy output stays the no-spec output while drafts are cut per request
and whole passes are skipped (counters prove both); skipped passes' step-0 K/V, deferred and
written in one batch before the next draft pass, give exactly the drafts that vLLM's own eager
step 0 gives (negative control: dropping the queue changes them). The distribution test (T = 1
and top-p 0.9) is `test_lossless.py[mtp-adaptive-reduced-vocab]`. In CI (e2e): one engine
(cost-model mode: cuts and skipped passes) and a config-time refusal; the skipped-pass-heavy run,
the deferred-context test (3 engines) and the worker-side refusal are in the full tier."""

import pytest

from .. import helpers as T
from .conftest import ADAPTIVE
from vllm_specx.adaptive.controller import worker_summary

pytestmark = pytest.mark.e2e
DRAFT = str(T.ASSETS / "drafts" / "ref-mtp")
PARAMS = ADAPTIVE
K = 5


def _spec(**extra):
    return {"method": "mtp", "model": DRAFT, "num_speculative_tokens": K, "adaptive": True, **extra}


def _run(spec, prompts):
    with T.cpu_llm(T.REF_TARGET, speculative_config=spec) as llm:
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)]
        drafter = llm.collective_rpc(_drafter_stats)[0]
        return outs, T.spec_metrics(llm), llm.collective_rpc(worker_summary)[0], drafter


def _drafter_stats(worker) -> dict:
    return dict(worker.model_runner.drafter.stats)


def test_mtp_greedy_output_unchanged_while_drafts_are_cut_and_passes_skipped(adaptive_prompts, adaptive_nospec):
    """Cost-model mode on the committed draft: cuts (requests verify different lengths, fewer
    verified than drafted) and skipped passes (their step-0 K/V deferred, then flushed), vLLM's
    counters follow ours; greedy output = no-spec. One engine: CI's MTP adaptive guarantee."""
    outs, metrics, st, drafter = _run(_spec(adaptive_threshold=0.6, adaptive_max_skip=4), adaptive_prompts)
    assert outs == adaptive_nospec
    assert st is not None and st["confidence"] == "estimator" and st["draft_passes"] > 0, st
    assert sum(1 for c in st["verify_length_counts"] if c) >= 2, st["verify_length_counts"]
    assert st["verified_tokens"] < st["drafted_tokens"], st
    assert 0.85 * st["verified_tokens"] <= metrics["num_draft_tokens"] <= st["verified_tokens"], (metrics, st)
    assert metrics["num_accepted_tokens"] == st["realised_accepted"], (metrics, st)
    assert "target_ms" in st["costs"], st
    assert st["skipped_passes"] > 0 and drafter["deferred_tokens"] > 0 and drafter["context_flushes"] > 0, \
        (st, drafter)


@pytest.mark.full
def test_mtp_skipped_passes_defer_step0_and_drafting_resumes(adaptive_prompts, adaptive_nospec):
    """A threshold no draft reaches: most passes are skipped (their step-0 K/V queued and
    flushed), probes still draft; output = no-spec."""
    outs, metrics, st, drafter = _run(_spec(adaptive_threshold=0.999, adaptive_max_skip=4), adaptive_prompts)
    assert outs == adaptive_nospec
    assert st["skipped_passes"] > st["draft_passes"] > 0, st
    assert drafter["deferred_tokens"] > 0 and drafter["context_flushes"] > 0, drafter
    assert metrics.get("num_draft_tokens", 0) <= st["verified_tokens"]


@pytest.fixture(scope="module")
def scheduled_drafts(adaptive_prompts):
    return T.scheduled_runs(T.REF_TARGET, _spec(adaptive_cost_model=False, adaptive_threshold=0.0),
                            adaptive_prompts, PARAMS)


@pytest.mark.full
def test_mtp_skipped_passes_step0_kv_is_deferred_exactly(scheduled_drafts, adaptive_nospec):
    """Every draft pass drafts what it drafts when each skipped pass runs vLLM's step 0 at once;
    dropping the queue (negative control) changes the drafts; output = no-spec in all three."""
    eager, deferred, lost = (scheduled_drafts[c] for c in ("eager", "deferred", "lost"))
    for outs, _, _ in (eager, deferred, lost):
        assert outs == adaptive_nospec
    assert deferred[2]["deferred_tokens"] > 0 and deferred[2]["context_flushes"] > 0, deferred[2]
    assert "deferred_tokens" not in eager[2]
    assert len(deferred[1]) == len(eager[1]) > 10
    assert deferred[1] == eager[1]
    same = sum(a == b for a, b in zip(lost[1], eager[1]))
    assert same < 0.5 * len(eager[1]), (same, len(eager[1]))


@pytest.mark.parametrize("extra, field", [
    pytest.param({"adaptive_confidence": "head"}, "adaptive_confidence", marks=pytest.mark.full),  # an engine start
    ({"adaptive_max_skip": 0}, "adaptive_max_skip"),
])
def test_mtp_adaptive_settings_it_cannot_honour_are_refused_by_name(extra, field):
    with pytest.raises(Exception) as err:
        with T.cpu_llm(T.REF_TARGET, speculative_config=_spec(**extra)):
            pass
    msg = str(err.value)
    assert "vllm-specx" in msg and field in msg, msg
