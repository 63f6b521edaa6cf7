"""Training losses for draft heads: one function per loss, its formula and why it matters for
acceptance in its docstring, tested for value and gradient in `tests/training/test_losses.py`.

Every loss takes a `DraftOutput` (draft logits for N draft positions and the tokens they should
predict) and per-position weights, and returns a scalar. Notation: position k = 0..N-1 of a
block, `z_k` the draft logits, `q_k = softmax(z_k)` the draft distribution, `y_k` the target
token (on-policy: what the target generated), `w_k` the position weight. Rows whose target is
`IGNORE` (-100) carry no loss.

`LOSSES` maps the trainer's `--loss` names to the functions; the training issue adds TV,
-log sum min(p, q) and chain TV here, each beside its test.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

IGNORE = -100


@dataclasses.dataclass
class DraftOutput:
    """What a method's training forward returns.

    Attributes:
        logits: [..., N, V] draft logits at each of the N draft positions of every block.
        targets: [..., N] int64 token each position should predict, IGNORE for no loss.
    """

    logits: torch.Tensor
    targets: torch.Tensor


def position_weights(n: int, gamma: float) -> torch.Tensor:
    """w_k = exp(-k / gamma), k = 0..n-1.

    Why: draft k is only ever used if drafts 0..k-1 were all accepted, so its contribution to the
    accepted length is discounted by the chance of getting that far; an exponential decay is the
    usual stand-in for that product (published block-drafter recipes use gamma ~ 4-7 for blocks
    of 8-16).
    """
    return torch.exp(-torch.arange(n) / gamma)


def cross_entropy(out: DraftOutput, weights: torch.Tensor) -> torch.Tensor:
    """Weighted cross-entropy on the target's tokens:

        L = sum_{r,k} w_k * valid_{r,k} * (-log q_k(y_{r,k})) / sum_{r,k} w_k * valid_{r,k}

    Why: with greedy verification a draft is accepted iff its argmax equals the target's token,
    and CE on on-policy tokens pushes the draft's mode onto them; it is the standard first-stage
    objective of published draft heads, though it ignores how much mass the target puts elsewhere, which
    matters at temperature > 0 (where TV-type losses fit acceptance better).
    """
    n = out.targets.shape[-1]
    ce = F.cross_entropy(out.logits.flatten(0, -2), out.targets.flatten(), reduction="none",
                         ignore_index=IGNORE).view(-1, n)
    valid = (out.targets.reshape(-1, n) != IGNORE).float()
    return (ce * valid * weights).sum() / (valid * weights).sum().clamp(min=1)


def per_position_accuracy(out: DraftOutput) -> torch.Tensor:
    """[N] fraction of valid rows whose draft argmax equals the target, per draft position (the
    teacher-forced greedy acceptance rate of each position)."""
    n = out.targets.shape[-1]
    targets = out.targets.reshape(-1, n)
    valid = (targets != IGNORE).float()
    hit = (out.logits.reshape(-1, n, out.logits.shape[-1]).argmax(-1) == targets).float()
    return (hit * valid).sum(0) / valid.sum(0).clamp(min=1)


LOSSES = {"ce": cross_entropy}
