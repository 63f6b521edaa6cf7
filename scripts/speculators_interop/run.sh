#!/usr/bin/env bash
# Regenerate tests/fixtures/speculators/<variant>/ from scratch: DSpark checkpoints
# written by speculators 0.9.0's own trainer (CPU) plus reference outputs computed by
# speculators' own DSparkDraftModel forward (<variant>.reference.safetensors, beside
# each checkpoint directory). Read by tests/test_speculators_interop.py and
# tests/e2e/test_speculators_vllm.py.
#
#   python3 -m venv .cache/speculators-venv && .cache/speculators-venv/bin/pip install \
#       "speculators==0.9.0" "torch==2.13.0" "transformers<=5.19.0" && \
#       .cache/speculators-venv/bin/pip uninstall -y torchvision torchaudio    # once, ~1.5 min
#   bash scripts/speculators_interop/run.sh            # ~10-15 min on 2 CPU cores
#   VARIANTS=reduced-vocab bash scripts/speculators_interop/run.sh   # data + one variant, ~4 min
#
# Environment (all optional):
#   SPEC_VENV       venv with speculators==0.9.0 (default .cache/speculators-venv)
#   SPEC_WORK       scratch dir, wiped and rebuilt (default .cache/speculators-work)
#   SPEC_THREADS    torch/OMP threads per process (default 1: on a shared 2-core box
#                   2 threads thrash, 0.35 s/step with 1 vs 5-7 s/step with 2)
#   DEFAULT_EPOCHS  epochs for the `default` variant (default 8)
#   PARALLEL        1 (default): train `default` in the background while the
#                   1-epoch variants train in the foreground; 0: all sequential
#   VARIANTS        space-separated variants to (re)build (default: all of ALL_VARIANTS);
#                   the data steps always run, other variants' fixtures are left as they are
#
# Steps:
#   1. make_data.py gen: first 300 prompts of assets/prompts/train.jsonl with >= 64
#      tokens, cut to 64 tokens, + 136 greedy target tokens (loss_mask 1 on those).
#   2. speculators prepare-data (offline: rows already carry input_ids/loss_mask).
#   3. make_data.py hs: target hidden states, aux ids 2 5 7 (+ pre-norm last layer).
#   4. train_cpu.py (speculators' trainer, CPU patches) for each variant. `reduced-vocab`
#      passes --draft-vocab-size 256: speculators' trainer builds d2t/t2d itself from
#      <data>/token_freq.pt (written by prepare-data --no-skip-token-freq: counts of the
#      loss-mask-1 tokens; top 256 by count, ties to the lower id) and saves lm_head.weight
#      [256, H] (the target's rows), d2t [256] int64 and t2d [4096] bool with the draft.
#      256, not more: the generations hold only 440 distinct tokens (99.1% of them in the
#      top 256); above 440 speculators fills the vocabulary with the lowest unused ids, and
#      at 1024 every token the draft ever drafts has draft id == target id (d2t 0 up to
#      draft id 855), so a reader that skipped d2t would pass. At 256 every d2t is nonzero.
#   5. collect_fixture.py copy -> dump_reference.py -> collect_fixture.py provenance.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$REPO/scripts/speculators_interop"
SPEC_VENV="${SPEC_VENV:-$REPO/.cache/speculators-venv}"
SPEC_WORK="${SPEC_WORK:-$REPO/.cache/speculators-work}"
SPEC_THREADS="${SPEC_THREADS:-1}"
DEFAULT_EPOCHS="${DEFAULT_EPOCHS:-8}"
PARALLEL="${PARALLEL:-1}"
PY="$SPEC_VENV/bin/python"
FIX="$REPO/tests/fixtures/speculators"
ALL_VARIANTS="default gated-noncausal rnn rnn-fillin full-noconf reduced-vocab"
VARIANTS="${VARIANTS:-$ALL_VARIANTS}"
for v in $VARIANTS; do
    case " $ALL_VARIANTS " in *" $v "*) ;; *) echo "unknown variant $v (known: $ALL_VARIANTS)"; exit 2;; esac
done
want() { case " $VARIANTS " in *" $1 "*) return 0;; *) return 1;; esac; }

export OMP_NUM_THREADS="$SPEC_THREADS" MKL_NUM_THREADS="$SPEC_THREADS"
export HF_DATASETS_CACHE="$SPEC_WORK/hf_datasets_cache"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false

"$PY" -c 'import importlib.metadata as m; v=m.version("speculators"); assert v=="0.9.0", v'

T0=$SECONDS
rm -rf "$SPEC_WORK"
mkdir -p "$SPEC_WORK/assets" "$SPEC_WORK/logs"
# Train from a scratch cwd in which the repo-relative verifier path resolves, so
# config.json records "assets/ref-target" (resolvable from the repo root).
ln -s "$REPO/assets/ref-target" "$SPEC_WORK/assets/ref-target"
cd "$SPEC_WORK"

echo "== data"
"$PY" "$HERE/make_data.py" gen --target assets/ref-target \
    --prompts "$REPO/assets/prompts/train.jsonl" --out samples.jsonl \
    --num-samples 300 --prompt-tokens 64 --gen-tokens 136 > logs/gen.log 2>&1
"$PY" -m speculators prepare-data --model assets/ref-target --data samples.jsonl \
    --output data --seq-length 256 --num-preprocessing-workers 1 \
    --no-skip-token-freq > logs/prepare.log 2>&1
