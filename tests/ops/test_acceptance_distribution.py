"""Statistical losslessness of the acceptance sampler, and block vs token accepted lengths.

Model: a Markov "language model" over a small vocabulary. The target's distribution at position
`j` is a table row `p_j(. | y_{j-1})` (position 0: a fixed row), processed like vLLM does
(temperature, then top-k / top-p, then softmax); the drafter's `q_j(. | x_{j-1})` is a noisy copy
with its own temperature and no truncation (vLLM's draft probs carry none), or a greedy drafter
(`argmax q_j`, passed as one-hot: `draft_probs=None`). Each of `N = 10^5` requests drafts a
`K`-token chain autoregressively from q, is verified in one batched call (the vectorised
`impl="torch"` path, which `test_acceptance.py` proves equal to the reference token for token),
and its emitted tokens are then continued with the target itself up to `K + 1` tokens. That
continuation is how losslessness is defined (Sun et al.: the output followed by ordinary target
decoding is distributed as the target); it also makes block verification testable, whose
within-step conditionals differ from the target's even though the sequence law does not.

For every position `j = 0..K`: the emitted `y_0 ~ p_0`, and `y_j | y_{j-1} ~ p_j(. | y_{j-1})`,
by a chi-square goodness-of-fit test over the (previous, next) contingency table (cells with
expected count < 5 pooled per row). Emissions outside the target's support fail exactly.

False-failure rate: each case passes iff every position's p-value is `>= ALPHA / (K + 1)`
(Bonferroni), so a correct sampler fails a case with probability `<= ALPHA = 1e-6` (about 2e-5
for the whole file's 24 cases); all seeds are fixed, so the outcome is deterministic anyway.
Two negative controls (a mis-specified q; block verification resampling from an unscaled
residual) must fail, which shows the test has the power to see such bugs.
"""

import itertools

import pytest
import torch

from vllm_specx.ops.acceptance import acceptance_sample, block_thresholds

ALPHA = 1e-6
N = 100_000

pytestmark = pytest.mark.usefixtures("one_thread")


def processed(logits, temp, top_k=None, top_p=None):
    """Temperature, then top-k, then top-p (keep the smallest prefix reaching top_p), softmax."""
    z = logits / temp
    if top_k is not None:
        z = z.masked_fill(z < z.topk(top_k, -1).values[..., -1:], float("-inf"))
    if top_p is not None:
        probs, order = z.softmax(-1).sort(-1, descending=True)
        drop = probs.cumsum(-1) - probs >= top_p  # mass before this token already reaches top_p
        z = z.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return z.softmax(-1)


def make_chain(V, K, *, temp=1.0, top_k=None, top_p=None, draft_temp=None, noise=1.0, seed=0):
    """Target tables p[0..K] and draft tables q[0..K-1]; p[0], q[0] are [1, V], the rest [V, V]."""
    g = torch.Generator().manual_seed(seed)
    p, q = [], []
    for j in range(K + 1):
        logits = 2.0 * torch.randn(1 if j == 0 else V, V, generator=g)
        p.append(processed(logits, temp, top_k, top_p))
        if j < K:
            noisy = logits + noise * torch.randn(logits.shape, generator=g)
            q.append(processed(noisy, draft_temp or temp))
    return p, q


def _row(table, prev):
    return table[torch.zeros_like(prev)] if table.shape[0] == 1 else table[prev]


def draw_chains(p, q, n, g, *, onehot=False, verify_q=None):
    """Draft `n` K-token chains from q (argmax for a greedy drafter). Returns drafts [n, K] and
    the target's and draft's rows at each draft, [n, K, V] each (the draft rows from `verify_q`
    when given)."""
    K, V = len(q), p[0].shape[1]
    prev = torch.zeros(n, dtype=torch.long)
    drafts, p_rows, q_rows = [], [], []
    for j in range(K):
        qj = _row(q[j], prev)
        race = qj / torch.empty(n, V).exponential_(generator=g)  # x ~ q_j by the exponential race
        x = qj.argmax(-1) if onehot else race.argmax(-1)
        p_rows.append(_row(p[j], prev))
        q_rows.append(qj if verify_q is None else _row(verify_q[j], prev))
        drafts.append(x)
        prev = x
    return torch.stack(drafts, 1), torch.stack(p_rows, 1), torch.stack(q_rows, 1)


