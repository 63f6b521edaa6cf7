"""The committed drafts for the reference target, in vLLM on CPU, on held-out code, read from
vLLM's own spec-decode counters, greedy output unchanged: our DSpark head (tau > 1.5 at k = 8, its
full block) and the EAGLE-3 baseline trained on the same data, served by vLLM's built-in `eagle3`
(tau > 1.5 at k = 7), and our MTP layer (GLM-5.2 recipe: chain TV, KVShare; tau > 1.5 at k = 7)."""

import pytest

from vllm_specx.bench.eval import run_configs

from ..helpers import ASSETS, REF_TARGET, load_prompts

pytestmark = [pytest.mark.e2e, pytest.mark.full]  # guards the committed assets (full tier)
DRAFT = ASSETS / "drafts" / "ref-dspark"
EAGLE3 = ASSETS / "drafts" / "ref-eagle3"
MTP = ASSETS / "drafts" / "ref-mtp"


CONFIGS = {"dspark": {"method": "dspark", "model": str(DRAFT), "num_speculative_tokens": 8},
           "eagle3": {"method": "eagle3", "model": str(EAGLE3), "num_speculative_tokens": 7},
           "mtp": {"method": "mtp", "model": str(MTP), "num_speculative_tokens": 7}}


def test_committed_drafts_reach_tau_above_1_5(nospec_tokens):
    rows = run_configs(REF_TARGET, CONFIGS, load_prompts("code", limit=16), max_tokens=64)
    for spec, k in zip(rows, (8, 7, 7)):
        assert spec["outputs"] == nospec_tokens(16, 64), spec  # the session's no-spec engine (conftest.py)
        assert spec["num_drafts"] > 0
        assert spec["tau"] > 1.5, spec
        # acceptance can only fall with depth: position k+1 is accepted only if position k was
        acc = spec["acceptance_per_pos"]
        assert len(acc) == k and all(a >= b for a, b in zip(acc, acc[1:])), spec
