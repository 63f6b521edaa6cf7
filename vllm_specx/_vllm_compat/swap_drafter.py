"""Patch `swap-drafter`: put the routed method's proposer (and our rejection sampler) into vLLM's
V1 runner right after the runner is built."""

from __future__ import annotations

import os

from vllm_specx._vllm_compat import acceptance
from vllm_specx._vllm_compat.patching import (Blank, ProbeReached, get_patch, logger, original, patch, probe,
                                              resolve, route_of)
from vllm_specx._vllm_compat.route import DELEGATED_REJECTION

TARGET = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.__init__"


def choose_rejection_sampler(runner, vllm_config):
    """The rejection sampler to put into `runner` for a routed config, or None to keep the
    RejectionSampler vLLM built: for the modes vLLM verifies itself (`DELEGATED_REJECTION`,
    i.e. synthetic acceptance for benchmarking) and when `VLLM_SPECX_SAMPLER=vllm`."""
    rsm = vllm_config.speculative_config.rejection_sample_method
    if rsm in DELEGATED_REJECTION:
        logger.info("vllm-specx: verification by vLLM's RejectionSampler "
                    "(rejection_sample_method %r: not lossless by design)", rsm)
        return None
    sampler = acceptance.make_rejection_sampler(runner, vllm_config)
    if sampler is not None:
        # vLLM's RejectionSampler.__init__ derives modes our acceptance op does not implement
        # from the speculative config; the route refuses them at config time, this is the backstop.
        modes = [m for m in ("synthetic_mode", "use_fly") if getattr(sampler, m, False)]
        if modes:
            raise ValueError(f"vllm-specx: rejection_sample_method {rsm!r} sets {modes} on the "
                             "rejection sampler, which vllm-specx's acceptance op does not implement")
    return sampler


def load_class(path: str):
    """The class named by "module:Class" (a method's proposer_cls)."""
    return resolve(path)[2]


@patch("swap-drafter", TARGET,
       why="the V1 runner builds its drafter inline with no factory; swap in the routed method's "
           "proposer (a subclass of the vLLM proposer it reuses, so every isinstance check in "
           "the runner still holds) and our SpecxRejectionSampler",
       remove_when="vLLM lets plugins supply the drafter (upstream plugin-proposer RFC)")
def runner_init(orig):
    def __init__(self, vllm_config, *args, **kwargs):
        orig(self, vllm_config, *args, **kwargs)
        method = route_of(vllm_config)
        if method is None or getattr(self, "drafter", None) is None:
            return
        cls = load_class(method.proposer_cls)
        self.drafter = cls(vllm_config, self.device, self)
        logger.info("vllm-specx: %s runner drafter -> %s (pid %d)", type(self).__name__,
                    cls.__name__, os.getpid())
        sampler = choose_rejection_sampler(self, vllm_config)
        if sampler is not None:
            self.rejection_sampler = sampler

    return __init__


class _ProbeRunner:
    """A fake runner: the first attribute vLLM's __init__ sets on it ends the probe."""

    def __setattr__(self, name, value):
        raise ProbeReached(name)


@probe("swap-drafter")
def _probe_swap_drafter():
    """The runner's __init__ is the wrapper `runner_init` made around the original __init__, and
    calling it runs that original (which the fake runner stops at its first assignment)."""
    fn = resolve(TARGET)[2]
    ours = get_patch("swap-drafter").make
    if getattr(fn, "__code__", None) is not ours(original("swap-drafter")).__code__:
        raise RuntimeError(f"the runner's __init__ is {fn!r}, not vllm-specx's wrapper")
    if getattr(fn, "__wrapped__", None) is not original("swap-drafter"):
        raise RuntimeError("the wrapper does not wrap vLLM's original __init__")
    try:
        fn(_ProbeRunner(), Blank(), "cpu")
    except ProbeReached:
        return
    raise RuntimeError("the wrapper returned without running vLLM's __init__")
