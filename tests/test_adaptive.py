"""Confidence-scheduled drafting (`vllm_specx.adaptive`) without an engine: the policy is the
reference its docstring states, cutting drafts to a draft-chosen prefix keeps verification
lossless (and a cut that peeks at the target does not, which the test sees), the cost model and
the online estimator learn what they should, and bad options are refused by name."""

import itertools

import pytest
import torch

from vllm_specx.adaptive import policy
from vllm_specx.adaptive.config import AdaptiveConfig
from vllm_specx.adaptive.costs import CostModel, monotone
from vllm_specx.adaptive.estimator import OnlineAcceptanceEstimator, feature
from vllm_specx.ops.acceptance import acceptance_sample

from .ops.test_acceptance_distribution import ALPHA, _row, draw_chains, make_chain, position_pvalues


def _linear(per_token: float, fixed: float):
    return lambda t: fixed + per_token * t


# ---- the policy ---------------------------------------------------------------------------

def _brute_force(surv, verify, base, threshold=0.0):
    """max over every per-request prefix length vector of (R + sum of kept survivals) / cost."""
    r, m = surv.shape
    best = -1.0
    for lengths in itertools.product(range(m + 1), repeat=r):
        if any(n and surv[i, n - 1] < threshold for i, n in enumerate(lengths)):
            continue
        gain = r + sum(float(surv[i, :n].sum()) for i, n in enumerate(lengths))
        best = max(best, gain / float(verify(torch.tensor([float(base + sum(lengths))], dtype=torch.float64))[0]))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_plan_finds_the_best_budget_and_its_level_reproduces_it(seed):
    """The planner's b* = brute force over all per-request prefix lengths (3 requests x 3
    slots), and cutting the same survivals at the planned level verifies exactly b* drafts."""
    g = torch.Generator().manual_seed(seed)
    surv = policy.survival(torch.rand(3, 3, generator=g, dtype=torch.float64) ** 0.5)
    verify = _linear(per_token=float(torch.rand(1, generator=g)) * 0.2, fixed=1.0)
    threshold = [0.0, 0.3][seed % 2]
    got = policy.plan(surv, verify, 3, threshold)
    assert got.tokens_per_second == pytest.approx(_brute_force(surv, verify, 3, threshold), rel=1e-9)
    assert sum(policy.cut(surv, got.level)) == got.budget and got.level >= threshold


def test_survival_is_a_cumulative_product_and_the_cut_a_prefix():
    conf = torch.tensor([[0.9, 0.5, 1.0], [1.0, 1.0, 0.2]])
    surv = policy.survival(conf)
    assert torch.allclose(surv, torch.tensor([[0.9, 0.45, 0.45], [1.0, 1.0, 0.2]]))
    assert policy.cut(surv, 0.0) == [3, 3]
    assert policy.cut(surv, 0.5) == [1, 2]
    assert policy.cut(surv, 1.0) == [0, 2]
    assert policy.cut(torch.tensor([[0.2, 0.9]]), 0.5) == [0]  # a later slot never opens a gap


def test_a_fixed_cost_of_verifying_keeps_small_budgets_out():
    surv = policy.survival(torch.full((4, 2), 0.5))
    assert policy.plan(surv, _linear(1e-3, 1.0), 4).budget == 8
    assert policy.plan(surv, _linear(1e-3, 1.0), 4, spec_seconds=2.0).budget == 0


def test_expensive_verification_verifies_nothing_and_drafting_does_not_pay():
    surv = policy.survival(torch.full((4, 3), 0.3))
    got = policy.plan(surv, _linear(per_token=1.0, fixed=0.1), 4, draft_seconds=0.5)
    assert got.budget == 0 and policy.cut(surv, got.level) == [0] * 4 and not got.pays
    cheap = policy.plan(surv, _linear(per_token=1e-4, fixed=1.0), 4, draft_seconds=1e-3)
    assert cheap.budget == 12 and cheap.pays


def test_scheduler_backs_off_exponentially_and_tracks_level_and_horizon():
    s = policy.Scheduler(7, max_skip=4)
    no = policy.Plan(0.9, 0, 2.0, 1.0, pays=False)
    runs = []
    for _ in range(5):
        assert s.draft_now()
        s.after_pass([0, 0], no)
        skipped = 0
        while not s.draft_now():
            skipped += 1
        runs.append(skipped)
    assert runs == [1, 2, 4, 4, 4] and s.level == 0.9 and s.horizon == 1
    s.after_pass([2, 1], policy.Plan(0.4, 3, 3.0, 1.0, pays=True))
    assert s.horizon == 3 and s.backoff == 1 and s.level == 0.4 and s.draft_now()
    off = policy.Scheduler(7, cost_model=False, threshold=0.3)
    off.after_pass([0], no)
    assert off.draft_now() and off.horizon == 7 and off.level == 0.3


