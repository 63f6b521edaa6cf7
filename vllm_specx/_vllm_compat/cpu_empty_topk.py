"""Patch `repair-cpu-empty-topk`: the rejection sampler's sampling constraints on a step with no
draft tokens return the (empty) target logits unchanged instead of reaching vLLM's CPU top-k.

Root cause: vLLM 0.32's V1 runner verifies through the rejection sampler on steps where no
request of the batch has a draft token (all rows were just prefilled, or every draft was empty),
so `apply_sampling_constraints` gets target logits of shape [0, V]. On CPU (no Triton),
`apply_top_k_top_p` takes the PyTorch path, whose top-k-only branch (`apply_top_k_only`, used when
some request sets top_k and none sets top_p) calls `k.max()` on the empty per-token top-k
tensor: the worker raises and the engine dies. With no rows there is nothing to constrain, so the
repair returns the logits as they are; every other input goes to vLLM's function untouched.
"""

from __future__ import annotations

import torch

from vllm_specx import envs
from vllm_specx._vllm_compat.patching import Blank, patch, probe, resolve

REPAIR_ENV = "VLLM_SPECX_REPAIR_CPU_EMPTY_TOPK"
TARGET = "vllm.v1.sample.rejection_sampler:apply_sampling_constraints"


def repair_enabled() -> bool:
    if envs.get(REPAIR_ENV) == "0":
        return False
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


@patch("repair-cpu-empty-topk", TARGET, enabled=repair_enabled,
       why="on a speculative step where no request has a draft token, vLLM's rejection sampler "
           "applies top-k to zero target rows, and the CPU top-k path (apply_top_k_only) calls "
           "k.max() on an empty tensor: any request with top_k and no top_p then kills the "
           "engine. On by default on CPU; VLLM_SPECX_REPAIR_CPU_EMPTY_TOPK=0 turns it off",
       remove_when="vLLM skips sampling constraints for empty draft rows or its CPU top-k "
                   "handles empty input (report upstream)")
def apply_sampling_constraints(orig):
    def _apply_sampling_constraints(logits, cu_num_draft_tokens, sampling_metadata):
        if logits.shape[0] == 0:
            return logits  # no draft token this step: nothing to constrain
        return orig(logits, cu_num_draft_tokens, sampling_metadata)

    return _apply_sampling_constraints


@probe("repair-cpu-empty-topk")
def _probe_empty_topk():
    """Zero draft rows with a top-k request come back empty (vLLM's function raises there)."""
    fn = resolve(TARGET)[2]
    meta = Blank(all_greedy=False, temperature=torch.tensor([1.0]), top_k=torch.tensor([2]), top_p=None)
    empty = fn(torch.zeros(0, 4), torch.tensor([0], dtype=torch.int32), meta)
    if tuple(empty.shape) != (0, 4):
        raise RuntimeError(f"empty target logits came back with shape {tuple(empty.shape)}")
