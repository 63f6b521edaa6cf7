#!/usr/bin/env bash
# vLLM 0.34's own speculative-decoding tests, from its sdist, run in the e2e034 venv with vllm-specx
# installed (its plugin loaded and its methods registered: vllm_specx.testing.upstream_plugin).
#
#   bash scripts/vllm034_upstream_tests.sh            # custom-speculator tests + the CPU spec-decode test
#   bash scripts/vllm034_upstream_tests.sh custom     # tests/v1/spec_decode/test_custom_speculator.py only
#   SPECX_UPSTREAM_NO_PLUGIN=1 bash scripts/vllm034_upstream_tests.sh cpu   # the control: without vllm-specx
#
# The sdist (51 MB, the package index) is unpacked once into .cache/vllm-0.34.0-tests (its tests/
# and pyproject.toml); `pip download` cannot build the sdist's metadata here, so it is kept from the
# failed metadata step (--no-clean). vLLM's tests need tblib and torchvision beyond the venv's set.
# tests/v1/e2e/test_cpu_spec_decode.py names `Qwen/Qwen3-0.6B` (a hub model): the n-gram test runs on
# the local SmolLM2 target instead (--specx-local-model), in float32 and eager (--specx-engine-arg:
# the interpreter's bf16 gives NaN; torch.compile takes over 25 min on 2 cores); its smoke test
# (acceptance floor 1.5) runs our SmolLM2 EAGLE-3, DSpark and MTP drafts in place of its hub pairs
# (--specx-smoke-draft; without the plugin, EAGLE-3 alone).
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
VENV="$(bash scripts/venv034.sh)"
SRC=.cache/vllm-0.34.0-tests
if [ ! -f "$SRC/tests/v1/e2e/test_cpu_spec_decode.py" ]; then
  tmp="$(mktemp -d)"
  echo "vllm034_upstream_tests: unpacking vLLM 0.34.0's sdist tests into $SRC" >&2
  TMPDIR="$tmp" VLLM_TARGET_DEVICE=empty "$VENV/bin/pip" download -q --no-clean --no-deps --no-binary vllm \
    --no-build-isolation -d "$tmp/dl" vllm==0.34.0 >/dev/null 2>&1 || true
  found="$(find "$tmp" -maxdepth 7 -path '*/tests/v1/e2e/test_cpu_spec_decode.py' | head -1)"
  [ -n "$found" ] || { echo "vllm034_upstream_tests: could not unpack vllm==0.34.0's sdist from the index" >&2; exit 1; }
  root="${found%/tests/v1/e2e/test_cpu_spec_decode.py}"
  mkdir -p "$SRC" && cp -r "$root/tests" "$root/pyproject.toml" "$SRC/"
  rm -rf "$tmp"
fi
"$VENV/bin/python" -c "import tblib, torchvision" 2>/dev/null || "$VENV/bin/pip" install -q tblib "torchvision==0.29.1"
plugin=(-p vllm_specx.testing.upstream_plugin)   # loads vllm-specx's plugin (checked), local model
if [ "${SPECX_UPSTREAM_NO_PLUGIN:-0}" = 1 ]; then export VLLM_PLUGINS=none; fi   # the control: no plugin
target="$("$VENV/bin/python" -m vllm_specx.cli target smollm2)"
d="$PWD/assets/drafts"   # vLLM's smoke configs -> our SmolLM2 drafts (method:folder:K, K as vLLM's config)
smoke=(--specx-smoke-draft "eagle3=eagle3:$d/smollm2-eagle3:3" --specx-smoke-draft "dflash=dspark:$d/smollm2-dspark:4"
       --specx-smoke-draft "mtp=mtp:$d/smollm2-mtp:3")
if [ "${SPECX_UPSTREAM_NO_PLUGIN:-0}" = 1 ]; then smoke=("${smoke[@]:0:2}"); fi   # the control: vLLM's EAGLE-3 alone
export SPECX_TRITON_INTERPRETER=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1
cd "$SRC"
rc=0
if [ "$what" = all ] || [ "$what" = custom ]; then
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider "${plugin[@]}" tests/v1/spec_decode/test_custom_speculator.py || rc=$?
fi
if [ "$what" = all ] || [ "$what" = cpu ]; then
  # --capture=sys: the plugin's `specx:` lines (sys.__stderr__) reach the terminal, not pytest's fd capture
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider --capture=sys "${plugin[@]}" tests/v1/e2e/test_cpu_spec_decode.py \
    -k "ngram or speculator_smoke" --specx-local-model "$target" "${smoke[@]}" \
    --specx-engine-arg 'dtype="float32"' \
    --specx-engine-arg enforce_eager=true || rc=$?
fi
exit "$rc"
