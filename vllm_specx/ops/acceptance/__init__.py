"""Lossless acceptance sampling for speculative decoding (token-wise and block verification).

`acceptance_sample()` verifies the drafts of a flattened ragged batch (vLLM V1's layout) against
the target distributions and returns vLLM V1's `[B, max_K + 1]` int32 `-1`-padded output. All
randomness is injected (uniforms, one Exp(1) vector per request), so the three implementations
return identical token ids: the Python reference (`reference.py`, the spec; its docstring holds the
exact formulas), the vectorised PyTorch path (`torch_path.py`, the CPU default) and the Triton
kernels (`kernel.py`, the CUDA default). Each implementation takes one `AcceptanceInputs` bundle;
`acceptance_sample` builds it from its arguments. Nothing here imports vLLM; in serving,
`vllm_specx/sample/rejection_sampler.py` calls `acceptance_sample` and `draw_exp_noise` from
inside vLLM's V1 `RejectionSampler`.
"""

from collections.abc import Mapping

import torch

from vllm_specx.ops._triton_utils import resolve_impl
from vllm_specx.ops.acceptance.reference import (
    METHODS,
    AcceptanceInputs,
    acceptance_sample_reference,
    block_thresholds,
)
from vllm_specx.ops.acceptance.torch_path import acceptance_sample_torch

__all__ = [
    "IMPLS",
    "METHODS",
    "AcceptanceInputs",
    "acceptance_sample",
    "acceptance_sample_reference",
    "acceptance_sample_torch",
    "block_thresholds",
    "draw_exp_noise",
    "draw_randomness",
]

IMPLS = ("auto", "triton", "torch", "reference")
# Measured on 2 CPU cores (benchmarks/bench_acceptance.py): for a single request the looped
# reference is faster than the vectorised path up to V = 32000 (0.16 vs 0.23 ms at V = 2048,
# 0.22 vs 0.29 ms at 32000) and slower at 152064.
_SMALL_VOCAB = 65536


def draw_exp_noise(
    batch: int,
    vocab: int,
    generators: Mapping[int, torch.Generator] | None,
    device: torch.device | str,
) -> torch.Tensor:
    """`[batch, vocab]` fp32 Exp(1) noise for the race, as `-log(U)`: the one host noise sampler.

    Rows of the requests listed in `generators` (request index -> `torch.Generator` on `device`)
    are drawn from their own generator, so a seeded request does not depend on its batch
    neighbours (vLLM V1's per-request seeding); the other rows come from the default generator.
    Serving (`vllm_specx/sample/rejection_sampler.py`) and `draw_randomness` both draw here.

    U is float64 (multiples of 2^-53), so the noise's tail is exact down to probabilities far
    below anything a float32 race can resolve (a float32 U stops at 2^-24 and undersamples tokens
    of probability ~1e-7); U = 0 (probability 2^-53) gives +inf, a zero key in the race. On CPU
    this is about 3.3x faster than `Tensor.exponential_` (measured on 2 cores: 11.8 vs 39.1 ms
    for 64 x 32000; float32 U: 7.0 ms).
    """
    noise = torch.rand(batch, vocab, dtype=torch.float64, device=device)
    for i, gen in (generators or {}).items():
        noise[i] = torch.rand(vocab, dtype=torch.float64, device=device, generator=gen)
    return noise.log_().neg_().float()


def draw_randomness(
    cu_num_draft_tokens: torch.Tensor,  # [B]
    vocab_size: int,
    generators: Mapping[int, torch.Generator] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Host-side draws for `acceptance_sample`: `uniforms [T]` fp64 and `exp_noise [B, V]` fp32.

    Requests listed in `generators` (request index -> `torch.Generator` on the same device) draw
    their own uniforms, then their noise vector, from it, so a seeded request's tokens do not
    depend on its batch neighbours (vLLM V1's per-request seeding). The noise is
    `draw_exp_noise`'s (see there for its float32 tail).
    """
    dev = cu_num_draft_tokens.device
    cu = cu_num_draft_tokens.long().tolist()
    B = len(cu)
    uniforms = torch.rand(cu[-1] if B else 0, dtype=torch.float64, device=dev)
    for b, gen in (generators or {}).items():
        s = cu[b - 1] if b else 0
        uniforms[s:cu[b]].uniform_(generator=gen)
    return uniforms, draw_exp_noise(B, vocab_size, generators, dev)


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
        draft_token_ids, cu_num_draft_tokens, target_probs, bonus_probs, draft_probs, is_greedy,
        uniforms, exp_noise: the eight fields of `AcceptanceInputs`, in its order (shapes,
            dtypes and meaning are documented there).
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
    auto = impl == "auto"
    impl = resolve_impl(impl, target_probs.device, IMPLS, cpu_default="torch")
    if auto and impl == "torch" and bonus_probs.shape[0] == 1 and bonus_probs.shape[1] <= _SMALL_VOCAB:
        impl = "reference"  # one request, small vocab: the loop beats the vectorised setup
    inputs = AcceptanceInputs(draft_token_ids, cu_num_draft_tokens, target_probs, bonus_probs,
                              draft_probs, is_greedy, uniforms, exp_noise)
    kw = dict(max_num_draft_tokens=max_num_draft_tokens, validate=validate)
    if impl == "triton":
        from vllm_specx.ops.acceptance.kernel import acceptance_sample_triton  # lazy: CPU paths

        return acceptance_sample_triton(inputs, method, **kw)
    if impl == "torch":
        return acceptance_sample_torch(inputs, method, **kw)
    return acceptance_sample_reference(inputs, method, **kw)
