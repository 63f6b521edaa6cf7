"""Fixtures for op tests. Triton runs through the interpreter on CPU: `tests/conftest.py` sets
TRITON_INTERPRET (and the per-test seed) for the whole suite."""

import os

import pytest
import torch


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def one_thread():
    """Small tensors: intra-op threads only add spin-wait contention on shared CPU cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def gathered_scores(scores: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """`scores [R, S]` at `idx [R, k]` (-1 -> -inf), sorted descending per row: the multiset a
    top-k selection picked, comparable across implementations whatever their tie choices."""
    vals = scores.float().gather(1, idx.clamp(min=0).long())
    return torch.where(idx >= 0, vals, float("-inf")).sort(dim=1, descending=True).values


def check_topk_sets(name: str, scores: torch.Tensor, ref: torch.Tensor, tri: torch.Tensor,
                    atol: float) -> None:
    """Top-k results agree as sets: same `-1` count per row, distinct in-range indices, and the
    chosen scores (read from the same `scores [R, S]`) equal the reference's multiset within
    `atol`. Near-ties may legitimately swap keys when the two sides computed scores differently."""
    assert ref.shape == tri.shape, f"{name}: shape {tuple(tri.shape)} != {tuple(ref.shape)}"
    assert torch.equal((ref < 0).sum(1), (tri < 0).sum(1)), f"{name}: -1 padding counts differ"
    assert tri.numel() == 0 or int(tri.max()) < scores.shape[1], f"{name}: index out of range"
    for row in tri:  # distinct indices per row
        kept = row[row >= 0]
        assert kept.unique().numel() == kept.numel(), f"{name}: duplicate index in {row.tolist()}"
    a, b = gathered_scores(scores, ref), gathered_scores(scores, tri)
    assert torch.isfinite(b).sum() == torch.isfinite(a).sum(), f"{name}: chose a masked key"
    fin = torch.isfinite(a)
    err = (a[fin] - b[fin]).abs().max().item() if fin.any() else 0.0
    assert err <= atol, f"{name}: chosen-score multisets differ by {err:.3g} > {atol:.3g}"


@pytest.fixture
def topk_sets():
    return check_topk_sets


def ptxas_or_skip(arch: int = 90) -> None:
    """Skip unless Triton's ptxas for sm_<arch> runs here (the `--compile-only` checks)."""
    import subprocess
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        from _sm90_compile import ptxas_path

        subprocess.run([ptxas_path(arch), "--version"], capture_output=True, check=True)
    except Exception as e:  # noqa: BLE001 - any missing piece means: cannot compile here
        pytest.skip(f"no usable ptxas for sm_{arch}: {e}")


def run_benchmark(script: str, *args, env_extra=None, drop=()):
    """Run `benchmarks/<script>` in a fresh interpreter (its own TRITON_INTERPRET setting)."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, str(repo / "benchmarks" / script), *args], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=300)

