#!/usr/bin/env bash
# The DSpark full-recipe ablation (issue: final-layer tap, per-layer tap fusion, per-slot learned
# queries, recurrent head): the baseline, each change alone, and the full recipe, trained on the
# same on-policy data with the same budget, then served in vLLM side by side.
#
#   bash scripts/dspark_ablation.sh [ref|smollm2]          # serve + measure runs/<t>-recipe-* drafts
#   bash scripts/dspark_ablation.sh [ref|smollm2] train    # first make the data and train all six
#
# ref (the 7M reference target, measured): data = the train prompts (taps 1,4,6 + the last
# layer 7), 1200 steps x 8 sequences x 24 blocks each (the committed head's budget), KL loss, block 8, 2 layers, Markov rank 64;
# measured on 32 held-out code prompts and 32 HumanEval raw prompts, 128 tokens, K 8 (a full
# block), batch 16, T 0 and T 1 (drafts sampled from q); ~30 min train + ~15 min bench on 2 cores.
# smollm2: data = 640 chat-train answers (taps 1,14,26 + 29), the committed SmolLM2 head's settings at 400 steps, CE;
# 32 HumanEval chats; ~1.5 h train + ~20 min bench on 2 cores.
# Variants (`vllm-specx train --method dspark`, every switch spelled out; each flag a switch):
#   baseline      --no-final-layer-tap --no-per-layer-fusion --no-slot-queries --markov-head-type vanilla
#   final-tap     baseline + --final-layer-tap   (the target's final residual as one more tap)
#   fusion        baseline + --per-layer-fusion  (per-layer softmax mixtures of the tap contexts)
#   slot-queries  baseline + --slot-queries      (a learned starting query per slot)
#   recurrent     baseline + --markov-head-type rnn (recurrent state across the block)
#   full          all four ($RECIPE)
# Writes benchmarks/results/e2e-<t>-dspark-ablation{,-humaneval}/ (results.json/.md, PNGs), copies
# each run's training record to its records/ folder, and the table + figure (ablation.md/.png).
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_CPU_NUM_OF_RESERVED_CPU=0
SPECX=.venv/bin/vllm-specx
T=${1:-ref}
R=runs
case "$T" in
  ref)
    DATA="gen-data --target assets/ref-target --prompts train --out $R/ref-data-recipe --max-tokens 192 --taps 1,4,6,7 --topk 32"
    C="--method dspark --target assets/ref-target --data $R/ref-data-recipe --steps 1200 --batch 8 --loss kl --lr 0.002 --val-samples 32 --val-every 100 --save-every 400 --seed 0 --threads 1 --seq-len 256 --anchors 24 --block-size 8 --layers 2 --markov-rank 64 --mask-token-id 2 --next-token-stream none"
    BENCH=(--target ref --limit 32 --max-tokens 128 -k 8)
    SETS=("code:e2e-ref-dspark-ablation" "humaneval-raw:e2e-ref-dspark-ablation-humaneval")
    EAGLE=assets/drafts/ref-eagle3 ;;
  smollm2)
    DATA="gen-data --target smollm2 --prompts chat-train --spread 640 --max-tokens 256 --stop-at-eos --taps 1,14,26,29 --topk 32 --out $R/smollm2-data-recipe"
    C="--method dspark --target smollm2 --data $R/smollm2-data-recipe --steps 400 --batch 8 --loss ce --lr 0.002 --val-samples 32 --val-every 100 --save-every 200 --seed 0 --threads 1 --seq-len 256 --anchors 24 --block-size 8 --layers 2 --markov-rank 32 --mask-token-id 0 --dtype bfloat16 --next-token-stream none"
    BENCH=(--target smollm2 --limit 32 --max-tokens 128 -k 8)
    SETS=("humaneval:e2e-smollm2-dspark-ablation")
    EAGLE=assets/drafts/smollm2-eagle3 ;;
  *) echo "usage: $0 [ref|smollm2] [train]" >&2; exit 2 ;;
esac
BASE="--no-final-layer-tap --no-per-layer-fusion --no-slot-queries --markov-head-type vanilla"
RECIPE="--final-layer-tap --per-layer-fusion --slot-queries --markov-head-type rnn"
VARIANTS=(baseline final-tap fusion slot-queries recurrent full)  # baseline first, full recipe last
if [[ "${2:-}" == "train" ]]; then
  $SPECX $DATA
  $SPECX train $C $BASE --out $R/$T-recipe-baseline &
  $SPECX train $C $RECIPE --out $R/$T-recipe-full &
  wait
  $SPECX train $C $BASE --final-layer-tap --out $R/$T-recipe-final-tap &
  $SPECX train $C $BASE --per-layer-fusion --out $R/$T-recipe-fusion &
  wait
  $SPECX train $C $BASE --slot-queries --out $R/$T-recipe-slot-queries &
  $SPECX train $C $BASE --markov-head-type rnn --out $R/$T-recipe-recurrent &
  wait
fi
P=()
for v in "${VARIANTS[@]}"; do
  P+=(--method "$v=$R/$T-recipe-$v@probabilistic")
done
for s in "${SETS[@]}"; do
  out=benchmarks/results/${s#*:}
  $SPECX bench "${BENCH[@]}" --prompts "${s%%:*}" --batch-sizes 16 --temperatures 0,1 --sweep "" \
    --method no-spec --method "eagle3-prob=$EAGLE@probabilistic" "${P[@]}" \
    --title "DSpark recipe ablation, $T x ${s%%:*} (K 8)" --out "$out"
  mkdir -p "$out/records"
  for v in "${VARIANTS[@]}"; do
    cp "$R/$T-recipe-$v/training.json" "$out/records/$v.training.json"
  done
done
DIRS=()
for s in "${SETS[@]}"; do DIRS+=("benchmarks/results/${s#*:}"); done
.venv/bin/python benchmarks/ablation_report.py --variants "$(IFS=,; echo "${VARIANTS[*]}")" \
  --title "DSpark recipe ablation, $T (K 8, batch 16)" "${DIRS[@]}"
