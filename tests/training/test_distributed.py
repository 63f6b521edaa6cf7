"""Distributed training: `torchrun --nproc-per-node N -m vllm_specx.cli train ...` (gloo on CPU).

Two processes at global batch 4 train the run one process trains at batch 4: the same global
batches in the same order, each rank computing on its half and DDP averaging the gradients. The
one difference is the loss normalisation: a rank's loss is the mean over its own valid positions,
so the average of the two means weighs the two halves equally where the one-process mean weighs
them by their valid positions (at step 0 here the gradients differ by 1.5e-3 relative; rescaled
by each half's share of the positions they agree to 1.5e-7, float summation order). Through
AdamW over 12 steps that leaves the weights 4.5e-4 apart (relative L2) and the validation losses
1e-4 apart; a run at another global batch (the negative control) is 8.3e-3 and 2.9e-2 apart. The
tolerances, 2e-3 and 3e-3, sit 4x and 30x above the one and 4x and 10x below the other.

A distributed run killed (SIGKILL) after its first state write and resumed equals the
uninterrupted distributed run exactly (gloo on CPU is deterministic); resumed by one process it
continues within the tolerance above.

The two tests that launch torchrun are in the e2e tier (CI's default run): together about 45-65 s
on 2 shared cores (data 6 s, 6 trainings in fresh processes), more than the quick tier takes; the
unit tests of the pieces stay in the quick tier.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from vllm_specx.training import trainer

from ..test_training import _data, _train_argv

METHOD = "mtp"  # any trainable method; MTP needs no flags beyond _train_argv's and trains fastest here
FLAGS = ("--batch", "4", "--loss", "tv", "--threads", "1")
WEIGHTS_RTOL, VAL_LOSS_ATOL = 2e-3, 3e-3  # see the module docstring
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _run(cmd: list[str], log: Path) -> None:
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=300).returncode
    assert rc == 0, log.read_text()[-4000:]


def _train(data: Path, out: Path, *extra: str, procs: int = 1, entry: list[str] | None = None) -> dict:
    """A training run in fresh processes (one, or `procs` under torchrun); its record."""
    launch = (TORCHRUN if procs > 1 else [sys.executable]) + (entry or ["-m", "vllm_specx.cli", "train"])
    _run(launch + _train_argv(METHOD, data, out, *FLAGS, *extra), out.with_suffix(".log"))
    return json.loads((out / trainer.RECORD_FILE).read_text())


def _state(out: Path) -> dict:
    return torch.load(out / trainer.STATE_FILE, weights_only=False)


def _distance(a: Path, b: Path) -> tuple[float, float]:
    """(relative L2 distance of the two runs' final weights, largest validation-loss difference
    over their logs)."""
    sa, sb = _state(a), _state(b)
    diff = sum(((sa["model"][k].double() - sb["model"][k].double()) ** 2).sum() for k in sa["model"]) ** 0.5
    norm = sum((sb["model"][k].double() ** 2).sum() for k in sb["model"]) ** 0.5
    assert [r["step"] for r in sa["log"]] == [r["step"] for r in sb["log"]]
    return (diff / norm).item(), max(abs(x["val_loss"] - y["val_loss"]) for x, y in zip(sa["log"], sb["log"]))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return _data(tmp_path_factory.mktemp("dist"), n=12)


@pytest.fixture(scope="module")
def two(data) -> tuple[Path, dict]:
    """The uninterrupted two-process run (global batch 4)."""
    out = data.parent / "two"
    return out, _train(data, out, procs=2)


@pytest.mark.e2e
def test_two_processes_train_what_one_process_trains_at_the_same_global_batch(data, two):
    out, record = two
    one = data.parent / "one"
    _train(data, one)
    dist, val = _distance(out, one)
    assert dist < WEIGHTS_RTOL and val < VAL_LOSS_ATOL, (dist, val)
    # the negative control: the same comparison with another global batch fails it
    other = data.parent / "one-batch-2"
    _train(data, other, "--batch", "2")
    dist2, val2 = _distance(out, other)
    assert dist2 > WEIGHTS_RTOL and val2 > VAL_LOSS_ATOL, (dist2, val2)

    # rank 0 wrote the record: the world size, the torchrun command, which re-parses to the run
    assert record["world_size"] == 2 and _state(out)["world_size"] == 2
    launch, flags = record["torchrun_command"].split(" train ", 1)
    assert launch == "torchrun --nproc-per-node 2 -m vllm_specx.cli"
    assert vars(trainer.parse_args(flags.split())) == record["args"]
    assert record["command"] == "vllm-specx train " + flags  # one process re-runs it too
    assert (out / "model.safetensors").is_file() and record["log"][-1]["step"] == 12


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


# torchrun runs this in place of `-m vllm_specx.cli train`: the trainer, whose rank 0 stops after
# its first state write (rank 1 waits in the next step's gradient all-reduce) until it is killed.
STALL = """import sys, time
from vllm_specx.training import trainer
write = trainer.save_state
def write_then_stall(cfg, d, run, step):
    write(cfg, d, run, step)
    while d.main:
        time.sleep(1)
