"""Child process of test_isa034.py: vLLM 0.34's CPU engine as it starts on a machine with the named
x86 ISA, on this (AVX2) machine: torch's CPU feature probes answer for that machine before vLLM is
imported, so vLLM takes that machine's branches (which kernel library it imports, which attention
ISA it picks); the instructions that run stay AVX2, which every AVX-512 CPU also executes.

    python tests/e2e034/isa_child.py ISA [--hide-avx512-library]

ISA: avx2 (this machine), avx512, avx512_bf16 (vLLM then imports `vllm._C`), amx (Sapphire Rapids
and later: AVX-512 BF16 and AMX tiles). Prints one JSON line: the library vLLM imported, whether
its CPU ops are registered, and the greedy output of the reference target with our committed
DSpark and MTP drafts (and without), or the error that stopped the engine.
`--hide-avx512-library`: the wheel as shipped, without the copies `scripts/venv034.sh` installs
(the negative control).
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys

ISAS = {"avx2": {}, "avx512": {"avx512": True},
        "avx512_bf16": {"avx512": True, "avx512_bf16": True},
        "amx": {"avx512": True, "avx512_bf16": True, "amx_tile": True}}
LIBRARIES = ("vllm._C", "vllm._C_AVX512", "vllm._C_AVX2")


class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ("vllm._C", "vllm._C_AVX512"):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden: the wheel as shipped)", name=name)
        return None


def simulate(isa: str) -> None:
    import torch

    has = ISAS[isa]
    for feature in ("avx512", "avx512_bf16", "amx_tile"):
        setattr(torch.cpu, f"_is_{feature}_supported", (lambda v: lambda: v)(has.get(feature, False)))


def main() -> None:
    isa, hide = sys.argv[1], "--hide-avx512-library" in sys.argv
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    simulate(isa)
    if hide:
        sys.meta_path.insert(0, _Hide())
    from vllm_specx.testing import triton_harness

    triton_harness.install()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    from vllm import SamplingParams
    from vllm.platforms import current_platform

    from tests import helpers as T
    from vllm_specx.bench.eval import generate_measured

    current_platform.import_kernels()
    out = {"isa": isa, "imported": [m for m in LIBRARIES if m in sys.modules],
           "ops_registered": hasattr(torch.ops._C, "rms_norm") and hasattr(torch.ops._C, "cpu_attention_with_kv_cache")}
    # a library imported under a name it does not export raises (ignored by vLLM): which one loaded
    # shows in the process's mapped files
    with open("/proc/self/maps") as f:
        out["loaded"] = sorted({line.rsplit("/", 1)[-1].strip() for line in f if "/vllm/_C" in line})
    prompts = T.load_prompts("code", limit=2)
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    try:
        for name, spec in (("nospec", None),
                           ("dspark", {"method": "dspark", "model": str(T.ASSETS / "drafts" / "ref-dspark"),
                                       "num_speculative_tokens": 7}),
                           ("mtp", {"method": "mtp", "model": str(T.ASSETS / "drafts" / "ref-mtp"),
                                    "num_speculative_tokens": 3})):
            with T.cpu_llm(T.REF_TARGET, spec) as llm:
                got = generate_measured(llm, prompts, greedy)  # vLLM's counters of this call
                out[name] = {"outputs": got["outputs"], "tau": got["tau"], "num_draft_tokens": got["num_draft_tokens"],
                             "num_drafts": got["num_drafts"]}
    except Exception as e:  # noqa: BLE001 - reported to the test, which names it
        out["error"] = f"{type(e).__name__}: {e}"[:500]
    print("ISA_RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
