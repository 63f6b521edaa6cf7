#!/usr/bin/env bash
# The SmolLM2 compute curve past 35,200 draws on this CPU (issue 56), as one resumable background job:
# the target, the chat-mix and evaluation taps rebuilt from the committed token files, then one
# `bench_compute_curve.py` run at a time (both threads), each adding its point to the report.
#
#   nohup nice -n 19 bash scripts/compute_curve_cpu.sh > ~/.cache/vllm-specx/compute-curve-cpu.log 2>&1 &
#   bash scripts/compute_curve_cpu.sh --status     # where it is: data, finished runs, the running step
#
# STAGES (default "2200:dspark-stream-r96,eagle3,mtp-glm52,dspark-stream-r96-l4 4400:eagle3,dspark-stream-r96";
# dspark-stream-r96-l4: the DSpark at equal serving cost to EAGLE-3; at 4400 the better DSpark of 2200) is a list of
# STEPS:PROVIDERS; steps x batch 32 = sample-draws (2200: 70,400; 4400: 140,800). Every step resumes:
# gen-data skips written shards, a finished run is read (its training.json), an interrupted one
# continues from its last trainer_state.pt (saved every 100 steps). So after a stop (a session's end,
# a reboot) the same command continues; nothing is trained twice. Time here (2 idle cores): the taps
# about 80 min (4.6 GB), a 70,400-draw run about 1.8 h (EAGLE-3 and MTP less), 140,800 about 3.5 h.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
cache="${VLLM_SPECX_CACHE:-$HOME/.cache/vllm-specx}"
D="$cache/data"
RUNS="$cache/runs/compute-curve-cpu"
OUT="${OUT:-benchmarks/results/compute-curve-smollm2}"
STAGES="${STAGES:-2200:dspark-stream-r96,eagle3,mtp-glm52,dspark-stream-r96-l4 4400:eagle3,dspark-stream-r96}"
say() { echo "[$(date '+%F %T')] compute_curve_cpu: $*"; }
if [ "${1:-}" = "--status" ]; then
  for d in smollm2-chat-mix eval-smollm2-humaneval eval-smollm2-chat-code eval-smollm2-chat-prose; do
    echo "$d: $(ls "$D/$d" 2>/dev/null | grep -c . || true) files"
  done
  for s in $STAGES; do
    IFS=, read -ra ps <<< "${s#*:}"
    for p in "${ps[@]}"; do
      r="$RUNS/$p-${s%%:*}x32"
      if [ -f "$r/training.json" ]; then echo "$p at ${s%%:*} steps: done"
      elif [ -f "$RUNS/$p-${s%%:*}x32.log" ]; then echo "$p at ${s%%:*} steps: $(tr '\r' '\n' < "$RUNS/$p-${s%%:*}x32.log" | grep -o '[0-9]*/[0-9]* \[[^]]*\]' | tail -1)"
      else echo "$p at ${s%%:*} steps: not started"; fi
    done
  done
  exit 0
fi
taps=(--taps 1,14,26,29 --topk 32 --dtype bfloat16 --taps-via transformers)
t0=$(date +%s)
"$py" -m vllm_specx.cli target smollm2 >/dev/null
say "target ready"
chat_mix=assets/data/smollm2-chat-mix.tokens.npz evals=assets/data
source scripts/_curve_data.sh   # sets evals_flags
say "data ready after $(( $(date +%s) - t0 )) s"
for s in $STAGES; do
  IFS=, read -ra ps <<< "${s#*:}"
  for p in "${ps[@]}"; do
    say "${s%%:*} steps x 32: $p (log: $RUNS/$p-${s%%:*}x32.log)"
    "$py" benchmarks/bench_compute_curve.py --target smollm2 --data "$D/smollm2-chat-mix" "${evals_flags[@]}" \
        --batch 32 --draft-vocab 14677 --jobs 1 --threads 2 --runs "$RUNS" --out "$OUT" \
        --budgets "${s%%:*}" --providers "$p"
  done
done
say "all stages done after $(( $(date +%s) - t0 )) s"
