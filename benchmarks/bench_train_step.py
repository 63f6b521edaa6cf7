"""Cheaper training steps on a CPU (issue 36, item 3): where one training step's time goes, and
what steps/s, sample-draws/s and blocks/s each setting buys, per provider, on this machine.

Three parts (`--parts`, default all):

* profile: one optimizer step per provider (after `--warmup` steps), run in this process exactly
  as the trainer runs it (`trainer.load_data`, `trainer.build_run`, then the loop's body: the
  method's `batch` and `forward`, `trainer.loss_and_accuracy`, backward, clipping, AdamW and the
  schedule, under `torch.autocast("cpu", bfloat16)` for `--dtype bfloat16`), under
  torch.profiler (CPU, shapes recorded). Every op's self time goes to one group: the output head
  (matrix products with the draft vocabulary as a dimension: lm_head rows, and DSpark's Markov
  bias rows, forward and backward), loss / softmax over the vocabulary (every other op on a
  [..., V] tensor: log-softmax, the TV terms, their gradients), the draft layers (everything
  else inside forward and backward: attention, MLP, norms, the chain), batch building / data
  loading, the optimizer (gradient clipping, AdamW, schedule), other.
* throughput: each setting in fresh worker processes (`--worker`), `--warmup` steps, then as many
  steps as fit in `--window` seconds (at least `--min-steps`); steps/s, sample-draws/s (= batch x
  steps/s, the compute curve's unit) and blocks/s (= batch x anchors x steps/s: a sample-draw
  teaches `--anchors` blocks, so settings that move anchors between sequences are compared by
  blocks too). Two processes with one thread each start their timed steps together (a file
  barrier) and their steps/s are summed. Every per-step time is kept: min and median reported.
* tau: short MTP runs (`vllm-specx train`, the mtp-glm52 flags, `--tau-steps` x batch 8) at each
  of `--tau-vocabs`, `--jobs` at a time with one thread each, in `--runs` (resumable: a run whose
  training.json exists is read); tau as serving counts it (`tau_served`) on the `--eval-data`
  folders, and the share of their greedy answers' tokens a vocabulary holds (a token outside can
  never be drafted).

`--pause-pgid G` / `--pause-pid P` (repeatable): processes to SIGSTOP while a profile or a timed
worker runs (a data pass sharing the CPU) and SIGCONT right after each one (also on errors and
on SIGINT/SIGTERM); the tau runs of this script are paused the same way. The load average
(os.getloadavg) at each measurement is recorded: other users of the CPU show there.

A reduced vocabulary larger than the number of distinct tokens in the data's responses cannot be
built by `train --draft-vocab` (it refuses); for throughput alone such a size is filled up with the
lowest unused ids (marked "padded": the same shapes, so the same time, but not a vocabulary to
train).

    D=~/.cache/vllm-specx/data
    .venv/bin/python benchmarks/bench_train_step.py --target smollm2 --data $D/smollm2-chat-mix \
        --eval-data $D/eval-smollm2-humaneval --eval-data $D/eval-smollm2-chat-code \
        --eval-data $D/eval-smollm2-chat-prose --runs ~/.cache/vllm-specx/runs/train-step-tau \
        --out benchmarks/results/train-step-cpu-smollm2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import provenance, write_report  # noqa: E402
from bench_learning_curve import PROVIDERS as ALL_PROVIDERS  # noqa: E402

PROVIDERS = ["mtp-glm52", "eagle3", "dspark-baseline", "dspark-recipe"]
GROUPS = ["output head", "loss / softmax over vocab", "draft layers", "batch / data", "optimizer", "other"]
SCOPES = ("batch", "forward", "loss", "backward", "optimizer")


# ---- one setting ---------------------------------------------------------------------------------

def setting(provider: str, vocab: int | None = None, dtype: str = "bfloat16", threads: int = 1, procs: int = 1,
            batch: int = 8, anchors: int = 24) -> dict:
    return {"provider": provider, "vocab": vocab, "dtype": dtype, "threads": threads, "procs": procs,
            "batch": batch, "anchors": anchors}


def label(s: dict) -> str:
    v = "full" if not s["vocab"] else f"{s['vocab']:,}"
    return (f"{s['provider']} vocab {v}, {s['dtype']}, {s['procs']} proc x {s['threads']} thread, "
            f"batch {s['batch']} x anchors {s['anchors']}")


def settings(args) -> list[dict]:
    if args.grid == "core":  # the settings a second round repeats (noise on a shared CPU)
        p = args.providers[0]
        return [setting(p), setting(p, vocab=args.data_vocab_max), setting(p, threads=2), setting(p, procs=2),
                setting(p, vocab=args.data_vocab_max, procs=2), setting(p, vocab=args.data_vocab_max, threads=2)]
    return full_grid(args)


def full_grid(args) -> list[dict]:
    """The throughput grid: per provider the default (bf16, full vocabulary, 1 thread, batch 8 x
    anchors 24), float32, the largest vocabulary the data can build, 2 threads, 2 processes; for
    the first provider also the vocabulary curve and the batch / anchors settings."""
    out = []
    for p in args.providers:
        out += [setting(p), setting(p, dtype="float32"), setting(p, vocab=args.data_vocab_max),
                setting(p, threads=2), setting(p, procs=2)]
    main = args.providers[0]
    out += [setting(main, vocab=v) for v in args.vocabs if v != args.data_vocab_max]
    out += [setting(main, batch=b, anchors=a) for b, a in args.shapes if (b, a) != (8, 24)]
    out += [setting(main, vocab=args.data_vocab_max, procs=2)]
    return out


def train_argv(args, s: dict, out: str) -> list[str]:
    """The `vllm-specx train` flags of setting `s` (the compute curve's budget flags)."""
    return [*ALL_PROVIDERS[s["provider"]], "--target", args.target, "--data", str(args.data), "--out", out,
            "--train-samples", str(args.train_samples), "--val-samples", str(args.val_samples),
            "--steps", "1000", "--batch", str(s["batch"]), "--seq-len", str(args.seq_len),
            "--anchors", str(s["anchors"]), "--lr", str(args.lr), "--threads", str(s["threads"]),
            "--dtype", s["dtype"], "--seed", str(args.seed), "--device", "cpu",
            *(["--draft-vocab", str(s["vocab"])] if s["vocab"] else [])]


def padded_vocab(data, size: int, vocab_size: int, exclude: tuple[int, ...] = ()) -> torch.Tensor:
    """`blocks.data_vocab`, or where the data has fewer distinct tokens than `size`, all of them
    then the lowest unused ids (same shapes: for timing only)."""
    from vllm_specx import vocab
    from vllm_specx.training.data import response_ids

    drop = set(exclude)
    ids, counts = vocab.by_frequency(([t for t in r if t not in drop] for r in response_ids(data)),
                                     size, vocab_size)
    if int((counts[ids] > 0).sum()) < size:
        print(f"draft vocabulary {size}: padded ({int((counts > 0).sum())} distinct data tokens) - timing only")
    return ids


def build(args, s: dict):
    """(cfg, data, run) of setting `s`, built by the trainer's own stages."""
    from vllm_specx.methods.eagle3 import train as eagle3_train
    from vllm_specx.methods.mtp import train as mtp_train
    from vllm_specx.training import blocks, trainer

    for mod in (mtp_train, eagle3_train, blocks):  # sizes above the data's distinct tokens: timing only
        mod.data_vocab = padded_vocab
    out = tempfile.mkdtemp(prefix="bench-train-step-")
    cfg = trainer.TrainConfig.from_args(trainer.parse_args(train_argv(args, s, out)))
    d = trainer.setup(cfg)
    rng = random.Random(cfg.seed)
    data = trainer.load_data(cfg, rng)
    run = trainer.build_run(cfg, d, data, rng)
    return cfg, d, data, run


def step(cfg, d, data, run, scoped: bool = False) -> float:
    """One optimizer step as `trainer.loop` takes it; its loss."""
    from torch.profiler import record_function

    from vllm_specx.training import blocks, trainer

    sc = record_function if scoped else (lambda _: contextlib.nullcontext())
    with run.autocast:
        with sc("batch"):
            b = run.h.batch(run.model, data.train, run.rng, cfg.batch, cfg)
            b = blocks.to_device(b, d.device)
        with sc("forward"):
            out = run.step_model(b)
        with sc("loss"):
            loss, _ = trainer.loss_and_accuracy(out, *run.loss_args)
    with sc("optimizer"):
        run.opt.zero_grad()
    with sc("backward"):
        loss.backward()
    with sc("optimizer"):
        torch.nn.utils.clip_grad_norm_(run.params, 1.0)
        run.opt.step()
        run.sched.step()
    return loss.item()


def vocab_dim(model) -> int:
    c = model.cfg
    return int(getattr(c, "draft_vocab_size", 0) or c.vocab_size)


MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm",
          "aten::_addmm_activation", "mkldnn", "aten::mkldnn")


