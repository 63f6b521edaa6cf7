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
