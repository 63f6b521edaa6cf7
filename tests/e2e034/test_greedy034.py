"""Our committed DSpark and MTP drafts in vLLM 0.34's `LLM` (V2 model runner, CPU): greedy output
identical to no-spec, read with vLLM's own spec-decode counters (drafts were made and accepted, so
the identity is not vacuous), on the reference target and on SmolLM2; with prefix caching and
chunked prefill; with vLLM's dynamic speculative decoding (K by batch size).

Negative control: vLLM's synthetic rejection sampler accepts drafts whatever the target says; the
same comparison then fails, so it can catch a verifier that breaks the target's distribution.
"""

import pytest
from vllm import SamplingParams

from vllm_specx.bench.eval import generate_measured

from .. import helpers as T
from .conftest import MAX_TOKENS, spec

pytestmark = pytest.mark.e2e034
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
CASES = [("smollm2", "dspark"), ("smollm2", "mtp"), ("ref", "dspark"), ("ref", "mtp")]
CI = {("smollm2", "dspark"), ("smollm2", "mtp")}  # the cases .ci/run runs (marker e2e034_ci)


def served(target_dir, name: str, prompts, speculative_config, **engine) -> dict:
    with T.cpu_llm(target_dir(name), speculative_config, **engine) as llm:
        return generate_measured(llm, prompts, GREEDY)


@pytest.mark.parametrize("name,method", [pytest.param(*c, marks=pytest.mark.e2e034_ci) if c in CI else c
                                         for c in CASES], ids=[f"{t}-{m}" for t, m in CASES])
def test_greedy_identical_to_nospec(target_dir, prompts, nospec, name, method):
    got = served(target_dir, name, prompts(name), spec(name, method))
    assert got["num_drafts"] > 0 and got["num_accepted_tokens"] > 0, got
    assert got["outputs"] == nospec(name)
    assert got["tau"] > 1.2, got["tau"]  # the committed drafts accept well above chance here


def test_negative_control_a_lossy_verifier_is_caught(target_dir, prompts, nospec):
    """vLLM's synthetic sampler accepts ~every draft (mean acceptance length K + 1): greedy output
    then differs from no-spec, and the identity check above would fail."""
    got = served(target_dir, "ref", prompts("ref"), spec("ref", "dspark", rejection_sample_method="synthetic",
                                                         synthetic_acceptance_length=8.0))
    assert got["tau"] > 7.5
    assert got["outputs"] != nospec("ref")


@pytest.mark.parametrize("method", ["dspark", "mtp"])
def test_prefix_caching_and_chunked_prefill(target_dir, method):
    """Prompts sharing a long prefix, served twice, with a 32-token step budget: prefills are cut
    into chunks, the second round hits the prefix cache, and greedy output equals no-spec's."""
    base = " ".join(T.load_prompts("code", limit=6))  # a shared prefix well over 32 tokens
    ask = [f"{base}\n# {i}: " for i in range(3)]
    engine = dict(enable_prefix_caching=True, enable_chunked_prefill=True, max_num_batched_tokens=32,
                  max_num_seqs=4)
    with T.cpu_llm(target_dir("ref"), **engine) as llm:
        want = [list(o.outputs[0].token_ids) for o in llm.generate(ask, GREEDY, use_tqdm=False)]
    with T.cpu_llm(target_dir("ref"), spec("ref", method), **engine) as llm:
        first = generate_measured(llm, ask, GREEDY)
        second = generate_measured(llm, ask, GREEDY)
        hits = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}.get("vllm:prefix_cache_hits", 0)
    assert first["outputs"] == want and second["outputs"] == want
    assert first["num_accepted_tokens"] > 0 and second["num_accepted_tokens"] > 0
    assert hits > 0, "no prefix-cache hit: the second round did not reuse the cached prefix"


@pytest.mark.parametrize("method", ["dspark", "mtp"])
def test_dynamic_speculative_decoding_serves_our_drafts(target_dir, prompts, nospec, method):
    """vLLM 0.34's K-by-batch-size schedule (`num_speculative_tokens_per_batch_size`) with our
    speculators: K 7 for one request, 2 for larger batches. The four prompts run as a batch, then
    one alone: the drafts per pass (vLLM's counters) follow the schedule and greedy output stays."""
    schedule = [[1, 1, 7], [2, 256, 2]]
    cfg = spec("ref", method, num_speculative_tokens_per_batch_size=schedule)
    with T.cpu_llm(target_dir("ref"), cfg) as llm:
        batch = generate_measured(llm, prompts("ref"), GREEDY)
        alone = generate_measured(llm, prompts("ref")[:1], GREEDY)
    assert batch["outputs"] == nospec("ref") and alone["outputs"] == nospec("ref")[:1]
    per_pass = lambda r: r["num_draft_tokens"] / r["num_drafts"]  # noqa: E731
    assert per_pass(alone) == 7
    assert per_pass(batch) < 4, per_pass(batch)  # mostly K 2 (the batch's tail runs alone: K 7)
