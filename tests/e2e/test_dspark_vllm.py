"""End to end in vLLM on CPU: `method: "dspark"` runs our proposer in the worker, its drafts equal
the pure-PyTorch reference, greedy output equals no-spec output, and a random head gives tau ~ 1."""

import pytest
from vllm import SamplingParams

from .. import helpers as T
from ..helpers import random_draft, reference_drafts, write
from vllm_specx.methods.dspark.config import RECIPE

from .conftest import GREEDY  # target, prompts, nospec_outputs: fixtures of conftest.py

pytestmark = pytest.mark.e2e
NDRAFTS = {"specx": 8, "speculators": 7}  # a full block of 8 (anchor layout); 8 - 1 (fill-in)


def _check_drafts_match_reference(llm, target, draft, prompt, n):
    """Run one request alone and compare every draft pass with the reference on the same prefix."""
    llm.collective_rpc(T.record_drafts)
    out = llm.generate([prompt], GREEDY)[0]
    seq = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
    records = llm.collective_rpc(T.read_drafts)[0]
    assert records, "DSparkProposer produced no drafts"
    p = len(out.prompt_token_ids)
    checked = 0
    for anchors, drafts in records[:4]:
        # A random head never gets a draft accepted, so pass j's anchor is generated token j.
        pos = p + checked
        assert anchors == [seq[pos]]
        assert len(drafts[0]) == n
        assert drafts[0] == reference_drafts(target, draft, seq[:pos], seq[pos], n)
        checked += 1
    return out


# case -> (checkpoint format, anchor layout, recipe switches). "recipe-fill-in": the full recipe
# (final-layer tap, per-layer fusion, per-slot queries, recurrent head) in DFlash's fill-in layout;
# the anchor layout with block 16 is covered by test_draft_probs. "speculators" is full-tier: CI
# covers the fill-in layout here ("recipe-fill-in") and speculators checkpoints in vLLM in
# test_speculators_vllm.py.
CASES = {"specx": ("specx", True, {}), "speculators": ("speculators", False, {}),
         "recipe-fill-in": ("specx", False, RECIPE),
         # the next-token stream: each context row's x_{t+1} (the bonus token for the last accepted
         # row) built by the proposer; fused into the context, and added beside per-layer mixtures
         "next-token-fused": ("specx", True, {"next_token_stream": "fused"}),
         "next-token-added-fusion": ("specx", True, {"next_token_stream": "added", "per_layer_fusion": True})}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.full) if c == "speculators" else c
                                  for c in CASES])
def test_dspark_proposer_runs_in_worker_and_matches_reference(tmp_path, target, prompts,
                                                              nospec_outputs, case):
    fmt, anchor, recipe = CASES[case]
    draft = random_draft(target, anchor=anchor, layers=2, **recipe)  # layer 2 has its own norms
    n = NDRAFTS["specx" if anchor else "speculators"]
    spec = {"method": "dspark", "model": write(draft, tmp_path / case, fmt), "num_speculative_tokens": n,
            "draft_sample_method": "probabilistic" if case == "specx" else "greedy"}
    with T.cpu_llm(T.REF_TARGET, speculative_config=spec) as llm:
        assert llm.collective_rpc(T.drafter_class) == ["vllm_specx.methods.dspark.proposer.DSparkProposer"]
        _check_drafts_match_reference(llm, target, draft, prompts[0], n)
        assert llm.collective_rpc(T.drafter_stats)[0]["query_slots"] == 8  # the training block
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
        metrics = T.spec_metrics(llm)
        sampler = llm.collective_rpc(T.rejection_sampler_info)[0]
        assert sampler["class"] == "SpecxRejectionSampler" and sampler["calls"] > 0  # our verifier
        if case == "specx":
            _check_draft_probs_reach_rejection_sampler(llm, prompts)
    assert outs == nospec_outputs  # greedy speculative decoding is lossless
    assert metrics["num_drafts"] > 0
    assert metrics["tau"] < 1.1  # a random head is (almost) never right


def _check_draft_probs_reach_rejection_sampler(llm, prompts):
    """With probabilistic drafting at T > 0 the sampled drafts' distributions reach vLLM's sampler."""
    llm.collective_rpc(T.spy_rejection_sampler)
    assert llm.collective_rpc(T.drafter_stats)[0]["probabilistic_calls"] == 0  # T=0 so far: greedy
    llm.generate(prompts[:2], SamplingParams(temperature=0.8, max_tokens=8, seed=1))
    assert llm.collective_rpc(T.drafter_stats)[0]["probabilistic_calls"] > 0
    seen = llm.collective_rpc(T.read_rejection_spy)[0]
    shapes = [s for s in seen if s is not None]
    assert shapes, f"rejection sampler never received draft probabilities: {seen}"
    assert all(s[0] > 0 and s[1] == 4096 for s in shapes)  # [num_draft_tokens, vocab]
