#!/usr/bin/env bash
# DSpark's confidence head (issue 14, part 1) for the committed SmolLM2 head: adds a
# "hidden+markov" confidence head (p_k = sigmoid(proj([h_k; W1[prev_k]])), the probability that
# draft slot k is accepted given slots < k were) to assets/drafts/smollm2-dspark and trains it
# alone (`--train-only confidence`: every other tensor is saved bit for bit as it was), then
# measures its calibration on held-out samples.
#
#   bash scripts/train_confidence.sh            # ~10 min train + ~3 min calibration on 2 cores
#
# Data: runs/smollm2-data-recipe (the DSpark ablation's: 640 chat-train answers of SmolLM2, taps
# 1,14,26,29, top-32; made here with the same command when it is missing). The head reads taps
# 1,14,26 of it (`--taps`). `--unseen-by` leaves out the 129 samples whose prompts the committed
# head was trained on (it accepts more of those, which would teach the confidence head an
# optimism new prompts do not earn); 64 of the other 511 are held back (the trainer's validation
# split), and the calibration report re-draws exactly that split. The flags after --taps are the
# committed head's own (its training.json), so the warm start copies every tensor of it.
# Writes runs/smollm2-dspark-conf (the run), assets/drafts/smollm2-dspark-conf (its
# config.json, model.safetensors, training.json) and benchmarks/results/confidence-smollm2/.
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_CPU_NUM_OF_RESERVED_CPU=0
SPECX=.venv/bin/vllm-specx
DATA=runs/smollm2-data-recipe
BASE=assets/drafts/smollm2-dspark
RUN=runs/smollm2-dspark-conf
OUT=assets/drafts/smollm2-dspark-conf
if [[ ! -f $DATA/meta.json ]]; then
  $SPECX gen-data --target smollm2 --prompts chat-train --spread 640 --max-tokens 256 --stop-at-eos \
    --taps 1,14,26,29 --topk 32 --out $DATA
fi
$SPECX train --method dspark --target smollm2 --data $DATA --out $RUN \
  --init-from $BASE --unseen-by $BASE --train-only confidence --confidence-head hidden+markov \
  --taps 1,14,26 --no-final-layer-tap --no-per-layer-fusion --no-slot-queries --markov-head-type vanilla --next-token-stream none \
  --block-size 8 --layers 2 --markov-rank 32 --mask-token-id 0 --layout anchor --seq-len 256 --anchors 24 \
  --steps 200 --batch 8 --lr 0.003 --val-samples 64 --val-every 100 --save-every 200 --seed 0 --threads 2 \
  --dtype float32 --save-dtype bfloat16
mkdir -p $OUT
cp $RUN/config.json $RUN/model.safetensors $RUN/training.json $OUT/
.venv/bin/python benchmarks/confidence_calibration.py --draft $OUT --target smollm2 --data $DATA \
  --samples 64 --out benchmarks/results/confidence-smollm2
