"""One training loop for every trainable method and baseline in the registry; it never names a method.

    vllm-specx train --method <name> --target <target dir> --data runs/data --out <draft dir> \
        --steps 600 [--loss ce|tv|chain-tv|...] [--device cuda --dtype bfloat16] [--resume]
    vllm-specx train --config <draft dir>/training.json     # re-run a recorded run exactly

The method's trainer hooks (`registry.trainers()`, a module) supply what differs per method:

* `add_args(parser)`: the method's own flags;
* `build(target, args, data_meta, embed, lm_head) -> model` (an nn.Module with `.cfg`);
* `batch(model, samples, rng, size, args) -> dict` of tensors (CPU);
* `forward(model, batch) -> losses.DraftOutput` (draft logits and what they should predict);
* `save(model, out_dir, dtype)`: a checkpoint vLLM loads (our proposer's, or vLLM's built-in).

The loop owns the rest: streaming the data from disk (`training.data.SampleStore`), optimiser
(AdamW, warm-up + cosine), the loss (`--loss`, `training.losses.LOSSES`, positions weighted by
exp(-k / gamma)), bf16 autocast (`--dtype`), validation on held-back samples every `--val-every`
steps printing the loss, per-position greedy acceptance, per-position alpha (sampled acceptance)
and two analytic taus: `tau_greedy` = mean over validation blocks of 1 + sum_j prod_{i<=j}
[draft i = target token] (teacher-forced greedy accepted length), `tau_sampled` = mean of 1 +
sum_j prod_{i<=j} alpha_i (needs the data's top-k). `<out>/trainer_state.pt` is written every
`--save-every` steps and at the end (`--resume` continues from it, bit for bit on CPU), and
`<out>/training.json` records the arguments, the command, the data's meta and the log.
Deterministic given `--seed` (on CPU).

A draft with a confidence head (a per-slot acceptance-probability logit, `DraftOutput.confidence`;
e.g. DSpark's `--confidence-head`) trains it with binary cross-entropy against each slot's
realised teacher-forced acceptance (`losses.confidence_bce`, labels `losses.confidence_labels`,
`--confidence-label greedy|soft`), on the slots a block reaches (`--confidence-slots`,
`losses.confidence_weights`): `--confidence-weight W` adds W * BCE to the draft loss;
`--train-only confidence` freezes every other parameter and trains on the BCE alone (the draft's
other tensors are saved as they were loaded, e.g. by a `--init-from` warm start). Validation then
also reports, on the reached slots with greedy labels, the head's BCE (`val_conf_bce`), Brier
score (`val_conf_brier`), its mean predicted acceptance per position (`val_conf_per_pos`) and
the realised conditional acceptance there (`val_conf_rate_per_pos`).
"""

from __future__ import annotations

import argparse
import contextlib
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
from vllm_specx.training.losses import (
    CONFIDENCE_LABELS,
    CONFIDENCE_SLOTS,
    IGNORE,
    LOSSES,
    NEEDS_TARGET_DISTRIBUTION,
    acceptance_rate,
    brier_score,
    confidence_bce,
    confidence_labels,
    confidence_weights,
    position_weights,
)

STATE_FILE = "trainer_state.pt"
RECORD_FILE = "training.json"
# `--train-only` parts: the parameters (by name prefix) that stay trainable.
TRAIN_ONLY = {"confidence": "confidence_head."}


def hooks(method_name: str):
    return importlib.import_module(registry.trainers()[method_name])


def loss_and_accuracy(out, loss: str, gamma: float, ce_weight: float = 0.0, confidence_weight: float = 0.0,
                      train_only: str | None = None, confidence_label: str = "greedy",
                      confidence_slots: str = "reached") -> tuple[torch.Tensor, torch.Tensor]:
    """(the `loss` of a forward's output with exp(-k / gamma) position weights, mixed with
    cross-entropy as (1 - ce_weight) * loss + ce_weight * CE when ce_weight > 0, plus
    confidence_weight * BCE of the confidence head when > 0 (the BCE alone when `train_only` is
    "confidence"); per-position accuracy).

    Why the mix: TV-type losses have almost no gradient where the draft puts ~no mass on the
    target's top-k (a fresh head), so a small CE term gets them started (seed recipe: 0.1)."""
    from vllm_specx.training.losses import cross_entropy, per_position_accuracy

    n = out.targets.shape[-1]
    with torch.no_grad():
        acc = per_position_accuracy(out)
    if train_only == "confidence":
        return confidence_loss(out, confidence_label, confidence_slots), acc
    w = position_weights(n, gamma).to(out.logits.device)
    value = LOSSES[loss](out, w)
    if ce_weight:
        value = (1 - ce_weight) * value + ce_weight * cross_entropy(out, w)
    if confidence_weight:
        value = value + confidence_weight * confidence_loss(out, confidence_label, confidence_slots)
    return value, acc


