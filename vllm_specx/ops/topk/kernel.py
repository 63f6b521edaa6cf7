"""Triton row-wise top-k by radix select: no sort, a fixed number of passes over each row.

Every score is mapped to an order-preserving 32-bit key. Four histogram passes (8 bits each) pin
down the key `T` of the k-th largest candidate, one byte at a time, and how many candidates equal
to `T` must still be taken (`k_tie`). A count pass and a write pass then emit every candidate
`> T` plus the first `k_tie` candidates `== T`, in ascending index order, so the result equals
`topk_reference` exactly. Each row is split over `num_splits` programs (grid `[R, num_splits]`);
the passes are separate launches because each needs the previous pass's histogram of the whole
row, and each program re-derives the threshold prefix from those tiny histograms itself.

Work per row: 6 reads of the row (4 histogram + count + write), no sort, `O(S + 256 * passes)`.
"""

import torch
import triton
import triton.language as tl

from vllm_specx.ops._triton_utils import check_tensor, interpreter_compat, interpreter_mode, next_pow2

if interpreter_mode():
    interpreter_compat()  # Triton 3.6's interpreter with numpy >= 2.4

# 8-bit digits: 4 passes over 32-bit keys, 256-bin histograms. Globals read inside kernels
# must be constexpr.
NUM_BINS: tl.constexpr = tl.constexpr(256)
NUM_PASSES: tl.constexpr = tl.constexpr(4)


@triton.jit
def _float_key(x):
    """Order-preserving fp32 -> uint32 map: `a < b` iff `key(a) < key(b)` (for non-NaN)."""
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 -> +0.0: the two zeros must tie, as in the reference
    bits = x.to(tl.uint32, bitcast=True)
    # Negative floats order backwards by bit pattern: flip all bits; positives: set the sign bit.
    return tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)  # not ~bits: Triton 3.6's interpreter overflows it


@triton.jit
def _load_keys(x_ptr, cols, end):
    """Keys and candidate mask of `x_ptr[cols]`: candidates are `cols < end` and `x > -inf`."""
    x = tl.load(x_ptr + cols, mask=cols < end, other=float("-inf")).to(tl.float32)
    return _float_key(x), (cols < end) & (x > float("-inf"))  # NaN > -inf is False: dropped


@triton.jit
def _radix_digit_kernel(
    hist_ptr,  # [R, NUM_PASSES, NUM_BINS] int32, passes 0..PASS complete
    state_ptr,  # [R, 2] int64: (threshold-key prefix so far, candidates still to take)
    k,
    PASS: tl.constexpr,
):
    """After pass PASS: fix the next 8 bits of the threshold key `T` (grid `[R]`)."""
    row = tl.program_id(0)
    bins = tl.arange(0, NUM_BINS)
    hist = tl.load(hist_ptr + row.to(tl.int64) * (NUM_PASSES * NUM_BINS) + PASS * NUM_BINS + bins)
    total = tl.sum(hist)
    if PASS == 0:
        prefix = tl.full((), 0, tl.int64)
        k_rem = tl.minimum(total, k).to(tl.int64)  # rows with fewer than k candidates take all
    else:
        prefix = tl.load(state_ptr + row * 2)
        k_rem = tl.load(state_ptr + row * 2 + 1)
    ge = total - tl.cumsum(hist, 0) + hist  # candidates whose digit is >= d (non-increasing)
    digit = tl.sum((ge >= k_rem).to(tl.int32)) - 1  # the largest d with ge[d] >= k_rem
    n_above = tl.sum(tl.where(bins == digit, ge - hist, 0))  # candidates strictly above it
    # k_rem stays >= 1 while the row has candidates (n_above < k_rem by the choice of digit).
    tl.store(state_ptr + row * 2, (prefix << 8) | digit)
    tl.store(state_ptr + row * 2 + 1, k_rem - n_above)


@triton.jit
def _row_end(len_ptr, row, S, HAS_LEN: tl.constexpr):
    if HAS_LEN:
        return tl.minimum(tl.load(len_ptr + row), S)
    return S


