#!/usr/bin/env bash
# The kernel tests (tests/ops, Triton's CPU interpreter) on another Triton than the venv's: by
# default Triton 3.6 (the CUDA image's) with the newest numpy, the pair under which the
# interpreter's scalar handling needs `ops._triton_utils.interpreter_compat`.
#
#   bash scripts/check_triton.sh                 # Triton 3.6.0, newest numpy
#   TRITON_VERSION=3.4.0 bash scripts/check_triton.sh   # the pyproject's `triton>=3.4` floor
#   TRITON_VERSION=3.4.0 bash scripts/check_triton.sh -k topk
#
# Both include the sm_90 `--compile-only` checks (no spills): the register use differs between
# Triton versions (the top-k kernel at 4 warps: 255 registers and spills on 3.6, 80 on 3.9).
#
# An overlay venv (.cache/venv-triton-<version>, gitignored): its own triton and numpy in front of
# .venv's packages (a .pth line), so nothing else is installed twice. Not part of .ci/run (a
# ~150 MB download); the venv's Triton runs in CI. Needs .venv (scripts/bootstrap.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
VER="${TRITON_VERSION:-3.6.0}"
VENV=".cache/venv-triton-$VER"
[ -x .venv/bin/python ] || bash scripts/bootstrap.sh
site=$(.venv/bin/python -c "import site; print(site.getsitepackages()[0])")
if ! "$VENV/bin/python" -c "import triton, sys; assert triton.__version__ == sys.argv[1]" "$VER" 2>/dev/null; then
  .venv/bin/python -m venv "$VENV"
  echo "$site" > "$("$VENV/bin/python" -c "import site; print(site.getsitepackages()[0])")/specx-venv.pth"
  "$VENV/bin/pip" install -q --no-deps "triton==$VER" "numpy>=2.4"
fi
"$VENV/bin/python" -c "import numpy, triton; print(f'triton {triton.__version__}, numpy {numpy.__version__}')"
"$VENV/bin/python" -m pytest tests/ops -m "not e2e" -q -p no:cacheprovider "$@"