def confidence_loss(out, label: str = "greedy", slots: str = "reached") -> torch.Tensor:
    """BCE of the output's confidence logits against the slots' realised acceptance, over the
    `slots` (`losses.confidence_weights`)."""
    if out.confidence is None:
        raise ValueError("this draft has no confidence head (its forward returns no confidence logits)")
    n = out.targets.shape[-1]
    c = confidence_labels(out, label)
    return confidence_bce(out.confidence.reshape(-1, n), c,
                          confidence_weights(c, out.targets.reshape(-1, n) != IGNORE, slots))


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


def parser(method_name: str | None = None) -> argparse.ArgumentParser:
    names = sorted(registry.trainers())
    ap = argparse.ArgumentParser(prog="vllm-specx train", description=__doc__.split("\n")[0])
    ap.add_argument("--config", help=f"a {RECORD_FILE}: its arguments are the defaults")
    ap.add_argument("--method", required=True, choices=names)
    ap.add_argument("--target", required=True, help="a target name (e.g. smollm2) or a model directory")
    ap.add_argument("--data", required=True, help="output folder of `vllm-specx gen-data`")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=600,
                    help="optimizer steps; 0 with --init-from writes that draft as this run builds it "
                         "(e.g. restricted to a --draft-vocab) after validating it")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--loss", default="ce", choices=sorted(LOSSES))
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--gamma", type=float, default=4.0, help="position weight exp(-k / gamma)")
    ap.add_argument("--ce-weight", type=float, default=0.0,
                    help="mix in cross-entropy: (1 - w) * loss + w * CE (TV-type losses from scratch need it)")
    ap.add_argument("--confidence-weight", type=float, default=0.0,
                    help="add W * BCE of the draft's confidence head (its per-slot acceptance "
                         "probability) to the loss")
    ap.add_argument("--confidence-label", default="greedy", choices=CONFIDENCE_LABELS,
                    help="the head's label: greedy (draft == the target's argmax, teacher-forced) or "
                         "soft (sum_v min(p, q), needs the data's top-k)")
    ap.add_argument("--confidence-slots", default="reached", choices=CONFIDENCE_SLOTS,
                    help="slots the head learns from: reached (slot k only where drafts < k were "
                         "accepted: p_k is then the conditional acceptance serving multiplies) or all")
    ap.add_argument("--train-only", default=None, choices=sorted(TRAIN_ONLY),
                    help="freeze all but this part: confidence (the confidence head, on its BCE alone; "
                         "the draft's other tensors are saved unchanged)")
    ap.add_argument("--unseen-by", default=None,
                    help="a trained draft: train and validate only on samples whose prompts its training "
                         "data did not hold (a head added to that draft then learns how it does on new prompts)")
    ap.add_argument("--train-samples", type=int, default=None,
                    help="split in the data's order: the first --val-samples samples validate, the "
                         "next N train (a learning curve's sizes are nested; default: a seeded "
                         "shuffle of all samples)")
    ap.add_argument("--eval-data", action="append", default=[],
                    help="a `gen-data --for-eval` folder (repeatable): after training, the draft's "
                         "teacher-forced greedy tau and per-position acceptance on all its samples "
                         "are recorded under 'eval' in training.json")
    ap.add_argument("--eval-drafts", type=int, default=None,
                    help="--eval-data measures the first K draft positions (the K drafts a pass "
                         "serves, e.g. 7 for a block of 8); default: every trained position")
    ap.add_argument("--val-samples", type=int, default=32)
    ap.add_argument("--val-every", type=int, default=100)
    ap.add_argument("--save-every", type=int, default=200, help=f"steps between {STATE_FILE} writes")
    ap.add_argument("--resume", action="store_true", help=f"continue from <out>/{STATE_FILE}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="autocast dtype of forward/backward (parameters stay float32)")
    ap.add_argument("--save-dtype", default="float32", choices=["float32", "bfloat16"],
                    help="dtype of the saved checkpoint tensors")
    if method_name in names:
        hooks(method_name).add_args(ap)
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else list(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--method")
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    defaults = {}
    if known.config:
        file = Path(known.config)
        try:
            defaults = json.loads(file.read_text())["args"]
        except (OSError, ValueError, KeyError) as e:
            raise SystemExit(f"--config {file}: not a {RECORD_FILE} with an 'args' object ({e})") from None
    method = known.method or defaults.get("method")
    ap = parser(method)
    if known.config and method in registry.trainers():  # what an older record meant by a missing key
        defaults = {**getattr(hooks(method), "RECORD_DEFAULTS", {}), **defaults}
    known_dests = {a.dest for a in ap._actions}
    unknown = sorted(set(defaults) - known_dests)
    if unknown:
        raise SystemExit(f"--config {known.config}: unknown argument(s) {unknown}")
    ap.set_defaults(**{k: v for k, v in defaults.items() if k != "config"})
    for a in ap._actions:  # recorded values satisfy required flags
        if a.dest in defaults:
            a.required = False
    args = ap.parse_args(argv)
    args.config = None
    # paths as a record writes them portably (~/.cache/...) work as given
    args.data, args.out = str(Path(args.data).expanduser()), str(Path(args.out).expanduser())
    args.eval_data = [str(Path(d).expanduser()) for d in args.eval_data]
    return args


def _to(batch: dict, device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def train(args: argparse.Namespace) -> dict:
    """Train and save; returns the training record (also written to <out>/training.json)."""
    from vllm_specx.training.data import COMMANDS_FILE, load_samples
    from vllm_specx.training.taps import embed_and_head, load_target

    h = hooks(args.method)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: this torch build sees no CUDA device")
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    meta = json.loads((Path(args.data) / "meta.json").read_text())
    from vllm_specx.training.data import EVALUATION

    if meta.get("purpose") == EVALUATION:
        raise SystemExit(f"--data {args.data}: made with `gen-data --for-eval` (prompts {meta.get('prompts')!r}): "
                         "drafts are measured on it, never trained on it; pass it as --eval-data")
    evals = [(Path(d), _eval_meta(Path(d), meta)) for d in args.eval_data]
    if args.train_samples is not None and args.train_samples < 1:
        raise SystemExit(f"--train-samples {args.train_samples}: must be >= 1")
    if not 0 <= args.ce_weight <= 1:
        raise SystemExit(f"--ce-weight {args.ce_weight}: must be in [0, 1]")
    if args.confidence_weight < 0:
        raise SystemExit(f"--confidence-weight {args.confidence_weight}: must be >= 0")
    if args.confidence_label == "soft" and not meta.get("topk"):
        raise SystemExit(f"--confidence-label soft needs the target's distribution: {args.data} has no top-k")
    if args.train_only != "confidence" and args.loss in NEEDS_TARGET_DISTRIBUTION and not meta.get("topk"):
        raise SystemExit(f"--loss {args.loss} needs the target's distribution: {args.data} has no "
                         "top-k (make it with `vllm-specx gen-data ... --topk 32`)")
    from vllm_specx.targets import resolve

    target = load_target(resolve(args.target))
    samples = load_samples(Path(args.data))
    pool = usable(samples, meta, args.unseen_by)
    if len(pool) <= args.val_samples:
        raise SystemExit(f"--data {args.data}: {len(pool)} usable samples, not more than --val-samples {args.val_samples}")
    if args.train_samples is None:
        val_idx, train_idx = split(len(pool), args.val_samples, rng)
        val_idx, train_idx = [pool[i] for i in val_idx], [pool[i] for i in train_idx]
    else:  # data order: the same validation samples and nested training sets for every N
        val_idx, train_idx = data_order_split(samples, pool, args.val_samples, args.train_samples)
    val, train_set = samples.subset(val_idx), samples.subset(train_idx)
    model = h.build(target, args, meta, *embed_and_head(target)).to(device)
    del target
    check_confidence_args(model, args)
    if args.train_only:
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith(TRAIN_ONLY[args.train_only]))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / max(1, args.steps)))))
    vrng = random.Random(1)
    val_batches = [h.batch(model, val.subset(range(i, min(i + args.batch, len(val)))), vrng,
                           min(args.batch, len(val) - i), args) for i in range(0, len(val), args.batch)]
    out_dir = Path(args.out)
    start, log, wall = 0, [], 0.0
    if args.resume and (out_dir / STATE_FILE).is_file():
        st = torch.load(out_dir / STATE_FILE, map_location=device, weights_only=False)
        changed = {k: (v, getattr(args, k, None)) for k, v in st.get("args", {}).items()
                   if getattr(args, k, None) != v}
        if changed:  # a resumed run is the interrupted run: another loss, schedule or data is a new run
            raise SystemExit(f"--resume {out_dir / STATE_FILE}: " + ", ".join(
                f"--{k.replace('_', '-')} {new} differs from the interrupted run's {old}" for k, (old, new) in changed.items())
                + "; start a new --out, or resume with the same arguments")
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        rng.setstate(st["rng"])
        torch.set_rng_state(st["torch_rng"])
        start, log, wall = st["step"], st["log"], st["wall_s"]
        tqdm.write(f"resumed from {out_dir / STATE_FILE} at step {start}")
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if args.dtype == "bfloat16"
                else contextlib.nullcontext())

    def save_state(step):
        out_dir.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                    "rng": rng.getstate(), "torch_rng": torch.get_rng_state(), "step": step, "log": log,
                    "wall_s": wall + time.time() - t0, "args": _run_args(args)}, out_dir / (STATE_FILE + ".tmp"))
        (out_dir / (STATE_FILE + ".tmp")).replace(out_dir / STATE_FILE)

    def validate(step, train_loss):
        total, vloss = {}, 0.0
        with torch.no_grad(), autocast:
            for vb in val_batches:
                vout = h.forward(model, _to(vb, device))
                vloss += loss_and_accuracy(vout, *loss_args)[0].item() / len(val_batches)
                for k, v in validation_stats(vout).items():
                    total[k] = total.get(k, 0) + v.float().cpu()
        log.append({"step": step, "train_loss": train_loss, "val_loss": round(vloss, 4),
                    **summarise(total), "elapsed_s": round(wall + time.time() - t0, 1)})
        tqdm.write(json.dumps(log[-1]))

    loss_args = (args.loss, args.gamma, args.ce_weight, args.confidence_weight, args.train_only,
                 args.confidence_label, args.confidence_slots)
    t0 = time.time()
    if start == 0:
        validate(0, None)  # the initial model: what training improves on
    for step in (bar := tqdm(range(start, args.steps), desc=f"train {args.method}", initial=start, total=args.steps)):
        with autocast:
            out = h.forward(model, _to(h.batch(model, train_set, rng, args.batch, args), device))
            loss, _ = loss_and_accuracy(out, *loss_args)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % args.val_every == 0 or step + 1 == args.steps:
            validate(step + 1, round(loss.item(), 4))
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            save_state(step + 1)
    if evals:
        evaluated = {}
        for d, m in evals:
            evaluated[d.name] = evaluate(h, model, load_samples(d), args, device, autocast)
            evaluated[d.name]["prompts"] = m.get("prompts")
            tqdm.write(f"eval {d.name}: {json.dumps(evaluated[d.name])}")
    cmds = Path(args.data) / COMMANDS_FILE
    record = {"command": "vllm-specx train " + command_flags(args), "args": vars(args), "data": meta,
              "data_commands": cmds.read_text().splitlines() if cmds.is_file() else None,
              "data_samples": len(samples),
              **({"unseen_by_excluded": len(samples) - len(pool)} if args.unseen_by else {}),
              "train_samples": len(train_set), "val_samples": len(val),
              "val_prompt_ids": [samples.index[i][1] for i in val_idx],
              "wall_s": round(wall + time.time() - t0, 1), "log": log,
              **({"eval": evaluated} if evals else {})}
    h.save(model, args.out, getattr(torch, args.save_dtype))
    (out_dir / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
    print(f"saved {args.out}")
    return record


def _eval_meta(folder: Path, train_meta: dict) -> dict:
    """An --eval-data folder's meta, checked against the training data's: the same target and
    the same taps, in the same order."""
    try:
        m = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"--eval-data {folder}: not a gen-data folder ({e})") from None
    if m.get("target") != train_meta.get("target"):
        raise SystemExit(f"--eval-data {folder}: made for target {m.get('target')!r}, the training data "
                         f"for {train_meta.get('target')!r}")
    if m.get("taps") != train_meta.get("taps"):
        raise SystemExit(f"--eval-data {folder}: taps {m.get('taps')} differ from the training data's "
                         f"{train_meta.get('taps')} (the draft reads taps by position: make it with the "
                         f"same --taps)")
    return m


