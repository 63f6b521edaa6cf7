"""The confidence head's loss and labels: BCE value and gradient against its docstring formula, the
label is the teacher-forced greedy acceptance (what the proposer's own draft loop gets accepted,
given the earlier drafts were), and the trainer's loss mix (`--confidence-weight`,
`--train-only confidence`) is what it says, with the BCE reaching the head only."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vllm_specx.training.losses import (
    IGNORE,
    DraftOutput,
    acceptance_rate,
    brier_score,
    confidence_bce,
    confidence_labels,
    cross_entropy,
    position_weights,
)


def _bce_formula(s, c, m):
    """The docstring: sum m (-c log p - (1 - c) log(1 - p)) / sum m, p = sigmoid(s), term by term."""
    num = den = 0.0
    for r in range(s.shape[0]):
        for k in range(s.shape[1]):
            if not m[r, k]:
                continue
            p = 1 / (1 + torch.exp(-s[r, k]))
            num = num - c[r, k] * torch.log(p) - (1 - c[r, k]) * torch.log(1 - p)
            den = den + 1
    return num / den


def _case(seed=0, rows=5, n=4):
    g = torch.Generator().manual_seed(seed)
    s = (torch.randn(rows, n, generator=g, dtype=torch.float64) * 3).requires_grad_()
    c = torch.rand(rows, n, generator=g, dtype=torch.float64)
    c[:2] = c[:2].round()  # hard labels and soft ones
    m = torch.ones(rows, n, dtype=torch.bool)
    m[3, 2:] = False
    m[4, 1:] = False
    return s, c, m


def test_confidence_bce_value_and_gradient():
    s, c, m = _case()
    got = confidence_bce(s, c, m)
    (g_got,) = torch.autograd.grad(got, s)
    ref = _bce_formula(s, c, m)
    (g_ref,) = torch.autograd.grad(ref, s)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_got, g_ref, rtol=1e-10, atol=1e-12)
    # The closed form the docstring states: dL/ds = m (p - c) / sum m.
    torch.testing.assert_close(g_got, m * (torch.sigmoid(s.detach()) - c) / m.sum(), rtol=1e-10, atol=1e-12)
    assert torch.count_nonzero(g_got[~m]) == 0 and torch.count_nonzero(g_got[m]) == m.sum()
    # Large logits stay finite (log-sigmoid, not log of a rounded sigmoid).
    big = confidence_bce(torch.tensor([[60.0, -60.0]], dtype=torch.float64), torch.tensor([[0.0, 1.0]]),
                         torch.ones(1, 2, dtype=torch.bool))
    torch.testing.assert_close(big, torch.tensor(60.0, dtype=torch.float64), rtol=1e-10, atol=1e-10)


def test_confidence_bce_is_smallest_at_the_true_rate():
    """A proper scoring rule: for labels with rate r, the constant logit minimising BCE is logit(r)."""
    c = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    m = torch.ones_like(c, dtype=torch.bool)
    grid = torch.linspace(-4, 4, 161, dtype=torch.float64)
    losses = torch.stack([confidence_bce(torch.full((1, 4), float(z), dtype=torch.float64), c, m) for z in grid])
    assert abs(torch.sigmoid(grid[losses.argmin()]).item() - 0.75) < 1e-2


def test_brier_score():
    s, c, m = _case()
    p = torch.sigmoid(s.detach())
    want = sum(float((p[r, k] - c[r, k]) ** 2) for r in range(5) for k in range(4) if m[r, k]) / int(m.sum())
    assert abs(brier_score(p, c, m).item() - want) < 1e-12


def _reached_formula(c, valid):
    """m_k = valid_k * prod_{i<k} c_i, one slot at a time."""
    m = torch.zeros(c.shape, dtype=torch.float64)
    for r in range(c.shape[0]):
        reach = 1.0
        for k in range(c.shape[1]):
            m[r, k] = float(valid[r, k]) * reach
            reach *= float(c[r, k]) * float(valid[r, k])
    return m


def test_confidence_weights():
    from vllm_specx.training.losses import confidence_weights

    c = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1], [0.5, 0.4, 1.0, 0.0]], dtype=torch.float64)
    valid = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    got = confidence_weights(c, valid)
    assert got.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 0.5, 0.2, 0.2]]
    torch.testing.assert_close(got, _reached_formula(c, valid))
    assert torch.equal(confidence_weights(c, valid, "all"), valid.double())
    with pytest.raises(ValueError, match="not one of"):
        confidence_weights(c, valid, "some")


def test_reached_slots_make_the_survival_product_exact_and_all_slots_do_not():
    """Acceptance in streaks (easy blocks pass every slot at 0.9, hard ones at 0.2): the per-slot
    rate that minimises the BCE over the reached slots multiplies out to the realised survival
    exactly (the products telescope); over all slots it under-predicts the accepted length."""
    from vllm_specx.training.losses import confidence_weights

    g = torch.Generator().manual_seed(0)
    easy = torch.rand(4000, 1, generator=g) < 0.5
    c = (torch.rand(4000, 6, generator=g) < torch.where(easy, 0.9, 0.2)).double()
    valid = torch.ones_like(c, dtype=torch.bool)
    realised = torch.cumprod(c, -1).sum(-1).mean()
    for slots in ("reached", "all"):
        m = confidence_weights(c, valid, slots)
        rate = (c * m).sum(0) / m.sum(0)  # the constant per-slot p the BCE is smallest at
        s = torch.logit(rate).expand_as(c).clone().requires_grad_()
        (grad,) = torch.autograd.grad(confidence_bce(s, c, m), s)
        assert grad.sum(0).abs().max() < 1e-12  # it is the minimiser
        predicted = torch.cumprod(rate, 0).sum()
        if slots == "reached":
            torch.testing.assert_close(predicted, realised, rtol=1e-12, atol=1e-12)
        else:
            assert predicted < 0.8 * realised, (predicted, realised)


def _labels_case():
    """Draft logits and targets where the labels are known by construction."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 4, 9, generator=g, dtype=torch.float64)
    draft = logits.argmax(-1)
    targets = draft.clone()
    targets[0, 1] = (draft[0, 1] + 1) % 9  # a miss
    targets[1, 3] = IGNORE  # past the end
    targets[2, 0] = (draft[2, 0] + 2) % 9  # a miss at slot 0
    return logits, targets