"$PY" "$HERE/make_data.py" hs --target assets/ref-target --data data \
    --aux-ids 2 5 7 > logs/hs.log 2>&1
DATA_RECIPE="300 on-policy samples: first 300 prompts of assets/prompts/train.jsonl \
with >= 64 tokens, each cut to its first 64 tokens, + 136 greedy tokens from \
assets/ref-target (transformers generate, fp32, min_new_tokens=max_new_tokens=136); \
loss_mask 0 on the prompt, 1 on the generation; 'speculators prepare-data \
--seq-length 256 --no-skip-token-freq' (shuffles, seed 0); hidden states from \
transformers: output_hidden_states[2,5,7] + pre-final-norm last-layer output (hook), \
fp32; train/val split 0.9 (270/30 rows)."
echo "   data done ($((SECONDS - T0)) s)"

COMMON=(--speculator-type dspark --verifier-name-or-path assets/ref-target
    --data-path data --target-layer-ids 2 5 7 --mask-token-id 2
    --total-seq-len 512 --num-workers 0 --on-missing raise
    --draft-attn-impl sdpa --loss-implementation eager
    --hidden-states-dtype float32 --max-anchors 64 --log-freq 30 --seed 0)

declare -A EPOCHS DESC WALL
train() {  # train <variant> <epochs> <description> <flags...> (skipped unless in VARIANTS)
    local v="$1" ep="$2" desc="$3"; shift 3
    EPOCHS[$v]="$ep"; DESC[$v]="$desc"
    want "$v" || return 0
    local t=$SECONDS
    "$PY" "$HERE/train_cpu.py" "${COMMON[@]}" "$@" --epochs "$ep" \
        --checkpoint-freq "$ep" --save-path "ckpt/$v" > "logs/train_$v.log" 2>&1 \
        || { echo "training $v failed, see $SPEC_WORK/logs/train_$v.log"; return 1; }
    echo "$((SECONDS - t))" > "logs/wall_$v"
    echo "   trained $v in $((SECONDS - t)) s"
}

echo "== train"
V_DEFAULT=(default "$DEFAULT_EPOCHS" \
    "speculators dspark defaults (sliding-window, causal in block, vanilla Markov, confidence head, sample_from_anchor), 2 layers, markov rank 64" \
    --num-layers 2 --markov-rank 64)
BG=
if [ "$PARALLEL" = 1 ] && want default; then
    train "${V_DEFAULT[@]}" & BG=$!
else
    train "${V_DEFAULT[@]}"
fi
train gated-noncausal 1 "gated Markov head, non-causal sliding-window block attention, 1 layer" \
    --num-layers 1 --markov-rank 32 --markov-head-type gated --sliding-window-non-causal
train rnn 1 "rnn Markov head, causal in block, 1 layer" \
    --num-layers 1 --markov-rank 32 --markov-head-type rnn
train rnn-fillin 1 "rnn Markov head, sample_from_anchor=False (bonus anchor), block 4, 1 layer" \
    --num-layers 1 --markov-rank 32 --markov-head-type rnn --no-sample-from-anchor --block-size 4
train full-noconf 1 "full-attention layer, no confidence head, vanilla Markov, 1 layer" \
    --num-layers 1 --markov-rank 32 --full-attention-indices 0 --no-enable-confidence-head
train reduced-vocab 1 "reduced draft vocabulary: 256 of the target's 4096 tokens (--draft-vocab-size 256; speculators builds d2t/t2d from prepare-data's token_freq.pt), speculators dspark defaults (sliding-window, causal in block, vanilla Markov, confidence head, sample_from_anchor), 1 layer" \
    --num-layers 1 --markov-rank 32 --draft-vocab-size 256
if [ -n "$BG" ]; then
    wait "$BG"
fi
DESC[default]="${V_DEFAULT[2]}"
EPOCHS[default]="$DEFAULT_EPOCHS"

echo "== fixtures"
REGEN="bash scripts/speculators_interop/run.sh"
[ "$VARIANTS" = "$ALL_VARIANTS" ] || REGEN="VARIANTS='$VARIANTS' $REGEN"
for v in $VARIANTS; do
    "$PY" "$HERE/collect_fixture.py" copy --ckpt "ckpt/$v" --epochs "${EPOCHS[$v]}" \
        --fixture "$FIX/$v"
    # From the repo root, so the recorded verifier path assets/ref-target resolves.
    (cd "$REPO" && "$PY" "$HERE/dump_reference.py" --fixture "$FIX/$v" \
        --data "$SPEC_WORK/data" --cross-check-eager) > "logs/dump_$v.log" 2>&1 \
        || { echo "dump_reference $v failed, see $SPEC_WORK/logs/dump_$v.log"; exit 1; }
    tail -n 1 "logs/dump_$v.log"
    "$PY" "$HERE/collect_fixture.py" provenance --ckpt "ckpt/$v" \
        --epochs "${EPOCHS[$v]}" --fixture "$FIX/$v" --variant "$v" \
        --description "${DESC[$v]}" --train-wall-s "$(cat "logs/wall_$v")" \
        --data-recipe "$DATA_RECIPE" --regenerate "$REGEN"
done
du -ab "$FIX" | sort -k2
echo "== done in $((SECONDS - T0)) s; fixtures in $FIX"
