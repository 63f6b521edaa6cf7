"""vLLM's CPU `expand_batch_to_tokens` is broken for float inputs (per-token temperature/top-p of the
rejection sampler); the plugin's repair fixes it. The first test shows the breakage itself, in a
fresh interpreter with the repair switched off, so it fails if upstream ever fixes the bug (then
the repair can go: see the manifest entry)."""

import subprocess
import sys

import pytest

SNIPPET = """
import sys, torch, vllm_specx
from vllm.platforms import current_platform
if sys.argv[1] == "plugin-first":  # as in a vLLM worker: plugins load, then overrides register
    vllm_specx.register()
current_platform.register_triton_kernel_overrides()
vllm_specx.register()
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens
cu = torch.tensor([2, 5, 6], dtype=torch.int32)
torch.manual_seed(0)
bad = 0
for _ in range(20):
    x = torch.rand(3) + 0.5
    got = expand_batch_to_tokens(x, cu, 6, replace_from=0, replace_to=1)
    bad += not torch.equal(got, x.repeat_interleave(torch.tensor([2, 3, 1])))
ints = expand_batch_to_tokens(torch.tensor([3, 4, 0]), cu, 6, replace_from=0, replace_to=1)
assert ints.tolist() == [3, 3, 4, 4, 4, 1], ints
print("BAD", bad)
"""


def _bad_expansions(repair: str, order: str = "plugin-first") -> int:
    out = subprocess.run([sys.executable, "-c", SNIPPET, order], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "VLLM_SPECX_REPAIR_CPU_EXPAND": repair})
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split("BAD")[-1])


def test_vllm_cpu_expand_is_broken_for_floats_without_the_repair():
    pytest.importorskip("vllm.utils.cpu_triton_utils")
    assert _bad_expansions("0") == 20


@pytest.mark.parametrize("order", ["plugin-first", "overrides-first"])
def test_repair_makes_float_expansion_exact(order):
    assert _bad_expansions("1", order) == 0
