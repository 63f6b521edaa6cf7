"""An offline `vllm.LLM` for tools, benchmarks and tests, shut down on exit.

The defaults are the settings measured to work on vLLM's CPU build on small machines (fp32, eager,
a small KV-cache share); pass overrides for anything else (e.g. `dtype="bfloat16"` on a GPU).
"""

from __future__ import annotations

import contextlib
import gc
import os
from pathlib import Path

VLLM_INTERNALS = ("vllm.engine.arg_utils:EngineArgs",)  # its fields are the engine arguments checked
CPU_ENGINE_ARGS = dict(dtype="float32", max_model_len=1024, enforce_eager=True,
                       gpu_memory_utilization=0.2, disable_log_stats=False, seed=0)


def engine_args(overrides: dict | None = None) -> dict:
    """`CPU_ENGINE_ARGS` with `overrides` (any `vllm.engine.arg_utils.EngineArgs` field: dtype,
    tensor_parallel_size, gpu_memory_utilization, max_model_len, ...) over them. ValueError
    naming the field when the installed vLLM has no such engine argument."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in dataclasses.fields(EngineArgs)}
    unknown = sorted(set(overrides or {}) - known)
    if unknown:
        raise ValueError(f"engine argument(s) {unknown} are not fields of this vLLM's EngineArgs "
                         f"(vllm {__import__('vllm').__version__})")
    return {**CPU_ENGINE_ARGS, **(overrides or {})}


@contextlib.contextmanager
def cpu_llm(model: str | Path, speculative_config: dict | None = None, **overrides):
    """An offline `vllm.LLM` with `CPU_ENGINE_ARGS` (overridable), shut down on exit."""
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(callable)
    from vllm import LLM

    llm = LLM(model=str(model), speculative_config=speculative_config, **{**CPU_ENGINE_ARGS, **overrides})
    try:
        yield llm
    finally:
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm
        gc.collect()


@contextlib.contextmanager
def spawned_core():
    """Within: offline engines start their engine core in its own process (vLLM's default), what
    VLLM_ENABLE_V1_MULTIPROCESSING=0 otherwise changes; the variable is restored on exit. (vLLM
    freezes its environment reads while an engine core runs in this process and releases them
    at its shutdown; the release here covers a core that failed to start.)"""
    from vllm import envs

    before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    getattr(envs, "disable_envs_cache", lambda: None)()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before
