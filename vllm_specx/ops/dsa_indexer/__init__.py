"""DeepSeek Sparse Attention (DSA) indexer ops and the IndexShare cache for MTP drafting.

Each op runs its Triton kernel on CUDA and its PyTorch reference elsewhere (`impl` forces either;
the kernels also run on CPU under `TRITON_INTERPRET=1`). The maths, shapes and masking are
specified in `reference.py`'s module docstring. Nothing here imports vLLM.

* `indexer_logits_prefill` / `indexer_logits_decode`: causal logits `I(t, s)`, varlen or paged K.
* `indexer_topk_prefill` / `indexer_topk_decode`: the top-k key indices; on Triton, long contexts
  take a fused path that never writes the `[T, S]` logits (`kernel.choose_group`).
* `IndexShareCache`: compute the indices at draft step 0, reuse them at later draft steps.
"""

from collections.abc import Callable

import torch

from vllm_specx.ops._triton_utils import resolve_impl
from vllm_specx.ops.dsa_indexer import reference as _ref
from vllm_specx.ops.dsa_indexer.reference import (
    apply_partial_rope,
    prepare_indexer_k,
    prepare_indexer_q,
    prepare_indexer_weights,
    quantize_fp8_ue8m0,
    rope_cos_sin,
)

__all__ = [
    "IndexShareCache",
    "apply_partial_rope",
    "indexer_logits_decode",
    "indexer_logits_prefill",
    "indexer_topk_decode",
    "indexer_topk_prefill",
    "prepare_indexer_k",
    "prepare_indexer_q",
    "prepare_indexer_weights",
    "quantize_fp8_ue8m0",
    "rope_cos_sin",
]


def _kernel():
    from vllm_specx.ops.dsa_indexer import kernel  # lazy: no Triton import on CPU paths

    return kernel


def indexer_logits_prefill(q, k, weights, cu_seqlens_q, cu_seqlens_k, k_scale=None, *,
                           impl: str = "auto") -> torch.Tensor:
    """Causal varlen logits `[T, S_max]` fp32; args as `reference.indexer_logits_prefill_reference`
    (`q [T, H, D]`, `k [S_total, D]`, `weights [T, H]` fp32, `cu_seqlens_q/k [B+1]` int32,
    `k_scale [S_total]` fp32 or None)."""
    if resolve_impl(impl, q.device) == "triton":
        return _kernel().indexer_logits_prefill_triton(q, k, weights, cu_seqlens_q, cu_seqlens_k,
                                                       k_scale)
    return _ref.indexer_logits_prefill_reference(q, k, weights, cu_seqlens_q, cu_seqlens_k, k_scale)


def indexer_logits_decode(q, k_cache, weights, block_table, seq_lens, k_scale=None,
                          max_seq_len=None, *, impl: str = "auto") -> torch.Tensor:
    """Paged decode logits `[B, N, max_seq_len]` fp32; args as
    `reference.indexer_logits_decode_reference` (`q [B, N, H, D]`,
    `k_cache [num_pages, page_size, D]`, `weights [B, N, H]`, `block_table [B, max_pages]` and
    `seq_lens [B]` int32, `k_scale [num_pages, page_size]` or None)."""
    if resolve_impl(impl, q.device) == "triton":
        return _kernel().indexer_logits_decode_triton(q, k_cache, weights, block_table, seq_lens,
                                                      k_scale, max_seq_len)
    return _ref.indexer_logits_decode_reference(q, k_cache, weights, block_table, seq_lens,
                                                k_scale, max_seq_len)


def _no_chunk(chunk) -> None:
    if chunk is not None:
        raise ValueError(f"chunk={chunk}: a Triton path option; the reference has no chunks")


def indexer_topk_prefill(q, k, weights, cu_seqlens_q, cu_seqlens_k, topk: int, k_scale=None, *,
                         impl: str = "auto", group: int | None = None,
                         chunk: int | None = None) -> torch.Tensor:
    """`[T, topk]` int32 request-local key indices (ascending, `-1` padded) of the prefill logits.

    `group` (Triton only): None = choose by context length, 0 = materialise the logits,
    G > 0 = fused path with G keys per group. `chunk` (Triton only; refused by the reference):
    the per-chunk-candidates path with `chunk` keys per program.
    """
    if resolve_impl(impl, q.device) == "triton":
        return _kernel().indexer_topk_prefill_triton(q, k, weights, cu_seqlens_q, cu_seqlens_k,
                                                     topk, k_scale, group=group, chunk=chunk)
    _no_chunk(chunk)
    return _ref.indexer_topk_prefill_reference(q, k, weights, cu_seqlens_q, cu_seqlens_k, topk,
                                               k_scale)


def indexer_topk_decode(q, k_cache, weights, block_table, seq_lens, topk: int, k_scale=None, *,
                        impl: str = "auto", group: int | None = None,
                        chunk: int | None = None) -> torch.Tensor:
    """`[B, N, topk]` int32 request-local key indices of the paged decode logits (see
    `indexer_topk_prefill` for `group` and `chunk`)."""
    if resolve_impl(impl, q.device) == "triton":
        return _kernel().indexer_topk_decode_triton(q, k_cache, weights, block_table, seq_lens,
                                                    topk, k_scale, group=group, chunk=chunk)
    _no_chunk(chunk)
    return _ref.indexer_topk_decode_reference(q, k_cache, weights, block_table, seq_lens, topk,
                                              k_scale)


class IndexShareCache:
    """IndexShare for MTP drafting: run the indexer at draft step 0, reuse its top-k afterwards.

    This mirrors vLLM's `index_share_for_mtp_iteration`: the draft prefill (step 0) runs the
    indexer over every query row; each request keeps the row of its last query token (vLLM's
    `compact_topk_indices`); draft steps 1.. attend with those indices and skip the indexer and
    the top-k entirely. The indices are request-local positions chosen at step 0, so the keys
    written by later draft steps are not among them (as in vLLM).

    Examples:
        >>> share = IndexShareCache()
        >>> step0 = lambda: torch.tensor([[0, 1], [1, 2]])  # [T=2, k=2], runs the indexer
        >>> rows = share.get_or_compute(0, step0, keep_rows=torch.tensor([1]))
        >>> share.get_or_compute(1, lambda: 1 / 0)  # step 1 reuses step 0's last row
        tensor([[1, 2]])
    """

    def __init__(self) -> None:
        self.indices: torch.Tensor | None = None  # [B, k] int32, one row per request
        self.num_computed = 0
        self.num_reused = 0

    def get_or_compute(
        self,
        step: int,
        compute_fn: Callable[[], torch.Tensor],
        keep_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Indices for draft step `step`.

        Args:
            step: 0 runs `compute_fn`; any later step returns the cached rows.
            compute_fn: returns `[T, k]` int32 top-k indices for every query row of step 0.
            keep_rows: `[B]` int, the row of each request's last query token; None keeps all.

        Returns:
            step 0: the full `[T, k]` result (every step-0 row needs its own indices);
            step >= 1: the cached `[B, k]` rows.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if step == 0:
            indices = compute_fn()
            self.indices = indices if keep_rows is None else indices[keep_rows.long()]
            self.num_computed += 1
            return indices
        if self.indices is None:
            raise ValueError("IndexShareCache: step > 0 before step 0 computed the indices")
        self.num_reused += 1
        return self.indices

    def reset(self) -> None:
        """Forget the cached indices (new draft round or batch change)."""
        self.indices = None
