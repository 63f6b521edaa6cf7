"""The indexer benchmark runs end to end on CPU (`--smoke`, Triton interpreter), and every kernel
specialisation it launches compiles for an H100/H200 target (`--compile-only`, no GPU needed)."""

import json


from conftest import ptxas_or_skip, run_benchmark


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


def test_kernels_compile_for_sm90(tmp_path):
    ptxas_or_skip(90)
    proc = run_benchmark("bench_dsa_indexer.py", "--compile-only", drop=("TRITON_INTERPRET",),
                env_extra={"TRITON_CACHE_DIR": str(tmp_path), "TRITON_DEFAULT_FP_FUSION": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if "regs=" in ln]
    assert lines and all("spill=0 " in ln for ln in lines), "register spills:\n" + proc.stdout
    assert all("wgmma" in ln for ln in lines if "_indexer_" in ln)  # tensor cores on Hopper
