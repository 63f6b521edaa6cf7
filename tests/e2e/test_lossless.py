"""Speculative decoding in vLLM on CPU samples exactly the target's distribution.

For one held-out prompt, N continuations of L tokens are sampled at temperature 1 (and with
top-p 0.9) without speculation and with each speculative config. At every position t the
marginal distribution of the token at t must be the same (lossless verification keeps the whole
joint distribution, so every marginal too). Two-sample chi-square on a contingency table per
position (categories with fewer than 5 expected counts pooled); the family of L positions x 2
sampling settings is Bonferroni-corrected at alpha = 1e-4, so a correct sampler fails a config
with probability < 1e-4. vLLM's built-in sampler with the CPU expand repair switched off must
fail the same test (p far below alpha): the test can fail.

Which verifier ran is proven from inside the worker, with the same engines: our
SpecxRejectionSampler counts the acceptance op's completed calls per method actually passed to
it, so the block config must show block calls (and no token-wise ones), the token-wise configs
the reverse, and every verification step of our proposers (DSpark, MTP) must be one of our
op's calls.

The e2e tier runs no-spec and three configs, one per verifier path: DSpark with block verification
(our op's block path), adaptive MTP with a reduced draft vocabulary (our op's token-wise path, with
drafts cut, passes skipped and q scattered from a draft vocabulary), and vLLM's n-gram with vLLM's
sampler (the CPU expand repair on); the full tier adds the other eight configs (adaptive DSpark,
DSpark's reduced vocabulary, EAGLE-3, ...) and the negative control.
"""

import pytest
import torch

from .. import helpers as T
from ..helpers import load_target, write_eagle3_head
from vllm_specx.adaptive.controller import worker_summary

pytestmark = pytest.mark.e2e
N, L = 2000, 4
ALPHA = 1e-4
SETTINGS = {"t1": dict(temperature=1.0), "top_p": dict(temperature=1.0, top_p=0.9)}


def _sample(spec, monkeypatch, repair="1", sampler="specx") -> dict[str, list[list[int]]]:
    from vllm import SamplingParams

    monkeypatch.setenv("VLLM_SPECX_REPAIR_CPU_EXPAND", repair)
    monkeypatch.setenv("VLLM_SPECX_SAMPLER", sampler)
    prompt = T.load_prompts("code", limit=1)[0]
    out = {}
    with T.cpu_llm(T.REF_TARGET, speculative_config=spec, max_num_seqs=256) as llm:
        for name, kw in SETTINGS.items():
            res = llm.generate([prompt] * N, SamplingParams(max_tokens=L, ignore_eos=True, **kw), use_tqdm=False)
            out[name] = [list(r.outputs[0].token_ids) for r in res]
        out["tau"] = T.spec_metrics(llm)["tau"]
        out["verifier"] = llm.collective_rpc(T.sampler_counters)[0]
        out["adaptive"] = llm.collective_rpc(worker_summary)[0]
    return out


def _two_sample_p(ca: dict, cb: dict) -> float:
    """Chi-square test that two token histograms come from one distribution; categories with
    fewer than 10 counts in total are pooled so every expected count is >= ~5."""
    rows, pooled = [], [0, 0]
    for k in set(ca) | set(cb):
        pair = [ca.get(k, 0), cb.get(k, 0)]
        if sum(pair) >= 10:
            rows.append(pair)
        else:
            pooled = [pooled[0] + pair[0], pooled[1] + pair[1]]
    if sum(pooled):
        rows.append(pooled)
    if len(rows) < 2:
        return 1.0
    obs = torch.tensor(rows, dtype=torch.float64)
    exp = obs.sum(1, keepdim=True) * obs.sum(0, keepdim=True) / obs.sum()
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = len(rows) - 1
    return torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2).item()


