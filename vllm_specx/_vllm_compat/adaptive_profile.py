"""Patch `adaptive-profile`: once the V1 runner's KV cache exists, a drafter with adaptive
drafting times the target's forward and its own pass on this machine (`profile_costs`), the cost
tables its policy needs; the runner has no hook between KV-cache set-up and serving."""

from __future__ import annotations

from vllm_specx._vllm_compat.patching import get_patch, original, patch, probe, resolve

TARGET = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.initialize_kv_cache"


@patch("adaptive-profile", TARGET,
       why="adaptive drafting needs draft/verify cost tables measured on the running machine once "
           "the KV cache exists (vLLM's V2 manager profiles them during its warm-up); the V1 runner "
           "has no hook there",
       remove_when="vLLM's V1 runner profiles speculative costs itself or calls a drafter hook "
                   "after KV-cache initialisation")
def initialize_kv_cache(orig):
    def _initialize_kv_cache(self, *args, **kwargs):
        out = orig(self, *args, **kwargs)
        profiling = kwargs.get("is_profiling", args[1] if len(args) > 1 else False)
        profile = getattr(getattr(self, "drafter", None), "profile_costs", None)
        if profile is not None and not profiling:
            profile(self)
        return out

    return _initialize_kv_cache


@probe("adaptive-profile")
def _probe_adaptive_profile():
    """The runner's initialize_kv_cache is the wrapper around vLLM's original."""
    fn = resolve(TARGET)[2]
    ours = get_patch("adaptive-profile").make
    if getattr(fn, "__code__", None) is not ours(original("adaptive-profile")).__code__:
        raise RuntimeError(f"the runner's initialize_kv_cache is {fn!r}, not vllm-specx's wrapper")
    if getattr(fn, "__wrapped__", None) is not original("adaptive-profile"):
        raise RuntimeError("the wrapper does not wrap vLLM's original initialize_kv_cache")