@torch.no_grad()
def evaluate(h, model, samples, args, device, autocast, seed: int = 2) -> dict:
    """Teacher-forced greedy tau and per-position acceptance of `model` on every sample of an
    evaluation folder (`--anchors` blocks per sequence, placed by a fixed seed): for greedy
    verification this is the served accepted length at those anchors, since a greedy chain's
    inputs equal the target's tokens wherever its drafts are accepted."""
    rng, total = random.Random(seed), {}
    with autocast:
        for i in range(0, len(samples), args.batch):
            part = samples.subset(range(i, min(i + args.batch, len(samples))))
            out = h.forward(model, _to(h.batch(model, part, rng, len(part), args), device))
            if args.eval_drafts:
                out = _first_positions(out, args.eval_drafts)
            for k, v in validation_stats(out).items():
                total[k] = total.get(k, 0) + v.float().cpu()
    res = summarise(total)
    return {"samples": len(samples), "blocks": int(total["blocks"]), **res}


def _first_positions(out, k: int):
    """A DraftOutput cut to its first k draft positions (targets [..., n], logits [..., n, V])."""
    import dataclasses

    cut = lambda t, dim: None if t is None else t.narrow(dim, 0, min(k, t.shape[dim]))  # noqa: E731
    n = out.targets.dim() - 1
    return dataclasses.replace(out, logits=cut(out.logits, n), targets=cut(out.targets, n),
                               target_ids=cut(out.target_ids, n), target_logp=cut(out.target_logp, n),
                               confidence=cut(out.confidence, n))