def test_scheduler_probes_at_once_when_the_batch_shrinks():
    """While skipping after a pass over 8 requests: 7 requests keep skipping (negative control),
    5 (< 3/4 of 8) probe at once with the back-off reset."""
    s = policy.Scheduler(7, max_skip=64)
    no = policy.Plan(0.9, 0, 2.0, 1.0, pays=False)
    for _ in range(4):
        assert s.draft_now(8)
        s.after_pass([0] * 8, no)
        while not s.draft_now(8):
            pass
    assert s.backoff == 16
    s.after_pass([0] * 8, no)
    assert not s.draft_now(7) and not s.draft_now(6)
    assert s.draft_now(5) and s.backoff == 1 and s.skip_left == 0


# ---- lossless whatever is cut ---------------------------------------------------------------

def _draws(p, q, n, seed):
    """n drafted chains: ((drafts [n, K], q rows [n, K, V]), p rows [n, K, V])."""
    x, p_rows, q_rows = draw_chains(p, q, n, torch.Generator().manual_seed(seed))
    return (x, q_rows), p_rows


def _simulate_cut(p, q, method, lengths_of, n=100_000, seed=7):
    """`test_acceptance_distribution.simulate` with each request's drafts cut to
    `lengths_of(drafts, q rows, q(draft), p(draft))` before verification."""
    (x, qr), pr = _draws(p, q, n, seed)
    g = torch.Generator().manual_seed(seed + 1)
    k, v = len(q), p[0].shape[1]
    lengths = torch.tensor(lengths_of(x, qr, qr.gather(2, x[..., None])[..., 0], pr.gather(2, x[..., None])[..., 0]))
    keep = torch.arange(k)[None] < lengths[:, None]
    last = x.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
    bonus = _bonus_rows(p, torch.where(lengths > 0, last, torch.zeros_like(last)), lengths)
    out = acceptance_sample(
        x[keep], lengths.cumsum(0), pr[keep], bonus, qr[keep],
        torch.zeros(n, dtype=torch.bool), torch.rand(int(keep.sum()), dtype=torch.float64, generator=g),
        torch.empty(n, v).exponential_(generator=g), method=method, impl="torch")
    y = torch.full((n, k + 1), -1, dtype=torch.long)
    y[:, :out.shape[1]] = out.long()
    for j in range(1, k + 1):  # continue with the target where this step stopped
        gap = y[:, j] == -1
        pj = _row(p[j], y[:, j - 1].clamp(min=0))[gap]
        y[gap, j] = torch.multinomial(pj, 1, generator=g).squeeze(1)
    return y, lengths


def _bonus_rows(p, prev, lengths):
    rows = torch.empty(prev.shape[0], p[0].shape[1])
    for m in lengths.unique().tolist():
        sel = lengths == m
        rows[sel] = _row(p[m], prev[sel])
    return rows


def _qmax_survival(x, q_rows):
    """Confidence of slot i = the top probability of the distribution draft i is drawn from
    (a function of drafts < i: the online estimator's feature)."""
    return policy.survival(q_rows.max(-1).values.double())


@pytest.mark.parametrize("method", ["token", "block"])
def test_cutting_at_a_level_fixed_before_the_pass_is_lossless(method):
    """Each request's K drafts are cut where their survival falls below a level planned on an
    earlier pass, then verified: every position still follows the target chain."""
    p, q = make_chain(16, 3, noise=1.0, seed=11)
    earlier, _ = _draws(p, q, 512, seed=1)
    level = float(_qmax_survival(*earlier)[:, 1].median())  # splits the second slot
    y, lengths = _simulate_cut(p, q, method, lambda x, q_rows, qx, px: policy.cut(_qmax_survival(x, q_rows), level))
    assert len(lengths.unique()) >= 2 and lengths.max() < 3, lengths.bincount()  # the cut really cuts, and varies
    pvals = position_pvalues(y, p)
    assert min(pvals) >= ALPHA / len(pvals), pvals


def test_negative_control_a_cut_that_reads_the_draft_it_cuts_is_detected():
    """Confidence = the draft's own probability q_i(x_i): the cut depends on draft i itself."""
    p, q = make_chain(16, 3, noise=1.0, seed=11)
    y, _ = _simulate_cut(p, q, "token", lambda x, q_rows, qx, px: policy.cut(policy.survival(qx.double()), 0.3))
    assert min(position_pvalues(y, p)) < ALPHA / 4


