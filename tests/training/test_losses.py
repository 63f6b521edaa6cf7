"""Training losses: value against the formula in each docstring, gradient against autograd of
that formula in float64, ignored rows carry neither loss nor gradient."""

from __future__ import annotations

import pytest
import torch

from vllm_specx.training.losses import (
    IGNORE,
    LOSSES,
    DraftOutput,
    cross_entropy,
    per_position_accuracy,
    position_weights,
)


def _output(rows=6, n=4, vocab=11, ignore=((0, 3), (4, 0)), seed=0) -> DraftOutput:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, n, vocab, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, vocab, (rows, n), generator=g)
    for r, k in ignore:
        targets[r, k] = IGNORE
    return DraftOutput(logits, targets)


def _ce_formula(out: DraftOutput, w: torch.Tensor) -> torch.Tensor:
    """The docstring: sum w_k valid (-log q_k(y)) / sum w_k valid, one term at a time."""
    num = den = 0.0
    for r in range(out.targets.shape[0]):
        for k in range(out.targets.shape[1]):
            y = int(out.targets[r, k])
            if y == IGNORE:
                continue
            num = num - w[k] * torch.log_softmax(out.logits[r, k], -1)[y]
            den = den + w[k]
    return num / den


def test_position_weights():
    torch.testing.assert_close(position_weights(3, 2.0), torch.tensor([1.0, 0.6065306, 0.3678794]))


@pytest.mark.parametrize("gamma", [1.0, 4.0, 1e9])
def test_cross_entropy_value_and_gradient(gamma):
    out = _output()
    w = position_weights(out.targets.shape[1], gamma).double()
    got = cross_entropy(out, w)
    (g_got,) = torch.autograd.grad(got, out.logits)
    ref = _ce_formula(out, w)
    (g_ref,) = torch.autograd.grad(ref, out.logits)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_got, g_ref, rtol=1e-10, atol=1e-12)
    assert torch.count_nonzero(g_got[0, 3]) == 0 and torch.count_nonzero(g_got[4, 0]) == 0  # ignored rows


def test_cross_entropy_takes_any_leading_shape():
    out = _output(rows=6)
    w = position_weights(4, 4.0).double()
    folded = DraftOutput(out.logits.view(2, 3, 4, -1), out.targets.view(2, 3, 4))
    torch.testing.assert_close(cross_entropy(folded, w), cross_entropy(out, w))


def test_cross_entropy_is_zero_only_for_a_perfect_draft():
    out = _output(ignore=())
    perfect = torch.full_like(out.logits, -1e4).scatter(-1, out.targets[..., None], 1e4)
    assert cross_entropy(DraftOutput(perfect, out.targets), position_weights(4, 4.0)) < 1e-6
    assert cross_entropy(out, position_weights(4, 4.0).double()) > 0.5  # negative control


def test_per_position_accuracy():
    out = _output(rows=4, n=2, ignore=((3, 1),))
    hit = out.logits.argmax(-1) == out.targets
    want = torch.tensor([hit[:, 0].double().mean(), hit[:3, 1].double().mean()])
    torch.testing.assert_close(per_position_accuracy(out).double(), want)


def test_every_registered_loss_has_a_docstring_formula():
    for name, fn in LOSSES.items():
        assert fn.__doc__ and "Why" in fn.__doc__ and "L =" in fn.__doc__, name


# ---- losses on the target's distribution ---------------------------------------------------------

def _dist_output(rows=5, n=3, vocab=9, k=4, ignore=((1, 2), (3, 1), (3, 2)), seed=1) -> DraftOutput:
    """Random draft logits and a random target top-k (log-probs of a full softmax, so their mass is
    below one), some positions past the end of the sequence (IGNORE, suffix-shaped per row)."""
    g = torch.Generator().manual_seed(seed)
    out = _output(rows, n, vocab, ignore, seed)
    full = torch.log_softmax(torch.randn(rows, n, vocab, generator=g, dtype=torch.float64) * 2, -1)
    logp, ids = full.topk(k, -1)
    return DraftOutput(out.logits, out.targets, ids, logp)


def _p_q(out, r, j):
    """Plain reference: the target's top-k renormalised, scattered over the vocabulary (0 off the
    top-k), and the draft's full softmax, for row r, position j."""
    p_s = torch.exp(out.target_logp[r, j]) / torch.exp(out.target_logp[r, j]).sum()
    p = torch.zeros(out.logits.shape[-1], dtype=torch.float64).index_put((out.target_ids[r, j],), p_s)
    return p, torch.softmax(out.logits[r, j], -1)