def simulate(p, q, method, *, onehot=False, n=N, seed=0, verify_q=None):
    """Draft, verify and continue `n` chains. Returns (tokens [n, K+1], accepted drafts [n])."""
    g = torch.Generator().manual_seed(seed)
    K, V = len(q), p[0].shape[1]
    drafts, p_rows, q_rows = draw_chains(p, q, n, g, onehot=onehot, verify_q=verify_q)
    bonus = _row(p[K], drafts[:, -1])
    out = acceptance_sample(
        drafts.reshape(-1), torch.arange(1, n + 1) * K,
        p_rows.reshape(n * K, V), bonus,
        None if onehot else q_rows.reshape(n * K, V),
        torch.zeros(n, dtype=torch.bool), torch.rand(n * K, dtype=torch.float64, generator=g),
        torch.empty(n, V).exponential_(generator=g), method=method, impl="torch")
    y = out.long()
    accepted = (y != -1).sum(1) - 1
    for j in range(1, K + 1):  # continue with the target wherever this step stopped early
        gap = y[:, j] == -1
        pj = _row(p[j], y[:, j - 1].clamp(min=0))[gap]
        y[gap, j] = torch.multinomial(pj, 1, generator=g).squeeze(1)
    return y, accepted


def chi2_pvalue(obs, exp):
    """Chi-square p-value of observed vs expected counts, row by row ([R, V] each), pooling the
    cells with expected count < 5 of a row into one (merged into the row's smallest cell if the
    pool itself stays < 5). Off-support emissions (expected 0, observed > 0) fail outright."""
    assert int(obs[exp == 0].sum()) == 0, "emitted a token outside the target's support"
    stat, df = 0.0, 0
    for o, e in zip(obs.double(), exp.double()):
        keep = e >= 5
        cells_o, cells_e = list(o[keep]), list(e[keep])
        small = (~keep) & (e > 0)
        if small.any():
            so, se = o[small].sum(), e[small].sum()
            if se >= 5 or not cells_e:
                cells_o.append(so)
                cells_e.append(se)
            else:
                k = int(torch.stack(cells_e).argmin())
                cells_o[k] += so
                cells_e[k] += se
        if len(cells_e) < 2:
            continue
        co, ce = torch.stack(cells_o), torch.stack(cells_e)
        stat += float(((co - ce) ** 2 / ce).sum())
        df += len(cells_e) - 1
    if df == 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def position_pvalues(y, p):
    """p-values of `y_0 ~ p_0` and of `y_j | y_{j-1} ~ p_j(. | y_{j-1})` for j = 1..K."""
    V = p[0].shape[1]
    pvals = [chi2_pvalue(torch.bincount(y[:, 0], minlength=V)[None], y.shape[0] * p[0])]
    for j in range(1, len(p)):
        pairs = torch.bincount(y[:, j - 1] * V + y[:, j], minlength=V * V).view(V, V)
        pvals.append(chi2_pvalue(pairs, pairs.sum(1, keepdim=True) * p[j]))
    return pvals


