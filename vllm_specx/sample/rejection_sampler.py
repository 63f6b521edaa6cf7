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
import logging
import os

import torch
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.rejection_sampler import GREEDY_TEMPERATURE, RejectionSampler, generate_uniform_probs

from vllm_specx.ops.acceptance import METHODS, acceptance_sample, draw_exp_noise

# The acceptance method of the SpecxRejectionSampler running now (the seam's switch), and that
# sampler itself (for its counters; None when the seam is driven without one, e.g. its probe).
logger = logging.getLogger("vllm.specx")
RAISE_ENV = "VLLM_RAISE_ON_LOGIT_NANS"  # vLLM's own switch for NaN logits

_ACTIVE: contextvars.ContextVar[str | None] = contextvars.ContextVar("specx_acceptance", default=None)
_SAMPLER: contextvars.ContextVar[SpecxRejectionSampler | None] = contextvars.ContextVar(
    "specx_rejection_sampler", default=None)


class SpecxRejectionSampler(RejectionSampler):
    """Counters (read in the worker, e.g. through `LLM.collective_rpc`): `calls` = forward calls;
    `op_calls[m]` = verifications our acceptance op completed with method `m` ("token" /
    "block"); `random_op_calls[m]` = those with at least one non-greedy request; `empty_calls` =
    steps with no draft to verify (answered without the op)."""

    def __init__(self, sampler, spec_config, device, method: str = "token"):
        super().__init__(sampler, spec_config, device)
        if method not in METHODS:
            raise ValueError(f"acceptance method must be 'token' or 'block', got {method!r}")
        self.method = method
        self.calls = 0
        self.op_calls = dict.fromkeys(METHODS, 0)
        self.random_op_calls = dict.fromkeys(METHODS, 0)
        self.empty_calls = 0

    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        self.calls += 1
        if metadata.max_spec_len == 0 and sampling_metadata.max_num_logprobs is None \
                and not getattr(sampling_metadata, "logprob_token_ids", None):
            # No draft in the step (all cut, or the drafter skipped the pass): the tokens are the
            # bonus tokens vLLM's path samples first (same sampler, same rows, same parameters);
            # its logprob bookkeeping and empty verification are skipped.
            self.empty_calls += 1
            out = self.sampler(logits=logits[metadata.bonus_logits_indices],
                               sampling_metadata=sampling_metadata, predict_bonus_token=True)
            return SamplerOutput(sampled_token_ids=out.sampled_token_ids.view(-1, 1).to(torch.int32),
                                 logprobs_tensors=None)
        token, sampler = _ACTIVE.set(self.method), _SAMPLER.set(self)
        try:
            return super().forward(metadata, draft_probs, logits, sampling_metadata)
        finally:
            _SAMPLER.reset(sampler)
            _ACTIVE.reset(token)


def active_method() -> str | None:
    """The acceptance method of the SpecxRejectionSampler running now, if any."""
    return _ACTIVE.get()


