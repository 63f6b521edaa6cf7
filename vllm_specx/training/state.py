"""A run's state and what it writes: the trained state the loop carries (`Run`),
`<out>/trainer_state.pt` every `--save-every` steps and at the end (`save_state`; `--resume`
continues from it, bit for bit on CPU, `resume`), and the last stage, `save`: `--eval-data`, the
draft's checkpoint and `<out>/training.json` (the arguments, the command, the data's meta and
the log)."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from vllm_specx.progress import duration
from vllm_specx.training.config import RECORD_FILE, STATE_FILE, TrainConfig, command_flags, run_args
from vllm_specx.training.samples import COMMANDS_FILE, load_samples
from vllm_specx.training.dist import Dist, torchrun_command
from vllm_specx.training.evaluation import evaluate
from vllm_specx.training.selection import Data


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
    now = run_args(cfg)
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
          "wall_s": run.elapsed(), "args": run_args(cfg), "world_size": d.world}
    if d.world > 1:
        st["torch_rng_ranks"] = torch_rngs
    torch.save(st, out_dir / (STATE_FILE + ".tmp"))
    (out_dir / (STATE_FILE + ".tmp")).replace(out_dir / STATE_FILE)



def save(cfg: TrainConfig, d: Dist, data: Data, run: Run) -> dict:
    """--eval-data, the draft's checkpoint and <out>/training.json, on rank 0 (the other ranks
    return the record without the evaluations and write nothing)."""
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
        print(summary(cfg, run, train_s), flush=True)
    return record


def summary(cfg: TrainConfig, run: Run, train_s: float) -> str:
    """The closing line of a run: its steps, time and rate, the first and last validation (loss
    and teacher-forced greedy tau) and where the draft went."""
    rate = f", {cfg.steps / train_s:.2f} step/s" if cfg.steps and train_s else ""
    first, last = (run.log[0], run.log[-1]) if run.log else ({}, {})
    seen = [f"{k} {first[k]:.3f} -> {last[k]:.3f}" for k in ("val_loss", "tau_greedy")
            if first.get(k) is not None and last.get(k) is not None]
    return (f"train {cfg.method}: {cfg.steps} steps in {duration(train_s)}{rate}"
            + (f"; {', '.join(seen)}" if seen else "") + f"; saved {cfg.out}")

