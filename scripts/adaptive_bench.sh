#!/usr/bin/env bash
# Confidence-scheduled drafting on SmolLM2-135M-Instruct x HumanEval (issue 14): tokens/s of
# no-spec, our DSpark head at fixed K 7, and the same head with `adaptive: true` (confidence from
# the online estimator; with the confidence-head checkpoint too when it exists), at batch sizes
# 1, 4, 16 and 32, temperature 0, in one run. The plan runs twice round robin (tokens/s is the
# median), so a slow spell of this shared machine hits every provider.
#
#   bash scripts/adaptive_bench.sh [OUT]      # about 30 minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-benchmarks/results/adaptive-smollm2}"
HEAD=assets/drafts/smollm2-dspark
CONF=assets/drafts/smollm2-dspark-conf
methods=(--method no-spec --method "dspark-ce=$HEAD" --method "dspark-ce-adaptive=$HEAD+adaptive")
if [ -f "$CONF/config.json" ]; then
  methods+=(--method "dspark-ce-conf-adaptive=$CONF+adaptive")
fi
VLLM_CPU_NUM_OF_RESERVED_CPU="${VLLM_CPU_NUM_OF_RESERVED_CPU:-0}" .venv/bin/vllm-specx bench \
  --target smollm2 --prompts humaneval --max-tokens 128 --batch-sizes 1,4,16,32 --temperatures 0 \
  -k 7 --sweep '' --prompts-per-slot 2 --repeats 2 "${methods[@]}" --out "$OUT"