def test_negative_control_a_cut_that_peeks_at_the_target_is_detected():
    """Cutting right before a draft the target finds less likely than the draft does (p < q)."""
    p, q = make_chain(4, 3, noise=2.0, seed=5)

    def peek(x, q_rows, qx, px):
        risky = (px < qx).long()
        return torch.where(risky.any(1), risky.argmax(1), torch.full_like(risky[:, 0], 3)).tolist()

    y, _ = _simulate_cut(p, q, "token", peek)
    assert min(position_pvalues(y, p)) < ALPHA / 4


# ---- cost model and estimator -------------------------------------------------------------

def test_monotone_pools_adjacent_violators():
    assert monotone({1: 1.0, 2: 3.0, 4: 2.0, 8: 5.0}) == {1: 1.0, 2: 2.5, 4: 2.5, 8: 5.0}


def test_cost_model_interpolates_and_learns_overhead_and_scale():
    c = CostModel({1: 0.03, 16: 0.06, 128: 0.2}, {1: 0.002, 16: 0.007}, {1: 0.003, 16: 0.007})
    assert float(c.target_seconds(torch.tensor([8.5]))) == pytest.approx(0.045)
    assert float(c.target_seconds(torch.tensor([256.0]))) == pytest.approx(0.2 + 128 * 0.14 / 112)
    for i, tokens in enumerate([1, 16, 32, 64, 128, 16] * 10):  # really 0.02 + 1.5 x table (+ 0.03)
        x = float(c.target_seconds(torch.tensor([float(tokens)])))
        drafts = i % 4 == 0
        c.observe_step(0.02 + 1.5 * x + 0.03 * drafts + 0.004, tokens, 0.004, drafts=drafts)
    assert c.overhead == pytest.approx(0.02, abs=2e-3) and c.scale == pytest.approx(1.5, abs=0.05)
    assert c.spec_seconds == pytest.approx(0.03, abs=3e-3)
    c.observe_step(60.0, 16, 0.004)  # an idle minute is not a step
    assert c.overhead == pytest.approx(0.02, abs=2e-3)
    for _ in range(10):
        c.observe_draft(2 * c.modelled_draft(16, 3), 16, 3)
    assert c.draft_seconds(16, 3) == pytest.approx(2 * c.modelled_draft(16, 3))


def test_estimator_recovers_a_logistic_acceptance_model():
    g = torch.Generator().manual_seed(0)
    est = OnlineAcceptanceEstimator(3, capacity=20_000, refit_every=1000)
    a, b = 0.6, torch.tensor([0.5, -0.5, -1.0], dtype=torch.float64)
    for _ in range(10):
        qmax = torch.rand(1000, generator=g) * 0.98 + 0.01
        slots = torch.randint(0, 3, (1000,), generator=g)
        f = feature(qmax)
        labels = (torch.rand(1000, generator=g, dtype=torch.float64) < torch.sigmoid(a * f + b[slots])).double()
        est.observe(f, slots, labels)
    assert est.theta[0] == pytest.approx(a, abs=0.08)
    assert torch.allclose(est.theta[1:], b, atol=0.12), est.theta
    flipped = OnlineAcceptanceEstimator(3, refit_every=1000)
    flipped.observe(f, slots, 1 - labels)
    assert flipped.theta[0] < 0  # labels that fall with q_max give a negative slope


# ---- options ------------------------------------------------------------------------------

@pytest.mark.parametrize("options, field", [
    ({"adaptive": "yes"}, "'adaptive'"),
    ({"adaptive": True, "adaptive_confidence": "oracle"}, "adaptive_confidence"),
    ({"adaptive": True, "adaptive_threshold": 1.0}, "adaptive_threshold"),
    ({"adaptive": True, "adaptive_threshold": -0.1}, "adaptive_threshold"),
    ({"adaptive": True, "adaptive_cost_model": 1}, "adaptive_cost_model"),
    ({"adaptive": True, "adaptive_max_skip": 0}, "adaptive_max_skip"),
    ({"adaptive_threshold": 0.3}, "need 'adaptive': true"),
])
def test_bad_adaptive_options_are_refused_by_name(options, field):
    with pytest.raises(ValueError, match=field):
        AdaptiveConfig.from_options(options)


def test_vllms_switch_turns_it_on():
    assert AdaptiveConfig.from_options({}, vllm_switch=True).enabled
    assert AdaptiveConfig.from_options({"adaptive_threshold": 0.2}, vllm_switch=True).threshold == 0.2
    assert not AdaptiveConfig.from_options({}).enabled
