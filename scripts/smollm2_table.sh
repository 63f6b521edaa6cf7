#!/usr/bin/env bash
# The SmolLM2-135M-Instruct x HumanEval table (issue 27 item 5, issue 29): no-spec, vLLM's n-gram
# and suffix decoding (skipped, saying so, without arctic-inference), vLLM's EAGLE-3 and our
# DSpark and MTP with the committed SmolLM2 drafts (assets/drafts/smollm2-{eagle3,dspark,mtp}: the
# compute curve's 35,200 sample-draws, benchmarks/bench_compute_curve.py --export), each of ours
# also with `adaptive: true`; batch 1 and 16, T = 0, K = 7; greedy output checked against no-spec.
# Batch b runs 4 x b HumanEval prompts (4 at batch 1, 64 at batch 16), 128 tokens, stop at EOS.
#
#   bash scripts/smollm2_table.sh [OUT]      # about 25 minutes on 2 idle cores
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-benchmarks/results/smollm2-table}"
D=assets/drafts
VLLM_CPU_NUM_OF_RESERVED_CPU="${VLLM_CPU_NUM_OF_RESERVED_CPU:-0}" .venv/bin/vllm-specx bench \
  --target smollm2 --prompts humaneval --max-tokens 128 --batch-sizes 1,16 --temperatures 0 \
  -k 7 --sweep '' --prompts-per-slot 4 \
  --method no-spec --method ngram --method suffix --method "eagle3=$D/smollm2-eagle3" \
  --method "dspark=$D/smollm2-dspark" --method "dspark-adaptive=$D/smollm2-dspark+adaptive" \
  --method "mtp=$D/smollm2-mtp" --method "mtp-adaptive=$D/smollm2-mtp+adaptive" \
  --out "$OUT"