def classify(events, v: int, h: int) -> tuple[dict[str, float], dict[str, float]]:
    """Self CPU time (s) of a profiled step by group (see the module's doc; the output head also
    counts the autocast casts of the [V, H] head weight), and of the ops on [..., V] tensors by name."""
    groups, vocab_ops = {g: 0.0 for g in GROUPS}, {}
    for e in events:
        if e.self_cpu_time_total <= 0:
            continue
        scope, p = None, e
        while p is not None:
            if p.name in SCOPES:
                scope = p.name
                break
            p = p.cpu_parent
        if e.name in SCOPES:
            scope = e.name
        shapes = getattr(e, "input_shapes", None) or []
        has_v = any(isinstance(sh, (list, tuple)) and v in sh for sh in shapes)
        head_weight = any(isinstance(sh, (list, tuple)) and sorted(sh) == sorted([v, h]) for sh in shapes)
        if scope in ("batch",):
            g = "batch / data"
        elif scope == "optimizer":
            g = "optimizer"
        elif has_v and (head_weight or any(e.name.startswith(m) for m in MATMUL)):
            g = "output head"
        elif has_v:
            g = "loss / softmax over vocab"
        elif scope in ("forward", "backward"):
            g = "draft layers"
        else:
            g = "other"
        groups[g] += e.self_cpu_time_total / 1e6
        if has_v and g in ("output head", "loss / softmax over vocab"):
            vocab_ops[e.name] = vocab_ops.get(e.name, 0.0) + e.self_cpu_time_total / 1e6
    return groups, vocab_ops