def _label_formula(out):
    """The definition, one slot at a time: [argmax of the draft's logits == the target's greedy token]."""
    lab = torch.zeros(out.targets.shape, dtype=torch.float64)
    for r in range(out.targets.shape[0]):
        for k in range(out.targets.shape[1]):
            y = int(out.targets[r, k])
            g = y if out.target_ids is None else int(out.target_ids[r, k, 0])
            lab[r, k] = float(y != IGNORE and int(out.logits[r, k].argmax()) == g)
    return lab


def _broken_labels(out, kind="greedy"):
    """A plausible bug: slot k judged against the target of slot k + 1 (an off-by-one between the
    block's slots and the tokens they predict)."""
    nxt = torch.cat([out.targets[:, 1:], torch.full_like(out.targets[:, :1], IGNORE)], 1)
    return (out.logits.argmax(-1) == nxt).to(out.logits.dtype)


@pytest.mark.parametrize("label_fn,ok", [(confidence_labels, True), (_broken_labels, False)],
                         ids=["confidence_labels", "negative-control-off-by-one"])
def test_greedy_labels_are_the_drafts_hits(label_fn, ok):
    logits, targets = _labels_case()
    out = DraftOutput(logits, targets)
    got = label_fn(out, "greedy")
    want = _label_formula(out)
    assert want.tolist() == [[1, 0, 1, 1], [1, 1, 1, 0], [0, 1, 1, 1]]
    assert torch.equal(got.double(), want) is ok
    # With the target's top-k stored, its first entry is the greedy token (the data's token at T = 0).
    ids = torch.stack([targets.clamp(min=0), (targets.clamp(min=0) + 1) % 9], -1)
    ids[0, 2, 0] = (ids[0, 2, 0] + 3) % 9  # a sampled token that is not the argmax: judged by the argmax
    with_topk = DraftOutput(logits, targets, ids, torch.log(torch.tensor([0.7, 0.2], dtype=torch.float64)).expand(3, 4, 2))
    assert torch.equal(label_fn(with_topk, "greedy").double(), _label_formula(with_topk)) is ok


def test_soft_labels_are_the_acceptance_probability():
    from tests.training.test_losses import _dist_output

    out = _dist_output()
    torch.testing.assert_close(confidence_labels(out, "soft"), acceptance_rate(out))
    assert not confidence_labels(out, "soft").requires_grad
    with pytest.raises(ValueError, match="not one of"):
        confidence_labels(out, "sampled")


def with_head(draft, kind="hidden+markov"):
    """`draft` with a (randomly initialised) confidence head added."""
    from vllm_specx.methods.dspark.model import ConfidenceHead

    draft.cfg = dataclasses.replace(draft.cfg, confidence_head=kind)
    torch.manual_seed(3)
    draft.confidence_head = ConfidenceHead(draft.cfg.hidden_size + (draft.cfg.markov_rank if kind == "hidden+markov" else 0))
    return draft


