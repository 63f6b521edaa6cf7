"""One training loop for every trainable method in the registry; it never names a method.

    python -m vllm_specx.training.trainer --method <name> --target assets/ref-target \
        --data runs/data --out assets/drafts/<head> --steps 600      # or: vllm-specx train ...

The method's trainer hooks (`Method.trainer`, a module) supply what differs per method:

* `add_args(parser)`: the method's own flags;
* `build(target, args, data_meta, embed, lm_head) -> model` (an nn.Module with `.cfg`);
* `batch(model, samples, rng, size, args) -> dict` of tensors;
* `forward(model, batch) -> losses.DraftOutput` (draft logits and the tokens they should predict);
* `save(model, out_dir)`.

The loop owns the rest: data loading (`training.data`), optimiser, schedule, the loss
(`--loss`, from `training.losses.LOSSES`, weighted per draft position by exp(-k / gamma)),
validation on a held-back slice of the data, and `training.json` beside the checkpoint (the exact
command, the data's meta, the log). Deterministic given `--seed`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from vllm_specx import registry
from vllm_specx.training.losses import LOSSES, per_position_accuracy, position_weights


def trainable_methods() -> dict[str, registry.Method]:
    return {name: m for name, m in registry.methods().items() if m.trainer}


def hooks(method: registry.Method):
    return importlib.import_module(method.trainer)


def loss_and_accuracy(out, loss: str, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(the `loss` of a forward's output with exp(-k / gamma) position weights, per-position accuracy)."""
    n = out.targets.shape[-1]
    with torch.no_grad():
        acc = per_position_accuracy(out)
    return LOSSES[loss](out, position_weights(n, gamma)), acc


def parser(method_name: str | None = None) -> argparse.ArgumentParser:
    methods = trainable_methods()
    ap = argparse.ArgumentParser(prog="vllm-specx train", description=__doc__.split("\n")[0])
    ap.add_argument("--method", required=True, choices=sorted(methods))
    ap.add_argument("--target", required=True)
    ap.add_argument("--data", required=True, help="output folder of `vllm-specx gen-data`")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--loss", default="ce", choices=sorted(LOSSES))
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--gamma", type=float, default=4.0, help="position weight exp(-k / gamma)")
    ap.add_argument("--val-samples", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    if method_name in methods:
        hooks(methods[method_name]).add_args(ap)
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--method")
    known, _ = pre.parse_known_args(argv)
    return parser(known.method).parse_args(argv)


def train(args: argparse.Namespace) -> dict:
    """Train and save; returns the training record (also written to <out>/training.json)."""
    from vllm_specx.training.data import load_samples
    from vllm_specx.training.taps import embed_and_head, load_target

    h = hooks(registry.get(args.method))
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    meta = json.loads((Path(args.data) / "meta.json").read_text())
    target = load_target(args.target)
    samples = load_samples(Path(args.data))
    rng.shuffle(samples)
    val, train_set = samples[:args.val_samples], samples[args.val_samples:]
    model = h.build(target, args, meta, *embed_and_head(target))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr,
                            weight_decay=0.01, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / args.steps))))
    val_batch = h.batch(model, val, random.Random(1), len(val), args)
    t0, log = time.time(), []
    for step in (bar := tqdm(range(args.steps), desc="train")):
        loss, _ = loss_and_accuracy(h.forward(model, h.batch(model, train_set, rng, args.batch, args)),
                                    args.loss, args.gamma)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % 100 == 0 or step + 1 == args.steps:
            with torch.no_grad():
                vloss, vacc = loss_and_accuracy(h.forward(model, val_batch), args.loss, args.gamma)
            # Expected accepted length under greedy verification if positions were independent.
            est_tau = 1 + torch.cumprod(vacc, 0).sum().item()
            log.append({"step": step + 1, "train_loss": round(loss.item(), 4), "val_loss": round(vloss.item(), 4),
                        "val_acc_per_pos": [round(a, 3) for a in vacc.tolist()], "est_tau": round(est_tau, 3)})
            tqdm.write(json.dumps(log[-1]))
    record = {"command": "python -m vllm_specx.training.trainer " + command_flags(args), "data": meta,
        "train_samples": len(train_set), "wall_s": round(time.time() - t0, 1), "log": log}
    h.save(model, args.out)
    (Path(args.out) / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"saved {args.out}")
    return record


def command_flags(args: argparse.Namespace) -> str:
    """The flags that re-run `args` (switches only when set; unset options left out)."""
    out = []
    for k, v in vars(args).items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        elif v is not None and v is not False:
            out.append(f"{flag} {v}")
    return " ".join(out)


def main(argv: list[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
