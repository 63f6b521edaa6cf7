"""Lossless acceptance sampling for speculative decoding (token-wise and block verification).

`acceptance_sample()` verifies the drafts of a flattened ragged batch (vLLM V1's layout) against
the target distributions and returns vLLM V1's `[B, max_K + 1]` int32 `-1`-padded output. All
randomness is injected (uniforms, one Exp(1) vector per request), so the three implementations
return identical token ids: the Python reference (`reference.py`, the spec; its docstring holds the
exact formulas), the vectorised PyTorch path (`torch_path.py`, the CPU default) and the Triton
kernels (`kernel.py`, the CUDA default). Nothing here imports vLLM.
"""

import torch

from vllm_specx.ops._triton_utils import interpreter_mode, triton_available
from vllm_specx.ops.acceptance.reference import (
    METHODS,
    acceptance_sample_reference,
    block_thresholds,
    check_acceptance_inputs,
)
from vllm_specx.ops.acceptance.torch_path import acceptance_sample_torch

__all__ = [
    "IMPLS",
    "METHODS",
    "acceptance_sample",
    "acceptance_sample_reference",
    "acceptance_sample_torch",
    "block_thresholds",
    "check_acceptance_inputs",
    "draw_randomness",
]

IMPLS = ("auto", "triton", "torch", "reference")
# Measured on 2 CPU cores (benchmarks/bench_acceptance.py): for a single request the looped
# reference is faster than the vectorised path up to V = 32000 (0.16 vs 0.23 ms at V = 2048,
# 0.22 vs 0.29 ms at 32000) and slower at 152064.
_SMALL_VOCAB = 65536


def _resolve(impl: str, device: torch.device) -> str:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if impl == "triton" and device.type != "cuda" and not interpreter_mode():
        raise ValueError(f"impl='triton' on device {device} needs TRITON_INTERPRET=1 "
                         "(set before the kernels are imported)")
    return impl


def draw_randomness(
    cu_num_draft_tokens: torch.Tensor,  # [B]
    vocab_size: int,
    generators: dict[int, torch.Generator] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Host-side draws for `acceptance_sample`: `uniforms [T]` fp64 and `exp_noise [B, V]` fp32.

    Requests listed in `generators` (request index -> `torch.Generator` on the same device) draw
    their own uniforms, then their noise vector, from it, so a seeded request's tokens do not
    depend on its batch neighbours (vLLM V1's per-request seeding).
    """
    dev = cu_num_draft_tokens.device
    cu = cu_num_draft_tokens.long().tolist()
    B = len(cu)
    uniforms = torch.rand(cu[-1] if B else 0, dtype=torch.float64, device=dev)
    exp_noise = torch.empty(B, vocab_size, dtype=torch.float32, device=dev).exponential_()
    for b, gen in (generators or {}).items():
        s = cu[b - 1] if b else 0
        uniforms[s:cu[b]].uniform_(generator=gen)
        exp_noise[b].exponential_(generator=gen)
    return uniforms, exp_noise


def acceptance_sample(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    bonus_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    is_greedy: torch.Tensor,
    uniforms: torch.Tensor,
    exp_noise: torch.Tensor,
    method: str = "token",
    impl: str = "auto",
    *,
    max_num_draft_tokens: int | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Verify the drafts of every request and emit the accepted prefix plus one sampled token.

    Args:
        draft_token_ids: `[T]` int64 (or int32) drafts, request-major.
        cu_num_draft_tokens: `[B]` int32/int64 cumulative draft counts; request `b` owns rows
            `cu[b-1]:cu[b]` and may own none.
        target_probs: `[T, V]` fp32 target distribution at each draft position (already
            temperature / top-k / top-p processed and softmaxed).
        bonus_probs: `[B, V]` fp32 target distribution after each request's last draft.
        draft_probs: `[T, V]` fp32 draft distributions, or None for one-hot drafts (greedy or
            n-gram drafters).
        is_greedy: `[B]` bool; greedy requests match drafts against the target argmax.
        uniforms: `[T]` fp64 in `[0, 1)`, the acceptance draws.
        exp_noise: `[B, V]` fp32 Exp(1) noise, one vector per request (the race
            `argmax(weights / exp_noise)` draws the single resampled or bonus token).
        method: "token" (Leviathan et al.) or "block" (Sun et al. block verification).
        impl: "auto" (Triton on CUDA, the vectorised torch path otherwise), "triton",
            "torch" or "reference" (the looped spec). Triton on CPU needs TRITON_INTERPRET=1.
        max_num_draft_tokens: `max_K`, if the caller knows it (vLLM's `max_spec_len`); saves a
            device-to-host sync. Trusted when given.
        validate: check values (finite non-negative probabilities and noise, draft ids in range,
            consistent `cu_num_draft_tokens`). Costs one read of every input and a sync on
            CUDA; shapes, dtypes and contiguity are always checked.

    Returns:
        `[B, max_K + 1]` int32: request `b` emits `a_b + 1` tokens (its `a_b` accepted drafts,
        then the resampled or bonus token), `-1` after.

    Raises:
        ValueError: naming the argument with a bad dtype, shape, layout or (validate) value.

    Examples:
        >>> p = torch.tensor([[0.5, 0.5], [0.2, 0.8]])
        >>> acceptance_sample(
        ...     torch.tensor([0]), torch.tensor([1]), p[:1], p[1:], None,
        ...     torch.tensor([True]), torch.tensor([0.3], dtype=torch.float64),
        ...     torch.ones(1, 2))
        tensor([[0, 1]], dtype=torch.int32)
    """
    auto, impl = impl == "auto", _resolve(impl, target_probs.device)
    if auto and impl == "torch" and bonus_probs.shape[0] == 1 and bonus_probs.shape[1] <= _SMALL_VOCAB:
        impl = "reference"  # one request, small vocab: the loop beats the vectorised setup
    args = (draft_token_ids, cu_num_draft_tokens, target_probs, bonus_probs, draft_probs,
            is_greedy, uniforms, exp_noise, method)
    kw = dict(max_num_draft_tokens=max_num_draft_tokens, validate=validate)
    if impl == "triton":
        from vllm_specx.ops.acceptance.kernel import acceptance_sample_triton  # lazy: CPU paths

        return acceptance_sample_triton(*args, **kw)
    if impl == "torch":
        return acceptance_sample_torch(*args, **kw)
    return acceptance_sample_reference(*args, **kw)