def _min_p_value(a: list[list[int]], b: list[list[int]]) -> float:
    """Smallest per-position p-value between two sets of sampled continuations."""
    ps = []
    for t in range(L):
        ca, cb = {}, {}
        for seq in a:
            ca[seq[t]] = ca.get(seq[t], 0) + 1
        for seq in b:
            cb[seq[t]] = cb.get(seq[t], 0) + 1
        ps.append(_two_sample_p(ca, cb))
    return min(ps)


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    root = tmp_path_factory.mktemp("lossless")
    target = load_target(T.REF_TARGET)
    return {"dspark": str(T.ASSETS / "drafts" / "ref-dspark"),
            "dspark-reduced": T.reduced_ref_dspark(root / "dspark-reduced")[0],
            "mtp": str(T.ASSETS / "drafts" / "ref-mtp"),
            "mtp-reduced": T.reduced_ref_mtp(root / "mtp-reduced")[0],
            "eagle3": write_eagle3_head(target, root / "eagle3")}


@pytest.fixture(scope="module")
def nospec():
    mp = pytest.MonkeyPatch()
    try:
        return _sample(None, mp)
    finally:
        mp.undo()


def _dspark(d, **kw):
    return {"method": "dspark", "model": d["dspark"], "num_speculative_tokens": 3, **kw}


CONFIGS = {
    "dspark-greedy-drafts": lambda d: _dspark(d),
    "dspark-probabilistic": lambda d: _dspark(d, draft_sample_method="probabilistic"),
    "dspark-probabilistic-block": lambda d: _dspark(d, draft_sample_method="probabilistic",
                                                    rejection_sample_method="block"),
    # adaptive drafting: each request's drafts cut by confidence (threshold only; the cost model)
    "dspark-adaptive-probabilistic": lambda d: _dspark(d, draft_sample_method="probabilistic", adaptive=True,
                                                       adaptive_cost_model=False, adaptive_threshold=0.5),
    "dspark-adaptive-block": lambda d: _dspark(d, draft_sample_method="probabilistic",
                                               rejection_sample_method="block", adaptive=True),
    # a reduced draft vocabulary (1,024 of 4,096 tokens): q is zero outside it
    "dspark-reduced-vocab": lambda d: {**_dspark(d, draft_sample_method="probabilistic"),
                                       "model": d["dspark-reduced"]},
    "mtp-probabilistic": lambda d: {"method": "mtp", "model": d["mtp"], "num_speculative_tokens": 3,
                                    "draft_sample_method": "probabilistic"},
    "mtp-reduced-vocab": lambda d: {"method": "mtp", "model": d["mtp-reduced"], "num_speculative_tokens": 3,
                                    "draft_sample_method": "probabilistic"},
    # MTP with adaptive drafting on the reduced-vocabulary draft: cuts, shorter chains and
    # skipped passes whose step-0 K/V are deferred, q scattered from the draft vocabulary
    "mtp-adaptive-reduced-vocab": lambda d: {"method": "mtp", "model": d["mtp-reduced"], "num_speculative_tokens": 3,
                                             "draft_sample_method": "probabilistic", "adaptive": True,
                                             "adaptive_cost_model": False, "adaptive_threshold": 0.5},
    "ngram-vllm-sampler": lambda d: {"method": "ngram", "num_speculative_tokens": 3,
                                     "prompt_lookup_max": 3, "prompt_lookup_min": 1},
    "eagle3-vllm-sampler": lambda d: {"method": "eagle3", "model": d["eagle3"], "num_speculative_tokens": 3,
                                      "draft_sample_method": "probabilistic"},
}


# CI (e2e) keeps one config per verifier path; MTP's proposer path is the same with and without a
# reduced vocabulary (the identity map) and with adaptive drafting off or on (no cut), so CI runs
# the reduced one with adaptive drafting, which also covers the token-wise path and a draft
# vocabulary for our op; DSpark's adaptive and reduced-vocabulary configs are full-tier (their
# greedy identity is in CI: test_adaptive_vllm.py, test_reduced_vocab_vllm.py).
FULL = {"dspark-greedy-drafts", "dspark-probabilistic", "dspark-adaptive-probabilistic", "eagle3-vllm-sampler",
        "mtp-probabilistic", "mtp-reduced-vocab", "dspark-adaptive-block", "dspark-reduced-vocab"}


