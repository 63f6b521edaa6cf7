"""The shared vLLM 0.34 CPU wheel on AVX-512 machines: the engine vLLM starts there, run here.

The wheel holds only the AVX2 kernel library (`vllm/_C_AVX2.abi3.so`); on a machine with AVX-512
vLLM imports `vllm._C_AVX512`, or `vllm._C` with AVX-512 BF16, and without it registers no CPU op.
`scripts/venv034.sh` installs the AVX2 library under those names too (every AVX-512 CPU executes
AVX2). No AVX-512 machine is at hand, so `isa_child.py` makes torch's CPU feature probes answer as
AVX-512, AVX-512 BF16 and AMX machines do before vLLM starts: vLLM then takes those machines'
Python branches (the library it imports, the attention ISA it picks; float32 keeps AMX kernels out,
as the tier runs), and our drafts must serve greedy-identical output there. (On a machine that has
AVX-512, the "avx2" case is the one simulated.)

Negative control: the same with the wheel as shipped (the copies hidden): no CPU op is registered
and the engine cannot serve.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e034
CHILD = Path(__file__).with_name("isa_child.py")
ROOT = Path(__file__).resolve().parents[2]
LIBRARY = {"avx2": "_C_AVX2", "avx512": "_C_AVX512", "avx512_bf16": "_C", "amx": "_C"}


def run(isa: str, *flags: str) -> dict:
    p = subprocess.run([sys.executable, str(CHILD), isa, *flags], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    lines = [x for x in p.stdout.splitlines() if x.startswith("ISA_RESULT ")]
    assert lines, f"isa_child {isa} {flags} printed no result (rc {p.returncode}):\n{p.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("ISA_RESULT "))


@pytest.mark.parametrize("isa", ["avx2", "avx512", "avx512_bf16", "amx"])
def test_the_engine_on_an_avx512_machine_serves_our_drafts(isa):
    got = run(isa)
    print(f"{isa}: loaded {got['loaded']}, tau DSpark {got.get('dspark', {}).get('tau')}, MTP {got.get('mtp', {}).get('tau')}")
    assert "error" not in got, got["error"]
    assert got["loaded"] == [f"{LIBRARY[isa]}.abi3.so"], got["loaded"]  # the library of that machine
    assert got["ops_registered"]
    for name in ("dspark", "mtp"):
        assert got[name]["outputs"] == got["nospec"]["outputs"], name  # greedy identical to no-spec
        assert got[name]["tau"] > 1.2, (name, got[name])  # drafts made and accepted


def test_negative_control_the_wheel_as_shipped_fails_there():
    got = run("avx512", "--hide-avx512-library")
    assert not got["ops_registered"] and got["loaded"] == [], got
    assert "error" in got, "an engine without CPU ops served: the check above could not fail"
