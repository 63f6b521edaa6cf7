"""DSpark ablations at equal budget (issue 45): each change alone on the DSpark baseline, then
combined, with EAGLE-3 and MTP trained on the same data at the same budget beside them.

Every variant is one `vllm-specx train --method dspark` run: the compute curve's
`dspark-baseline` flags (2 layers, taps 1,14,26, block 8, vanilla Markov head of rank 32, CE,
lr 2e-3, 24 anchors drawn with replacement) with the variant's flags appended (argparse: the
last value wins). Reported per run, on each --eval-data folder (greedy answers the data never
held; `train --eval-data`):

* tau as serving counts it (T = 0, K = 7; `training.serving_count`, equal to vLLM's counters);
* per-slot conditional acceptance P(slot k accepted | slots < k accepted), from the walk;
* the first draft's hit rate at every anchor, split into "copyable" anchors (the last earlier
  occurrence of x_a was followed by x_{a+1}) and the rest (`serving_count.copy_split`);
* steps/s (denser anchors cost compute) and the draft's trainable parameters.

Runs live in --runs (outside the work tree) and resume: a run whose training.json exists is
read, an interrupted one continues from its trainer_state.pt (`--resume`), so the same command
picks up after an interruption. `--jobs N` trains N at once, `--threads` each (1 by default). The report keeps
the rows of the earlier results.json that this command did not re-make (runs trained on another
machine or in another session; each carries `measured`, its date).

    D=~/.cache/vllm-specx/data
    .venv/bin/python benchmarks/bench_dspark_ablation.py --data $D/smollm2-chat-mix \\
        --train-samples 1400 --eval-data $D/eval-smollm2-humaneval \\
        --eval-data $D/eval-smollm2-chat-code --eval-data $D/eval-smollm2-chat-prose \\
        --draws 8000 --variants baseline,next-fused,next-added,eagle3 \\
        --runs ~/.cache/vllm-specx/runs/dspark-ablation --out benchmarks/results/dspark-ablation-smollm2

`--combine NAME=a+b+c` defines a variant of several variants' flags together (later wins);
`--report-only` trains nothing and reports the finished runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import curve_provenance, earlier_rows, train_queue, write_report  # noqa: E402
from bench_learning_curve import PROVIDERS, TV_LOSS  # noqa: E402

BASE = PROVIDERS["dspark-baseline"]
# variant -> flags appended to the baseline's (the references: their own provider flags)
VARIANTS: dict[str, list[str]] = {
    "baseline": [],
    "next-fused": ["--next-token-stream", "fused"],
    "next-added": ["--next-token-stream", "added"],
    "anchors-24u": ["--anchor-draw", "unique"],
    "anchors-96": ["--anchor-draw", "unique", "--anchors", "96"],
    "anchors-256": ["--anchor-draw", "unique", "--anchors", "256"],
    "anchors-all": ["--anchor-draw", "unique", "--anchors", "0"],
    "block-7": ["--block-size", "7"],
    "rank-96": ["--markov-rank", "96"],
    "rank-128": ["--markov-rank", "128"],
    "rank-256": ["--markov-rank", "256"],
    "layers-3": ["--layers", "3"],
    "layers-5": ["--layers", "5"],
    "taps-last": ["--taps", "1,14,29"],
    "taps-4": ["--taps", "1,14,26,29"],
    "loss-tv": TV_LOSS,
    "lr-6e-4": ["--lr", "6e-4"],
    # the recipe's four changes (item 4: each on top of the winner, via --combine); the final-layer
    # tap's columns start at zero (the baseline's function) or at the target's final norm
    "final-tap": ["--final-layer-tap"],
    "final-tap-norm": ["--final-layer-tap", "--final-tap-init", "final-norm"],
    "layer-fusion": ["--per-layer-fusion"],
    "slot-queries": ["--slot-queries"],
    "rnn-head": ["--markov-head-type", "rnn"],
}
REFERENCES = {"eagle3": PROVIDERS["eagle3"], "mtp-glm52": PROVIDERS["mtp-glm52"]}


def flags_of(name: str, combos: dict[str, list[str]]) -> list[str]:
    if name in REFERENCES:
        return list(REFERENCES[name])
    if name in combos:
        return BASE + [f for part in combos[name] for f in VARIANTS[part]]
    if name not in VARIANTS:
        raise SystemExit(f"--variants: unknown variant {name!r} (known: {[*VARIANTS, *REFERENCES, *combos]})")
    return BASE + VARIANTS[name]


def parse_combine(specs: list[str]) -> dict[str, list[str]]:
    out = {}
    for spec in specs:
        name, _, parts = spec.partition("=")
        bad = [p for p in parts.split("+") if p not in VARIANTS]
        if not name or not parts or bad:
            raise SystemExit(f"--combine {spec!r}: give NAME=a+b+... of known variants (unknown: {bad})")
        out[name] = parts.split("+")
    return out


def run_name(name: str, steps: int, batch: int) -> str:
    return f"{name}-{steps}x{batch}"


def command(args, name: str, steps: int, out: Path, combos) -> list[str]:
    evals = [x for d in args.eval_data for x in ("--eval-data", str(d))]
    budget = ["--steps", str(steps), "--batch", str(args.batch), "--seq-len", "256", "--anchors", "24",
              "--lr", "0.002", "--threads", str(args.threads), "--dtype", "bfloat16", "--val-samples", "32",
              "--val-every", str(steps), "--save-every", "25", "--seed", str(args.seed),
              "--eval-drafts", "7", "--save-dtype", "bfloat16", "--device", args.device,
              "--draft-vocab", str(args.draft_vocab)]
    if args.train_samples:
        budget += ["--train-samples", str(args.train_samples)]
    # the variant's flags last: they override the budget's --anchors / --lr where they set them
    return [sys.executable, "-m", "vllm_specx.cli", "train", "--target", args.target, "--data", str(args.data),
            "--out", str(out), *budget, *evals, "--resume", *flags_of(name, combos)]


def run_all(args, combos) -> list[tuple[str, int]]:
    todo = [(v, s) for s in args.steps for v in args.variants]
    done = lambda v, s: (args.runs / run_name(v, s, args.batch) / "training.json").is_file()  # noqa: E731
    if not args.report_only:
        train_queue(args.runs, args.jobs, [(run_name(v, s, args.batch),
                                            command(args, v, s, args.runs / run_name(v, s, args.batch), combos))
                                           for v, s in todo])
    return [t for t in todo if done(*t)]


def conditional(per_pos: list[float]) -> list[float | None]:
    """P(slot k accepted | slots < k accepted) from accepted-per-pass at each slot (the walk's
    `served_acc_per_pos`: the share of passes whose slot k was accepted)."""
    out, prev = [], 1.0
    for x in per_pos:
        out.append(round(x / prev, 4) if prev > 0 else None)
        prev = x
    return out


def row_of(args, name: str, steps: int) -> dict:
    from vllm_specx.training.trainer import command_flags

    rec = json.loads((args.runs / run_name(name, steps, args.batch) / "training.json").read_text())
    a = rec["args"]
    ev = {}
    for k, v in rec.get("eval", {}).items():
        ev[k] = {"tau_served": v.get("tau_served"), "served_acc_per_pos": v.get("served_acc_per_pos"),
                 "conditional": conditional(v.get("served_acc_per_pos") or []),
                 "first_hit_copyable": v.get("first_hit_copyable"), "first_hit_other": v.get("first_hit_other"),
                 "copyable_anchors": v.get("copyable_anchors"), "other_anchors": v.get("other_anchors"),
                 "tau_teacher_forced": v.get("tau_greedy")}
    train_s = rec.get("train_s") or rec["wall_s"]
    return {"variant": name, "method": a["method"], "steps": a["steps"], "batch": a["batch"],
            "sample_draws": a["steps"] * a["batch"], "device": a["device"], "wall_s": rec["wall_s"],
            "steps_per_s": round(a["steps"] / train_s, 4) if train_s else None,
            "trainable_params": rec.get("trainable_params"), "eval": ev,
            "flags": flags_of(name, parse_combine(args.combine)) if name not in REFERENCES else REFERENCES[name],
            "command": "vllm-specx train " + command_flags(argparse.Namespace(**a))}


def table(rows: list[dict], sets: list[str]) -> str:
    short = [s.replace("eval-smollm2-", "") for s in sets]
    lines = ["| variant | draws | " + " | ".join(f"τ {s}" for s in short)
             + " | τ vs EAGLE-3 (" + " / ".join(short) + ") | acceptance of drafts 1-4 given the earlier ones ("
             + short[0] + ") | first draft's hit rate, copyable anchors (" + " / ".join(short)
             + ") | the same, other anchors | steps/s | params |",
             "|" + "---|" * (8 + len(sets))]
    ref = {(r["sample_draws"], s): r["eval"].get(s, {}).get("tau_served") for r in rows if r["variant"] == "eagle3"
           for s in sets}
    for r in rows:
        e = r["eval"]
        taus = " | ".join(f"{e[s]['tau_served']:.3f}" if e.get(s, {}).get("tau_served") else "-" for s in sets)
        rat = " / ".join(f"{e[s]['tau_served'] / ref[(r['sample_draws'], s)]:.3f}"
                         if e.get(s, {}).get("tau_served") and ref.get((r["sample_draws"], s)) else "-" for s in sets)
        first = e.get(sets[0], {})
        cond = ", ".join(f"{x:.2f}" for x in (first.get("conditional") or [])[:4] if x is not None)

        def split(key):
            return " / ".join(f"{e[s][key]:.3f}" if e.get(s, {}).get(key) is not None else "-" for s in sets)
        copy = f"{split('first_hit_copyable')} | {split('first_hit_other')}"
        params = f"{r['trainable_params'] / 1e6:.2f}M" if r.get("trainable_params") else "-"
        lines.append(f"| {r['variant']} | {r['sample_draws']:,} | {taus} | {rat} | {cond} | {copy} | "
                     f"{r['steps_per_s'] or '-'} | {params} |")
    return "\n".join(lines)


def plot(rows: list[dict], sets: list[str], out: Path, title: str) -> None:
    try:
        import matplotlib
    except ImportError:
        print(f"no matplotlib here: {out.name} not drawn")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sets), figsize=(4.6 * len(sets), 0.32 * len(rows) + 1.6), squeeze=False)
    for ax, s in zip(axes[0], sets):
        names = [f"{r['variant']} ({r['sample_draws']:,})" for r in rows]
        vals = [r["eval"].get(s, {}).get("tau_served") or 0 for r in rows]
        colors = ["tab:gray" if r["variant"] in REFERENCES else "tab:blue" for r in rows]
        ax.barh(names, vals, color=colors)
        for r in rows:
            if r["variant"] == "eagle3":
                ax.axvline(r["eval"].get(s, {}).get("tau_served") or 0, color="k", ls="--", lw=0.8)
        ax.set_xlim(1.0, max(vals + [1.1]) * 1.05)
        ax.set_title(s.replace("eval-smollm2-", ""), fontsize=9)
        ax.set_xlabel("τ as served (T = 0, K = 7)")
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--data", type=Path, required=True, help="the training data folder (gen-data, with taps)")
    ap.add_argument("--train-samples", type=int, default=None, help="train on the data's first N answers")
    ap.add_argument("--eval-data", type=Path, action="append", required=True)
    ap.add_argument("--draws", type=lambda t: [int(x) for x in t.split(",") if x], default=[8000],
                    help="budgets in sample-draws (steps x --batch), comma-separated")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--variants", type=lambda t: [x for x in t.split(",") if x],
                    default=["baseline", "next-fused", "next-added", "eagle3"])
    ap.add_argument("--combine", action="append", default=[], metavar="NAME=a+b+...")
    ap.add_argument("--draft-vocab", type=int, default=14677)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (--jobs x --threads <= cores)")
    ap.add_argument("--runs", type=Path, required=True, help="where the runs are trained (outside the work tree)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    combos = parse_combine(args.combine)
    for v in args.variants:
        flags_of(v, combos)  # unknown names refused before anything runs
    args.steps = sorted({d // args.batch for d in args.draws})
    runs = run_all(args, combos)
    rows = [row_of(args, v, s) for v, s in runs]
    made = {(r["variant"], r["sample_draws"]) for r in rows}
    # points measured in earlier sessions (their runs are not in this machine's cache) stay
    rows = earlier_rows(args.out / "results.json", lambda r, meta: (r["variant"], r["sample_draws"]) in made) + rows
    rows.sort(key=lambda r: (r["sample_draws"], r["variant"] != "eagle3"))
    sets = [d.name for d in args.eval_data]
    args.out.mkdir(parents=True, exist_ok=True)
    meta = curve_provenance(torch.device(args.device), args, rows, variants=VARIANTS, combine=combos,
                            base_flags=BASE, references=REFERENCES)
    text = table(rows, sets)
    write_report({"meta": meta, "rows": rows}, args.out / "results.json", text)
    (args.out / "results.md").write_text(
        "# DSpark ablations, smollm2: τ as served (T = 0, K = 7) at equal budget\n\n"
        f"Base flags (the compute curve's dspark-baseline): `{' '.join(BASE)}`; each variant appends its "
        "flags (results.json: `flags`, `command`).\n\n" + text + "\n")
    plot(rows, sets, args.out / "ablation.png", "DSpark ablations at equal budget (SmolLM2, CPU)")


if __name__ == "__main__":
    main()
