#!/usr/bin/env bash
# Engine-free tests of vllm-specx against vLLM 0.33 (its CUDA wheel imports on a CPU machine).
#
#   bash scripts/check_vllm033.sh            # build .cache/venv-vllm033 if needed, run the tests
#   bash scripts/check_vllm033.sh -k options # extra arguments go to pytest
#
# Idempotent: the venv (vllm==0.33.0 with its CUDA torch, pytest, vllm-specx editable without
# deps) is built once and reused; the build prints its time and size (measured: about 3 min and
# 9.4 GB, a 336 MB vllm wheel). VLLM033_VENV overrides the venv path, VLLM033_VERSION the vLLM
# version. Not part of .ci/run (the download is several GB). No engine is started: there is no
# GPU, and VLLM_TARGET_DEVICE=cpu gives the CUDA wheel the CPU platform so that engine configs
# can be built (vLLM's platform detection finds none otherwise: "Device string must not be empty").
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM033_VENV:-.cache/venv-vllm033}"    # /.cache/ is gitignored
VER="${VLLM033_VERSION:-0.33.0}"
PY="${PYTHON:-python3}"
ready() {
  "$VENV/bin/python" - "$VER" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
assert md.version("vllm") == sys.argv[1]
import pytest, transformers.models.auto, vllm_specx  # noqa: F401
assert vllm_specx.__file__.startswith(__import__("os").getcwd())
PY
}
if ! ready; then
  start=$(date +%s)
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "vllm==$VER" "pytest>=8"
  "$VENV/bin/pip" install -q --no-deps -e .
  # As in scripts/bootstrap.sh: PyPI's torchvision/torchaudio/torchcodec can break
  # `import transformers`; nothing here uses them.
  if ! "$VENV/bin/python" -c "import transformers.models.auto" 2>/dev/null; then
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  ready || { echo "check_vllm033: $VENV is not usable after the install" >&2; exit 1; }
  echo "check_vllm033: venv built in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
fi
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" \
  2>/dev/null
export VLLM_TARGET_DEVICE=cpu
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  tests/test_plugin.py tests/test_routing.py tests/test_bad_input.py tests/test_registry.py \
  tests/test_layout.py tests/test_options.py tests/test_vllm033.py tests/test_dspark_heads.py \
  tests/test_speculators_interop.py tests/test_malformed_drafts.py tests/test_dspark_recipe.py \
  tests/test_adaptive.py tests/training/test_vllm_taps.py "$@"