CASES = {
    "V8-K3-T1": dict(V=8, K=3),
    "V16-K3-T0.5-topk5": dict(V=16, K=3, temp=0.5, top_k=5),
    "V32-K2-T1.5-topp0.8": dict(V=32, K=2, temp=1.5, top_p=0.8),
    "V16-K4-T0.7-topk6-topp0.9-draftT1.2": dict(V=16, K=4, temp=0.7, top_k=6, top_p=0.9,
                                                 draft_temp=1.2),
    "V24-K3-T1-closedraft": dict(V=24, K=3, noise=0.3),
    "V4-K3-T1-fardraft": dict(V=4, K=3, noise=2.0),  # where the control below has most power
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("onehot", [False, True], ids=["q", "greedy-drafter"])
@pytest.mark.parametrize("method", ["token", "block"])
def test_emitted_tokens_follow_target(method, onehot, case):
    """Every position's emitted token follows the target chain (Bonferroni over K+1 positions)."""
    cfg = CASES[case]
    p, q = make_chain(seed=len(case), **cfg)
    y, accepted = simulate(p, q, method, onehot=onehot, seed=7)
    pvals = position_pvalues(y, p)
    assert min(pvals) >= ALPHA / len(pvals), f"p-values per position: {pvals}"
    if not onehot:  # the case exercises both outcomes (a greedy drafter may always miss)
        assert 0 < float(accepted.float().mean()) < cfg["K"]


def test_negative_control_mis_specified_q_is_detected():
    """Power check: drafts drawn from q but verified against another q' must fail the test."""
    p, q = make_chain(8, 3, noise=1.0, seed=1)
    _, q_wrong = make_chain(8, 3, noise=1.0, seed=2)
    y, _ = simulate(p, q, "token", verify_q=q_wrong, seed=7)
    assert min(position_pvalues(y, p)) < ALPHA / 4


def test_negative_control_unscaled_block_residual_is_detected(monkeypatch):
    """Power check for a block-specific bug: resampling from max(p - q, 0) instead of
    max(P_tau p - q, 0) after a block rejection (observed p-value ~1e-110 on this case)."""
    import vllm_specx.ops.acceptance.torch_path as tp

    final_tokens = tp._final_tokens
    monkeypatch.setattr(tp, "_final_tokens", lambda *a: final_tokens(*a[:-1], "token"))
    p, q = make_chain(seed=len("V4-K3-T1-fardraft"), **CASES["V4-K3-T1-fardraft"])
    y, _ = simulate(p, q, "block", seed=7)
    assert min(position_pvalues(y, p)) < ALPHA / 4


# ---------------------------------------------------------------------------------------------
# Accepted length: block >= token, exactly and by simulation.


def exact_expected_lengths(p, q):
    """E[accepted drafts] of token and block verification, by enumerating all drafted chains."""
    K, V = len(q), p[0].shape[1]
    e_tok = e_blk = 0.0
    for xs in itertools.product(range(V), repeat=K):
        x = torch.tensor(xs)
        prev = torch.cat([x.new_zeros(1), x[:-1]])
        p_rows = torch.stack([_row(p[j], prev[j:j + 1])[0] for j in range(K)])
        q_rows = torch.stack([_row(q[j], prev[j:j + 1])[0] for j in range(K)])
        prob = float(q_rows[torch.arange(K), x].double().prod())
        if prob == 0:
            continue
        beta = (p_rows[torch.arange(K), x].double() / q_rows[torch.arange(K), x]).clamp(max=1)
        e_tok += prob * float(beta.cumprod(0).sum())
        _, h = block_thresholds(p_rows, q_rows, x)
        # P(tau = i) = h_i prod_{j > i} (1 - h_j), the u's being independent.
        e_blk += prob * sum(i * h[i - 1] * _prod(1 - hj for hj in h[i:]) for i in range(1, K + 1))
    return e_tok, e_blk


def _prod(xs):
    out = 1.0
    for v in xs:
        out *= v
    return out


def test_sun_et_al_two_token_example():
    """Sun et al.'s motivating example: p = (1/3, 2/3), q = (2/3, 1/3), K = 2, context-free.
    Token verification accepts 10/9 drafts on average, block verification 11/9."""
    p = [torch.tensor([[1 / 3, 2 / 3]])] * 3
    q = [torch.tensor([[2 / 3, 1 / 3]])] * 2
    e_tok, e_blk = exact_expected_lengths(p, q)
    assert e_tok == pytest.approx(10 / 9, abs=1e-6) and e_blk == pytest.approx(11 / 9, abs=1e-6)


@pytest.mark.parametrize("seed,cfg", [(0, dict(temp=1.0)), (1, dict(temp=0.5, top_k=3)),
                                      (2, dict(temp=1.5, draft_temp=0.8)), (3, dict(noise=3.0))])
def test_block_never_accepts_less_than_token(seed, cfg):
    """Exact expectations over all drafted chains (V=5, K=3), then the same by simulation:
    each simulated mean is within 6 standard errors of its exact value (two-sided false-failure
    rate 2e-9 per assertion, CLT), and block >= token holds exactly."""
    p, q = make_chain(5, 3, seed=seed, **cfg)
    e_tok, e_blk = exact_expected_lengths(p, q)
    assert e_blk >= e_tok - 1e-9, (e_tok, e_blk)
    for method, exact in (("token", e_tok), ("block", e_blk)):
        _, accepted = simulate(p, q, method, n=50_000, seed=seed + 11)
        a = accepted.double()
        se = float(a.std()) / a.numel() ** 0.5
        assert abs(float(a.mean()) - exact) < 6 * se + 1e-9, (method, float(a.mean()), exact, se)
