#!/usr/bin/env bash
# Install (if needed) and run the test suite: unit, kernel (Triton interpreter) and vLLM end-to-end
# tests on CPU. Extra arguments go to pytest (e.g. -m "not e2e" for the quick part).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest -m "not slow" -q -p no:cacheprovider "$@"
