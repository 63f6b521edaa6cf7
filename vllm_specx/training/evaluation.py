"""What a draft is measured by: validation's statistics of one batch (`validation_stats`) and
their means (`summarise`), and `--eval-data`'s measurement of a trained draft (`evaluate`).

Validation reports the loss, per-position greedy acceptance, per-position alpha (sampled
acceptance) and two analytic taus: `tau_greedy` = mean over validation blocks of 1 + sum_j
prod_{i<=j} [draft i = target token] (teacher-forced greedy accepted length), `tau_sampled` = mean
of 1 + sum_j prod_{i<=j} alpha_i (needs the data's top-k). With a confidence head it also
reports, on the reached slots with greedy labels, the head's BCE (`val_conf_bce`), Brier score
(`val_conf_brier`), its mean predicted acceptance per position (`val_conf_per_pos`) and the
realised conditional acceptance there (`val_conf_rate_per_pos`)."""

from __future__ import annotations

import random

import torch

from vllm_specx.training.blocks import to_device
from vllm_specx.training.losses import (
    IGNORE,
    acceptance_rate,
    brier_score,
    confidence_bce,
    confidence_labels,
    confidence_weights,
    first_positions,
)
from vllm_specx.training.serving_count import served_tau


def validation_stats(out) -> dict[str, torch.Tensor]:
    """Sums over valid blocks/positions of one validation batch (`summarise` turns them into means)."""
    n = out.targets.shape[-1]
    logits = out.logits.reshape(-1, n, out.logits.shape[-1])
    targets = out.targets.reshape(-1, n)
    valid = (targets != IGNORE).float()
    hit = (logits.argmax(-1) == targets).float() * valid
    full = valid.all(-1).float()  # blocks with every position in range (taus are over these)
    st = {"valid": valid.sum(0), "hit": hit.sum(0), "blocks": full.sum(),
          "tau_greedy": ((1 + torch.cumprod(hit, -1).sum(-1)) * full).sum()}
    if out.target_ids is not None:
        alpha = acceptance_rate(out).float() * valid
        st["alpha"] = alpha.sum(0)
        st["tau_sampled"] = ((1 + torch.cumprod(alpha, -1).sum(-1)) * full).sum()
    if out.confidence is not None:  # the head against the greedy acceptance, on the slots blocks reach
        z, c = out.confidence.reshape(-1, n).float(), confidence_labels(out, "greedy").float()
        reached = confidence_weights(c, valid)
        m = reached.sum()
        st["conf_reached"] = reached.sum(0)
        st["conf_bce"] = confidence_bce(z, c, reached) * m
        st["conf_brier"] = brier_score(torch.sigmoid(z), c, reached) * m
        st["conf_p"] = (torch.sigmoid(z) * reached).sum(0)
        st["conf_hit"] = (c * reached).sum(0)
    return st



def summarise(total: dict[str, torch.Tensor]) -> dict:
    out = {"val_acc_per_pos": [round(a, 3) for a in (total["hit"] / total["valid"].clamp(min=1)).tolist()],
           "tau_greedy": round((total["tau_greedy"] / total["blocks"].clamp(min=1)).item(), 3)}
    if "alpha" in total:
        out["val_alpha_per_pos"] = [round(a, 3) for a in (total["alpha"] / total["valid"].clamp(min=1)).tolist()]
        out["tau_sampled"] = round((total["tau_sampled"] / total["blocks"].clamp(min=1)).item(), 3)
    if "conf_bce" in total:
        r = total["conf_reached"]
        out["val_conf_bce"] = round((total["conf_bce"] / r.sum().clamp(min=1)).item(), 4)
        out["val_conf_brier"] = round((total["conf_brier"] / r.sum().clamp(min=1)).item(), 4)
        out["val_conf_per_pos"] = [round(a, 3) for a in (total["conf_p"] / r.clamp(min=1)).tolist()]
        out["val_conf_rate_per_pos"] = [round(a, 3) for a in (total["conf_hit"] / r.clamp(min=1)).tolist()]
    return out



@torch.no_grad()
def evaluate(h, model, samples, args, device, autocast, seed: int = 2, served: bool = True) -> dict:
    """Teacher-forced greedy tau and per-position acceptance of `model` on every sample of an
    evaluation folder (`--anchors` blocks per sequence, placed by a fixed seed): for greedy
    verification this is the served accepted length at those anchors, since a greedy chain's
    inputs equal the target's tokens wherever its drafts are accepted. With `served` (answers
    generated at T = 0) also tau as serving counts it (`serving_count.served_tau`: `tau_served`,
    `served_acc_per_pos`, `served_passes`), K = `--eval-drafts` or every trained position."""
    rng, total = random.Random(seed), {}
    with autocast:
        for i in range(0, len(samples), args.batch):
            part = samples.subset(range(i, min(i + args.batch, len(samples))))
            out = h.forward(model, to_device(h.batch(model, part, rng, len(part), args), device))
            if args.eval_drafts:
                out = first_positions(out, args.eval_drafts)
            for k, v in validation_stats(out).items():
                total[k] = total.get(k, 0) + v.float().cpu()
    res = summarise(total)
    if served:
        k = len(res["val_acc_per_pos"])
        res.update(served_tau(h, model, samples, args, device, autocast, k, getattr(args, "eval_max_tokens", None)))
    return {"samples": len(samples), "blocks": int(total["blocks"]), **res}