def _tiered(names):
    """`names` as parameters, those of configs in `FULL` marked for the full tier."""
    return [pytest.param(n, marks=pytest.mark.full) if n in FULL else n for n in names]


_RUNS: dict[str, dict] = {}  # one engine per config, shared by the tests below


@pytest.fixture
def run(drafts, monkeypatch):
    def get(name: str) -> dict:
        if name not in _RUNS:
            _RUNS[name] = _sample(CONFIGS[name](drafts), monkeypatch)
        return _RUNS[name]
    return get


@pytest.mark.parametrize("name", _tiered(CONFIGS))
def test_spec_decode_matches_nospec_distribution(name, nospec, run):
    got = run(name)
    for setting in SETTINGS:
        p = _min_p_value(nospec[setting], got[setting])
        assert p > ALPHA / (L * len(SETTINGS)), f"{name} {setting}: min p = {p:.3g} (tau {got['tau']})"


OURS = [n for n in CONFIGS if n.startswith(("dspark", "mtp"))]  # our proposers: our sampler verifies


def _op_calls(got: dict, name: str) -> dict:
    v = got["verifier"]
    assert v and v["class"] == "SpecxRejectionSampler", f"{name}: verified by {v}"
    return v


@pytest.mark.parametrize("name", _tiered(n for n in CONFIGS if "adaptive" in n))
def test_adaptive_configs_really_cut(name, run):
    """The distribution test above holds while drafts are cut: fewer verified than drafted, and
    requests verified different numbers of drafts."""
    st = run(name)["adaptive"]
    assert st and st["draft_passes"] > 0 and st["verified_tokens"] < st["drafted_tokens"], st
    assert sum(1 for c in st["verify_length_counts"][1:] if c) >= 2, st["verify_length_counts"]


def test_block_verification_runs_when_configured(run):
    v = _op_calls(run("dspark-probabilistic-block"), "block")
    assert v["method"] == "block"
    assert v["op_calls"].get("block", 0) > 0 and v["random_op_calls"].get("block", 0) > 0, v
    assert v["op_calls"].get("token", 0) == 0, v


@pytest.mark.parametrize("name", _tiered(["dspark-probabilistic", "dspark-greedy-drafts", "mtp-probabilistic",
                                          "dspark-adaptive-probabilistic", "dspark-reduced-vocab",
                                          "mtp-reduced-vocab", "mtp-adaptive-reduced-vocab"]))
def test_token_wise_verification_runs_for_standard(name, run):
    v = _op_calls(run(name), name)
    assert v["op_calls"].get("token", 0) > 0 and v["random_op_calls"].get("token", 0) > 0, v
    assert v["op_calls"].get("block", 0) == 0, v


@pytest.mark.parametrize("name", _tiered(OURS))
def test_every_verification_step_of_our_proposers_is_our_op(name, run):
    """Not just the class name: each forward of the sampler with drafts to verify completed one
    call of our op (a step without any draft is plain sampling, counted as `empty_calls`)."""
    v = _op_calls(run(name), name)
    assert v["calls"] > 0 and sum(v["op_calls"].values()) + v["empty_calls"] == v["calls"], v
    assert sum(v["op_calls"].values()) > 0, v


@pytest.mark.parametrize("name", _tiered(n for n in CONFIGS if n not in OURS))
def test_vllm_methods_keep_vllms_sampler(name, run):
    """The counters tell the samplers apart: vLLM's own methods are verified by vLLM's sampler."""
    v = run(name)["verifier"]
    assert v and v["class"] == "RejectionSampler" and not v["op_calls"], v


@pytest.mark.full  # a canary for an upstream fix; the repair's own test is tests/test_cpu_expand_repair.py
def test_vllm_cpu_sampler_without_the_repair_is_not_lossless(drafts, nospec, monkeypatch):
    got = _sample(CONFIGS["ngram-vllm-sampler"](drafts), monkeypatch, repair="0")
    assert _min_p_value(nospec["t1"], got["t1"]) < 1e-12
