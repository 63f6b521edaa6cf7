"""vLLM 0.34's own tests with vllm-specx installed (`scripts/vllm034_upstream_tests.sh`, which takes
them from vLLM's sdist and loads our plugin first, failing if our methods are not registered):
`tests/v1/spec_decode/test_custom_speculator.py` (vLLM's speculator plugin API, engine-free) must
pass whole. `tests/v1/e2e/test_cpu_spec_decode.py`'s n-gram test (a real engine, on the local
SmolLM2 instead of a hub model) is in the full e2e034 tier."""

import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e034
ROOT = Path(__file__).resolve().parents[2]


def _run(what: str) -> str:
    proc = subprocess.run(["bash", "scripts/vllm034_upstream_tests.sh", what], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.mark.e2e034_ci
def test_vllms_custom_speculator_tests_pass_with_our_plugin():
    out = _run("custom")
    m = re.search(r"(\d+) passed", out)
    assert m and int(m.group(1)) >= 39 and " failed" not in out, out[-2000:]


def test_vllms_cpu_spec_decode_test_passes_with_our_plugin():
    out = _run("cpu")
    assert re.search(r"\b1 passed", out), out[-2000:]
