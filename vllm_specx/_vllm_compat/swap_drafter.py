"""Patch `swap-drafter`: put the routed method's proposer (and our rejection sampler) into vLLM's
V1 runner right after the runner is built."""

from __future__ import annotations

import importlib
import os

from vllm_specx._vllm_compat import acceptance, logger, patch, route_of


def load_class(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


@patch("swap-drafter", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.__init__",
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
        sampler = acceptance.make_rejection_sampler(self, vllm_config)
        if sampler is not None:
            self.rejection_sampler = sampler

    return __init__
