"""Where the reference assets (the 7M reference target, prompt sets, committed draft heads) are.

They live in the source checkout's `assets/` folder, which is not part of the installed wheel;
the demo, the benchmarks and the tests find them here. Set `VLLM_SPECX_ASSETS` to a folder with
the same layout (`ref-target/`, `prompts/<name>.jsonl`, `drafts/<head>/`) to use another copy, e.g.
with an installed vllm-specx. Nothing in the serving path reads assets.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ENV = "VLLM_SPECX_ASSETS"


def root() -> Path:
    """The assets folder: `$VLLM_SPECX_ASSETS`, else `assets/` of the source checkout."""
    env = os.environ.get(ENV)
    path = Path(env) if env else Path(__file__).resolve().parent.parent / "assets"
    if not path.is_dir():
        raise FileNotFoundError(
            f"vllm-specx assets folder {path} not found: set {ENV} to a folder with ref-target/, "
            "prompts/ and drafts/ (the source checkout's assets/)")
    return path


def path(*parts: str) -> Path:
    """A path inside the assets folder, e.g. `path("ref-target")`, `path("drafts", "<head>")`."""
    return root().joinpath(*parts)


def load_prompts(name: str = "code", limit: int | None = None) -> list[str]:
    """The prompts of `prompts/<name>.jsonl` (each line {"id", "prompt"}), the first `limit`."""
    rows = [json.loads(line) for line in path("prompts", f"{name}.jsonl").read_text().splitlines() if line]
    return [r["prompt"] for r in rows[:limit]]
