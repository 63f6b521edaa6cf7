"""The committed DSpark head for the reference target: tau > 1.5 at k = 8 (its full block) on
held-out code, in vLLM on CPU, read from vLLM's own spec-decode counters; greedy output unchanged."""

import pytest

from vllm_specx.eval import run_configs

from ..helpers import ASSETS, REF_TARGET, load_prompts

pytestmark = pytest.mark.e2e
DRAFT = ASSETS / "drafts" / "ref-dspark"


def test_committed_dspark_head_reaches_tau_above_1_5():
    rows = run_configs(REF_TARGET, {"no-spec": None,
                        "dspark": {"method": "dspark", "model": str(DRAFT), "num_speculative_tokens": 8}},
                       load_prompts("code", limit=16), max_tokens=64)
    spec = rows[1]
    assert spec["greedy_output_identical"]
    assert spec["num_drafts"] > 0
    assert spec["tau"] > 1.5, spec
    # acceptance can only fall with depth: position k+1 is accepted only if position k was
    acc = spec["acceptance_per_pos"]
    assert len(acc) == 8 and all(a >= b for a, b in zip(acc, acc[1:]))