@triton.jit
def _radix_hist_kernel(
    x_ptr,  # [R, S] scores (fp32 / bf16 / fp16), row stride `stride_x`
    len_ptr,  # [R] int32 valid prefix per row (HAS_LEN)
    hist_ptr,  # [R, NUM_PASSES, NUM_BINS] int32, zeroed; this pass adds into hist[:, PASS]
    state_ptr,  # [R, 2] int64 from _radix_digit_kernel (read when PASS > 0)
    S,
    stride_x,
    CHUNK,  # columns per program; a multiple of BLOCK
    HAS_LEN: tl.constexpr,
    PASS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row, split = tl.program_id(0), tl.program_id(1)
    end = _row_end(len_ptr, row, S, HAS_LEN)
    prefix = tl.load(state_ptr + row * 2).to(tl.uint32)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    acc = tl.zeros((NUM_BINS,), tl.int32)
    for start in range(split * CHUNK, tl.minimum(split * CHUNK + CHUNK, end), BLOCK):
        key, ok = _load_keys(x_row, start + tl.arange(0, BLOCK), end)
        if PASS > 0:  # only candidates that share the already-fixed high digits
            ok &= (key >> (32 - 8 * PASS)) == prefix
        digit = ((key >> (24 - 8 * PASS)) & 0xFF).to(tl.int32)
        acc += tl.histogram(digit, NUM_BINS, mask=ok)
    hist_row = hist_ptr + row.to(tl.int64) * (NUM_PASSES * NUM_BINS) + PASS * NUM_BINS
    tl.atomic_add(hist_row + tl.arange(0, NUM_BINS), acc)


@triton.jit
def _radix_count_kernel(
    x_ptr,  # [R, S] scores
    len_ptr,  # [R] int32 (HAS_LEN)
    state_ptr,  # [R, 2] int64: (T, k_tie) after the last pass
    counts_ptr,  # [R, num_splits, 2] int32: (# > T, # == T) in this program's chunk
    S,
    stride_x,
    CHUNK,
    HAS_LEN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row, split = tl.program_id(0), tl.program_id(1)
    end = _row_end(len_ptr, row, S, HAS_LEN)
    thresh = tl.load(state_ptr + row * 2).to(tl.uint32)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    n_gt = tl.zeros((BLOCK,), tl.int32)
    n_eq = tl.zeros((BLOCK,), tl.int32)
    for start in range(split * CHUNK, tl.minimum(split * CHUNK + CHUNK, end), BLOCK):
        key, ok = _load_keys(x_row, start + tl.arange(0, BLOCK), end)
        n_gt += (ok & (key > thresh)).to(tl.int32)
        n_eq += (ok & (key == thresh)).to(tl.int32)
    out = counts_ptr + (row * tl.num_programs(1) + split).to(tl.int64) * 2
    tl.store(out, tl.sum(n_gt))
    tl.store(out + 1, tl.sum(n_eq))


@triton.jit
def _radix_write_kernel(
    x_ptr,  # [R, S] scores
    len_ptr,  # [R] int32 (HAS_LEN)
    state_ptr,  # [R, 2] int64: (T, k_tie)
    counts_ptr,  # [R, num_splits, 2] int32 from _radix_count_kernel
    out_ptr,  # [R, k] int32, pre-filled with -1
    k,
    S,
    stride_x,
    CHUNK,
    HAS_LEN: tl.constexpr,
    SPLITS_PAD: tl.constexpr,  # next power of two >= num_splits
    BLOCK: tl.constexpr,
):
    row, split = tl.program_id(0), tl.program_id(1)
    end = _row_end(len_ptr, row, S, HAS_LEN)
    thresh = tl.load(state_ptr + row * 2).to(tl.uint32)
    k_tie = tl.load(state_ptr + row * 2 + 1).to(tl.int32)
    # Exclusive prefix over the programs to the left gives this chunk's first output slot.
    prev = tl.arange(0, SPLITS_PAD)
    counts_row = counts_ptr + row.to(tl.int64) * tl.num_programs(1) * 2
    n_gt = tl.sum(tl.load(counts_row + prev * 2, mask=prev < split, other=0))
    n_eq = tl.sum(tl.load(counts_row + prev * 2 + 1, mask=prev < split, other=0))
    x_row = x_ptr + row.to(tl.int64) * stride_x
    for start in range(split * CHUNK, tl.minimum(split * CHUNK + CHUNK, end), BLOCK):
        cols = start + tl.arange(0, BLOCK)
        key, ok = _load_keys(x_row, cols, end)
        gt = (ok & (key > thresh)).to(tl.int32)
        eq = (ok & (key == thresh)).to(tl.int32)
        gt_before = n_gt + tl.cumsum(gt, 0) - gt  # row-wide counts strictly left of each column
        eq_before = n_eq + tl.cumsum(eq, 0) - eq
        take = (gt > 0) | ((eq > 0) & (eq_before < k_tie))  # ties: the leftmost k_tie win
        slot = gt_before + tl.minimum(eq_before, k_tie)  # selected columns left of this one
        tl.store(out_ptr + row.to(tl.int64) * k + slot, cols, mask=take)
        n_gt += tl.sum(gt)
        n_eq += tl.sum(eq)


def topk_triton(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None = None,
    *,
    block: int | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Triton twin of `topk_reference` (same contract, identical output).

    Args:
        scores: `[R, S]` fp32 / bf16 / fp16, unit stride along S.
        k: indices per row, `k >= 0`.
        lengths: optional `[R]` int32 valid prefix per row.
        block: columns per vector step (power of two; tuning / tests).
        num_splits: programs per row (tuning / tests); default keeps ~1024 programs in flight.

    Returns:
        `[R, k]` int32, ascending within each row, `-1` padded.
    """
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an int >= 0, got {k!r}")
    check_tensor(
        "scores", scores, ndim=2, dtypes=(torch.float32, torch.bfloat16, torch.float16),
        contiguous=False,
    )
    if scores.shape[1] > 1 and scores.stride(1) != 1:
        raise ValueError("scores must have unit stride along its last dim")
    num_rows, row_len = scores.shape
    if lengths is not None:
        check_tensor("lengths", lengths, ndim=1, dtypes=(torch.int32,), device=scores.device)
        if lengths.shape[0] != num_rows:
            raise ValueError(f"lengths must have shape ({num_rows},), got {tuple(lengths.shape)}")
    out = torch.full((num_rows, k), -1, dtype=torch.int32, device=scores.device)
    if num_rows == 0 or row_len == 0 or k == 0:
        return out

    block = block or min(1024, max(16, next_pow2(row_len)))
    if block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    num_blocks = triton.cdiv(row_len, block)
    # Enough programs to fill a GPU when there are few rows, at most one per block.
    splits = min(num_blocks, num_splits or max(1, 1024 // num_rows))
    chunk = triton.cdiv(num_blocks, splits) * block
    splits = triton.cdiv(row_len, chunk)

    hist = torch.zeros(num_rows, NUM_PASSES, NUM_BINS, dtype=torch.int32, device=scores.device)
    state = torch.zeros(num_rows, 2, dtype=torch.int64, device=scores.device)
    counts = torch.empty(num_rows, splits, 2, dtype=torch.int32, device=scores.device)
    has_len = lengths is not None
    len_arg = lengths if has_len else out  # unused pointer when HAS_LEN is False
    grid = (num_rows, splits)
    stride = scores.stride(0)
    for p in range(NUM_PASSES):
        _radix_hist_kernel[grid](
            scores, len_arg, hist, state, row_len, stride, chunk,
            HAS_LEN=has_len, PASS=p, BLOCK=block,
        )
        _radix_digit_kernel[(num_rows,)](hist, state, k, PASS=p)
    _radix_count_kernel[grid](
        scores, len_arg, state, counts, row_len, stride, chunk, HAS_LEN=has_len, BLOCK=block
    )
    _radix_write_kernel[grid](
        scores, len_arg, state, counts, out, k, row_len, stride, chunk,
        HAS_LEN=has_len, SPLITS_PAD=next_pow2(splits), BLOCK=block,
    )
    return out
