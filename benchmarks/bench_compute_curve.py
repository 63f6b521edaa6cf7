"""Compute curve (issue 36, item 4): tau against training compute (optimizer steps x batch =
sample-draws) for our MTP (GLM-5.2 recipe), the EAGLE-3 baseline, the DSpark baseline and the
DSpark recipe, every provider at the same budget at every point, all on the same training data.

tau is what serving counts (`train --eval-data`, `training.serving_count`): each greedy answer of
a `gen-data --for-eval` folder walked from its first generated token, K drafts a pass, the
accepted prefix plus one per pass (T = 0; `tests/e2e/test_serving_count.py` checks it against
vLLM's own counters). The teacher-forced tau at random anchors (the learning curve's figure) and
the chat-mix validation tau are kept beside it: they overstate what serving sees.

Each point is one `vllm-specx train` run with its own cosine schedule (`--steps`). Runs live in
`--runs` (the cache) and are resumable: a run whose training.json exists is read, an interrupted
one continues from its last trainer_state.pt (`train --resume`), so the same command picks up
after an interruption, on this CPU across sessions or on a GPU (`--device cuda`, where the wall
time per run is the GPU time per draft). `--jobs N` trains N runs at once (one thread each).

    D=~/.cache/vllm-specx/data
    .venv/bin/python benchmarks/bench_compute_curve.py --target smollm2 --data $D/smollm2-chat-mix \
        --eval-data $D/eval-smollm2-humaneval --eval-data $D/eval-smollm2-chat-code \
        --eval-data $D/eval-smollm2-chat-prose --budgets 75,250,500,1100 --batch 32 \
        --device cuda --jobs 16 --runs ~/.cache/vllm-specx/runs/compute-curve \
        --out benchmarks/results/compute-curve-smollm2

On this CPU the same points at `--batch 8` take 4x the steps (about 4.7 s each with one thread).
`--export PROVIDER=DIR` copies the largest budget's run of PROVIDER to DIR as a committed draft
(bf16; the learning curve's `export`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import provenance, write_report  # noqa: E402
from bench_learning_curve import PROVIDERS as ALL_PROVIDERS  # noqa: E402
from bench_learning_curve import export  # noqa: E402

DEFAULT_PROVIDERS = ["mtp-glm52", "eagle3", "dspark-baseline", "dspark-recipe"]


def budget_flags(args, steps: int) -> list[str]:
    return ["--steps", str(steps), "--batch", str(args.batch), "--seq-len", str(args.seq_len),
            "--anchors", str(args.anchors), "--lr", str(args.lr), "--threads", "1", "--dtype", "bfloat16",
            "--val-samples", str(args.val_samples), "--val-every", str(steps),
            "--save-every", str(min(100, steps)), "--seed", str(args.seed), "--eval-drafts", str(args.k),
            "--save-dtype", "bfloat16", "--device", args.device]


def run_name(provider: str, steps: int, batch: int) -> str:
    return f"{provider}-{steps}x{batch}"


def command(args, provider: str, steps: int, out: Path) -> list[str]:
    evals = [x for d in args.eval_data for x in ("--eval-data", str(d))]
    return [sys.executable, "-m", "vllm_specx.cli", "train", *ALL_PROVIDERS[provider],
            "--target", args.target, "--data", str(args.data), "--out", str(out),
            *budget_flags(args, steps), *evals, "--resume"]


def run_all(args) -> list[tuple[str, int]]:
    """Train every (provider, budget) not yet trained, `--jobs` at a time, the largest budgets
    first (`--report-only`: none); the (provider, steps) pairs that have finished."""
    todo = [(p, s) for s in sorted(args.budgets, reverse=True) for p in args.providers]
    done = lambda p, s: (args.runs / run_name(p, s, args.batch) / "training.json").is_file()  # noqa: E731
    if not args.report_only:
        args.runs.mkdir(parents=True, exist_ok=True)
        pending, running = [t for t in todo if not done(*t)], []
        while pending or running:
            while pending and len(running) < args.jobs:
                p, s = pending.pop(0)
                name = run_name(p, s, args.batch)
                print(f"train {name}", flush=True)
                log = open(args.runs / f"{name}.log", "a")
                running.append((name, subprocess.Popen(command(args, p, s, args.runs / name), stdout=log,
                                                       stderr=subprocess.STDOUT)))
            for item in list(running):
                if item[1].poll() is not None:
                    running.remove(item)
                    print(f"{item[0]}: exit {item[1].returncode}", flush=True)
                    if item[1].returncode:
                        raise SystemExit(f"{item[0]} failed: see {args.runs}/{item[0]}.log")
            time.sleep(2)
    return [t for t in todo if done(*t)]


def rows_of(args, runs: list[tuple[str, int]]) -> list[dict]:
    from vllm_specx.training.trainer import command_flags

    rows = []
    for p, s in runs:
        rec = json.loads((args.runs / run_name(p, s, args.batch) / "training.json").read_text())
        last = rec["log"][-1]
        a = rec["args"]
        rows.append({"provider": p, "steps": a["steps"], "batch": a["batch"],
                     "sample_draws": a["steps"] * a["batch"], "device": a["device"],
                     "wall_s": rec["wall_s"], "val_tau_greedy": last.get("tau_greedy"),
                     "eval": {k: {"tau_served": v.get("tau_served"), "served_acc_per_pos": v.get("served_acc_per_pos"),
                                  "served_passes": v.get("served_passes"), "tau_teacher_forced": v["tau_greedy"]}
                              for k, v in rec.get("eval", {}).items()},
                     "command": "vllm-specx train " + command_flags(argparse.Namespace(**a))})
    return sorted(rows, key=lambda r: (r["sample_draws"], args.providers.index(r["provider"])))


def table(rows: list[dict], sets: list[str]) -> str:
    head = ("| provider | steps × batch | sample-draws | " + " | ".join(f"τ served {s}" for s in sets)
            + " | τ teacher-forced " + sets[0] + " | τ validation (chat-mix) | train s |")
    lines = [head, "|" + "---|" * (6 + len(sets))]
    for r in rows:
        taus = " | ".join(f"{r['eval'][s]['tau_served']:.3f}" if r["eval"].get(s, {}).get("tau_served") else "-"
                          for s in sets)
        tf = r["eval"].get(sets[0], {}).get("tau_teacher_forced")
        lines.append(f"| {r['provider']} | {r['steps']} × {r['batch']} | {r['sample_draws']:,} | {taus} | "
                     f"{tf if tf is not None else '-'} | {r['val_tau_greedy']} | {r['wall_s']:.0f} ({r['device']}) |")
    others = [p for p in dict.fromkeys(r["provider"] for r in rows) if p != "eagle3"]
    ratios = []
    for s in sets:
        for n in sorted({r["sample_draws"] for r in rows}):
            by = {r["provider"]: r["eval"].get(s, {}).get("tau_served") for r in rows if r["sample_draws"] == n}
            if by.get("eagle3"):
                ratios.append(f"| {s} | {n:,} | " + " | ".join(
                    f"{by[p] / by['eagle3']:.3f}" if by.get(p) else "-" for p in others) + " |")
    if ratios:
        lines += ["", "Served τ against EAGLE-3 at equal budget (the project's goal: ≥ 1.3×):", "",
                  "| set | sample-draws | " + " | ".join(others) + " |", "|" + "---|" * (2 + len(others))] + ratios
    return "\n".join(lines)


def plot(rows: list[dict], sets: list[str], out: Path, title: str) -> None:
    try:
        import matplotlib
    except ImportError:  # a bare GPU box: the report is re-made where matplotlib is (--report-only)
        print(f"no matplotlib here: {out.name} not drawn")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sets), figsize=(4.2 * len(sets), 3.6), squeeze=False)
    for ax, s in zip(axes[0], sets):
        for p in dict.fromkeys(r["provider"] for r in rows):
            pts = sorted((r["sample_draws"], r["eval"][s]["tau_served"]) for r in rows
                         if r["provider"] == p and r["eval"].get(s, {}).get("tau_served"))
            if pts:
                ax.plot(*zip(*pts), marker="o", label=p)
        ax.set_xscale("log")
        ax.set_xlabel("training compute (steps × batch)")
        ax.set_ylabel("τ as served (T = 0, K = 7)")
        ax.set_title(s, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--data", type=Path, required=True, help="the training data folder (gen-data, with taps)")
    ap.add_argument("--eval-data", type=Path, action="append", required=True,
                    help="gen-data --for-eval folders of greedy answers (repeatable)")
    ap.add_argument("--budgets", type=lambda t: [int(x) for x in t.split(",")], default=[75, 250, 500, 1100],
                    help="optimizer steps of each point (sample-draws = steps x --batch)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--providers", type=lambda t: t.split(","), default=DEFAULT_PROVIDERS)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=24)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--val-samples", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-k", type=int, default=7, help="drafts per pass")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (every run)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--runs", type=Path, required=True, help="where the runs are trained (outside the work tree)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--export", action="append", default=[], metavar="PROVIDER=DIR",
                    help="copy the largest budget's run of PROVIDER to DIR as a committed draft (bf16)")
    ap.add_argument("--report-only", action="store_true", help="train nothing: report the finished runs")
    args = ap.parse_args()
    unknown = [p for p in args.providers if p not in ALL_PROVIDERS]
    if unknown:
        raise SystemExit(f"--providers: unknown {unknown} (known: {list(ALL_PROVIDERS)})")
    finished = run_all(args)
    rows = rows_of(args, finished)
    if not rows:
        raise SystemExit(f"--runs {args.runs}: no finished run to report")
    sets = list(dict.fromkeys(s for r in rows for s in r["eval"]))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = provenance(torch.device(args.device if torch.cuda.is_available() else "cpu"), args,
                      providers={p: ALL_PROVIDERS[p] for p in args.providers},
                      data=json.loads((args.data / "meta.json").read_text()),
                      eval_data={d.name: json.loads((d / "meta.json").read_text()) for d in args.eval_data})
    meta["args"]["runs"] = "<runs>"
    meta["args"]["data"] = f"<cache>/data/{args.data.name}"
    meta["args"]["eval_data"] = [f"<cache>/data/{d.name}" for d in args.eval_data]
    for r in rows:  # machine paths out of the recorded commands
        for d in [args.data, *args.eval_data]:
            r["command"] = r["command"].replace(str(d), f"<cache>/data/{d.name}")
        r["command"] = r["command"].replace(str(args.runs), "<runs>")
    missing = [run_name(p, s, args.batch) for s in args.budgets for p in args.providers
               if (p, s) not in finished]
    meta["not_run_yet"] = missing
    text = table(rows, sets) + (f"\n\nNot run yet (the curve is partial): {', '.join(missing)}" if missing else "")
    write_report({"meta": meta, "rows": rows}, args.out / "results.json", text)
    (args.out / "results.md").write_text(
        f"# Compute curve, {args.target}: τ as served (T = 0, K = {args.k}) against training compute\n\n"
        f"Per run: {' '.join(budget_flags(args, 0)[2:])}\n\n{text}\n")
    plot(rows, sets, args.out / "compute_curve.png", f"{args.target}: τ as served vs training compute")
    print(f"wrote {args.out}")
    for spec in args.export:
        provider, _, dest = spec.partition("=")
        if provider not in args.providers or not dest:
            raise SystemExit(f"--export {spec}: give PROVIDER=DIR with PROVIDER one of {args.providers}")
        export(args.runs / run_name(provider, max(args.budgets), args.batch), Path(dest), args)


if __name__ == "__main__":
    main()
