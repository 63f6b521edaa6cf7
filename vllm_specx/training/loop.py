"""The training itself: the draft and its optimiser (`build_run`: the method's `build`, AdamW,
warm-up + cosine, the validation batches, `--resume`, the DDP wrapper), the steps (`loop`) and
validation on held-back samples every `--val-every` steps (`validate`)."""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import random
import time

import torch
from tqdm import tqdm

from vllm_specx.progress import Reporter
from vllm_specx.targets import resolve as resolve_target
from vllm_specx.training.blocks import to_device
from vllm_specx.training.config import TRAIN_ONLY, TrainConfig, hooks
from vllm_specx.training.dist import Dist, shard
from vllm_specx.training.evaluation import summarise, validation_stats
from vllm_specx.training.objective import check_confidence_args, draft_loss
from vllm_specx.training.selection import Data
from vllm_specx.training.state import Run, resume, save_state
from vllm_specx.training.taps import embed_and_head, load_target


class _Forward(torch.nn.Module):
    """The method's `forward(model, batch)` as a module call, the one DistributedDataParallel
    wraps (its gradient hooks are armed by that call)."""

    def __init__(self, h, model: torch.nn.Module):
        super().__init__()
        self.h, self.model = h, model

    def forward(self, b: dict):
        return self.h.forward(self.model, b)



def build_run(cfg: TrainConfig, d: Dist, data: Data, rng: random.Random) -> Run:
    """The draft (the method's `build`), optimiser, schedule and validation batches; the state of
    `--resume`; under torchrun the DistributedDataParallel wrapper."""
    h = hooks(cfg.method)
    target = load_target(resolve_target(cfg.target))
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



def validate(cfg: TrainConfig, d: Dist, run: Run, step: int, train_loss: float | None) -> None:
    """Validation loss and statistics of the current draft, appended to the log. The batches are
    shared out over the ranks and gathered back, summed in batch order as one process sums them
    (so the numbers do not depend on the world size)."""
    mine = []
    with torch.no_grad(), run.autocast:
        for n, vb in run.val_batches:
            vout = run.h.forward(run.model, to_device(vb, d.device))
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
    bar = Reporter(quiet=cfg.quiet or not d.main).bar(
        iterable=range(run.start, cfg.steps), desc=f"train {cfg.method}", unit="step", initial=run.start,
        total=cfg.steps)
    for step in bar:
        with run.autocast:
            b = run.h.batch(run.model, data.train, run.rng, cfg.batch, cfg)
            if d.world > 1:
                b = shard(b, d.rank, d.world)
            out = run.step_model(to_device(b, d.device))
            loss = draft_loss(out, *run.loss_args)
        run.opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(run.params, 1.0)
        run.opt.step()
        run.sched.step()
        value = d.mean(loss.item())  # the global batch's loss, as the ranks' mean (DDP's gradient)
        bar.set_postfix(loss=f"{value:.3f}", refresh=False)
        if (step + 1) % cfg.val_every == 0 or step + 1 == cfg.steps:
            validate(cfg, d, run, step + 1, round(value, 4))
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_state(cfg, d, run, step + 1)

