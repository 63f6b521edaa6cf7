"""The loss a run optimises, from its flags: `--loss` with exp(-k / gamma) position weights,
mixed with cross-entropy (`--ce-weight`), plus the confidence head's BCE.

A draft with a confidence head (a per-slot acceptance-probability logit, `DraftOutput.confidence`;
e.g. DSpark's `--confidence-head`) trains it with binary cross-entropy against each slot's
realised teacher-forced acceptance (`losses.confidence_bce`, labels `losses.confidence_labels`,
`--confidence-label greedy|soft`), on the slots a block reaches (`--confidence-slots`,
`losses.confidence_weights`): `--confidence-weight W` adds W * BCE to the draft loss;
`--train-only confidence` freezes every other parameter and trains on the BCE alone (the draft's
other tensors are saved as they were loaded, e.g. by a `--init-from` warm start);
`check_confidence_args` refuses flags that would train nothing."""

from __future__ import annotations

import argparse

import torch

from vllm_specx.training.config import TRAIN_ONLY, TrainConfig
from vllm_specx.training.losses import (
    IGNORE,
    LOSSES,
    confidence_bce,
    confidence_labels,
    confidence_weights,
    cross_entropy,
    per_position_accuracy,
    position_weights,
)


def loss_and_accuracy(out, loss: str, gamma: float, ce_weight: float = 0.0, confidence_weight: float = 0.0,
                      train_only: str | None = None, confidence_label: str = "greedy",
                      confidence_slots: str = "reached") -> tuple[torch.Tensor, torch.Tensor]:
    """(the `loss` of a forward's output with exp(-k / gamma) position weights, mixed with
    cross-entropy as (1 - ce_weight) * loss + ce_weight * CE when ce_weight > 0, plus
    confidence_weight * BCE of the confidence head when > 0 (the BCE alone when `train_only` is
    "confidence"); per-position accuracy).

    Why the mix: TV-type losses have almost no gradient where the draft puts ~no mass on the
    target's top-k (a fresh head), so a small CE term gets them started (seed recipe: 0.1)."""
    with torch.no_grad():
        acc = per_position_accuracy(out)
    return draft_loss(out, loss, gamma, ce_weight, confidence_weight, train_only, confidence_label,
                      confidence_slots), acc



def draft_loss(out, loss: str, gamma: float, ce_weight: float = 0.0, confidence_weight: float = 0.0,
               train_only: str | None = None, confidence_label: str = "greedy",
               confidence_slots: str = "reached") -> torch.Tensor:
    """`loss_and_accuracy`'s loss alone: what a training step needs (the accuracy's argmax over
    the vocabulary is about a tenth of a CPU step, benchmarks/results/train-step-cpu-smollm2)."""
    n = out.targets.shape[-1]
    if train_only == "confidence":
        return confidence_loss(out, confidence_label, confidence_slots)
    w = position_weights(n, gamma, out.logits.device)
    value = LOSSES[loss](out, w)
    if ce_weight:
        value = (1 - ce_weight) * value + ce_weight * cross_entropy(out, w)
    if confidence_weight:
        value = value + confidence_weight * confidence_loss(out, confidence_label, confidence_slots)
    return value



def confidence_loss(out, label: str = "greedy", slots: str = "reached") -> torch.Tensor:
    """BCE of the output's confidence logits against the slots' realised acceptance, over the
    `slots` (`losses.confidence_weights`)."""
    if out.confidence is None:
        raise ValueError("this draft has no confidence head (its forward returns no confidence logits)")
    n = out.targets.shape[-1]
    c = confidence_labels(out, label)
    return confidence_bce(out.confidence.reshape(-1, n), c,
                          confidence_weights(c, out.targets.reshape(-1, n) != IGNORE, slots))



def check_confidence_args(model, args: argparse.Namespace | TrainConfig) -> None:
    """Refuse confidence flags that would train nothing, or a confidence head nothing trains."""
    names = [n for n, _ in model.named_parameters()]
    has_head = any(n.startswith(TRAIN_ONLY["confidence"]) for n in names)
    if args.train_only and not any(n.startswith(TRAIN_ONLY[args.train_only]) for n in names):
        raise SystemExit(f"--train-only {args.train_only}: this draft has no such part (a confidence "
                         "head needs the method's flag, e.g. --confidence-head)")
    if args.confidence_weight and not has_head:
        raise SystemExit(f"--confidence-weight {args.confidence_weight}: this draft has no confidence "
                         "head (add one with the method's flag, e.g. --confidence-head)")
    if has_head and not args.confidence_weight and args.train_only != "confidence":
        raise SystemExit("this draft has a confidence head but nothing trains it: pass "
                         "--confidence-weight W > 0, or --train-only confidence")

