"""One training loop for every trainable method and baseline in the registry; it never names a method.

    vllm-specx train --method <name> --target <target dir> --data runs/data --out <draft dir> \
        --steps 600 [--loss ce|tv|chain-tv|...] [--device cuda --dtype bfloat16] [--resume]
    vllm-specx train --config <draft dir>/training.json     # re-run a recorded run exactly

The method's trainer hooks (`registry.trainers()`, a module) supply what differs per method:

* `add_args(parser)`: the method's own flags;
* `build(target, args, data_meta, embed, lm_head) -> model` (an nn.Module with `.cfg`);
* `batch(model, samples, rng, size, args, at=None) -> dict` of tensors (CPU; `at`: blocks at
  given anchors of whole samples, for `serving_count`), each [size, ...] (torchrun's ranks take
  rows of it);
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

The arguments are one typed config (`TrainConfig`: the trainer's flags as fields, checked in
`__post_init__`, the method's flags in `method_args` and read as attributes, so the config is the
`args` the hooks take), and `train(args)` runs the stages in turn: `setup` (device, seeds, process
group), `load_data` (meta, split), `build_run` (draft, optimiser, validation batches, `--resume`),
`loop` (steps, `validate`, `save_state`) and `save` (`--eval-data`, checkpoint, record).

Distributed training (DDP): `torchrun --nproc-per-node N -m vllm_specx.cli train ...` starts N
processes (WORLD_SIZE, RANK, LOCAL_RANK in their environment); each joins a process group, gloo
for `--device cpu`, NCCL for `--device cuda` (rank r on cuda:LOCAL_RANK; an explicit `cuda:1` is
refused: pick GPUs with CUDA_VISIBLE_DEVICES). `--batch B` is the global batch (B must divide by
N). The data is sharded by rows of each global batch: every rank draws the same global batch with
the run's seeded rng (the very draws one process makes) and computes on its B / N sequences only
(`shard`); DDP averages the gradients. So the data order is the run's for any N: a run compares
and resumes across world sizes, unlike per-rank data bins (speculators' trainer gives each rank
its own shuffled share, so N changes which samples meet in a step). The price: every rank reads
the whole global batch's samples from disk (forward, backward and optimiser are what it shares).
Each rank's loss is the mean over its own valid positions, so the average DDP takes weighs the
ranks' shares equally where one process weighs them by their valid positions: N processes
train one process's run up to that and float summation order, not bit for bit
(`tests/training/test_distributed.py` bounds it). Validation batches are shared out over the
ranks and summed back in batch order (the numbers one process gets on the same weights);
`--eval-data` runs on rank 0 alone, after training. Rank 0 alone prints and writes
trainer_state.pt (with the world size and every rank's torch RNG state), the checkpoint and
training.json (with "world_size" and "torchrun_command"; its "command", one process, trains the
same run). `--resume` loads the one state on every rank, also with another world size (the same
global batches; then equal up to summation order). `--threads` is per process.

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
import dataclasses
import importlib
import inspect
import json
import math
import os
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
    from vllm_specx.training.losses import per_position_accuracy

    with torch.no_grad():
        acc = per_position_accuracy(out)
    return draft_loss(out, loss, gamma, ce_weight, confidence_weight, train_only, confidence_label,
                      confidence_slots), acc


def draft_loss(out, loss: str, gamma: float, ce_weight: float = 0.0, confidence_weight: float = 0.0,
               train_only: str | None = None, confidence_label: str = "greedy",
               confidence_slots: str = "reached") -> torch.Tensor:
    """`loss_and_accuracy`'s loss alone: what a training step needs (the accuracy's argmax over
    the vocabulary is about a tenth of a CPU step, benchmarks/results/train-step-cpu-smollm2)."""
    from vllm_specx.training.losses import cross_entropy

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


@dataclasses.dataclass
class TrainConfig:
    """A training run's arguments, typed and checked (`__post_init__`: errors name the flag).

    The fields are the trainer's own flags (their defaults are the parser's); the method's flags
    (its hooks' `add_args`) are in `method_args` and read as attributes too, so the config is the
    `args` the hooks take. `as_dict()` is what the record stores under "args": the parsed
    namespace's keys, in its order."""

    method: str
    target: str
    data: str
    out: str
    config: str | None = None
    steps: int = 600
    batch: int = 8
    loss: str = "ce"
    lr: float = 2e-3
    gamma: float = 4.0
    ce_weight: float = 0.0
    confidence_weight: float = 0.0
    confidence_label: str = "greedy"
    confidence_slots: str = "reached"
    train_only: str | None = None
    unseen_by: str | None = None
    train_samples: int | None = None
    eval_data: list[str] = dataclasses.field(default_factory=list)
    eval_max_tokens: int | None = None
    eval_drafts: int | None = None
    val_samples: int = 32
    val_every: int = 100
    save_every: int = 200
    resume: bool = False
    seed: int = 0
    threads: int = 2
    device: str = "cpu"
    dtype: str = "float32"
    save_dtype: str = "float32"
    method_args: dict = dataclasses.field(default_factory=dict)
    keys: tuple[str, ...] = dataclasses.field(default=(), repr=False, compare=False)  # as_dict's order

    def __post_init__(self):
        def need(ok: bool, flag: str, why: str):
            if not ok:
                raise SystemExit(f"--{flag.replace('_', '-')} {getattr(self, flag)}: {why}")

        need(self.method in registry.trainers(), "method", f"not a trainable method ({', '.join(sorted(registry.trainers()))})")
        need(self.steps >= 0, "steps", "must be >= 0")
        need(self.batch >= 1, "batch", "must be >= 1")
        need(self.loss in LOSSES, "loss", f"not a loss ({', '.join(sorted(LOSSES))})")
        need(self.confidence_label in CONFIDENCE_LABELS, "confidence_label", f"one of {CONFIDENCE_LABELS}")
        need(self.confidence_slots in CONFIDENCE_SLOTS, "confidence_slots", f"one of {CONFIDENCE_SLOTS}")
        need(self.train_only is None or self.train_only in TRAIN_ONLY, "train_only", f"one of {sorted(TRAIN_ONLY)}")
        need(self.train_samples is None or self.train_samples >= 1, "train_samples", "must be >= 1")
        need(0 <= self.ce_weight <= 1, "ce_weight", "must be in [0, 1]")
        need(self.confidence_weight >= 0, "confidence_weight", "must be >= 0")
        need(self.eval_max_tokens is None or self.eval_max_tokens >= 1, "eval_max_tokens", "must be >= 1")
        need(self.eval_drafts is None or self.eval_drafts >= 1, "eval_drafts", "must be >= 1")
        need(self.val_samples >= 1, "val_samples", "must be >= 1 (validation is what the log reports)")
        need(self.val_every >= 1, "val_every", "must be >= 1")
        need(self.save_every >= 1, "save_every", "must be >= 1")
        need(self.threads >= 1, "threads", "must be >= 1")
        need(self.dtype in ("float32", "bfloat16"), "dtype", "float32 or bfloat16")
        need(self.save_dtype in ("float32", "bfloat16"), "save_dtype", "float32 or bfloat16")
        clash = set(self.method_args) & {f.name for f in dataclasses.fields(self)}
        if clash:
            raise ValueError(f"method flags {sorted(clash)} shadow the trainer's own")

    def __getattr__(self, name: str):  # the method's flags, as the hooks read them (args.seq_len)
        if name.startswith("__") or name == "method_args":
            raise AttributeError(name)
        try:
            return self.__dict__["method_args"][name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no flag {name!r}") from None

    @classmethod
    def from_args(cls, args: argparse.Namespace | dict) -> TrainConfig:
        """The config of parsed arguments (`parse_args`); the keys the trainer does not own are
        the method's flags."""
        items = dict(vars(args) if isinstance(args, argparse.Namespace) else args)
        own = {f.name for f in dataclasses.fields(cls)} - {"method_args", "keys"}
        return cls(**{k: v for k, v in items.items() if k in own},
                   method_args={k: v for k, v in items.items() if k not in own}, keys=tuple(items))

    def as_dict(self) -> dict:
        """The arguments as `vars(parse_args(...))` has them (the record's "args")."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("method_args", "keys")}
        both = {**own, **self.method_args}
        return {k: both[k] for k in (self.keys or both) if k in both}


_DEFAULTS = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
             for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING
             or f.default_factory is not dataclasses.MISSING}


def parser(method_name: str | None = None) -> argparse.ArgumentParser:
    names = sorted(registry.trainers())
    ap = argparse.ArgumentParser(prog="vllm-specx train", description=__doc__.split("\n")[0])
    ap.add_argument("--config", help=f"a {RECORD_FILE}: its arguments are the defaults")
    ap.add_argument("--method", required=True, choices=names)
    ap.add_argument("--target", required=True, help="a target name (e.g. smollm2) or a model directory")
    ap.add_argument("--data", required=True, help="output folder of `vllm-specx gen-data`")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=_DEFAULTS["steps"],
                    help="optimizer steps; 0 with --init-from writes that draft as this run builds it "
                         "(e.g. restricted to a --draft-vocab) after validating it")
    ap.add_argument("--batch", type=int, default=_DEFAULTS["batch"])
    ap.add_argument("--loss", default=_DEFAULTS["loss"], choices=sorted(LOSSES))
    ap.add_argument("--lr", type=float, default=_DEFAULTS["lr"])
    ap.add_argument("--gamma", type=float, default=_DEFAULTS["gamma"], help="position weight exp(-k / gamma)")
    ap.add_argument("--ce-weight", type=float, default=_DEFAULTS["ce_weight"],
                    help="mix in cross-entropy: (1 - w) * loss + w * CE (TV-type losses from scratch need it)")
    ap.add_argument("--confidence-weight", type=float, default=_DEFAULTS["confidence_weight"],
                    help="add W * BCE of the draft's confidence head (its per-slot acceptance "
                         "probability) to the loss")
    ap.add_argument("--confidence-label", default=_DEFAULTS["confidence_label"], choices=CONFIDENCE_LABELS,
                    help="the head's label: greedy (draft == the target's argmax, teacher-forced) or "
                         "soft (sum_v min(p, q), needs the data's top-k)")
    ap.add_argument("--confidence-slots", default=_DEFAULTS["confidence_slots"], choices=CONFIDENCE_SLOTS,
                    help="slots the head learns from: reached (slot k only where drafts < k were "
                         "accepted: p_k is then the conditional acceptance serving multiplies) or all")
    ap.add_argument("--train-only", default=_DEFAULTS["train_only"], choices=sorted(TRAIN_ONLY),
                    help="freeze all but this part: confidence (the confidence head, on its BCE alone; "
                         "the draft's other tensors are saved unchanged)")
    ap.add_argument("--unseen-by", default=_DEFAULTS["unseen_by"],
                    help="a trained draft: train and validate only on samples whose prompts its training "
                         "data did not hold (a head added to that draft then learns how it does on new prompts)")
    ap.add_argument("--train-samples", type=int, default=_DEFAULTS["train_samples"],
                    help="split in the data's order: the first --val-samples samples validate, the "
                         "next N train (a learning curve's sizes are nested; default: a seeded "
                         "shuffle of all samples)")
    ap.add_argument("--eval-data", action="append", default=list(_DEFAULTS["eval_data"]),
                    help="a `gen-data --for-eval` folder (repeatable): after training, the draft's "
                         "teacher-forced greedy tau and per-position acceptance on all its samples "
                         "are recorded under 'eval' in training.json")
    ap.add_argument("--eval-max-tokens", type=int, default=None,
                    help="--eval-data's served tau counts passes as if serving stopped after N generated "
                         "tokens (vLLM's max_tokens), the stored answers' tokens past that checking the last "
                         "pass, as vLLM counts it (answers longer than N; default: the whole answers)")
    ap.add_argument("--eval-drafts", type=int, default=_DEFAULTS["eval_drafts"],
                    help="--eval-data measures the first K draft positions (the K drafts a pass "
                         "serves, e.g. 7 for a block of 8); default: every trained position")
    ap.add_argument("--val-samples", type=int, default=_DEFAULTS["val_samples"])
    ap.add_argument("--val-every", type=int, default=_DEFAULTS["val_every"])
    ap.add_argument("--save-every", type=int, default=_DEFAULTS["save_every"], help=f"steps between {STATE_FILE} writes")
    ap.add_argument("--resume", action="store_true", help=f"continue from <out>/{STATE_FILE}")
    ap.add_argument("--seed", type=int, default=_DEFAULTS["seed"])
    ap.add_argument("--threads", type=int, default=_DEFAULTS["threads"])
    ap.add_argument("--device", default=_DEFAULTS["device"], help="cpu, cuda, cuda:1, ...")
    ap.add_argument("--dtype", default=_DEFAULTS["dtype"], choices=["float32", "bfloat16"],
                    help="autocast dtype of forward/backward (parameters stay float32)")
    ap.add_argument("--save-dtype", default=_DEFAULTS["save_dtype"], choices=["float32", "bfloat16"],
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
        # a repeatable option given on the command line replaces the recorded values (not extends)
        if isinstance(a, argparse._AppendAction) and any(x in a.option_strings or x.split("=")[0] in a.option_strings
                                                         for x in argv):
            ap.set_defaults(**{a.dest: []})
    args = ap.parse_args(argv)
    args.config = None
    # paths as a record writes them portably (~/.cache/...) work as given
    args.data, args.out = str(Path(args.data).expanduser()), str(Path(args.out).expanduser())
    args.eval_data = [str(Path(d).expanduser()) for d in args.eval_data]
    return args


def _to(batch: dict, device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


# ---- distributed: torchrun's processes, each a rank's share of every global batch ------------------

@dataclasses.dataclass
class Dist:
    """Where this process trains: its rank among `world` processes (torchrun's), its device, and
    whether it started the process group (and so ends it)."""

    rank: int = 0
    world: int = 1
    local_world: int = 1
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    owns_group: bool = False

    @property
    def main(self) -> bool:
        """Rank 0: the process that prints, evaluates and writes."""
        return self.rank == 0

    def gather(self, obj) -> list:
        """`obj` of every rank, in rank order (one process: [obj])."""
        if self.world == 1:
            return [obj]
        got = [None] * self.world
        torch.distributed.all_gather_object(got, obj)
        return got

    def mean(self, x: float) -> float:
        """The mean over the ranks of a number (one process: the number)."""
        if self.world == 1:
            return x
        t = torch.tensor([x], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return t.item() / self.world

    def close(self) -> None:
        if self.owns_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
            self.owns_group = False


def world_from_env() -> tuple[int, int, int, int]:
    """(rank, world size, local rank, processes per node) as torchrun sets them (1 process: 0, 1,
    0, 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, 0, 1
    return (int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")),
            int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))


def shard(batch: dict, rank: int, world: int) -> dict:
    """Rank `rank`'s share of a global batch: every tensor of a hook's batch is [B, ...] (one row
    per sequence), and a rank keeps rows [rank * B / world, (rank + 1) * B / world); values that
    are not tensors (e.g. `chain_tokens`) are kept as they are."""
    sizes = {v.shape[0] for v in batch.values() if isinstance(v, torch.Tensor) and v.dim()}
    if len(sizes) != 1:
        raise ValueError(f"a batch's tensors must all be [B, ...] to be split over ranks; first dims {sorted(sizes)}")
    size = sizes.pop()
    per = size // world
    return {k: v[rank * per:(rank + 1) * per] if isinstance(v, torch.Tensor) and v.dim() else v
            for k, v in batch.items()}


class _Forward(torch.nn.Module):
    """The method's `forward(model, batch)` as a module call, the one DistributedDataParallel
    wraps (its gradient hooks are armed by that call)."""

    def __init__(self, h, model: torch.nn.Module):
        super().__init__()
        self.h, self.model = h, model

    def forward(self, b: dict):
        return self.h.forward(self.model, b)


def torchrun_command(cfg: TrainConfig, d: Dist) -> str:
    """The command that launches this distributed run (rendezvous flags left out)."""
    nodes = max(1, d.world // max(1, d.local_world))
    return (("torchrun" + (f" --nnodes {nodes}" if nodes > 1 else "") + f" --nproc-per-node {d.local_world}")
            + " -m vllm_specx.cli train " + command_flags(cfg))


# ---- the stages of a run: setup, data, model, loop (with validation), save ------------------------

@dataclasses.dataclass
class Data:
    """What the data stage reads: the data's meta, the --eval-data folders with their meta, all
    samples, the split (indices into `samples`) and its two views."""

    meta: dict
    evals: list
    samples: object
    pool: list
    val_idx: list
    train_idx: list
    val: object
    train: object


@dataclasses.dataclass
class Run:
    """The trained state and what the loop needs around it."""

    h: object
    model: torch.nn.Module
    step_model: torch.nn.Module  # what the loop calls: the DDP wrapper, or `_Forward` alone
    params: list
    opt: torch.optim.Optimizer
    sched: object
    rng: random.Random
    val_batches: list  # this rank's (index, batch) of the validation batches
    n_val_batches: int
    autocast: object
    loss_args: tuple
    start: int = 0
    log: list = dataclasses.field(default_factory=list)
    wall: float = 0.0
    t0: float = 0.0

    def elapsed(self) -> float:
        return self.wall + time.time() - self.t0


def setup(cfg: TrainConfig) -> Dist:
    """Device, seeds and threads; under torchrun (WORLD_SIZE > 1) the process group too: gloo for
    --device cpu, NCCL for --device cuda, where rank r takes cuda:LOCAL_RANK."""
    rank, world, local, local_world = world_from_env()
    device = torch.device(cfg.device)
    if world > 1:
        if device.type == "cuda":
            if device.index is not None:
                raise SystemExit(f"--device {cfg.device}: under torchrun each process takes the GPU "
                                 f"of its local rank (cuda:LOCAL_RANK); pass --device cuda (pick the "
                                 f"GPUs with CUDA_VISIBLE_DEVICES)")
            device = torch.device("cuda", local)
        elif device.type != "cpu":
            raise SystemExit(f"--device {cfg.device}: distributed training runs on cpu (gloo) or cuda (NCCL)")
        if cfg.batch % world:
            raise SystemExit(f"--batch {cfg.batch}: the global batch must split evenly over the world "
                             f"size {world} (torchrun's processes); pass a multiple of {world}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {cfg.device}: this torch build sees no CUDA device")
    d = Dist(rank, world, local_world, device)
    if world > 1 and not torch.distributed.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                             rank=rank, world_size=world)
        d.owns_group = True
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    return d


def load_data(cfg: TrainConfig, rng: random.Random) -> Data:
    """The data's meta (checked against the flags), the --eval-data folders, the samples and the
    validation / training split (`rng`: the run's, seeded with --seed). Every rank reads the same."""
    from vllm_specx.training.data import EVALUATION, load_samples

    meta = json.loads((Path(cfg.data) / "meta.json").read_text())
    if meta.get("purpose") == EVALUATION:
        raise SystemExit(f"--data {cfg.data}: made with `gen-data --for-eval` (prompts {meta.get('prompts')!r}): "
                         "drafts are measured on it, never trained on it; pass it as --eval-data")
    evals = [(Path(d), _eval_meta(Path(d), meta)) for d in cfg.eval_data]
    if cfg.confidence_label == "soft" and not meta.get("topk"):
        raise SystemExit(f"--confidence-label soft needs the target's distribution: {cfg.data} has no top-k")
    if cfg.train_only != "confidence" and cfg.loss in NEEDS_TARGET_DISTRIBUTION and not meta.get("topk"):
        raise SystemExit(f"--loss {cfg.loss} needs the target's distribution: {cfg.data} has no "
                         "top-k (make it with `vllm-specx gen-data ... --topk 32`)")
    samples = load_samples(Path(cfg.data))
    pool = usable(samples, meta, cfg.unseen_by)
    if len(pool) <= cfg.val_samples:
        raise SystemExit(f"--data {cfg.data}: {len(pool)} usable samples, not more than --val-samples {cfg.val_samples}")
    if cfg.train_samples is None:
        val_idx, train_idx = split(len(pool), cfg.val_samples, rng)
        val_idx, train_idx = [pool[i] for i in val_idx], [pool[i] for i in train_idx]
    else:  # data order: the same validation samples and nested training sets for every N
        val_idx, train_idx = data_order_split(samples, pool, cfg.val_samples, cfg.train_samples)
    return Data(meta, evals, samples, pool, val_idx, train_idx, samples.subset(val_idx), samples.subset(train_idx))


def build_run(cfg: TrainConfig, d: Dist, data: Data, rng: random.Random) -> Run:
    """The draft (the method's `build`), optimiser, schedule and validation batches; the state of
    `--resume`; under torchrun the DistributedDataParallel wrapper."""
    from vllm_specx.targets import resolve
    from vllm_specx.training.taps import embed_and_head, load_target

    h = hooks(cfg.method)
    target = load_target(resolve(cfg.target))
    model = h.build(target, cfg, data.meta, *embed_and_head(target)).to(d.device)
    del target
    check_confidence_args(model, cfg)
    if cfg.train_only:
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith(TRAIN_ONLY[cfg.train_only]))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / max(1, cfg.steps)))))
    vrng, val = random.Random(1), data.val
    val_batches = []  # every rank draws them all (one vrng sequence), keeps its own: i % world == rank
    for n, i in enumerate(range(0, len(val), cfg.batch)):
        b = h.batch(model, val.subset(range(i, min(i + cfg.batch, len(val)))), vrng, min(cfg.batch, len(val) - i), cfg)
        if n % d.world == d.rank:
            val_batches.append((n, b))
    autocast = (torch.autocast(d.device.type, dtype=torch.bfloat16) if cfg.dtype == "bfloat16"
                else contextlib.nullcontext())
    loss_args = (cfg.loss, cfg.gamma, cfg.ce_weight, cfg.confidence_weight, cfg.train_only,
                 cfg.confidence_label, cfg.confidence_slots)
    run = Run(h, model, _Forward(h, model), params, opt, sched, rng, val_batches,
              len(range(0, len(val), cfg.batch)), autocast, loss_args)
    resume(cfg, d, run)
    if d.world > 1:  # after the resume: the ranks' states are equal (DDP checks, broadcasting rank 0's)
        from torch.nn.parallel import DistributedDataParallel

        # the buffers (the target's embedding, norm) never change: no sync at each forward
        quiet = ({"forward_sync_buffers": False} if "forward_sync_buffers" in
                 inspect.signature(DistributedDataParallel).parameters else {"broadcast_buffers": False})
        run.step_model = DistributedDataParallel(
            run.step_model, device_ids=[d.device.index] if d.device.type == "cuda" else None, **quiet)
    return run