def usable(samples, data_meta: dict, unseen_by: str | None) -> list[int]:
    """Indices of the samples a run may use: all, or with `unseen_by` (a draft directory with a
    training record) those whose prompt its training data did not hold (`data.trained_prompt_ids`)."""
    if not unseen_by:
        return list(range(len(samples)))
    from vllm_specx.training.data import trained_prompt_ids

    rec_file = Path(unseen_by) / RECORD_FILE
    try:
        seen = trained_prompt_ids(json.loads(rec_file.read_text()))
    except (OSError, ValueError) as e:
        raise SystemExit(f"--unseen-by {unseen_by}: cannot tell which prompts it was trained on ({e})") from None
    if seen is None:
        raise SystemExit(f"--unseen-by {unseen_by}: its {RECORD_FILE} does not say which prompts it was trained on")
    spec, ids = seen
    if spec != data_meta.get("prompts"):
        raise SystemExit(f"--unseen-by {unseen_by}: trained on prompts {spec!r}, this data on "
                         f"{data_meta.get('prompts')!r}; prompt ids of different sets cannot be compared")
    return [i for i in range(len(samples)) if samples.index[i][1] not in ids]


def data_order_split(samples, pool: list[int], val_samples: int, n: int) -> tuple[list[int], list[int]]:
    """`--train-samples N`: (validation, training) sample indices in the data's order (gen-data
    writes answers in prompt order): the first `val_samples` samples validate, the next N train.
    Every N gets the same validation samples and nested training sets, and a run needs taps only
    for that prefix (a data set whose prompt order is a mix, like chat-mix, gives representative
    prefixes)."""
    order = sorted(pool, key=lambda i: samples.index[i][1])  # by sample id: prompt order
    if val_samples + n > len(order):
        raise SystemExit(f"--train-samples {n}: the data holds {len(order)} samples with taps, fewer "
                         f"than {val_samples} validation + {n} training samples")
    return order[:val_samples], order[val_samples: val_samples + n]


