"""Row-wise top-k selection for sparse attention (`-1` padded, ascending indices).

`topk()` runs the Triton radix select on CUDA and the PyTorch reference elsewhere; `impl` forces
either. The contract (candidates, tie rule, padding) is the docstring of `reference.topk_reference`.
"""

import torch

from vllm_specx.ops._triton_utils import resolve_impl
from vllm_specx.ops.topk.reference import topk_reference

__all__ = ["topk", "topk_reference"]


def topk(
    scores: torch.Tensor, k: int, lengths: torch.Tensor | None = None, *, impl: str = "auto"
) -> torch.Tensor:
    """Indices of the `k` largest candidates of every row.

    Args:
        scores: `[R, S]` fp32 / bf16 / fp16; `-inf` and NaN entries are never chosen.
        k: indices per row.
        lengths: optional `[R]` int32, valid prefix of every row.
        impl: "auto" (Triton on CUDA, reference otherwise), "triton" or "reference".

    Returns:
        `[R, k]` int32, ascending within a row, ties to the lower index, `-1` padded.

    Examples:
        >>> topk(torch.tensor([[0.5, 2.0, 1.0, 2.0]]), 2)
        tensor([[1, 3]], dtype=torch.int32)
    """
    if resolve_impl(impl, scores.device) == "triton":
        from vllm_specx.ops.topk.kernel import topk_triton  # lazy: no Triton import on CPU paths

        return topk_triton(scores, k, lengths)
    return topk_reference(scores, k, lengths)
