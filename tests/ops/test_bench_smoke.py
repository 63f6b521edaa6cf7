"""The indexer benchmark runs end to end on CPU (`--smoke`, Triton interpreter), every kernel
specialisation it launches compiles for an H100/H200 target (`--compile-only`, no GPU needed), and
its goal check judges issue 37's speed goals as documented."""

import json
import sys
from pathlib import Path

from conftest import ptxas_or_skip, run_benchmark


def _bench():
    """`benchmarks/bench_dsa_indexer.py` as a module, for its pure functions."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_dsa_indexer

    return bench_dsa_indexer


def test_bench_smoke(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_benchmark("bench_dsa_indexer.py", "--smoke", "--out", str(out), env_extra={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {"date", "git_sha", "torch", "triton", "device", "peaks"} <= set(report["meta"])
    ops = {(r["op"], r["variant"].split("-")[0]) for r in report["results"]}
    assert ops == {("logits", "triton"), ("topk", "radix"), ("indexer_topk", "materialised"),
                   ("indexer_topk", "fused"), ("indexer_topk", "chunks")}
    for r in report["results"]:
        assert r["time_ms"] > 0 and r["roofline_ms"] > 0 and r["bytes"] > 0
        assert r["speedup_vs_reference"] is not None
    assert "%roof" in proc.stdout  # the table
    # A 256-key smoke run measures none of issue 37's goals: each says so rather than pass or fail.
    assert len(report["goals"]) == 7 and all(g["holds"] is None for g in report["goals"])
    assert "not measured" in proc.stdout


def _row(op, variant, ctx, batch, n, ms, graph_ms=None, torch_ms=None, roof_ms=0.01):
    return {"op": op, "variant": variant, "context": ctx, "batch": batch, "next_n": n,
            "time_ms": ms, "graph_ms": graph_ms, "torch.topk_ms": torch_ms,
            "graph_torch.topk_ms": torch_ms, "roofline_ms": roof_ms}


def test_goals_verdicts():
    """The goal check takes each config's fastest variant (graph times when all rows have them)
    and judges the worst config: one slow 1M config fails the 3x-torch.topk goal that the 128K
    config alone would pass; the fused path is compared with the same config's fastest logits."""
    bench = _bench()
    rows = [
        _row("topk", "radix", 131072, 64, 1, 0.050, torch_ms=0.178),  # 3.56x, 50 us
        _row("topk", "radix-8bit", 131072, 64, 1, 0.055, torch_ms=0.178),
        _row("topk", "radix", 1 << 20, 64, 1, 0.400, torch_ms=0.900),  # 2.25x: the worst
        _row("logits", "triton", 131072, 8, 1, 0.100, roof_ms=0.080),  # 80 % of roofline
        _row("logits", "triton-w8", 131072, 8, 1, 0.090, roof_ms=0.080),  # 89 %: the best
        _row("indexer_topk", "chunks-C4096", 131072, 8, 1, 0.100),  # 1.11x the best logits
        _row("indexer_topk", "materialised", 131072, 8, 1, 0.300),
    ]
    got = {g["goal"]: g for g in bench.goals(rows)}
    torch3 = got["top-k >= 3x torch.topk at 128K-1M"]
    assert torch3["holds"] is False and torch3["configs"] == 2 and abs(torch3["worst"] - 2.25) < 1e-9
    assert torch3["at"] == "ctx 1048576 B 64 N 1"
    us60 = got["top-k <= 60 us for 64 x 128K"]
    assert us60["holds"] is True and abs(us60["worst"] - 50.0) < 1e-6 and us60["variant"] == "radix"
    roof = got["logits >= 70% roofline, 1 token, batch >= 8, >= 128K"]
    assert roof["holds"] is True and roof["variant"] == "triton-w8"
    fused = got["indexer -> top-k <= 1.2x logits, >= 128K, batch >= 8"]
    assert fused["holds"] is True and abs(fused["worst"] - 0.100 / 0.090) < 1e-9
    assert got["short-context floor <= 15 us (logits, 4K, batch 1)"]["holds"] is None
    # graph times, when every row has one, are what counts: 20 us replayed beats 60 us eager
    graphed = [_row("logits", "triton", 4096, 1, 1, 0.060, graph_ms=0.012)]
    assert {g["goal"]: g for g in bench.goals(graphed)}[
        "short-context floor <= 15 us (logits, 4K, batch 1)"]["holds"] is True
    assert "NO" in bench.goals_table(bench.goals(rows))


def test_kernels_compile_for_sm90(tmp_path):
    ptxas_or_skip(90)
    proc = run_benchmark("bench_dsa_indexer.py", "--compile-only", drop=("TRITON_INTERPRET",),
                env_extra={"TRITON_CACHE_DIR": str(tmp_path), "TRITON_DEFAULT_FP_FUSION": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if "regs=" in ln]
    assert lines and all("spill=0 " in ln for ln in lines), "register spills:\n" + proc.stdout
    assert all("wgmma" in ln for ln in lines if "_indexer_" in ln)  # tensor cores on Hopper


def test_mixed_batches():
    """`--mixed-short`: one long request among short ones, costed by what each request holds, and
    left out of the goal check (whose goals are uniform batches)."""
    import argparse

    import torch

    bench = _bench()
    args = argparse.Namespace(dtype="bf16", heads=64, head_dim=128, topk=2048, mixed_short=4096)
    assert bench.seq_lens_of(131072, 3, args) == [131072, 4096, 4096]
    mixed, uniform = bench.op_costs(131072, 3, 1, args), bench.op_costs(131072, 3, 1, argparse.Namespace(
        **{**vars(args), "mixed_short": 0}))
    k_bytes = (131072 + 2 * 4096) * 128 * 2
    assert mixed["indexer_topk"][0] == k_bytes + 3 * 64 * (128 * 2 + 4) + 3 * 2048 * 4
    assert mixed["logits"][0] - mixed["indexer_topk"][0] == 3 * 131072 * 4 - 3 * 2048 * 4  # full width
    assert mixed["topk"][1] == 0 and uniform["topk"][0] > mixed["topk"][0]  # prefixes only
    assert bench.row_lengths(torch.tensor([10, 4], dtype=torch.int32), 3).tolist() == [8, 9, 10, 2, 3, 4]
    row = _row("topk", "radix", 131072, 64, 1, 0.010, torch_ms=1.0)
    assert bench.goals([{**row, "mixed_short": 4096}])[0]["holds"] is None
    assert bench.goals([row])[0]["holds"] is True
