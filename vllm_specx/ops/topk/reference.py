"""Pure-PyTorch spec of row-wise top-k selection as the sparse-attention indexer uses it.

This is the contract the Triton kernel in `kernel.py` meets exactly (same index sets, same order).
It is not fast: it sorts every row in full, which is what the kernel exists to avoid.
"""

import torch


def topk_reference(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""Indices of the `k` largest entries of every row, ascending, `-1` padded.

    For row `r`, entry `j` is a *candidate* iff

        j < lengths[r]  and  scores[r, j] > -inf          (so -inf and NaN are never chosen)

    Let `n_r` be the number of candidates. The row selects `m_r = min(k, n_r)` candidates: every
    candidate strictly greater than the `m_r`-th largest value `v`, then the candidates equal to
    `v` in ascending index order until `m_r` are taken (ties go to the lower index; `-0.0` and
    `+0.0` are equal). The selected indices are written in ascending index order to
    `out[r, :m_r]` and `out[r, m_r:] = -1`.

    Args:
        scores: `[R, S]`, fp32 / bf16 / fp16 (compared in fp32, which is exact for all three).
        k: number of indices per row, `k >= 0`; `k > S` or `k > n_r` pads with `-1`.
        lengths: optional `[R]` int, valid prefix length of every row (default: `S`).

    Returns:
        `[R, k]` int32 indices into the last dim of `scores`.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    num_rows, row_len = scores.shape
    x = scores.float()
    col = torch.arange(row_len, device=scores.device)
    valid = x > float("-inf")  # also drops NaN
    if lengths is not None:
        valid &= col[None, :] < lengths.to(scores.device).long()[:, None]
    # -inf for non-candidates; +0.0 for -0.0 so both zeros tie. A stable descending sort puts
    # equal values in ascending index order, which is exactly the tie rule above.
    x = torch.where(valid, x + 0.0, float("-inf"))
    order = torch.sort(x, dim=1, descending=True, stable=True).indices[:, : min(k, row_len)]
    n_take = valid.sum(dim=1).clamp(max=k)  # m_r
    taken = torch.arange(order.shape[1], device=scores.device)[None, :] < n_take[:, None]
    # Sort the chosen indices ascending; the sentinel `row_len` marks unused slots.
    chosen = torch.where(taken, order, row_len).sort(dim=1).values
    out = torch.full((num_rows, k), -1, dtype=torch.int32, device=scores.device)
    out[:, : chosen.shape[1]] = torch.where(chosen == row_len, -1, chosen).int()
    return out