def profile(args, s: dict) -> dict:
    """One profiled step of setting `s` (in this process, `s["threads"]` threads)."""
    from torch.profiler import ProfilerActivity, profile as tprofile

    cfg, d, data, run = build(args, s)
    for _ in range(args.warmup):
        step(cfg, d, data, run)
    load = os.getloadavg()
    with tprofile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        step(cfg, d, data, run, scoped=True)
        wall = time.perf_counter() - t0
    events = prof.events()
    groups, vocab_ops = classify(events, vocab_dim(run.model), int(run.model.cfg.hidden_size))
    top = sorted(prof.key_averages(), key=lambda k: -k.self_cpu_time_total)[:12]
    # an un-profiled step beside it: the profiler's own overhead
    t0 = time.perf_counter()
    step(cfg, d, data, run)
    plain = time.perf_counter() - t0
    return {**s, "vocab_dim": vocab_dim(run.model), "wall_s": round(wall, 3), "unprofiled_step_s": round(plain, 3),
            "groups_s": {k: round(x, 3) for k, x in groups.items()},
            "groups_share": {k: round(x / max(1e-9, sum(groups.values())), 3) for k, x in groups.items()},
            "vocab_ops_s": {k: round(x, 3) for k, x in sorted(vocab_ops.items(), key=lambda kv: -kv[1]) if x >= 0.005},
            "top_ops": [{"name": k.key, "self_s": round(k.self_cpu_time_total / 1e6, 3), "calls": k.count} for k in top],
            "params": sum(p.numel() for p in run.params), "loadavg": [round(x, 2) for x in load]}


# ---- throughput workers --------------------------------------------------------------------------

def worker(args) -> None:
    """`--worker JSON`: time one process of a setting; prints one JSON line."""
    spec = json.loads(args.worker)
    s, barrier, rank, n = spec["setting"], Path(spec["barrier"]), spec["rank"], spec["n"]
    cfg, d, data, run = build(args, s)
    for _ in range(args.warmup):
        step(cfg, d, data, run)
    (barrier / f"ready.{rank}").touch()
    while len(list(barrier.glob("ready.*"))) < n:
        time.sleep(0.01)
    load = os.getloadavg()
    times, t0 = [], time.perf_counter()
    while len(times) < args.min_steps or time.perf_counter() - t0 < args.window:
        t = time.perf_counter()
        step(cfg, d, data, run)
        times.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - t0
    print("RESULT " + json.dumps({"rank": rank, "steps": len(times), "elapsed_s": elapsed, "step_s": times,
                                  "loadavg": load, "threads": torch.get_num_threads()}), flush=True)


