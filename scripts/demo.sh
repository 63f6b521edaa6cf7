#!/usr/bin/env bash
# Install (if needed) and run the demo: the reference target in vLLM on CPU, no-spec vs the
# committed DSpark head through vllm-specx; prints tau, per-position acceptance and tokens/s.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python examples/demo.py "$@"