def resume(cfg: TrainConfig, d: Dist, run: Run) -> None:
    """With --resume and a <out>/trainer_state.pt: continue from it (every rank loads the one file
    rank 0 wrote). A state from another world size continues too: the global batches and their
    order do not depend on it (the result then equals the uninterrupted run up to float summation
    order, not bit for bit)."""
    file = Path(cfg.out) / STATE_FILE
    if not (cfg.resume and file.is_file()):
        return
    st = torch.load(file, map_location=d.device, weights_only=False)
    # compared as they were stored (_run_args), not as the hooks may have resolved them since
    # (DSpark's build fills a default --mask-token-id on the config it is given)
    now = _run_args(cfg)
    changed = {k: (v, now.get(k)) for k, v in st.get("args", {}).items() if now.get(k) != v}
    if changed:  # a resumed run is the interrupted run: another loss, schedule or data is a new run
        raise SystemExit(f"--resume {file}: " + ", ".join(
            f"--{k.replace('_', '-')} {new} differs from the interrupted run's {old}" for k, (old, new) in changed.items())
            + "; start a new --out, or resume with the same arguments")
    run.model.load_state_dict(st["model"])
    run.opt.load_state_dict(st["opt"])
    run.sched.load_state_dict(st["sched"])
    run.rng.setstate(st["rng"])
    world = st.get("world_size", 1)
    ranks = st.get("torch_rng_ranks")
    torch.set_rng_state((ranks[d.rank] if ranks and world == d.world else st["torch_rng"]).cpu())
    run.start, run.log, run.wall = st["step"], st["log"], st["wall_s"]
    if d.main:
        tqdm.write(f"resumed from {file} at step {run.start}"
                   + (f" (written by {world} processes, continued by {d.world})" if world != d.world else ""))


