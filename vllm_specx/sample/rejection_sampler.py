"""SpecxRejectionSampler: vLLM's V1 RejectionSampler with vllm-specx's acceptance op as its core.

vLLM's `RejectionSampler.forward` stays in charge of everything around verification (bonus-token
sampling with the full sampling parameters, logits processors, temperature/top-k/top-p via
`apply_sampling_constraints`, logprobs); only its call to the module function
`rejection_sample()` is answered by `specx_rejection_sample` (patched in `_vllm_compat`) while
a SpecxRejectionSampler is running. That function turns vLLM's inputs into
`vllm_specx.ops.acceptance.acceptance_sample`'s: target probabilities from the processed
logits, vLLM's sampled bonus token as a one-hot bonus distribution, and host-drawn randomness
that honours per-request seeds.
"""

from __future__ import annotations

import contextvars

import torch
from vllm.v1.sample.rejection_sampler import GREEDY_TEMPERATURE, RejectionSampler, generate_uniform_probs

from vllm_specx.ops.acceptance import acceptance_sample, draw_exp_noise

_ACTIVE: contextvars.ContextVar[str | None] = contextvars.ContextVar("specx_acceptance", default=None)


class SpecxRejectionSampler(RejectionSampler):
    def __init__(self, sampler, spec_config, device, method: str = "token"):
        super().__init__(sampler, spec_config, device)
        if method not in ("token", "block"):
            raise ValueError(f"acceptance method must be 'token' or 'block', got {method!r}")
        self.method = method
        self.calls = 0

    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        self.calls += 1
        token = _ACTIVE.set(self.method)
        try:
            return super().forward(metadata, draft_probs, logits, sampling_metadata)
        finally:
            _ACTIVE.reset(token)


def active_method() -> str | None:
    """The acceptance method of the SpecxRejectionSampler running now, if any."""
    return _ACTIVE.get()


def specx_rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                           draft_probs, target_logits, bonus_token_ids, sampling_metadata,
                           **_unused) -> torch.Tensor:
    """vLLM's `rejection_sample()` contract, computed by our acceptance op.

    Args:
        draft_token_ids: [T] drafts; num_draft_tokens: per-request counts (list of B ints);
        cu_num_draft_tokens: [B] cumulative counts; draft_probs: [T, V] or None (one-hot drafts);
        target_logits: [T, V] after vLLM's logits processors and sampling constraints;
        bonus_token_ids: [B, 1] sampled by vLLM's sampler from the bonus position.
    Returns:
        [B, max_spec_len + 1] int32, -1 padded.
    """
    batch, (num_tokens, vocab) = len(num_draft_tokens), target_logits.shape
    device = target_logits.device
    if sampling_metadata.all_greedy:
        is_greedy = torch.ones(batch, dtype=torch.bool, device=device)
        uniforms = torch.zeros(num_tokens, dtype=torch.float64, device=device)
        exp_noise = torch.ones(batch, vocab, dtype=torch.float32, device=device)
    else:
        is_greedy = sampling_metadata.temperature == GREEDY_TEMPERATURE
        uniforms = generate_uniform_probs(num_tokens, num_draft_tokens, sampling_metadata.generators, device)
        exp_noise = draw_exp_noise(batch, vocab, sampling_metadata.generators, device)
    # The bonus token was already drawn by vLLM's sampler from the bonus distribution, with every
    # sampling parameter applied; as a one-hot "distribution" the op emits exactly that token.
    bonus_probs = torch.zeros(batch, vocab, dtype=torch.float32, device=device)
    bonus_probs.scatter_(1, bonus_token_ids.view(-1, 1).long(), 1.0)
    return acceptance_sample(
        draft_token_ids.long(), cu_num_draft_tokens, target_logits.softmax(-1, dtype=torch.float32),
        bonus_probs, draft_probs, is_greedy, uniforms.double(), exp_noise, method=active_method(),
        max_num_draft_tokens=max_spec_len, validate=False)