def split(n: int, val_samples: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """(validation, training) sample indices: a shuffle of range(n) by `rng` (the trainer's, seeded
    with `--seed`), the first `val_samples` held back. `benchmarks/confidence_calibration.py`
    re-draws a run's split from its record with this."""
    order = list(range(n))
    rng.shuffle(order)
    return order[:val_samples], order[val_samples:]


def check_confidence_args(model, args: argparse.Namespace) -> None:
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


RESUME_MAY_CHANGE = ("out", "resume", "config", "threads", "device", "val_every", "save_every")


def _run_args(args: argparse.Namespace) -> dict:
    """The arguments a `--resume` must repeat: all but where it runs and how often it reports."""
    return {k: v for k, v in vars(args).items() if k not in RESUME_MAY_CHANGE}


def command_flags(args: argparse.Namespace) -> str:
    """The flags that re-run `args` (switches only when set, `--no-X` for a switch that is on by
    default and was turned off; a repeatable option once per value; unset and empty options left
    out)."""
    on_by_default = {a.dest for a in parser(getattr(args, "method", None))._actions
                     if isinstance(a, argparse.BooleanOptionalAction) and a.default is True}
    out = []
    for k, v in vars(args).items():
        if k in ("config", "resume"):
            continue
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        elif v is False and k in on_by_default:
            out.append("--no-" + k.replace("_", "-"))
        elif isinstance(v, (list, tuple)):  # a repeatable option: once per value
            out += [f"{flag} {x}" for x in v]
        elif v is not None and v is not False and v != "":
            out.append(f"{flag} {v}")
    return " ".join(out)


def main(argv: list[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
