"""The acceptance benchmark runs end to end on CPU (`--smoke`: 2 tiny configs, JSON + table), and
every Triton kernel specialisation it launches compiles for an H100/H200 target with IEEE
divisions and no contracted multiply-adds (`--compile-only`, no GPU needed)."""

import json


from conftest import ptxas_or_skip, run_benchmark


def test_bench_acceptance_smoke(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_benchmark("bench_acceptance.py", "--smoke", "--out", str(out), env_extra={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    meta = set(report["meta"])
    assert {"date", "git_sha", "torch", "triton", "vllm", "device", "threads"} <= meta
    assert [(r["batch"], r["k"], r["vocab"]) for r in report["results"]] == [(2, 2, 64), (3, 2, 64)]
    for r in report["results"]:
        assert r["ours_op_ms"] > 0 and r["ours_e2e_ms"] > 0 and r["reference_ms"] > 0
        assert r["vllm_ms"] is None or r["vllm_ms"] > 0  # None (with a note) without vLLM
        assert (r["vllm_ms"] is None) == (r["vllm_note"] is not None)
    assert "ours_e2e" in proc.stdout and "e2e x" in proc.stdout  # the table


def test_kernels_compile_for_sm90(tmp_path):
    ptxas_or_skip(90)
    proc = run_benchmark("bench_acceptance.py", "--compile-only", drop=("TRITON_INTERPRET",),
                env_extra={"TRITON_CACHE_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if "regs=" in ln]
    assert len(lines) == 13, proc.stdout  # 4 kernels x (token, block) x (q, one-hot), deduped
    assert all("spill=0 " in ln and "approx_div=0 " in ln and "fma=0 " in ln for ln in lines), \
        proc.stdout
