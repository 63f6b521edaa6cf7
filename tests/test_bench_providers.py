"""The benchmark's providers turn into the speculative configs vLLM receives (no engine)."""

from vllm_specx import bench

from .helpers import ASSETS


def test_draft_sample_method_reaches_draft_providers_only():
    providers = [bench.parse_provider(m) for m in
                 ("no-spec", "ngram", f"eagle3={ASSETS / 'drafts' / 'ref-eagle3'}", str(ASSETS / "drafts" / "ref-dspark"))]
    greedy = [p.spec(7) for p in providers]
    assert greedy[0] is None and all("draft_sample_method" not in s for s in greedy[1:])  # vLLM's default
    sampled = [p.spec(7) for p in bench.with_draft_sample_method(providers, "probabilistic")]
    assert sampled[0] is None and "draft_sample_method" not in sampled[1]  # n-gram has no distribution
    assert [s["draft_sample_method"] for s in sampled[2:]] == ["probabilistic", "probabilistic"]
    assert [s["method"] for s in sampled[1:]] == ["ngram", "eagle3", "dspark"]
