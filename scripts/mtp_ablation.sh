#!/usr/bin/env bash
# The MTP ablation on the reference target, in vLLM (K 7, 32 held-out code prompts, batch 16,
# T 0 and 1), with the built-in EAGLE-3 baseline and our DSpark head in the same run:
#
#   bash scripts/mtp_ablation.sh          # serve + measure the drafts in runs/ref-mtp-* (~10 min)
#   bash scripts/mtp_ablation.sh train    # first make the data and train every variant (~50 min)
#
# Variants (one trainer, `vllm-specx train --method mtp`; the same data and budget as EAGLE-3):
#   1step      CE on step 0 only (pre-training-style MTP), served for 7 steps with mixed KV
#   glm51      per-step CE, exp(-k/4) decay (FastMTP), 7 steps unrolled, mixed KV; greedy drafts
#   glm51-prob the same layer, probabilistic drafts
#   tv-prob    + end-to-end chain TV (+0.1 CE), mixed KV, probabilistic drafts
#   glm52      + KVShare in training and serving: chain TV, KVShare, probabilistic drafts
#   k3         Kimi K3: the 1step layer + fusion of target layers 1,4,7 (initialised to the last),
#              7 recurrent steps, -log sum min(p, q), mixed KV (1200 more steps from 1step)
#   controls:  glm52 served with mixed KV (train/serve mismatch), CE trained with KVShare
# Writes benchmarks/results/e2e-ref-mtp-ablation/{results.json,results.md,*.png}.
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_CPU_NUM_OF_RESERVED_CPU=0
PY=.venv/bin/python
SPECX=.venv/bin/vllm-specx
R=runs
if [[ "${1:-}" == "train" ]]; then
  $SPECX gen-data --target assets/ref-target --prompts train --out $R/ref-data-mtp --max-tokens 192 --taps 1,4,7 --topk 32
  C="--method mtp --target assets/ref-target --data $R/ref-data-mtp --steps 1200 --batch 8 --lr 0.002 --val-samples 32 --val-every 100 --save-every 400 --seed 0 --threads 1 --seq-len 256 --anchors 24"
  $SPECX train $C --out $R/ref-mtp-glm51 --loss ce --gamma 4 --kv-share off &
  $SPECX train $C --out $R/ref-mtp-glm52 --loss chain-tv --ce-weight 0.1 --kv-share on &
  wait
  $SPECX train $C --out $R/ref-mtp-1step --loss ce --drafts 1 --kv-share off &
  $SPECX train $C --out $R/ref-mtp-ce-kvshare --loss ce --gamma 4 --kv-share on &
  wait
  $SPECX train $C --out $R/ref-mtp-tv-mixed --loss chain-tv --ce-weight 0.1 --kv-share off &
  # Kimi K3: the single-step ("pre-trained") layer turned into an EAGLE-3-style draft
  $SPECX train $C --out $R/ref-mtp-k3 --loss nla --kv-share off --fusion-layers 1,4,7 --init-from $R/ref-mtp-1step --lr 0.001 &
  wait
fi
# The same glm52 tensors served with KVShare off (the option is the checkpoint's kv_share).
$PY -c "from vllm_specx.methods.mtp.checkpoint import with_options as w; w('$R/ref-mtp-glm52', '$R/ref-mtp-glm52-mixed-serve', kv_share=False)"
$SPECX bench --target ref --prompts code --limit 32 --max-tokens 128 --batch-sizes 16 --temperatures 0,1 -k 7 --sweep "" \
  --method no-spec --method eagle3=assets/drafts/ref-eagle3 --method eagle3-prob=assets/drafts/ref-eagle3@probabilistic --method dspark-kl=assets/drafts/ref-dspark@probabilistic \
  --method mtp-1step=$R/ref-mtp-1step --method glm51=$R/ref-mtp-glm51 --method glm51-prob=$R/ref-mtp-glm51@probabilistic \
  --method tv-prob=$R/ref-mtp-tv-mixed@probabilistic --method glm52=$R/ref-mtp-glm52@probabilistic \
  --method glm52-mixed-serve=$R/ref-mtp-glm52-mixed-serve@probabilistic \
  --method ce-kvshare-prob=$R/ref-mtp-ce-kvshare@probabilistic \
  --method k3=$R/ref-mtp-k3 --method k3-prob=$R/ref-mtp-k3@probabilistic \
  --title "MTP ablation, reference target x code (K 7)" --out benchmarks/results/e2e-ref-mtp-ablation
