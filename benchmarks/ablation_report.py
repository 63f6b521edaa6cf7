"""One table and one figure for an ablation: the variants' in-vLLM tau (from `vllm-specx bench`
result folders, one per prompt set, T = 0 and T = 1) beside their validation tau (from the
training records the ablation script copies into `<first folder>/records/<variant>.training.json`).

    python benchmarks/ablation_report.py --title "..." --variants baseline,final-tap,... \
        DIR [DIR ...]          # writes DIR/ablation.md and DIR/ablation.png (the first DIR)

Rows: the variants in the given order (`--variants`), then the other providers of the bench run
(no-spec has no tau and is left out). Read-only on the bench results.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(dirs: list[Path]) -> tuple[list[str], dict]:
    """(prompt-set names, {(provider, set, T): row})."""
    sets, rows = [], {}
    for d in dirs:
        res = json.loads((d / "results.json").read_text())
        name = res["settings"]["prompts"]
        sets.append(name)
        batch = max(x["batch_size"] for x in res["rows"])
        for r in res["rows"]:
            if r["tau"] is not None and r["batch_size"] == batch:
                rows[(r["provider"], name, r["temperature"])] = r
    return sets, rows


def validation(records: Path, variant: str) -> tuple[float, float] | None:
    f = records / f"{variant}.training.json"
    if not f.exists():
        return None
    last = json.loads(f.read_text())["log"][-1]
    return last["tau_greedy"], last["tau_sampled"]


def report(dirs: list[Path], variants: list[str], title: str) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets, rows = load(dirs)
    others = sorted({p for p, _, _ in rows} - set(variants))
    order = variants + others
    temps = sorted({t for _, _, t in rows})
    head = ["variant", "validation τ greedy / sampled"] + [f"τ {s}, T = {t:g}" for s in sets for t in temps]
    head.append(f"acceptance per position, {sets[0]}, T = {temps[0]:g}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = {(s, t): rows[(variants[0], s, t)]["tau"] for s in sets for t in temps if (variants[0], s, t) in rows}
    for p in order:
        v = validation(dirs[0] / "records", p)
        cells = [p, f"{v[0]:.2f} / {v[1]:.2f}" if v else "-"]
        for s in sets:
            for t in temps:
                r = rows.get((p, s, t))
                d = f" ({r['tau'] - base[(s, t)]:+.2f})" if r and p in variants[1:] and (s, t) in base else ""
                cells.append(f"{r['tau']:.2f}{d}" if r else "-")
        r0 = rows.get((p, sets[0], temps[0]))
        cells.append(" ".join(f"{a:.2f}" for a in r0["acceptance_per_pos"]) if r0 else "-")
        lines.append("| " + " | ".join(cells) + " |")
    out = dirs[0]
    (out / "ablation.md").write_text(f"# {title}\n\n(τ deltas against `{variants[0]}` in brackets; "
                                     "validation τ from each run's training record)\n\n" + "\n".join(lines) + "\n")
    panels = [(s, t) for s in sets for t in temps]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False)
    for ax, (s, t) in zip(axes[0], panels):
        names = [p for p in order if (p, s, t) in rows]
        vals = [rows[(p, s, t)]["tau"] for p in names]
        colors = ["tab:gray" if p == variants[0] else "tab:green" if p == variants[-1] else
                  "tab:blue" if p in variants else "tab:orange" for p in names]
        ax.bar(range(len(names)), vals, color=colors)
        if (variants[0], s, t) in rows:
            ax.axhline(rows[(variants[0], s, t)]["tau"], color="tab:gray", ls="--", lw=1)
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
        lo = min(vals)
        ax.set_ylim(max(0.0, lo - 0.3 * (max(vals) - lo + 0.1)), max(vals) + 0.1 * (max(vals) - lo + 0.1))
        ax.set_title(f"{s}, T = {t:g}", fontsize=10)
        ax.set_ylabel("τ (accepted tokens per target pass)")
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out / "ablation.png", dpi=110)
    plt.close(fig)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="bench result folders (the first gets the report)")
    ap.add_argument("--variants", required=True, help="comma-separated providers, baseline first, full recipe last")
    ap.add_argument("--title", required=True)
    args = ap.parse_args(argv)
    out = report(args.dirs, [v for v in args.variants.split(",") if v], args.title)
    print((out / "ablation.md").read_text())


if __name__ == "__main__":
    main()