trainer.save_state = write_then_stall
trainer.main(sys.argv[1:])
"""


@pytest.mark.e2e
def test_a_killed_distributed_run_resumes_where_its_state_left_off(data, two):
    out, record = two
    cut = data.parent / "cut"
    script = data.parent / "stall.py"
    script.write_text(STALL)
    log = cut.with_suffix(".log")
    with log.open("w") as f:
        proc = subprocess.Popen(TORCHRUN + [str(script)] + _train_argv(METHOD, data, cut, *FLAGS),
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 240
        while not (cut / trainer.STATE_FILE).is_file():
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.time() < deadline, "no trainer_state.pt within 240 s"
            time.sleep(0.05)
    finally:  # torchrun starts each worker in a session of its own: kill them all, by id
        for pid in [proc.pid, *_descendants(proc.pid)]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert _state(cut)["step"] == 6 and not (cut / trainer.RECORD_FILE).exists()
    one_cut = data.parent / "cut-one"
    shutil.copytree(cut, one_cut)

    resumed = _train(data, cut, "--resume", procs=2)
    assert "resumed from" in cut.with_suffix(".log").read_text()
    assert [r["val_loss"] for r in resumed["log"]] == [r["val_loss"] for r in record["log"]]
    a, b = _state(out)["model"], _state(cut)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)

    # the state does not tie a run to its world size: one process continues it (within tolerance)
    _train(data, one_cut, "--resume")
    assert "written by 2 processes, continued by 1" in one_cut.with_suffix(".log").read_text()
    dist, val = _distance(out, one_cut)
    assert dist < WEIGHTS_RTOL and val < VAL_LOSS_ATOL, (dist, val)


def test_the_global_batch_must_split_over_the_ranks(monkeypatch, tmp_path):
    """What torchrun's processes refuse before they start a process group (the world size from
    torchrun's environment)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    argv = _train_argv(METHOD, tmp_path, tmp_path / "out")
    with pytest.raises(SystemExit, match=r"--batch 3: the global batch must split evenly over the world size 2"):
        trainer.train(trainer.parse_args(argv + ["--batch", "3"]))
    with pytest.raises(SystemExit, match=r"--device cuda:1: under torchrun each process takes the GPU of its local rank"):
        trainer.train(trainer.parse_args(argv + ["--batch", "4", "--device", "cuda:1"]))
    assert not torch.distributed.is_initialized()


def test_a_rank_takes_its_rows_of_every_batch_tensor():
    b = {"ids": torch.arange(8).view(4, 2), "anchors": torch.arange(4)[:, None], "chain_tokens": "target"}
    parts = [trainer.shard(b, r, 2) for r in range(2)]
    assert torch.equal(torch.cat([p["ids"] for p in parts]), b["ids"]) and parts[1]["anchors"].tolist() == [[2], [3]]
    assert parts[0]["chain_tokens"] == "target"
    with pytest.raises(ValueError, match=r"\[B, \.\.\.\]"):
        trainer.shard({"a": torch.zeros(4, 1), "b": torch.zeros(3)}, 0, 2)


def test_the_config_is_the_parsed_arguments_typed_and_checked(tmp_path):
    args = trainer.parse_args(_train_argv(METHOD, tmp_path, tmp_path / "out"))
    cfg = trainer.TrainConfig.from_args(args)
    assert cfg.as_dict() == vars(args) and list(cfg.as_dict()) == list(vars(args))
    assert cfg.batch == 2 and cfg.seq_len == 32 and "seq_len" in cfg.method_args  # the method's flags
    assert trainer.command_flags(cfg) == trainer.command_flags(args)
    with pytest.raises(AttributeError):
        cfg.no_such_flag  # noqa: B018
    for flag, value, why in [("--val-every", "0", "must be >= 1"), ("--ce-weight", "1.5", r"must be in \[0, 1\]"),
                             ("--batch", "0", "must be >= 1")]:
        with pytest.raises(SystemExit, match=f"{flag} {value}: {why}"):
            trainer.TrainConfig.from_args(trainer.parse_args(_train_argv(METHOD, tmp_path, tmp_path / "o", flag, value)))