@torch.no_grad()
def test_labels_are_the_proposers_conditional_acceptance():
    """A DSpark head's greedy draft loop (prev = its own drafts) on a block whose true continuation
    is its drafts up to slot j, then another token: the teacher-forced labels of slots 0..j are
    exactly what verification accepts given the earlier drafts were (1 .. 1 0); the off-by-one
    labels are not."""
    from tests.test_dspark_torch import tiny
    from vllm_specx.methods.dspark import train as dspark_train
    from vllm_specx.training.blocks import assemble

    draft = with_head(tiny())
    n = draft.cfg.max_drafts
    g = torch.Generator().manual_seed(5)
    taps = torch.randn(30, 32, generator=g)
    ids = torch.randint(5, 50, (30,), generator=g)
    a = 12
    own = draft.greedy_drafts(taps[:a], int(ids[a]), n)  # the proposer's drafts at anchor a
    broken_agrees = []
    for j in range(n):
        seq = ids.clone()
        seq[a + 1:a + 1 + n] = torch.tensor(own)
        seq[a + 1 + j] = (own[j] + 1 - 5) % 45 + 5  # the target disagrees at draft j
        b = assemble([{"ids": seq, "taps": taps}], [[a]], 30, n, draft.cfg.mask_token_id, q=draft.cfg.block_size)
        out = dspark_train.forward(draft, {**b, "chain_tokens": "target"})
        out = DraftOutput(out.logits.reshape(1, n, -1), out.targets.reshape(1, n), confidence=out.confidence.reshape(1, n))
        want = [1.0] * j + [0.0]
        assert confidence_labels(out)[0, :j + 1].tolist() == want, j
        broken_agrees.append(_broken_labels(out)[0, :j + 1].tolist() == want)
        # The head's p_k reads the slot state and W1[prev_k]: the same as serving computes for an
        # accepted prefix (prev = the earlier drafts = the true tokens).
        h = draft.query_states(taps[:a], int(ids[a]), n)[None]
        prev = torch.cat([ids[a:a + 1], torch.tensor(own[:n - 1])])[None]
        serve = draft.confidence_logits(h, prev)[0]
        torch.testing.assert_close(out.confidence[0, :j + 1], serve[:j + 1], rtol=1e-5, atol=1e-5)
        # ... and on every slot, reached or not, what the proposer computes before verifying.
        torch.testing.assert_close(dspark_train.drafted_confidence(draft, b).reshape(n), serve, rtol=1e-5, atol=1e-5)
    assert not all(broken_agrees)  # negative control: the off-by-one labels fail this check


def _conf_output(seed=0):
    from tests.training.test_losses import _dist_output

    out = _dist_output(seed=seed)
    g = torch.Generator().manual_seed(seed + 10)
    conf = torch.randn(out.targets.shape, generator=g, dtype=torch.float64, requires_grad=True)
    return dataclasses.replace(out, confidence=conf)


def test_trainer_adds_the_weighted_bce_or_trains_it_alone():
    from vllm_specx.training.trainer import loss_and_accuracy

    out = _conf_output()
    w = position_weights(3, 4.0).double()
    valid = out.targets != IGNORE
    bce = confidence_bce(out.confidence, _label_formula(out), _reached_formula(_label_formula(out), valid))
    mixed, _ = loss_and_accuracy(out, "ce", 4.0, confidence_weight=0.5)
    torch.testing.assert_close(mixed, cross_entropy(out, w) + 0.5 * bce)
    alone, _ = loss_and_accuracy(out, "ce", 4.0, confidence_weight=0.5, train_only="confidence")
    torch.testing.assert_close(alone, bce)
    every, _ = loss_and_accuracy(out, "ce", 4.0, train_only="confidence", confidence_slots="all")
    torch.testing.assert_close(every, confidence_bce(out.confidence, _label_formula(out), valid))
    soft, _ = loss_and_accuracy(out, "ce", 4.0, train_only="confidence", confidence_label="soft")
    alpha = acceptance_rate(out).detach()
    torch.testing.assert_close(soft, confidence_bce(out.confidence, alpha, _reached_formula(alpha, valid)))
    (g,) = torch.autograd.grad(alone, out.logits, allow_unused=True)
    assert g is None or torch.count_nonzero(g) == 0  # labels carry no gradient into the draft
    plain, _ = loss_and_accuracy(dataclasses.replace(out, confidence=None), "ce", 4.0)
    torch.testing.assert_close(plain, cross_entropy(out, w))
    with pytest.raises(ValueError, match="no confidence head"):
        loss_and_accuracy(dataclasses.replace(out, confidence=None), "ce", 4.0, train_only="confidence")


def test_the_bce_trains_the_head_and_not_the_drafts():
    """DSpark's training forward: with `--confidence-weight` the draft's parameters get exactly the
    gradient of the draft loss alone; the head gets the BCE's."""
    import random

    from tests.test_dspark_torch import tiny
    from vllm_specx.methods.dspark import train as dspark_train
    from vllm_specx.training.trainer import loss_and_accuracy

    draft = with_head(tiny())
    samples = [{"ids": torch.randint(4, 50, (40,)), "taps": torch.randn(40, 32), "prompt_len": 5} for _ in range(3)]
    b = dspark_train.make_batch(samples, random.Random(0), 3, 32, 4, draft.cfg.max_drafts, 3, q=draft.cfg.block_size)
    grads = []
    for cw in (0.0, 2.0):
        draft.zero_grad()
        loss, _ = loss_and_accuracy(dspark_train.forward(draft, b), "ce", 4.0, confidence_weight=cw)
        loss.backward()
        grads.append({k: None if p.grad is None else p.grad.clone() for k, p in draft.named_parameters()})
    for k in grads[0]:
        if k.startswith("confidence_head."):
            assert grads[0][k] is None and torch.count_nonzero(grads[1][k]) > 0, k
        else:
            torch.testing.assert_close(grads[1][k], grads[0][k], msg=k)
