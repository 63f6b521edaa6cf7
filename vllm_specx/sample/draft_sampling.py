"""Draft sampling shared by vLLM-side proposers: the exact q handed to the rejection sampler."""

from __future__ import annotations

import torch
from vllm.v1.sample.sampler import _SAMPLING_EPS

from vllm_specx.ops.acceptance import draw_exp_noise


def hands_draft_probs(spec) -> bool:
    """Whether a proposer keeps its drafts' distributions for verification: probabilistic drafts
    verified by "standard" or "block" (vLLM itself keeps them only for "standard")."""
    return spec.draft_sample_method == "probabilistic" and spec.rejection_sample_method in ("standard", "block")


def probabilistic_pick(sampling_metadata, batch: int):
    """`pick` for `sequential_drafts`: `logits [batch, V]` -> (drafts, `q = softmax(logits / T)`).

    The same distribution vLLM's `compute_probs_and_sample_next_token` gives drafts (the request's
    temperature only; top-k/top-p are not applied to drafts, which keeps verification lossless;
    greedy requests in a mixed batch: temperature 1 and the argmax), sampled by the exponential
    race with `draw_exp_noise`: seeded requests draw their noise from their own generator in
    `sampling_metadata.generators` (vLLM's function uses the global RNG for every request, so a
    seeded request's drafts, and with them its output, depended on its batch neighbours).
    """
    temperature = sampling_metadata.temperature[:batch]
    greedy = None if sampling_metadata.all_random else temperature < _SAMPLING_EPS
    if greedy is not None:
        temperature = torch.where(greedy, 1.0, temperature)
    temperature = temperature.view(-1, 1)
    generators = sampling_metadata.generators

    def pick(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = (logits / temperature).softmax(-1, dtype=torch.float32)
        noise = draw_exp_noise(batch, probs.shape[-1], generators, probs.device)
        tokens = (probs / noise).argmax(-1)
        if greedy is not None:
            tokens = torch.where(greedy, probs.argmax(-1), tokens)
        return tokens, probs

    return pick
