# Sourced by scripts/compute_curve_{cpu,gpu}.sh: the compute curve's data, taps and top-k for the
# committed chat-mix answers and for the evaluation answers, rebuilt from token files (each gen-data
# run resumes shard by shard). Needs: $py, $D (the data folder), the array `taps` (gen-data flags),
# $chat_mix and $evals (the token files' folder). Sets the array `evals_flags` (--eval-data DIR ...).
"$py" -m vllm_specx.cli gen-data --from-tokens "$chat_mix" "${taps[@]}" --out "$D/smollm2-chat-mix"
evals_flags=()
for name in humaneval chat-code chat-prose; do
  "$py" -m vllm_specx.cli gen-data --from-tokens "$evals/eval-smollm2-$name.tokens.npz" "${taps[@]}" \
      --out "$D/eval-smollm2-$name"
  evals_flags+=(--eval-data "$D/eval-smollm2-$name")
done