def _reference(name, out, w):
    """Each docstring's formula, one (row, position) at a time, from dense p and q."""
    rows, n = out.targets.shape
    num, den = 0.0, 0.0
    for r in range(rows):
        prefix = 1.0
        for j in range(n):
            if int(out.targets[r, j]) == IGNORE:
                continue
            p, q = _p_q(out, r, j)
            alpha = torch.minimum(p, q).sum()
            prefix = prefix * alpha
            ce_y = -torch.log(q[int(out.targets[r, j])])
            term = {"ce": ce_y,
                    "ce-argmax": -torch.log(q[int(p.argmax())]),
                    "kl": sum(p[v] * (torch.log(p[v]) - torch.log(q[v])) for v in range(len(p)) if p[v] > 0),
                    "tv": 0.5 * (p - q).abs().sum(),  # TV as the half L1 distance, not via alpha
                    "nla": -torch.log(alpha),
                    "chain-tv": 1 - prefix,
                    "ce-tv": 0.1 * ce_y + 0.9 * 0.5 * (p - q).abs().sum()}[name]
            if name == "ce-tv":  # a mix of two weighted means: compare its parts below
                term = None
            weight = 1.0 if name == "chain-tv" else w[j]
            if term is not None:
                num, den = num + weight * term, den + weight
    return num / den if den else None


@pytest.mark.parametrize("name", sorted(set(LOSSES) - {"ce-tv"}))
def test_loss_value_and_gradient_against_the_formula(name):
    out = _dist_output()
    w = position_weights(3, 2.0).double()
    got = LOSSES[name](out, w)
    (g_got,) = torch.autograd.grad(got, out.logits)
    ref = _reference(name, out, w)
    (g_ref,) = torch.autograd.grad(ref, out.logits)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_got, g_ref, rtol=1e-8, atol=1e-12)
    for r, j in ((1, 2), (3, 1), (3, 2)):  # past the end: no gradient
        assert torch.count_nonzero(g_got[r, j]) == 0, (name, r, j)
    assert torch.count_nonzero(g_got) > 0


def test_ce_tv_mix_is_its_two_terms():
    out = _dist_output()
    w = position_weights(3, 4.0).double()
    from vllm_specx.training.losses import ce_tv_mix, total_variation
    torch.testing.assert_close(ce_tv_mix(out, w), 0.1 * _reference("ce", out, w) + 0.9 * total_variation(out, w))
    torch.testing.assert_close(total_variation(out, w), _reference("tv", out, w), rtol=1e-10, atol=1e-12)


def test_tv_losses_vanish_only_when_the_draft_is_the_target():
    out = _dist_output(ignore=())
    w = position_weights(3, 4.0).double()
    # q = p exactly: logits = log p on the top-k, -inf elsewhere.
    exact = torch.full_like(out.logits, float("-inf")).scatter(-1, out.target_ids, out.target_logp)
    same = DraftOutput(exact, out.targets, out.target_ids, out.target_logp)
    for name in ("tv", "nla", "chain-tv", "kl"):
        assert abs(LOSSES[name](same, w).item()) < 1e-12, name
        assert LOSSES[name](out, w).item() > 0.05, name  # negative control: a random draft


def test_topk_tv_is_exact_when_q_outside_the_topk_is_counted():
    """alpha over the top-k with the full-vocabulary q gives TV(p_topk, q) exactly, and differs
    from TV against the untruncated target by at most the top-k's missing mass."""
    from vllm_specx.training.losses import acceptance_rate
    g = torch.Generator().manual_seed(3)
    vocab, k = 50, 6
    full = torch.log_softmax(torch.randn(1, 1, vocab, generator=g, dtype=torch.float64) * 3, -1)
    logits = torch.randn(1, 1, vocab, generator=g, dtype=torch.float64)
    logp, ids = full.topk(k, -1)
    out = DraftOutput(logits, torch.zeros(1, 1, dtype=torch.long), ids, logp)
    q = torch.softmax(logits[0, 0], -1)
    p_trunc = torch.zeros(vocab, dtype=torch.float64).index_put((ids[0, 0],), torch.softmax(logp[0, 0], -1))
    alpha = acceptance_rate(out)[0, 0]
    torch.testing.assert_close(1 - alpha, 0.5 * (p_trunc - q).abs().sum(), rtol=1e-12, atol=1e-14)
    miss = 1 - torch.exp(logp).sum()
    tv_full = 0.5 * (torch.exp(full[0, 0]) - q).abs().sum()
    assert abs((1 - alpha) - tv_full) <= miss + 1e-12
    # Renormalising q over the top-k instead (the mistake the docstring rules out) is not exact.
    q_renorm = torch.zeros(vocab, dtype=torch.float64).index_put((ids[0, 0],), q[ids[0, 0]] / q[ids[0, 0]].sum())
    assert abs(0.5 * (p_trunc - q_renorm).abs().sum() - (1 - alpha)) > 1e-3


