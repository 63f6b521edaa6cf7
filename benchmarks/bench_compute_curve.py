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
time per run is the GPU time per draft). `--jobs N` trains N runs at once (`--threads` each, 1 by
default).

    D=~/.cache/vllm-specx/data
    .venv/bin/python benchmarks/bench_compute_curve.py --target smollm2 --data $D/smollm2-chat-mix \
        --eval-data $D/eval-smollm2-humaneval --eval-data $D/eval-smollm2-chat-code \
        --eval-data $D/eval-smollm2-chat-prose --budgets 75,250,500,1100 --batch 32 \
        --device cuda --jobs 16 --runs ~/.cache/vllm-specx/runs/compute-curve \
        --out benchmarks/results/compute-curve-smollm2

On this CPU the same points at `--batch 8` take 4x the steps (about 4.7 s each with one thread).
`--export PROVIDER=DIR` copies the largest budget's run of PROVIDER to DIR as a committed draft
(bf16; the learning curve's `export`). The report keeps the earlier results.json's rows that this
command did not re-make (runs of another session or machine, each with `measured`, its date), less
committed-draft rows whose draft folder is re-evaluated (`--committed`) or replaced (`--export`).
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import curve_provenance, earlier_rows, plot_panels, ratio_table, train_queue, write_report  # noqa: E402
from bench_learning_curve import PROVIDERS as ALL_PROVIDERS  # noqa: E402
from bench_learning_curve import export  # noqa: E402

DEFAULT_PROVIDERS = ["mtp-glm52", "eagle3", "dspark-baseline", "dspark-recipe"]


def budget_flags(args, steps: int) -> list[str]:
    return ["--steps", str(steps), "--batch", str(args.batch), "--seq-len", str(args.seq_len),
            "--anchors", str(args.anchors), "--lr", str(args.lr), "--threads", str(args.threads), "--dtype", "bfloat16",
            "--val-samples", str(args.val_samples), "--val-every", str(val_every(steps)),
            "--save-every", str(min(100, steps)), "--seed", str(args.seed), "--eval-drafts", str(args.k),
            "--save-dtype", "bfloat16", "--device", args.device]


def val_every(steps: int) -> int:
    """Validation steps of a run: at its end, and from 2,200 steps on (70,400 draws at batch 32,
    ~10 passes over the chat-mix answers) every quarter, so that over-fitting shows (`overfit_table`)."""
    return steps if steps < 2200 else steps // 4


def fixed_flags(args) -> list[str]:
    """The budget flags every run of the curve shares (all but --steps and what follows from it)."""
    flags, out = budget_flags(args, 1), []
    for k, v in zip(flags[::2], flags[1::2]):
        if k not in ("--steps", "--val-every", "--save-every"):
            out += [k, v]
    return out


def run_name(provider: str, steps: int, batch: int, tag: str | None = None) -> str:
    """A run's folder name; `tag` (`--run-tag`): runs on other training data than the curve's first."""
    return f"{provider}-{steps}x{batch}" + (f"-{tag}" if tag else "")


def command(args, provider: str, steps: int, out: Path) -> list[str]:
    evals = [x for d in args.eval_data for x in ("--eval-data", str(d))]
    return [sys.executable, "-m", "vllm_specx.cli", "train", *ALL_PROVIDERS[provider],
            "--target", args.target, "--data", str(args.data), "--out", str(out),
            *budget_flags(args, steps), *evals, "--resume",
            *(["--draft-vocab", str(args.draft_vocab)] if args.draft_vocab else [])]


def run_all(args) -> list[tuple[str, int]]:
    """Train every (provider, budget) not yet trained, `--jobs` at a time, the largest budgets
    first (`--report-only`: none); the (provider, steps) pairs that have finished."""
    todo = [(p, s) for s in sorted(args.budgets, reverse=True) for p in args.providers]
    done = lambda p, s: (args.runs / run_name(p, s, args.batch, args.run_tag) / "training.json").is_file()  # noqa: E731
    if not args.report_only:
        train_queue(args.runs, args.jobs, [(run_name(p, s, args.batch, args.run_tag),
                                            command(args, p, s, args.runs / run_name(p, s, args.batch, args.run_tag)))
                                           for p, s in todo])
    return [t for t in todo if done(*t)]


def evaluate_committed(args) -> list[dict]:
    """`--committed PROVIDER=DIR`: a trained draft measured as the curve's runs are (`train
    --steps 0 --init-from DIR` with the flags of its record, the same --eval-data), a point at
    the budget its record says it was trained with; (provider, record, evaluation record)."""
    out = []
    for spec in args.committed:
        provider, _, src = spec.partition("=")
        if provider not in ALL_PROVIDERS or not src or not (Path(src) / "training.json").is_file():
            raise SystemExit(f"--committed {spec}: give PROVIDER=DIR, DIR a trained draft with its training.json")
        dest = args.runs / f"committed-{provider}-{Path(src).name}"
        if not (dest / "training.json").is_file() and not args.report_only:
            evals = [x for d in args.eval_data for x in ("--eval-data", str(d))]
            cmd = [sys.executable, "-m", "vllm_specx.cli", "train", "--config", str(Path(src) / "training.json"),
                   "--target", args.target, "--data", str(args.data), "--out", str(dest), "--steps", "0",
                   "--init-from", src, "--train-samples", "1", "--eval-drafts", str(args.k), "--threads", str(args.threads),
                   "--device", args.device, *evals]
            print(f"evaluate {src} as {provider}", flush=True)
            args.runs.mkdir(parents=True, exist_ok=True)
            with open(args.runs / f"{dest.name}.log", "w") as log:
                if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode:
                    raise SystemExit(f"--committed {spec}: evaluation failed, see {args.runs}/{dest.name}.log")
        if (dest / "training.json").is_file():
            out.append((provider, src, json.loads((Path(src) / "training.json").read_text()),
                        json.loads((dest / "training.json").read_text())))
    return out


def served_eval(record: dict) -> dict:
    """A training record's --eval-data results as the curve reports them, by evaluation folder."""
    return {k: {"tau_served": v.get("tau_served"), "served_acc_per_pos": v.get("served_acc_per_pos"),
                "served_passes": v.get("served_passes"), "tau_teacher_forced": v["tau_greedy"]}
            for k, v in record.get("eval", {}).items()}


def rows_of(args, runs: list[tuple[str, int]]) -> list[dict]:
    from vllm_specx.training.trainer import command_flags

    rows = []
    for p, src, trained, measured in evaluate_committed(args):
        a = trained["args"]
        rows.append({"provider": p, "steps": a["steps"], "batch": a["batch"], "sample_draws": a["steps"] * a["batch"],
                     "device": a["device"], "wall_s": trained["wall_s"],
                     "val_tau_greedy": trained["log"][-1].get("tau_greedy"), "committed_draft": True, "draft": src,
                     "draft_vocab": a.get("draft_vocab"),
                     "eval": served_eval(measured),
                     "command": trained["command"]})
    for p, s in runs:
        rec = json.loads((args.runs / run_name(p, s, args.batch, args.run_tag) / "training.json").read_text())
        last = rec["log"][-1]
        a = rec["args"]
        rows.append({"provider": p, "steps": a["steps"], "batch": a["batch"],
                     "sample_draws": a["steps"] * a["batch"], "device": a["device"],
                     **({"run_tag": args.run_tag} if args.run_tag else {}),
                     "data_prompts": rec.get("data", {}).get("prompts"), "data_samples": rec.get("data_samples"),
                     "losses": [[x["step"], x.get("train_loss"), x.get("val_loss")] for x in rec["log"]],
                     "wall_s": rec["wall_s"], "val_tau_greedy": last.get("tau_greedy"),
                     "draft_vocab": a.get("draft_vocab"), "eval": served_eval(rec),
                     "command": "vllm-specx train " + command_flags(argparse.Namespace(**a))})
    return rows


def point(r: dict) -> tuple:
    return r["provider"], r["sample_draws"], bool(r.get("committed_draft")), r.get("run_tag")


def with_earlier(args, rows: list[dict]) -> list[dict]:
    """This run's rows and the earlier report's that it did not re-make (`_report.earlier_rows`).
    An earlier committed-draft row is left out when its draft folder is evaluated again now
    (`--committed`) or replaced (`--export`): it measured a draft that is no longer there."""
    made = {point(r) for r in rows}
    now = {spec.partition("=")[2].rstrip("/") for spec in args.committed + args.export}

    def drop(r, meta):
        if point(r) in made:
            return True
        if not r.get("committed_draft"):
            return False
        was = dict(spec.partition("=")[::2] for spec in meta.get("args", {}).get("committed", []))
        r.setdefault("draft", was.get(r["provider"], ""))  # rows before "draft" was recorded: from the meta
        return r["draft"].rstrip("/") in now

    order = list(ALL_PROVIDERS)
    return sorted(earlier_rows(args.out / "results.json", drop) + rows,
                  key=lambda r: (r["sample_draws"], order.index(r["provider"]) if r["provider"] in order else len(order)))


DRAFT_COST = Path(__file__).resolve().parent / "results" / "draft-cost-smollm2" / "results.json"


@functools.cache
def _draft_costs() -> dict:
    """`bench_draft_cost.py`'s rows by name, read once ({} without that report)."""
    return {r["name"]: r for r in json.loads(DRAFT_COST.read_text())["rows"]} if DRAFT_COST.is_file() else {}


def draft_cost(provider: str) -> tuple[float, float] | None:
    """(draft ms per pass at batch 1, at batch 16) of the provider's architecture, from
    `bench_draft_cost.py`'s report (a draft's cost depends on its architecture, not its training),
    or None when that report has no such row."""
    costs = _draft_costs()
    if not costs or provider not in ALL_PROVIDERS:
        return None
    flags = ALL_PROVIDERS[provider]
    method = flags[flags.index("--method") + 1]
    name = f"{method}-L{flags[flags.index('--layers') + 1]}" if "--layers" in flags else method
    r = costs.get(name)
    return None if r is None else (r["batch 1"]["draft_ms_per_pass"], r["batch 16"]["draft_ms_per_pass"])


def challengers(rows: list[dict]) -> list[str]:
    """The providers measured against EAGLE-3, in row order."""
    return [p for p in dict.fromkeys(r["provider"] for r in rows) if p != "eagle3"]


def table(rows: list[dict], sets: list[str], ts: list[dict]) -> str:
    head = ("| provider | steps × batch | sample-draws | training data | draft vocabulary | "
            + " | ".join(f"τ served {s}" for s in sets)
            + " | τ teacher-forced " + sets[0] + " | τ validation (chat-mix) | draft ms / pass (batch 1 / 16) | train s |")
    lines = [head, "|" + "---|" * (9 + len(sets))]
    for r in rows:
        taus = " | ".join(f"{r['eval'][s]['tau_served']:.3f}" if r["eval"].get(s, {}).get("tau_served") else "-"
                          for s in sets)
        tf = r["eval"].get(sets[0], {}).get("tau_teacher_forced")
        cost = draft_cost(r["provider"])
        data = data_cell(r)
        lines.append(f"| {r['provider']}{' (committed draft)' if r.get('committed_draft') else ''} | {r['steps']} × {r['batch']} | {r['sample_draws']:,} | {data} | "
                     f"{r['draft_vocab'] or 'full'} | {taus} | "
                     f"{tf if tf is not None else '-'} | {r['val_tau_greedy']} | "
                     f"{f'{cost[0]:.1f} / {cost[1]:.1f}' if cost else '-'} | {r['wall_s']:.0f} ({r['device']}) |")
    lines += ratio_table(rows, sets, "sample_draws", "sample-draws", lambda r, s: r["eval"].get(s, {}).get("tau_served"),
                         challengers(rows), "Served τ against EAGLE-3 at equal budget (the project's goal: ≥ 1.3×):")
    lines += trend_table(ts)
    lines += overfit_table(rows)
    if DRAFT_COST.is_file():
        lines += ["", "Draft ms / pass: time in the drafter's `propose` per target pass in vLLM's CPU engine, K = 7 "
                  "(benchmarks/results/draft-cost-smollm2; it depends on the architecture, not the budget)."]
    return "\n".join(lines)


def data_cell(r: dict) -> str:
    """A row's training data as the report's tables give it."""
    return f"{r['data_samples']:,} answers" if r.get("data_samples") else "-"


def overfit_table(rows: list[dict]) -> list[str]:
    """Over-fitting, for the runs validated more than once (`val_every`): the validation loss (the
    held-back chat-mix answers) at each validation beside that step's training-batch loss; a
    validation loss that rises while the training loss falls is over-fitting."""
    runs = [r for r in rows if len([x for x in r.get("losses", []) if x[0]]) > 1]
    if not runs:
        return []
    lines = ["", "Over-fitting: validation loss / training-batch loss at each validation "
             "(the training loss is one batch's, noisy):", "",
             "| provider | sample-draws | training data | " + " | ".join(f"{q}/4 of the run" for q in range(1, 5))
             + " | validation loss rose |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        pts = [x for x in r["losses"] if x[0]][-4:]
        rose = any(b[2] > a[2] for a, b in zip(pts, pts[1:]))
        data = data_cell(r)
        cells = [f"{v:.3f} / {t:.3f}" if t is not None else f"{v:.3f}" for _, t, v in pts]
        lines.append(f"| {r['provider']} | {r['sample_draws']:,} | {data} | " + " | ".join(cells + ["-"] * (4 - len(cells)))
                     + f" | {'yes' if rose else 'no'} |")
    return lines


def ratios(rows: list[dict], s: str, provider: str, baseline: str = "eagle3") -> list[tuple[int, float]]:
    """(sample-draws, served τ of `provider` / `baseline`'s) on set `s` at every budget both have."""
    by: dict[int, dict[str, float]] = {}
    for r in rows:
        t = r["eval"].get(s, {}).get("tau_served")
        if t:
            by.setdefault(r["sample_draws"], {})[r["provider"]] = t
    return sorted((n, v[provider] / v[baseline]) for n, v in by.items() if provider in v and baseline in v)


def trends(rows: list[dict], sets: list[str], providers: list[str]) -> list[dict]:
    """Per set and provider: the least-squares line ratio = a + b·log10(sample-draws) through the
    `ratios` points, and the budgets where it reaches 1.0 and 1.3 (None where it does not trend
    there: slope <= 0 below the level; 'reached' where the last point is already at or above it)."""
    import math

    out = []
    for s in sets:
        for p in providers:
            pts = ratios(rows, s, p)
            t = {"set": s, "provider": p, "points": len(pts), "slope_per_10x": None, "cross": {}}
            if len(pts) >= 2 and len({n for n, _ in pts}) >= 2:
                xs, ys = [math.log10(n) for n, _ in pts], [y for _, y in pts]
                mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
                b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
                a = my - b * mx
                t["slope_per_10x"] = round(b, 4)
                for level in (1.0, 1.3):
                    if ys[-1] >= level:
                        t["cross"][level] = "reached"
                    elif b > 0:
                        t["cross"][level] = round(10 ** ((level - a) / b))
                    else:
                        t["cross"][level] = None
            out.append(t)
    return out


def trend_table(ts: list[dict]) -> list[str]:
    if not ts:
        return []
    lines = ["", "Trend: the ratio above against log10(sample-draws), least squares per set and provider "
             "(ratio = a + b·log10 draws), and where that line reaches 1.0 and 1.3 (an extrapolation; "
             "\"no trend\": slope <= 0; fewer than 2 budgets: no fit):", "",
             "| set | provider | budgets | slope per 10× draws | reaches 1.0 at | reaches 1.3 at |", "|---|---|---|---|---|---|"]

    def at(v):  # past 10^9 draws (~30,000x this curve's range) the line says nothing practical
        return "-" if v is None else v if isinstance(v, str) else f"{v:,} draws" if v <= 1e9 else "beyond 10⁹ draws"
    for t in ts:
        if t["slope_per_10x"] is None:
            lines.append(f"| {t['set']} | {t['provider']} | {t['points']} | no fit | - | - |")
            continue
        c = t["cross"]
        lines.append(f"| {t['set']} | {t['provider']} | {t['points']} | {t['slope_per_10x']:+.3f} | "
                     f"{at(c.get(1.0)) if c.get(1.0) is not None else 'no trend'} | "
                     f"{at(c.get(1.3)) if c.get(1.3) is not None else 'no trend'} |")
    return lines


def plot(rows: list[dict], sets: list[str], out: Path, title: str) -> None:
    providers = dict.fromkeys(r["provider"] for r in rows)
    plot_panels({s: {p: [(r["sample_draws"], r["eval"][s]["tau_served"]) for r in rows
                         if r["provider"] == p and r["eval"].get(s, {}).get("tau_served")] for p in providers}
                 for s in sets}, out, title, "training compute (steps × batch)", "τ as served (T = 0, K = 7)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--data", type=Path, required=True, help="the training data folder (gen-data, with taps)")
    ap.add_argument("--eval-data", type=Path, action="append", required=True,
                    help="gen-data --for-eval folders of greedy answers (repeatable)")
    ap.add_argument("--budgets", type=lambda t: [int(x) for x in t.split(",") if x], default=[75, 250, 500, 1100],
                    help="optimizer steps of each point (sample-draws = steps x --batch); empty: none")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--providers", type=lambda t: t.split(","), default=DEFAULT_PROVIDERS)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=24)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--val-samples", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-k", type=int, default=7, help="drafts per pass")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (every run)")
    ap.add_argument("--draft-vocab", type=int, default=None,
                    help="a reduced draft vocabulary for every run (on a CPU about 2.4x the steps/s: "
                         "benchmarks/results/train-step-cpu-smollm2); default: the full vocabulary")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (--jobs x --threads <= cores)")
    ap.add_argument("--runs", type=Path, required=True, help="where the runs are trained (outside the work tree)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--export", action="append", default=[], metavar="PROVIDER=DIR",
                    help="copy the largest budget's run of PROVIDER to DIR as a committed draft (bf16)")
    ap.add_argument("--committed", action="append", default=[], metavar="PROVIDER=DIR",
                    help="also measure a trained draft (e.g. a committed one) as a point of PROVIDER's line, "
                         "at the budget its record says (evaluated, not trained)")
    ap.add_argument("--report-only", action="store_true", help="train nothing: report the finished runs")
    ap.add_argument("--run-tag", default=None,
                    help="runs on other training data than the curve's first (e.g. x2: twice the answers): "
                         "named <provider>-<steps>x<batch>-TAG, kept beside untagged points of the same budget")
    args = ap.parse_args()
    unknown = [p for p in args.providers if p not in ALL_PROVIDERS]
    if unknown:
        raise SystemExit(f"--providers: unknown {unknown} (known: {list(ALL_PROVIDERS)})")
    finished = run_all(args) if args.budgets else []
    rows = with_earlier(args, rows_of(args, finished))
    if not rows:
        raise SystemExit(f"--runs {args.runs}: no finished run to report")
    sets = list(dict.fromkeys(s for r in rows for s in r["eval"]))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = curve_provenance(torch.device(args.device if torch.cuda.is_available() else "cpu"), args, rows,
                            providers={p: ALL_PROVIDERS[p] for p in args.providers})
    missing = [run_name(p, s, args.batch, args.run_tag) for s in args.budgets for p in args.providers
               if (p, s) not in finished]
    meta["not_run_yet"] = missing
    others = challengers(rows)
    ts = trends(rows, sets, others)
    text = table(rows, sets, ts) + (f"\n\nNot run yet (the curve is partial): {', '.join(missing)}" if missing else "")
    write_report({"meta": meta, "rows": rows, "trends": ts}, args.out / "results.json", text)
    (args.out / "results.md").write_text(
        f"# Compute curve, {args.target}: τ as served (T = 0, K = {args.k}) against training compute\n\n"
        f"Per run (with its --steps; --val-every = --steps): {' '.join(fixed_flags(args))}"
        f"{f' --draft-vocab {args.draft_vocab}' if args.draft_vocab else ''}\n\n{text}\n")
    plot(rows, sets, args.out / "compute_curve.png", f"{args.target}: τ as served vs training compute")
    plot_panels({s: {p: ratios(rows, s, p) for p in others} for s in sets}, args.out / "ratio_to_eagle3.png",
                f"{args.target}: served τ / EAGLE-3's at equal budget", "training compute (steps × batch)",
                "τ / EAGLE-3's τ")
    print(f"wrote {args.out}")
    for spec in args.export:
        provider, _, dest = spec.partition("=")
        if provider not in args.providers or not dest:
            raise SystemExit(f"--export {spec}: give PROVIDER=DIR with PROVIDER one of {args.providers}")
        export(args.runs / run_name(provider, max(args.budgets), args.batch, args.run_tag), Path(dest), args,
               curve="benchmarks/bench_compute_curve.py")


if __name__ == "__main__":
    main()
