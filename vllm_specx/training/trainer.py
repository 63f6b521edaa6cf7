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

The loop owns the rest: streaming the data from disk (`training.samples.SampleStore`), optimiser
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

Each stage lives in the module of its job; this module runs them in turn and keeps every name
importable from here:

* `training.config`: the flags, `TrainConfig`, `--config`, `hooks`, `command_flags`;
* `training.dist`: torchrun's processes (`setup`, `Dist`, `shard`; "Distributed training" there);
* `training.selection`: the data stage (`load_data`, `split`, `data_order_split`, `usable`);
* `training.loop`: `build_run`, `loop`, `validate`;
* `training.objective`: the loss of the flags (`draft_loss`, `loss_and_accuracy`, the confidence
  head's BCE);
* `training.evaluation`: `validation_stats`, `summarise`, `evaluate` (`--eval-data`);
* `training.state`: `Run`, `save_state` / `resume` (trainer_state.pt) and `save` (checkpoint,
  training.json).
"""

from __future__ import annotations

import argparse
import random

from vllm_specx.progress import Reporter
from vllm_specx.training.config import (
    DESCRIPTION,
    RECORD_FILE,
    RESUME_MAY_CHANGE,
    STATE_FILE,
    TRAIN_ONLY,
    TrainConfig,
    command_flags,
    hooks,
    parse_args,
    parser,
    run_args,
)
from vllm_specx.training.dist import Dist, setup, shard, torchrun_command, world_from_env
from vllm_specx.training.evaluation import evaluate, summarise, validation_stats
from vllm_specx.training.loop import build_run, loop, validate
from vllm_specx.training.objective import check_confidence_args, confidence_loss, draft_loss, loss_and_accuracy
from vllm_specx.training.selection import Data, data_order_split, load_data, split, usable
from vllm_specx.training.state import Run, resume, save, save_state

__all__ = [
    "DESCRIPTION", "RECORD_FILE", "RESUME_MAY_CHANGE", "STATE_FILE", "TRAIN_ONLY", "TrainConfig", "command_flags",
    "hooks", "parse_args", "parser", "run_args", "Dist", "setup", "shard", "torchrun_command", "world_from_env",
    "evaluate", "summarise", "validation_stats", "build_run", "loop", "validate", "check_confidence_args",
    "confidence_loss", "draft_loss", "loss_and_accuracy", "Data", "data_order_split", "load_data", "split",
    "usable", "Run", "resume", "save", "save_state", "train", "main",
]


def train(args: argparse.Namespace | TrainConfig) -> dict:
    """Train and save; returns the training record (also written to <out>/training.json). One
    process, or each of torchrun's (see `training.dist`, "Distributed training")."""
    cfg = args if isinstance(args, TrainConfig) else TrainConfig.from_args(args)
    d = setup(cfg)
    rng = random.Random(cfg.seed)
    data = load_data(cfg, rng)
    run = build_run(cfg, d, data, rng)
    loop(cfg, d, data, run)
    record = save(cfg, d, data, run)
    d.close()
    return record


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    Reporter(quiet=args.quiet).quiet_libraries()
    train(args)


if __name__ == "__main__":
    main()
