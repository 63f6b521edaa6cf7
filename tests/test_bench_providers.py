"""The benchmark's providers turn into the speculative configs vLLM receives (no engine)."""

from vllm_specx.bench import e2e as bench

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


def test_a_provider_can_choose_its_own_draft_sample_method():
    import pytest

    d = ASSETS / "drafts" / "ref-dspark"
    texts = [f"a={d}@probabilistic", f"b={d}", f"c={d}@greedy"]
    providers = [bench.parse_provider(t) for t in texts]
    assert [p.draft_sample_method for p in providers] == ["probabilistic", "greedy", "greedy"]
    assert providers[0].spec(7)["draft_sample_method"] == "probabilistic" and providers[0].model == str(d)
    # a global --draft-sample-method leaves the providers that chose their own alone
    out = bench.with_draft_sample_method(providers, "probabilistic", keep={"a", "c"})
    assert [p.draft_sample_method for p in out] == ["probabilistic", "probabilistic", "greedy"]
    with pytest.raises(ValueError, match="@sampled"):
        bench.parse_provider(f"x={d}@sampled")


def test_builtin_eagle3_providers_may_carry_a_label():
    e = ASSETS / "drafts" / "ref-eagle3"
    p = bench.parse_provider(f"eagle3-prob={e}@probabilistic")
    assert (p.label, p.method, p.draft_sample_method) == ("eagle3-prob", "eagle3", "probabilistic")
    d = bench.parse_provider(f"eagle3-like={ASSETS / 'drafts' / 'ref-dspark'}")  # a draft of ours stays ours
    assert d.method == "dspark"


def test_adaptive_providers_and_repeats():
    import pytest

    d = ASSETS / "drafts" / "ref-dspark"
    p = bench.parse_provider(f"dspark-adaptive={d}+adaptive@probabilistic")
    assert p.adaptive and p.model == str(d) and p.label == "dspark-adaptive"
    assert p.spec(7) == {"method": "dspark", "model": str(d), "num_speculative_tokens": 7,
                         "draft_sample_method": "probabilistic", "adaptive": True}
    assert "adaptive" not in bench.parse_provider(f"fixed={d}").spec(7)
    with pytest.raises(ValueError, match="adaptive"):
        bench.parse_provider(f"eagle3={ASSETS / 'drafts' / 'ref-eagle3'}+adaptive")
    rows = [{"provider": "a", "k": 7, "batch_size": 1, "temperature": 0.0, "tokens_per_s": v, "tau": t}
            for v, t in ((10.0, 2.0), (30.0, 3.0), (20.0, None))]
    merged = bench.merge_repeats(rows)
    assert len(merged) == 1 and merged[0]["tokens_per_s"] == 20.0 and merged[0]["tau"] == 2.5
    assert merged[0]["tokens_per_s_runs"] == [10.0, 30.0, 20.0]


def test_learning_curve_providers_are_trainer_flag_sets():
    """Every provider of `benchmarks/bench_learning_curve.py`, with the common budget, parses as a
    `vllm-specx train` command line of its method (a renamed or removed flag fails here)."""
    import argparse
    import importlib.util
    import sys
    from pathlib import Path

    from vllm_specx.training import trainer

    spec = importlib.util.spec_from_file_location("bench_learning_curve", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_learning_curve.py")
    lc = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_learning_curve", lc)
    spec.loader.exec_module(lc)
    args = argparse.Namespace(steps=10, batch=2, seq_len=64, anchors=4, lr=1e-3, val_samples=4, seed=0, k=7,
                              target="smollm2", data="d", eval_data=["e1", "e2"], draft_vocab=None)
    methods = set()
    for name in lc.PROVIDERS:
        argv = lc.command(args, name, 100, "out")[2:]  # after `vllm-specx train`
        parsed = trainer.parse_args(argv)
        assert parsed.train_samples == 100 and parsed.eval_data == ["e1", "e2"] and parsed.eval_drafts == 7
        assert parsed.steps == 10 and parsed.batch == 2 and parsed.anchors == 4  # the same budget for all
        methods.add(parsed.method)
    assert methods == {"dspark", "mtp", "eagle3"}


def test_suffix_provider_is_vllms_suffix_method():
    p = bench.parse_provider("suffix")
    assert p.label == "suffix" and p.model is None
    assert p.spec(7) == {"method": "suffix", "num_speculative_tokens": 7}
    # no draft distribution: the draft_sample_method switch leaves it alone
    assert bench.with_draft_sample_method([p], "probabilistic")[0].spec(7) == p.spec(7)