def target_probs_or_raise(target_logits: torch.Tensor, num_draft_tokens: list[int]) -> torch.Tensor:
    """`softmax(target_logits)` in fp32, with rows that are not a distribution reported.

    A softmax row is NaN in every entry exactly when its logits hold a NaN or a `+inf`, or are
    all `-inf` (max-subtract, exp, sum, divide: the NaN reaches the sum), so column 0 flags
    them in `O(T)` (one host sync on CUDA). NaN or `+inf` logits are a numerical failure of the
    target: vLLM's own sampler samples from such rows silently (and raises, after sampling,
    only with `VLLM_RAISE_ON_LOGIT_NANS=1`). Here they are never silent: by default an error is
    logged naming the rows and requests and those rows become all-zero (every draft there is
    rejected and the op emits token 0, so the engine and the other requests of the batch go on);
    with `VLLM_RAISE_ON_LOGIT_NANS=1` (vLLM's own switch) a RuntimeError is raised instead.
    All `-inf` rows (every token masked, reachable through sampling parameters) become all-zero
    rows, from which the op emits token 0, as vLLM's own sampler does for them.
    """
    probs = target_logits.softmax(-1, dtype=torch.float32)
    bad = probs[:, 0].isnan()
    if not bool(bad.any()):
        return probs
    rows = bad.nonzero().squeeze(1)
    broken = target_logits.index_select(0, rows)
    broken = (broken.isnan() | (broken == float("inf"))).any(-1)
    if bool(broken.any()):
        cu = torch.tensor(num_draft_tokens, device=rows.device).cumsum(0)
        bad_rows = rows[broken]
        reqs = torch.searchsorted(cu, bad_rows, right=True).unique().tolist()
        msg = (f"vllm-specx: the target's logits contain NaN or +inf at {bad_rows.numel()} draft "
               f"position(s) (rows {bad_rows.tolist()[:8]}) of request(s) {reqs} (batch indices): "
               f"the target model's output is not a distribution there")
        if os.environ.get(RAISE_ENV, "0") not in ("", "0"):
            raise RuntimeError(f"{msg} ({RAISE_ENV}=1). Check the model and its dtype.")
        logger.error("%s; their drafts are rejected and token 0 is emitted (set %s=1 to raise). "
                     "Check the model and its dtype.", msg, RAISE_ENV)
    probs[rows] = 0.0  # every token masked: no distribution; the op emits token 0
    return probs


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
    Raises:
        RuntimeError: NaN or +inf target logits with VLLM_RAISE_ON_LOGIT_NANS=1
            (`target_probs_or_raise`; logged otherwise).

    Seeded requests (`sampling_metadata.generators`) draw from their own generator only what
    their own drafts need, as vLLM's sampler does: their uniforms (`generate_uniform_probs`)
    and, only when they have drafts, their noise vector. A request with zero drafts this step (it
    was just prefilled next to decoding requests, or its drafts were cut) takes nothing from its
    generator, so its tokens do not depend on what else is in the batch.

    A step with no draft at all (every request's drafts were cut, or the drafter skipped the
    pass) returns vLLM's bonus tokens as they are, which is what the op computes for it (nothing
    to accept, nothing drawn), without building its [B, V] inputs.
    """
    batch, (num_tokens, vocab) = len(num_draft_tokens), target_logits.shape
    device = target_logits.device
    if num_tokens == 0:
        sampler = _SAMPLER.get()
        if sampler is not None:
            sampler.empty_calls += 1
        return bonus_token_ids.view(batch, 1).to(torch.int32)
    method = active_method() or "token"  # "token" when called directly (tests)
    target_probs = target_probs_or_raise(target_logits, num_draft_tokens)
    if sampling_metadata.all_greedy:
        is_greedy = torch.ones(batch, dtype=torch.bool, device=device)
        uniforms = torch.zeros(num_tokens, dtype=torch.float64, device=device)
        exp_noise = torch.ones(batch, vocab, dtype=torch.float32, device=device)
    else:
        generators = sampling_metadata.generators
        is_greedy = sampling_metadata.temperature == GREEDY_TEMPERATURE
        uniforms = generate_uniform_probs(num_tokens, num_draft_tokens, generators, device)
        with_drafts = {i: g for i, g in generators.items() if num_draft_tokens[i] > 0}
        exp_noise = draw_exp_noise(batch, vocab, with_drafts, device)
    # The bonus token was already drawn by vLLM's sampler from the bonus distribution, with every
    # sampling parameter applied; as a one-hot "distribution" the op emits exactly that token.
    bonus_probs = torch.zeros(batch, vocab, dtype=torch.float32, device=device)
    bonus_probs.scatter_(1, bonus_token_ids.view(-1, 1).long(), 1.0)
    out = acceptance_sample(
        draft_token_ids.long(), cu_num_draft_tokens, target_probs, bonus_probs, draft_probs,
        is_greedy, uniforms.double(), exp_noise, method=method, max_num_draft_tokens=max_spec_len,
        validate=False)
    sampler = _SAMPLER.get()
    if sampler is not None:
        sampler.op_calls[method] += 1
        if not sampling_metadata.all_greedy:
            sampler.random_op_calls[method] += 1
    return out
