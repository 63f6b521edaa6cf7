#!/usr/bin/env bash
# Install (if needed) and run the demo (examples/demo.py): SmolLM2-135M-Instruct in vLLM on CPU
# (the embedded reference target when the package index cannot be reached, said so), greedy, K = 7:
# at batch 1 (latency) no-spec, vLLM's n-gram and EAGLE-3 and our DSpark and MTP drafts; at batch
# 16 (throughput) no-spec and DSpark at a fixed K and with adaptive drafting. Each engine says when
# it starts, shows a progress bar and prints its tau, tokens/s, speed-up and greedy identity when it
# ends; two tables at the end. --offline runs the reference target; --quick is a smoke run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python examples/demo.py "$@"
