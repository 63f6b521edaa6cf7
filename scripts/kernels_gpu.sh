#!/usr/bin/env bash
# The kernel checks and sweep on one CUDA GPU with no vLLM and no package index (a lent H200):
# tests/ops on the GPU (the vLLM-serving test left out), then the DSA indexer / top-k sweep with
# CUDA-graph timing in bf16, with an fp8 K cache and on a mixed batch, then the acceptance
# sampler's sweep.
#
#   bash scripts/kernels_gpu.sh OUT_DIR            # ~5-8 min on an H200
#
# Writes OUT_DIR/{pytest_ops.txt, dsa_bf16.json/.txt, dsa_fp8.json/.txt, dsa_mixed.json/.txt,
# acceptance.txt} and prints the speed goals' verdicts; copy the JSON files to benchmarks/results/
# (dsa_indexer-<gpu>-<date>.json) and the 128K rows to docs/kernels.md "Measured". Run from the
# repository root with the repository on PYTHONPATH.
set -uo pipefail
out="${1:?the output folder}"
mkdir -p "$out"
py="${PYTHON:-python3}"
t0=$(date +%s)
"$py" -m pytest tests/ops -q -x -p no:cacheprovider --ignore tests/ops/test_acceptance_serving.py \
    > "$out/pytest_ops.txt" 2>&1
echo "kernels_gpu: tests/ops rc=$? after $(( $(date +%s) - t0 )) s ($(tail -n 1 "$out/pytest_ops.txt"))"
"$py" benchmarks/bench_dsa_indexer.py --contexts 4096,32768,131072,1048576 --batches 1,8,64 \
    --next-n 1,4 --cuda-graph --out "$out/dsa_bf16.json" > "$out/dsa_bf16.txt" 2>&1
echo "kernels_gpu: bf16 sweep rc=$? after $(( $(date +%s) - t0 )) s"
sed -n '/^goal /,/^wrote /p' "$out/dsa_bf16.txt"  # issue 37's speed goals, judged on the sweep
"$py" benchmarks/bench_dsa_indexer.py --contexts 131072,1048576 --batches 8,64 --next-n 1 \
    --dtype fp8 --cuda-graph --out "$out/dsa_fp8.json" > "$out/dsa_fp8.txt" 2>&1
echo "kernels_gpu: fp8 sweep rc=$? after $(( $(date +%s) - t0 )) s"
"$py" benchmarks/bench_dsa_indexer.py --contexts 1048576 --batches 64 --next-n 1 --mixed-short 4096 \
    --cuda-graph --out "$out/dsa_mixed.json" > "$out/dsa_mixed.txt" 2>&1  # one 1M request among 4K ones
echo "kernels_gpu: mixed batch rc=$? after $(( $(date +%s) - t0 )) s"
timeout 120 "$py" benchmarks/bench_acceptance.py --gpu --no-vllm --batches 1,64,256 --ks 4,8,16 \
    --vocabs 32000,152064 --min-time 0.2 > "$out/acceptance.txt" 2>&1
echo "kernels_gpu: acceptance rc=$? after $(( $(date +%s) - t0 )) s"
