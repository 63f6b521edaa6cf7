#!/usr/bin/env bash
# Engine-free tests of vllm-specx against vLLM 0.34 (its CUDA wheel imports on a CPU machine).
#
#   bash scripts/check_vllm034.sh            # build .cache/venv-vllm034 if needed, run the tests
#   bash scripts/check_vllm034.sh -k markov  # extra arguments go to pytest
#
# Idempotent: the venv (vllm==0.34.0 with its CUDA torch 2.14, pytest, vllm-specx editable without
# deps) is built once and reused; the build prints its time and size (measured 2026-12-06 on
# 2 busy cores: about 2.5 min and 8.5 GB; 67 tests on 2026-12-07: about 40 s on idle cores
# without the two rejection-sampler tests, about 10 min with them on busy cores, which run vLLM's
# sampling kernels in the Triton interpreter; -k "not rejection_sampler" skips them). VLLM034_VENV overrides the venv path, VLLM034_VERSION
# the vLLM version. Not part of .ci/run (the download is several GB).
#
# `pip install vllm==0.34.0` cannot resolve from the package index here: vLLM 0.34 pins
# flashinfer-python==0.7.3, which the index does not have (it has 0.7.2 and 0.7.4). So vLLM is
# installed without deps, then every requirement vLLM declares for this platform except
# flashinfer-python (a CUDA kernel library; nothing engine-free imports it).
#
# No engine is started: there is no GPU. VLLM_TARGET_DEVICE=cpu gives the CUDA wheel the CPU
# platform; CUDA_VISIBLE_DEVICES= (empty) makes vLLM's Triton probe accept the CUDA wheel's
# Triton with no active driver (vLLM 0.34's CPU platform refuses an x86 machine without Triton
# when it builds an engine config: "vLLM on x86 CPUs requires Triton (triton-cpu)").
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM034_VENV:-.cache/venv-vllm034}"    # /.cache/ is gitignored
VER="${VLLM034_VERSION:-0.34.0}"
PY="${PYTHON:-python3}"
SKIP_REQS="${VLLM034_SKIP_REQS:-flashinfer-python}"   # space-separated requirement names
ready() {
  "$VENV/bin/python" - "$VER" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
assert md.version("vllm") == sys.argv[1]
import pytest, torch, transformers.models.auto, vllm_specx  # noqa: F401
assert vllm_specx.__file__.startswith(__import__("os").getcwd())
PY
}
if ! ready; then
  start=$(date +%s)
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q --no-deps "vllm==$VER"
  reqs="$(mktemp)"
  "$VENV/bin/python" - "$SKIP_REQS" > "$reqs" <<'PY'
import importlib.metadata as md, sys
from pip._vendor.packaging.requirements import Requirement
skip = set(sys.argv[1].split())
for r in md.requires("vllm"):
    req = Requirement(r)
    if (req.marker and not req.marker.evaluate({"extra": ""})) or req.name in skip:
        continue
    req.marker = None
    print(req)
print("pytest>=8")
PY
  "$VENV/bin/pip" install -q -r "$reqs"
  rm -f "$reqs"
  "$VENV/bin/pip" install -q --no-deps -e .
  # As in scripts/bootstrap.sh: PyPI's torchvision/torchaudio/torchcodec can break
  # `import transformers`; nothing here uses them.
  if ! "$VENV/bin/python" -c "import transformers.models.auto" 2>/dev/null; then
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  ready || { echo "check_vllm034: $VENV is not usable after the install" >&2; exit 1; }
  echo "check_vllm034: venv built in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
fi
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" \
  2>/dev/null
export VLLM_TARGET_DEVICE=cpu CUDA_VISIBLE_DEVICES=
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/test_vllm034.py "$@"
