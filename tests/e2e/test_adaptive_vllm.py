"""Confidence-scheduled drafting (`adaptive: true`) end to end in vLLM on CPU, reference target:
greedy output stays the no-spec output while drafts are cut per request and whole passes are
skipped; vLLM's own spec-decode counters count the verified drafts, ours the drafted ones; the
confidence comes from the draft's head when it has one; bad settings are refused by name.
The distribution test with adaptive drafting on is in `test_lossless.py`. The no-spec reference is
the session's (`nospec_tokens`, conftest.py). In the e2e tier: threshold mode and skipped passes;
the cost-model mode, the deferred context (3 engines) and the confidence head are in the full tier."""

import pytest

from .. import helpers as T
from .conftest import ADAPTIVE
from ..helpers import random_draft, write
from vllm_specx.adaptive.controller import worker_summary

pytestmark = pytest.mark.e2e
DRAFT = str(T.ASSETS / "drafts" / "ref-dspark")
PARAMS = ADAPTIVE
K = 7


def _run(spec_extra, prompts, draft=DRAFT):
    spec = {"method": "dspark", "model": draft, "num_speculative_tokens": K, **spec_extra}
    with T.cpu_llm(T.REF_TARGET, speculative_config=spec) as llm:
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)]
        return outs, T.spec_metrics(llm), llm.collective_rpc(worker_summary)[0]


@pytest.mark.parametrize("mode", ["threshold", pytest.param("cost-model", marks=pytest.mark.full)])
def test_greedy_output_unchanged_while_drafts_are_cut(mode, adaptive_prompts, adaptive_nospec):
    extra = ({"adaptive": True, "adaptive_cost_model": False, "adaptive_threshold": 0.5}
             if mode == "threshold" else {"adaptive": True})
    outs, metrics, st = _run(extra, adaptive_prompts)
    assert outs == adaptive_nospec
    assert st is not None and st["confidence"] == "estimator" and st["draft_passes"] > 0
    lengths = st["verify_length_counts"]
    assert sum(1 for c in lengths if c) >= 2, lengths  # requests got different lengths
    assert st["verified_tokens"] < st["drafted_tokens"], st  # drafts were cut
    # vLLM's counter of drafts sent to verification follows ours of drafts kept after the cut
    # (not the drafted ones); vLLM itself drops those past a request's max_tokens at its end.
    assert 0.85 * st["verified_tokens"] <= metrics["num_draft_tokens"] <= st["verified_tokens"], (metrics, st)
    assert metrics["num_accepted_tokens"] == st["realised_accepted"], (metrics, st)
    if mode == "cost-model":
        assert "target_ms" in st["costs"] and st["costs"]["steps_observed"] > 10, st["costs"]


def test_skipped_passes_keep_output_and_drafting_resumes(adaptive_prompts, adaptive_nospec):
    """A threshold no draft reaches makes every plan 'does not pay': passes are skipped with
    back-off (the draft's context cache still written), probes still draft."""
    outs, metrics, st = _run({"adaptive": True, "adaptive_threshold": 0.999, "adaptive_max_skip": 4},
                             adaptive_prompts)
    assert outs == adaptive_nospec
    assert st["skipped_passes"] > st["draft_passes"] > 0, st
    assert metrics.get("num_draft_tokens", 0) <= st["verified_tokens"]


@pytest.fixture(scope="module")
def scheduled_drafts(adaptive_prompts):
    """Per context mode: outputs, the drafts of every draft pass, drafter counters, with a
    draft pass on every 3rd step only (threshold mode: every draft of a pass is kept)."""
    spec = {"method": "dspark", "model": DRAFT, "num_speculative_tokens": K, "adaptive": True,
            "adaptive_cost_model": False, "adaptive_threshold": 0.0}
    return T.scheduled_runs(T.REF_TARGET, spec, adaptive_prompts, PARAMS)


@pytest.fixture(scope="module")
def scheduled_stream_drafts(tmp_path_factory, target, adaptive_prompts):
    """`scheduled_drafts` for a random draft with the next-token stream: the deferred writes must
    carry each row's next token (the bonus token for a pass's last accepted row)."""
    path = write(random_draft(target, next_token_stream="fused"), tmp_path_factory.mktemp("stream") / "d")
    spec = {"method": "dspark", "model": path, "num_speculative_tokens": K, "adaptive": True,
            "adaptive_cost_model": False, "adaptive_threshold": 0.0}
    return T.scheduled_runs(T.REF_TARGET, spec, adaptive_prompts, PARAMS)


@pytest.mark.full
@pytest.mark.parametrize("runs", ["scheduled_drafts", "scheduled_stream_drafts"])
def test_skipped_passes_context_is_deferred_exactly(runs, request, adaptive_nospec):
    """Skipped passes queue their context K/V and the next draft pass writes them in one batch:
    every draft pass then drafts what it drafts when each skipped pass writes at once through
    vLLM's own DFlash input path (same context, same cache). Dropping the queue (negative
    control) changes the drafts; the output is the no-spec output in all three. The committed
    draft, and a draft whose context rows carry the next-token stream."""
    scheduled_drafts = request.getfixturevalue(runs)
    eager, deferred, lost = (scheduled_drafts[c] for c in ("eager", "deferred", "lost"))
    for outs, _, _ in (eager, deferred, lost):
        assert outs == adaptive_nospec
    assert deferred[2]["deferred_tokens"] > 0 and deferred[2]["context_flushes"] > 0, deferred[2]
    assert len(deferred[1]) == len(eager[1]) > 10
    assert deferred[1] == eager[1]
    same = sum(a == b for a, b in zip(lost[1], eager[1]))
    assert same < 0.5 * len(eager[1]), (same, len(eager[1]))


@pytest.mark.full
def test_draft_with_a_confidence_head_uses_it(tmp_path, target, adaptive_prompts, adaptive_nospec):
    draft = random_draft(target, confidence_head="hidden+markov")
    path = write(draft, tmp_path / "conf")
    outs, _, st = _run({"adaptive": True, "adaptive_confidence": "head"}, adaptive_prompts, path)
    assert outs == adaptive_nospec and st["confidence"] == "head" and st["draft_passes"] > 0
    # the estimator is not trained when the head scores the drafts
    assert "estimator" not in st


@pytest.mark.parametrize("spec, field", [
    ({"method": "dspark", "model": DRAFT, "num_speculative_tokens": K, "adaptive": True,
      "adaptive_confidence": "head"}, "adaptive_confidence"),
    ({"method": "dspark", "model": DRAFT, "num_speculative_tokens": K, "adaptive_threshold": 0.2},
     "need 'adaptive': true"),
    ({"method": "dspark", "model": DRAFT, "num_speculative_tokens": K, "adaptive": True,
      "adaptive_max_skip": -1}, "adaptive_max_skip"),
    ({"method": "eagle3", "model": str(T.ASSETS / "drafts" / "ref-eagle3"), "num_speculative_tokens": K,
      "adaptive": True}, "adaptive drafting is implemented for method"),
    ({"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "adaptive": True},
     "adaptive drafting is implemented for method"),
])
def test_unsupported_adaptive_settings_are_refused_by_name(spec, field):
    with pytest.raises(Exception) as err:
        with T.cpu_llm(T.REF_TARGET, speculative_config=spec):
            pass
    msg = str(err.value)
    assert "vllm-specx" in msg and field in msg and "\n" not in msg.strip(), msg
