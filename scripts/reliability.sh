#!/usr/bin/env bash
# The reliability suite at full counts (issue 13; CI runs the same tests with smaller counts):
# 64 concurrent streaming requests per drafter (DSpark, MTP and vLLM's n-gram, mixed sampling, seeds,
# n, a quarter aborted, the last eight alone on an idle server), the CPU-engine repairs with
# their negative controls, preemption / prefix caching / chunked prefill / edge requests against
# no-spec, TP=2 against TP=1, the malformed-draft table and `vllm serve` refusing bad drafts.
# Summaries go to $SPECX_RELIABILITY_OUT (default benchmarks/results/reliability).
#
#   bash scripts/reliability.sh            # about 15 minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_CPU_NUM_OF_RESERVED_CPU="${VLLM_CPU_NUM_OF_RESERVED_CPU:-0}"
export SPECX_LOAD_REQUESTS="${SPECX_LOAD_REQUESTS:-64}"
export SPECX_RELIABILITY_OUT="${SPECX_RELIABILITY_OUT:-benchmarks/results/reliability}"
mkdir -p "$SPECX_RELIABILITY_OUT"
start=$(date +%s)
.venv/bin/python -m pytest -q -p no:cacheprovider -rA \
    tests/e2e/test_load.py tests/e2e/test_cpu_repairs.py tests/e2e/test_reliability.py \
    tests/e2e/test_tensor_parallel.py tests/test_malformed_drafts.py tests/e2e/test_serve_refuses_bad_drafts.py \
    "$@" 2>&1 | sed "s|$PWD/||g" | tee "$SPECX_RELIABILITY_OUT/pytest.log" | grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed"
echo "reliability suite: $(( $(date +%s) - start )) s; summaries in $SPECX_RELIABILITY_OUT"
