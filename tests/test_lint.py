"""The linter of the quick tier: `ruff check` with the rules of pyproject.toml's `[tool.ruff]` finds
nothing in the repository. ruff comes with the `dev` extra (`scripts/bootstrap.sh` installs it); a
missing ruff fails this test rather than skipping it."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    assert importlib.util.find_spec("ruff") is not None, (
        "ruff is not installed: `pip install -e '.[dev]'` (bash scripts/bootstrap.sh does)")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"ruff check found problems (fix them, or see [tool.ruff] in pyproject.toml):\n" \
        f"{proc.stdout[-6000:]}{proc.stderr[-2000:]}"