def save_state(cfg: TrainConfig, d: Dist, run: Run, step: int) -> None:
    """<out>/trainer_state.pt, written by rank 0 (every rank's torch RNG state in it)."""
    torch_rngs = d.gather(torch.get_rng_state())
    if not d.main:
        return
    out_dir = Path(cfg.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    st = {"model": run.model.state_dict(), "opt": run.opt.state_dict(), "sched": run.sched.state_dict(),
          "rng": run.rng.getstate(), "torch_rng": torch_rngs[0], "step": step, "log": run.log,
          "wall_s": run.elapsed(), "args": _run_args(cfg), "world_size": d.world}
    if d.world > 1:
        st["torch_rng_ranks"] = torch_rngs
    torch.save(st, out_dir / (STATE_FILE + ".tmp"))
    (out_dir / (STATE_FILE + ".tmp")).replace(out_dir / STATE_FILE)


def validate(cfg: TrainConfig, d: Dist, run: Run, step: int, train_loss: float | None) -> None:
    """Validation loss and statistics of the current draft, appended to the log. The batches are
    shared out over the ranks and gathered back, summed in batch order as one process sums them
    (so the numbers do not depend on the world size)."""
    mine = []
    with torch.no_grad(), run.autocast:
        for n, vb in run.val_batches:
            vout = run.h.forward(run.model, _to(vb, d.device))
            mine.append((n, draft_loss(vout, *run.loss_args).item(),
                         {k: v.float().cpu() for k, v in validation_stats(vout).items()}))
    total, vloss = {}, 0.0
    for _, loss, stats in sorted((x for part in d.gather(mine) for x in part), key=lambda x: x[0]):
        vloss += loss / run.n_val_batches
        for k, v in stats.items():
            total[k] = total.get(k, 0) + v
    run.log.append({"step": step, "train_loss": train_loss, "val_loss": round(vloss, 4),
                    **summarise(total), "elapsed_s": round(run.elapsed(), 1)})
    if d.main:
        tqdm.write(json.dumps(run.log[-1]))


def loop(cfg: TrainConfig, d: Dist, data: Data, run: Run) -> None:
    """The optimizer steps from `run.start` to --steps: validation every --val-every steps (and at
    step 0 of a fresh run), the state every --save-every (and at the end). Each step draws the
    global batch of --batch sequences with the run's rng, the same draws for any world size;
    rank r trains on its share (`shard`) and DDP averages the gradients."""
    run.t0 = time.time()
    if run.start == 0:
        validate(cfg, d, run, 0, None)  # the initial model: what training improves on
    bar = tqdm(range(run.start, cfg.steps), desc=f"train {cfg.method}", initial=run.start, total=cfg.steps,
               disable=not d.main)
    for step in bar:
        with run.autocast:
            b = run.h.batch(run.model, data.train, run.rng, cfg.batch, cfg)
            if d.world > 1:
                b = shard(b, d.rank, d.world)
            out = run.step_model(_to(b, d.device))
            loss = draft_loss(out, *run.loss_args)
        run.opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(run.params, 1.0)
        run.opt.step()
        run.sched.step()
        value = d.mean(loss.item())  # the global batch's loss, as the ranks' mean (DDP's gradient)
        bar.set_postfix(loss=f"{value:.3f}")
        if (step + 1) % cfg.val_every == 0 or step + 1 == cfg.steps:
            validate(cfg, d, run, step + 1, round(value, 4))
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_state(cfg, d, run, step + 1)


def save(cfg: TrainConfig, d: Dist, data: Data, run: Run) -> dict:
    """--eval-data, the draft's checkpoint and <out>/training.json, on rank 0 (the other ranks
    return the record without the evaluations and write nothing)."""
    from vllm_specx.training.data import COMMANDS_FILE, load_samples

    evaluated, train_s = {}, round(run.elapsed(), 1)  # the training alone: before the evaluations
    if d.main:
        for folder, m in data.evals:
            evaluated[folder.name] = evaluate(run.h, run.model, load_samples(folder), cfg, d.device, run.autocast,
                                              served=float(m.get("temperature", 0.0)) == 0.0)
            evaluated[folder.name]["prompts"] = m.get("prompts")
            tqdm.write(f"eval {folder.name}: {json.dumps(evaluated[folder.name])}")
    samples, cmds = data.samples, Path(cfg.data) / COMMANDS_FILE
    record = {"command": "vllm-specx train " + command_flags(cfg), "args": cfg.as_dict(), "data": data.meta,
              "data_commands": cmds.read_text().splitlines() if cmds.is_file() else None,
              "data_samples": len(samples),
              **({"unseen_by_excluded": len(samples) - len(data.pool)} if cfg.unseen_by else {}),
              "train_samples": len(data.train), "val_samples": len(data.val),
              "val_prompt_ids": [samples.index[i][1] for i in data.val_idx],
              "wall_s": round(run.elapsed(), 1), "train_s": train_s,
              "trainable_params": sum(p.numel() for p in run.params), "log": run.log,
              **({"eval": evaluated} if data.evals and d.main else {}),
              "world_size": d.world, **({"torchrun_command": torchrun_command(cfg, d)} if d.world > 1 else {})}
    if d.main:
        run.h.save(run.model, cfg.out, getattr(torch, cfg.save_dtype))
        (Path(cfg.out) / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
        print(f"saved {cfg.out}")
    return record


def train(args: argparse.Namespace | TrainConfig) -> dict:
    """Train and save; returns the training record (also written to <out>/training.json). One
    process, or each of torchrun's (see the module's "Distributed training")."""
    cfg = args if isinstance(args, TrainConfig) else TrainConfig.from_args(args)
    d = setup(cfg)
    rng = random.Random(cfg.seed)
    data = load_data(cfg, rng)
    run = build_run(cfg, d, data, rng)
    loop(cfg, d, data, run)
    record = save(cfg, d, data, run)
    d.close()
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
            out = h.forward(model, _to(h.batch(model, part, rng, len(part), args), device))
            if args.eval_drafts:
                out = _first_positions(out, args.eval_drafts)
            for k, v in validation_stats(out).items():
                total[k] = total.get(k, 0) + v.float().cpu()
    res = summarise(total)
    if served:
        from vllm_specx.training.serving_count import served_tau

        k = len(res["val_acc_per_pos"])
        res.update(served_tau(h, model, samples, args, device, autocast, k, getattr(args, "eval_max_tokens", None)))
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


RESUME_MAY_CHANGE = ("out", "resume", "config", "threads", "device", "val_every", "save_every")


def _items(args: argparse.Namespace | TrainConfig) -> dict:
    return args.as_dict() if isinstance(args, TrainConfig) else vars(args)


def _run_args(args: argparse.Namespace | TrainConfig) -> dict:
    """The arguments a `--resume` must repeat: all but where it runs and how often it reports."""
    return {k: v for k, v in _items(args).items() if k not in RESUME_MAY_CHANGE}


def command_flags(args: argparse.Namespace | TrainConfig) -> str:
    """The flags that re-run `args` (switches only when set, `--no-X` for a switch that is on by
    default and was turned off; a repeatable option once per value; unset and empty options left
    out)."""
    on_by_default = {a.dest for a in parser(getattr(args, "method", None))._actions
                     if isinstance(a, argparse.BooleanOptionalAction) and a.default is True}
    out = []
    for k, v in _items(args).items():
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