def test_tv_is_one_minus_our_samplers_acceptance_rate():
    """Draft tokens drawn from q, verified by vllm-specx's token-wise sampler against p: the
    empirical acceptance rate is 1 - TV within sampling error (5 sigma), for several random pairs."""
    from vllm_specx.ops.acceptance import acceptance_sample
    from vllm_specx.training.losses import total_variation
    g = torch.Generator().manual_seed(7)
    vocab, trials = 12, 20000
    for case in range(4):
        p = torch.softmax(torch.randn(vocab, generator=g) * (1 + case), -1)
        z = torch.randn(vocab, generator=g) * 2
        q = torch.softmax(z, -1)
        out = DraftOutput(z[None, None].double(), torch.zeros(1, 1, dtype=torch.long),
                          torch.arange(vocab)[None, None], torch.log(p)[None, None].double())
        tv = total_variation(out, torch.ones(1)).item()
        drafts = torch.multinomial(q, trials, replacement=True, generator=g)
        emitted = acceptance_sample(
            drafts, torch.arange(1, trials + 1), p.expand(trials, vocab).contiguous(),
            p.expand(trials, vocab).contiguous(), q.expand(trials, vocab).contiguous(),
            torch.zeros(trials, dtype=torch.bool), torch.rand(trials, generator=g, dtype=torch.float64),
            (-torch.log(torch.rand(trials, vocab, generator=g))).clamp(min=1e-12))
        # Each request has one draft: accepted iff two tokens were emitted.
        rate = (emitted[:, 1] >= 0).double().mean().item()
        sigma = ((1 - tv) * tv / trials) ** 0.5
        assert abs(rate - (1 - tv)) < 5 * sigma + 1e-9, (case, rate, 1 - tv)
        # Negative control: TV against a slightly different draft is outside the same bound.
        other = DraftOutput(0.7 * out.logits, out.targets, out.target_ids, out.target_logp)
        assert abs(rate - (1 - total_variation(other, torch.ones(1)).item())) > 5 * sigma, case


def test_chain_tv_is_the_expected_accepted_prefix_on_exhaustive_cases():
    """K drafts over a vocabulary of 3 with position-wise p_i, q_i: enumerate every draft sequence
    (probability prod q_i(x_i)) and the exact probability that its first j + 1 drafts pass
    token-wise verification (prod min(1, p_i / q_i)); the expected accepted prefix length equals
    K (1 - chain TV), and tau = 1 + that equals `analytic_tau`."""
    import itertools

    from vllm_specx.training.losses import acceptance_rate, analytic_tau, chain_tv
    g = torch.Generator().manual_seed(11)
    for k in (1, 2, 3, 4):
        vocab = 3
        p = torch.softmax(torch.randn(k, vocab, generator=g, dtype=torch.float64) * 2, -1)
        z = torch.randn(k, vocab, generator=g, dtype=torch.float64) * 2
        q = torch.softmax(z, -1)
        expected = 0.0
        for xs in itertools.product(range(vocab), repeat=k):
            prob = float(torch.prod(torch.stack([q[i, x] for i, x in enumerate(xs)])))
            passed = 1.0
            for i, x in enumerate(xs):
                passed *= min(1.0, float(p[i, x] / q[i, x]))
                expected += prob * passed  # drafts 0..i all accepted
        out = DraftOutput(z[None], torch.zeros(1, k, dtype=torch.long),
                          torch.arange(vocab).expand(1, k, vocab), torch.log(p)[None])
        loss = chain_tv(out, torch.ones(k)).item()
        assert abs(k * (1 - loss) - expected) < 1e-12, (k, k * (1 - loss), expected)
        assert abs(analytic_tau(acceptance_rate(out))[0].item() - (1 + expected)) < 1e-12


def test_trainer_ce_weight_mixes_cross_entropy_in():
    from vllm_specx.training.losses import chain_tv
    from vllm_specx.training.trainer import loss_and_accuracy

    out = _dist_output()
    w = position_weights(3, 4.0).double()
    mixed, _ = loss_and_accuracy(out, "chain-tv", 4.0, ce_weight=0.1)
    torch.testing.assert_close(mixed, 0.9 * chain_tv(out, w) + 0.1 * cross_entropy(out, w))
    plain, _ = loss_and_accuracy(out, "chain-tv", 4.0)
    torch.testing.assert_close(plain, chain_tv(out, w))
