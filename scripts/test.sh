#!/usr/bin/env bash
# Install (if needed) and run the test suite on CPU, by tier (markers in pyproject.toml):
#
#   quick  no engine: unit, kernel (Triton interpreter), training and config-level tests, the linter
#   e2e    tests marked `e2e`: a real vLLM engine per guarantee (routing, each method's parity with
#          its reference, losslessness, seeds, refused bad drafts, the CPU repairs, load, TP=2)
#   full   tests marked `full` (also `e2e`): the bench grid, training of every method, the other
#          lossless configs and variants, upstream-bug canaries, the network target
#   e2e034 tests/e2e034 in vLLM 0.34's CPU engine (the V2 model runner; scripts/venv034.sh makes its
#          venv): our drafts in LLM and `vllm serve`, refusals, the serving count, losslessness,
#          64-stream load, prefix caching / chunked prefill, dynamic K, vLLM's own custom-speculator
#          tests; vLLM's Triton kernels in the interpreter (vllm_specx.testing.triton_harness)
#   e2e034-ci  the part of e2e034 that .ci/run runs (marker e2e034_ci)
#
#   bash scripts/test.sh                # quick + e2e: `-m "not full"` (CI: .ci/run)
#   bash scripts/test.sh --tier quick   # quick only: `-m "not e2e and not full"`
#   bash scripts/test.sh --tier e2e     # e2e only: `-m "e2e and not full"`
#   bash scripts/test.sh --tier full    # everything on 0.32: quick, e2e and full
#   bash scripts/test.sh --tier e2e034  # the vLLM 0.34 tier (its own venv; 49 min on 2 shared cores)
#
# SPECX_TEST_TIER=<tier> does what --tier does. Extra arguments go to pytest (e.g. -k lossless, or a
# test file); a later `-m` replaces the tier's. Every run ends with the 25 slowest tests
# (--durations=25). Selecting no test fails (pytest's exit code 5), as any other failure does.
set -euo pipefail
cd "$(dirname "$0")/.."
tier="${SPECX_TEST_TIER:-ci}"
if [ "${1:-}" = "--tier" ]; then
  tier="${2:?--tier needs one of quick, e2e, ci, full, e2e034, e2e034-ci}"
  shift 2
elif [[ "${1:-}" == --tier=* ]]; then
  tier="${1#--tier=}"
  shift
fi
case "$tier" in
  e2e034 | e2e034-ci)
    venv="$(bash scripts/venv034.sh)"
    [ "$tier" = e2e034 ] && select=(-m e2e034) || select=(-m e2e034_ci)
    echo "scripts/test.sh: tier $tier on a CPU with $("$venv/bin/python" -c 'import torch.cpu as c; print(
      "AMX" if c._is_amx_tile_supported() else "AVX-512 BF16" if c._is_avx512_bf16_supported()
      else "AVX-512" if c._is_avx512_supported() else "AVX2 (no AVX-512)")')"
    rc=0
    "$venv/bin/python" -m pytest "${select[@]}" -q -p no:cacheprovider --strict-markers --durations=25 \
      tests/e2e034 "$@" || rc=$?
    [ "$rc" -eq 5 ] && echo "scripts/test.sh: no test selected (tier $tier, arguments: $*)" >&2
    exit "$rc" ;;
  quick) select=(-m "not e2e and not full") ;;
  e2e) select=(-m "e2e and not full") ;;
  ci | default) select=(-m "not full") ;;
  full) select=() ;;
  *) echo "scripts/test.sh: unknown tier '$tier' (quick, e2e, ci, full, e2e034, e2e034-ci)" >&2; exit 2 ;;
esac
bash scripts/bootstrap.sh
rc=0
.venv/bin/python -m pytest "${select[@]}" -q -p no:cacheprovider --strict-markers --durations=25 "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "scripts/test.sh: no test selected (tier $tier, arguments: $*)" >&2
fi
exit "$rc"
