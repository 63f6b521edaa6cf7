"""TEST HARNESS: run vLLM 0.34's Triton kernels in Triton's interpreter on a CPU machine.

vLLM 0.34 on x86 CPUs runs the V2 GPU model runner (`vllm/v1/worker/cpu/model_runner.py`:
`CPUModelRunner(GPUModelRunner)`), whose input preparation, sampling and speculative-decoding
bookkeeping are Triton kernels, and it refuses to build an engine without the `triton-cpu`
backend ("vLLM on x86 CPUs requires Triton (triton-cpu)"), which the package index does not have.
This module, imported before vLLM in every process of an engine, makes the index's `triton` stand
in for it:

- `TRITON_INTERPRET=1`: every `@triton.jit` kernel runs in Triton's interpreter (numpy on the
  host): the same kernel source and results as a compiled backend, about 3 tokens/s on SmolLM2;
- a stand-in `"cpu"` entry in `triton.backends.backends` (no compiler; a driver that reports itself
  active), which is what vLLM's `HAS_TRITON` probe for CPU builds looks for;
- `tl.range` loop variables as Triton scalars, as compiled Triton gives them: the interpreter
  (triton 3.8) yields Python ints, and vLLM's top-k/top-p sampling kernel calls
  `row_id.to(tl.int64)` on its loop variable ("'int' object has no attribute 'to'", so every
  request with top_k or top_p failed). `tl.static_range` keeps Python ints, as compiled.

- top-k/top-p masking in the engine by vLLM's own PyTorch function (`apply_top_k_top_p_pytorch`, what
  vLLM runs when it has no Triton): its Triton kernel, interpreted, took 95 % of the engine's time on
  requests with top_k/top_p (4 requests x 8 tokens: 167 s against 3.5 s greedy). The kernel itself
  stays tested against that function (tests/e2e034/test_harness034.py); SPECX_TRITON_TOPK_TOPP=kernel
  keeps it in the engine.

It is for the e2e034 test tier only (`scripts/venv034.sh` installs a `.pth` that imports it when
SPECX_TRITON_INTERPRETER=1, so `vllm serve`'s spawned processes get it too). It makes the engine
correct and slow: never measure speed with it, never serve with it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

ENV = "SPECX_TRITON_INTERPRETER"
TOPK_TOPP_ENV = "SPECX_TRITON_TOPK_TOPP"  # "kernel": keep vLLM's Triton top-k/top-p kernel in the engine
TOPK_TOPP_MODULE = "vllm.v1.sample.ops.topk_topp_sampler"


def install() -> bool:
    """Install the harness in this process (idempotent). Returns True when the stand-in backend was
    added now, False when one was already there (a real triton-cpu, or an earlier call)."""
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault(ENV, "1")  # child processes (spawned engine cores) install it too
    import triton.backends as tb
    from triton.backends.compiler import BaseBackend
    from triton.backends.driver import DriverBase

    if "cpu" in tb.backends:
        return False

    class _InterpreterDriver(DriverBase):
        """Active, so vLLM's probe counts one driver; nothing launches through it (interpret mode
        calls kernels as Python)."""

        @classmethod
        def is_active(cls):
            return True

        def map_python_to_cpp_type(self, ty):
            raise NotImplementedError("triton_harness: kernels run in TRITON_INTERPRET mode only")

        def get_current_target(self):
            raise NotImplementedError("triton_harness: kernels run in TRITON_INTERPRET mode only")

        def get_active_torch_device(self):
            import torch

            return torch.device("cpu")

        def get_benchmarker(self):
            raise NotImplementedError("triton_harness: no benchmarking in the interpreter")

    tb.backends["cpu"] = tb.Backend(compiler=BaseBackend, driver=_InterpreterDriver)
    _range_yields_scalars()
    if os.environ.get(TOPK_TOPP_ENV) != "kernel":
        _topk_topp_by_pytorch()
    return True


def _topk_topp_by_pytorch() -> None:
    """vLLM's `apply_top_k_top_p` reads its module's HAS_TRITON at each call: set it False in that
    module alone, now or when vLLM imports it (every caller imports the function, not the flag)."""
    def patch(module):
        module.HAS_TRITON = False
        module.specx_topk_topp_by_pytorch = True

    if TOPK_TOPP_MODULE in sys.modules:
        patch(sys.modules[TOPK_TOPP_MODULE])
        return

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != TOPK_TOPP_MODULE:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            exec_module = spec.loader.exec_module

            def exec_then_patch(module):
                exec_module(module)
                patch(module)

            spec.loader.exec_module = exec_then_patch
            return spec

    sys.meta_path.insert(0, _Finder())


def _range_yields_scalars() -> None:
    """Make the interpreter's `tl.range` yield int32/int64 Triton scalars (see the module doc)."""
    from triton.runtime import interpreter

    patch_core = interpreter._patch_lang_core
    if getattr(patch_core, "specx_scalar_range", False):
        return

    def _patch_lang_core(lang, scope):
        patch_core(lang, scope)
        python_range = lang.range

        def scalar_range(*args, **kwargs):
            for i in python_range(*args, **kwargs):
                yield interpreter._implicit_cvt(i)

        scope.set_attr(lang, "range", scalar_range)

    _patch_lang_core.specx_scalar_range = True
    _patch_lang_core.specx_original = patch_core
    interpreter._patch_lang_core = _patch_lang_core


if os.environ.get(ENV) == "1":
    install()
