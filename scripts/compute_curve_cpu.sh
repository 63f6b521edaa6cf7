#!/usr/bin/env bash
# The SmolLM2 compute curve past 35,200 draws on this CPU (issue 56), as one resumable background job:
# the target, the chat-mix and evaluation taps rebuilt from the committed token files, then one
# `bench_compute_curve.py` run at a time (both threads), each adding its point to the report.
#
#   nohup nice -n 19 bash scripts/compute_curve_cpu.sh > ~/.cache/vllm-specx/compute-curve-cpu.log 2>&1 &
#   bash scripts/compute_curve_cpu.sh --status     # where it is: data, finished runs, the running step
#
# STAGES (default "2200:dspark-stream-r96,eagle3,mtp-glm52,dspark-stream-r96-l4 4400@x2:eagle3,dspark-stream-r96";
# dspark-stream-r96-l4: the DSpark at equal serving cost to EAGLE-3; at 4400 the better DSpark of 2200) is a list of
# STEPS[@x2]:PROVIDERS; steps x batch 32 = sample-draws (2200: 70,400; 4400: 140,800). "@x2": on twice the
# answers, the chat-mix's and SmolLM2's answers to the rest of chat-mix and to chat-mix2 (`gen-data
# --from-tokens ... --prompts chat-mix+chat-mix2`: the chat-mix answers rebuilt, their taps linked from
# the chat-mix folder, the new prompts answered in vLLM and tapped), made before the first such stage,
# its runs named <provider>-<steps>x32-x2. Every step resumes:
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
STAGES="${STAGES:-2200:dspark-stream-r96,eagle3,mtp-glm52,dspark-stream-r96-l4 4400@x2:eagle3,dspark-stream-r96}"
say() { echo "[$(date '+%F %T')] compute_curve_cpu: $*"; }
if [ "${1:-}" = "--status" ]; then
  for d in smollm2-chat-mix eval-smollm2-humaneval eval-smollm2-chat-code eval-smollm2-chat-prose smollm2-chat-mix-x2; do
    n=$(cat "$D/$d/tokens.jsonl" 2>/dev/null | grep -c . || true)
    echo "$d: ${n:-0} answers, taps in $(ls "$D/$d/taps" 2>/dev/null | grep -c '\.safetensors$' || true) of $(( (${n:-0} + 31) / 32 )) shards"
  done
  for s in $STAGES; do
    IFS=, read -ra ps <<< "${s#*:}"
    steps="${s%%:*}"; tag=""; [ "${steps#*@}" != "$steps" ] && tag="-${steps#*@}"; steps="${steps%%@*}"
    for p in "${ps[@]}"; do
      name="$p-${steps}x32$tag"
      if [ -f "$RUNS/$name/training.json" ]; then echo "$name: done"
      elif [ -f "$RUNS/$name.log" ]; then echo "$name: $(tr '\r' '\n' < "$RUNS/$name.log" | grep -o '[0-9]*/[0-9]* \[[^]]*\]' | tail -1)"
      else echo "$name: not started"; fi
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
twice_the_answers() {  # the @x2 data: the chat-mix answers plus the rest of chat-mix and chat-mix2's
  local d2="$D/smollm2-chat-mix-x2"
  if [ ! -d "$d2/taps" ]; then  # the chat-mix answers' taps are the same tensors: linked, not recomputed
    mkdir -p "$d2" && cp -al "$D/smollm2-chat-mix/taps" "$d2/taps"
  fi
  say "data x2: answering the rest of chat-mix+chat-mix2 in vLLM, then its taps ($d2)"
  "$py" -m vllm_specx.cli gen-data --from-tokens "$chat_mix" --prompts chat-mix+chat-mix2 "${taps[@]}" \
      --out "$d2" --batch 256 --engine-args '{"gpu_memory_utilization": 0.3, "max_num_seqs": 128}'
}
for s in $STAGES; do
  IFS=, read -ra ps <<< "${s#*:}"
  steps="${s%%:*}"; data="$D/smollm2-chat-mix"; tag=()
  if [ "${steps#*@}" != "$steps" ]; then
    [ "${steps#*@}" = x2 ] || { echo "compute_curve_cpu: stage $s: only @x2 is known" >&2; exit 2; }
    twice_the_answers
    data="$D/smollm2-chat-mix-x2"; tag=(--run-tag x2); steps="${steps%%@*}"
  fi
  for p in "${ps[@]}"; do
    say "$steps steps x 32 on $(basename "$data"): $p (log: $RUNS/$p-${steps}x32${tag[1]:+-${tag[1]}}.log)"
    "$py" benchmarks/bench_compute_curve.py --target smollm2 --data "$data" "${evals_flags[@]}" \
        --batch 32 --draft-vocab 14677 --jobs 1 --threads 2 --runs "$RUNS" --out "$OUT" \
        --budgets "$steps" --providers "$p" "${tag[@]}"
  done
done
say "all stages done after $(( $(date +%s) - t0 )) s"