class Pauser:
    """SIGSTOP / SIGCONT of the processes sharing the CPU, always resumed (errors, signals, exit)."""

    def __init__(self, pgids: list[int], pids: list[int]):
        self.pgids, self.pids, self.stopped = list(pgids), list(pids), False
        for sig in (signal.SIGINT, signal.SIGTERM):
            prev = signal.getsignal(sig)

            def handler(signum, frame, prev=prev):
                self.resume()
                if callable(prev):
                    prev(signum, frame)
                raise SystemExit(128 + signum)

            signal.signal(sig, handler)
        import atexit

        atexit.register(self.resume)

    def _send(self, sig) -> None:
        for g in self.pgids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(g, sig)
        for p in self.pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, sig)

    @contextlib.contextmanager
    def paused(self):
        self._send(signal.SIGSTOP)
        self.stopped = True
        try:
            yield
        finally:
            self.resume()

    def resume(self) -> None:
        self._send(signal.SIGCONT)
        self.stopped = False


def measure(args, s: dict, pauser: Pauser) -> dict:
    """Steps/s of setting `s`: `procs` worker processes started together."""
    barrier = Path(tempfile.mkdtemp(prefix="bench-barrier-"))
    base = [sys.executable, __file__, *sys.argv[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": str(s["threads"])}
    with pauser.paused():
        procs = [subprocess.Popen([*base, "--worker", json.dumps({"setting": s, "barrier": str(barrier),
                                                                  "rank": r, "n": s["procs"]})],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                 for r in range(s["procs"])]
        outs = [p.communicate()[0] for p in procs]
    got = []
    for p, o in zip(procs, outs):
        line = [x for x in o.splitlines() if x.startswith("RESULT ")]
        if p.returncode or not line:
            print(f"worker of {label(s)} failed (exit {p.returncode}):\n{o[-3000:]}", flush=True)
            return None
        got.append(json.loads(line[-1][7:]))
    sps = sum(g["steps"] / g["elapsed_s"] for g in got)
    steps = [t for g in got for t in g["step_s"]]
    row = {**s, "steps_per_s": round(sps, 4), "sample_draws_per_s": round(sps * s["batch"], 3),
           "blocks_per_s": round(sps * s["batch"] * s["anchors"], 1),
           "step_s_min": round(min(steps), 3), "step_s_median": round(statistics.median(steps), 3),
           "step_s": [round(t, 3) for t in steps], "loadavg": [round(x, 2) for x in got[0]["loadavg"]]}
    print(f"{label(s)}: {row['steps_per_s']:.3f} steps/s, {row['sample_draws_per_s']:.2f} draws/s, "
          f"step min {row['step_s_min']} / median {row['step_s_median']} s, load {row['loadavg']}", flush=True)
    return row


# ---- tau at equal steps --------------------------------------------------------------------------

def tau_command(args, vocab: int | None, out: Path) -> list[str]:
    from bench_compute_curve import budget_flags

    b = argparse.Namespace(batch=8, seq_len=args.seq_len, anchors=24, lr=args.lr, val_samples=args.val_samples,
                           seed=args.seed, k=7, device="cpu")
    evals = [x for d in args.eval_data for x in ("--eval-data", str(d))]
    return [sys.executable, "-m", "vllm_specx.cli", "train", *ALL_PROVIDERS[args.tau_provider],
            "--target", args.target, "--data", str(args.data), "--out", str(out),
            "--train-samples", str(args.train_samples), *budget_flags(b, args.tau_steps), *evals, "--resume",
            *(["--draft-vocab", str(vocab)] if vocab else [])]


def tau_name(args, vocab: int | None) -> str:
    return f"{args.tau_provider}-vocab-{vocab or 'full'}"


def tau_runs(args) -> None:
    """Train the tau runs not yet trained, `--jobs` at a time (one thread each)."""
    args.runs.mkdir(parents=True, exist_ok=True)
    pending = [v for v in args.tau_vocabs if not (args.runs / tau_name(args, v) / "training.json").is_file()]
    running = []
    while pending or running:
        while pending and len(running) < args.jobs:
            v = pending.pop(0)
            name = tau_name(args, v)
            print(f"train {name}", flush=True)
            log = open(args.runs / f"{name}.log", "a")
            running.append((name, subprocess.Popen(tau_command(args, v, args.runs / name), stdout=log,
                                                   stderr=subprocess.STDOUT)))
        for item in list(running):
            if item[1].poll() is not None:
                running.remove(item)
                if item[1].returncode:
                    raise SystemExit(f"{item[0]} failed: see {args.runs}/{item[0]}.log")
        time.sleep(5)


def coverage(args, vocab: int | None) -> dict[str, float]:
    """Share of each eval folder's answer tokens inside the vocabulary `train --draft-vocab`
    builds from the data (1.0 for the full vocabulary)."""
    from vllm_specx import vocab as V
    from vllm_specx.training.data import response_ids

    out = {}
    t2d = None
    if vocab:
        from vllm_specx.targets import resolve

        cfg = json.loads((Path(resolve(args.target)) / "config.json").read_text())
        ids, _ = V.by_frequency(response_ids(args.data), vocab, int(cfg["vocab_size"]))
        t2d = V.maps(ids, int(cfg["vocab_size"]))[1]
    for d in args.eval_data:
        toks = torch.tensor([t for r in response_ids(d) for t in r])
        out[d.name] = 1.0 if t2d is None else round(V.coverage(toks, t2d), 4)
    return out


def tau_rows(args) -> list[dict]:
    rows = []
    for v in args.tau_vocabs:
        f = args.runs / tau_name(args, v) / "training.json"
        if not f.is_file():
            continue
        rec = json.loads(f.read_text())
        rows.append({"provider": args.tau_provider, "vocab": v, "steps": rec["args"]["steps"],
                     "batch": rec["args"]["batch"], "train_samples": rec["train_samples"], "wall_s": rec["wall_s"],
                     "val_tau_greedy": rec["log"][-1].get("tau_greedy"),
                     "tau_served": {k: e.get("tau_served") for k, e in rec.get("eval", {}).items()},
                     "tau_teacher_forced": {k: e.get("tau_greedy") for k, e in rec.get("eval", {}).items()},
                     "eval_coverage": coverage(args, v),
                     "command": " ".join(["vllm-specx", "train", *tau_command(args, v, Path("<runs>") / tau_name(args, v))[4:]])})
    return rows


# ---- report --------------------------------------------------------------------------------------

def tables(args, prof: list[dict], rows: list[dict], taus: list[dict]) -> str:
    out = []
    if prof:
        out += ["## Where one step's time goes (1 thread, bf16 autocast, batch 8 x anchors 24, full vocabulary)", "",
                "Self CPU time of one profiled step after warm-up, by group (share of the step):", "",
                "| provider | step s (profiled / plain) | " + " | ".join(GROUPS) + " |", "|" + "---|" * (2 + len(GROUPS))]
        for p in prof:
            out.append(f"| {p['provider']} | {p['wall_s']:.2f} / {p['unprofiled_step_s']:.2f} | " + " | ".join(
                f"{p['groups_s'][g]:.2f} ({100 * p['groups_share'][g]:.0f} %)" for g in GROUPS) + " |")
        out += ["", "The ops on [..., V] tensors (the first two groups) by name, seconds of the step:", ""]
        for p in prof:
            out.append(f"* {p['provider']}: " + ", ".join(f"{k} {x:.2f}" for k, x in p.get("vocab_ops_s", {}).items()))
        out.append("")
    if rows:
        out += ["## Throughput", "",
                "steps/s summed over the processes; sample-draws/s = batch x steps/s; blocks/s = batch x anchors x "
                "steps/s; step time min / median over every timed step; load = os.getloadavg() at the start.", "",
                "| provider | draft vocab | dtype | procs x threads | batch x anchors | steps/s | sample-draws/s | "
                "blocks/s | vs default | step s min / median | load |", "|" + "---|" * 11]
        base = {r["provider"]: r for r in rows if r == {**r, **setting(r["provider"])} and r.get("round", 1) == 1}
        for r in rows:
            b = base.get(r["provider"])
            rel = f"{r['sample_draws_per_s'] / b['sample_draws_per_s']:.2f}x" if b else "-"
            v = "full" if not r["vocab"] else f"{r['vocab']:,}" + (" (padded)" if r["vocab"] > args.data_vocab_max else "")
            rnd = f" (round {r['round']})" if r.get("round", 1) > 1 else ""
            out.append(f"| {r['provider']}{rnd} | {v} | {r['dtype']} | {r['procs']} x {r['threads']} | {r['batch']} x {r['anchors']} | "
                       f"{r['steps_per_s']:.3f} | {r['sample_draws_per_s']:.2f} | {r['blocks_per_s']:.0f} | {rel} | "
                       f"{r['step_s_min']:.2f} / {r['step_s_median']:.2f} | {r['loadavg'][0]:.1f} |")
        out.append("")
    if taus:
        sets = list(dict.fromkeys(k for t in taus for k in t["tau_served"]))
        out += [f"## τ at equal steps ({taus[0]['provider']}, {taus[0]['steps']} steps x batch {taus[0]['batch']}, "
                f"{taus[0]['train_samples']} training responses)", "",
                "| draft vocab | " + " | ".join(f"τ served {s}" for s in sets) + " | mean | "
                + " | ".join(f"coverage {s}" for s in sets) + " | train + eval wall s |", "|" + "---|" * (3 + 2 * len(sets))]
        for t in taus:
            served = [t["tau_served"].get(s) for s in sets]
            mean = statistics.mean(x for x in served if x is not None) if any(x is not None for x in served) else None
            out.append(f"| {'full' if not t['vocab'] else format(t['vocab'], ',')} | "
                       + " | ".join(f"{x:.3f}" if x is not None else "-" for x in served)
                       + (f" | {mean:.3f} | " if mean is not None else " | - | ")
                       + " | ".join(f"{t['eval_coverage'].get(s, float('nan')):.4f}" for s in sets) + f" | {t['wall_s']:.0f} |")
        out.append("")
    return "\n".join(out)


def plot(prof: list[dict], rows: list[dict], out: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print(f"no matplotlib here: {out.name} not drawn")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 7), gridspec_kw={"width_ratios": [1, 1.6]})
    ax = axes[0]
    left = [0.0] * len(prof)
    for g in GROUPS:
        vals = [p["groups_s"][g] for p in prof]
        ax.barh([p["provider"] for p in prof], vals, left=left, label=g)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_xlabel("seconds of one step (self CPU time, 1 thread)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3)
    ax.set_title("where a step's time goes", fontsize=10)
    ax = axes[1]
    names = [f"{r['provider']}: {'full' if not r['vocab'] else r['vocab']}, "
             f"{'bf16' if r['dtype'] == 'bfloat16' else 'fp32'}, {r['procs']} proc x {r['threads']} thr, "
             f"b{r['batch']} x a{r['anchors']}" + (f" (round {r['round']})" if r.get("round", 1) > 1 else "")
             for r in rows]
    ax.barh(names, [r["sample_draws_per_s"] for r in rows], color="tab:blue")
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=6)
    ax.set_xlabel("sample-draws / s (batch x steps/s)")
    ax.set_title("throughput per setting", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def distinct_tokens(data: Path) -> int:
    from vllm_specx.training.data import response_ids

    return len({t for r in response_ids(data) for t in r})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--data", type=Path, required=True, help="the training data folder (gen-data, with taps)")
    ap.add_argument("--eval-data", type=Path, action="append", default=[], help="gen-data --for-eval folders (tau)")
    ap.add_argument("--parts", type=lambda t: t.split(","), default=["profile", "throughput", "tau"])
    ap.add_argument("--providers", type=lambda t: t.split(","), default=PROVIDERS)
    ap.add_argument("--vocabs", type=lambda t: [int(x) for x in t.split(",")], default=[32768, 16384, 8192],
                    help="reduced draft vocabularies timed for the first provider")
    ap.add_argument("--shapes", type=lambda t: [tuple(int(y) for y in x.split("x")) for x in t.split(",")],
                    default=[(4, 48), (16, 12), (8, 48), (8, 12)], help="batch x anchors settings timed")
    ap.add_argument("--train-samples", type=int, default=256)
    ap.add_argument("--val-samples", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--window", type=float, default=20.0, help="seconds of timed steps per setting")
    ap.add_argument("--min-steps", type=int, default=3)
    ap.add_argument("--tau-provider", default="mtp-glm52")
    ap.add_argument("--tau-vocabs", type=lambda t: [None if x == "full" else int(x) for x in t.split(",")],
                    default=None, help="default: full and the largest vocabulary the data builds")
    ap.add_argument("--tau-steps", type=int, default=150)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--runs", type=Path, default=Path("~/.cache/vllm-specx/runs/train-step-tau").expanduser())
    ap.add_argument("--pause-pgid", type=int, action="append", default=[])
    ap.add_argument("--pause-pid", type=int, action="append", default=[])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/train-step-cpu-smollm2"))
    ap.add_argument("--grid", default="full", choices=["full", "core"],
                    help="core: the default, the data's vocabulary, 2 threads and 2 processes of the first provider")
    ap.add_argument("--append", action="store_true",
                    help="add this throughput round to the rows of --out's results.json (another round of repeats)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.data = args.data.expanduser()
    if args.worker:
        args.data_vocab_max = 0
        return worker(args)
    args.data_vocab_max = distinct_tokens(args.data)
    if args.tau_vocabs is None:
        args.tau_vocabs = [None, args.data_vocab_max]
    pauser = Pauser(args.pause_pgid, args.pause_pid)
    args.out.mkdir(parents=True, exist_ok=True)
    res_file = args.out / "results.json"
    old = json.loads(res_file.read_text()) if res_file.is_file() else {}
    prof, rows = old.get("profile", []), old.get("throughput", [])
    tau_proc = None
    if "tau" in args.parts and args.eval_data:  # in the background, paused with the rest while timing
        tau_proc = subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--parts", "tau-runs"],
                                    start_new_session=True)
        pauser.pgids.append(tau_proc.pid)  # its runs are in its process group (its own session)
    if args.parts == ["tau-runs"]:
        return tau_runs(args)
    torch.set_num_threads(1)
    if "profile" in args.parts and not args.append:
        prof = []
        for p in args.providers:
            try:
                with pauser.paused():
                    prof.append(profile(args, setting(p)))
            except Exception:  # noqa: BLE001 - the other providers still get measured
                import traceback

                traceback.print_exc()
                continue
            print(f"profile {p}: {prof[-1]['groups_share']} ({prof[-1]['wall_s']} s)", flush=True)
    if "throughput" in args.parts:
        new = [r for r in (measure(args, s, pauser) for s in settings(args)) if r is not None]
        rnd = 1 + max((r.get("round", 1) for r in rows), default=0) if args.append else 1
        new = [{**r, "round": rnd} for r in new]
        rows = rows + new if args.append else new
    if tau_proc is not None:
        tau_proc.wait()
    taus = tau_rows(args) if args.eval_data else []
    meta = provenance(torch.device("cpu"), args, providers={p: ALL_PROVIDERS[p] for p in args.providers},
                      data=json.loads((args.data / "meta.json").read_text()),
                      data_distinct_response_tokens=args.data_vocab_max)
    meta["args"]["data"] = f"<cache>/data/{args.data.name}"
    meta["args"]["eval_data"] = [f"<cache>/data/{d.name}" for d in args.eval_data]
    meta["args"]["runs"] = "<runs>"
    for t in taus:
        for d in [args.data, *args.eval_data]:
            t["command"] = t["command"].replace(str(d), f"<cache>/data/{d.name}")
    text = tables(args, prof, rows, taus)
    write_report({"meta": meta, "profile": prof, "throughput": rows, "tau": taus}, res_file, text)
    notes = args.out / "notes.md"  # the hand-written reading of the numbers, kept across re-runs
    (args.out / "results.md").write_text(
        f"# Training steps on this CPU ({meta['device']}, {meta['cpu_count']} cores), {args.target}\n\n"
        f"Data: {args.data.name} ({args.train_samples} training responses, {args.val_samples} validation), "
        f"seq-len {args.seq_len}; its responses hold {args.data_vocab_max:,} distinct tokens. "
        f"Measured {meta['date']} (git {str(meta['git_sha'])[:10]}, dirty {meta['git_dirty']}), torch {meta['torch']}.\n\n"
        + text + ("\n" + notes.read_text() if notes.is_file() else ""))
    plot(prof, rows, args.out / "train_step.png")


if __name__ == "__main__":
    main()
