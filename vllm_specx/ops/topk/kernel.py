"""Triton row-wise top-k: a radix select per (row, chunk) in one program, no sort, no host sync.

Every score maps to an order-preserving 32-bit key. One program owns a row (or one chunk of a
long row) and does the whole select itself, the way vLLM's `persistent_topk` gives a row to one
CTA: a histogram of the keys' top `RADIX_BITS` bits (2,048 bins at 11 bits) over its columns, a
scan of the bins for the one that holds the k-th largest key, then again on the next bits, but
only over the keys in that bin, until the bin holds exactly the keys still to take (usually
after two passes; ties may need the last). A final pass emits every key above the bin and the
first of the bin's keys in column order, so the output is ascending and equals
`topk_reference` exactly (ties to the lower index). Chunks with at most k candidates skip the
histograms and emit all of them.

Launches: one when a row is one chunk (decode: few rows, or short rows). Long rows with few rows
are split into `num_splits` chunks so the GPU fills up; each chunk keeps its own top-k (keys and
columns, the union holds the row's top-k: an entry outranked by k others in its chunk is
outranked by them in the row) and a second launch selects k of the `num_splits * k` candidates
with the same program. The `-1` padding is written by the kernel: nothing else is launched, and
nothing is read back to the host, so a call can be captured in a CUDA graph.

Work per chunk: 1 histogram read (+1 or 2 over the same columns, from L2, when the first bin is
not decisive) and 1 emission read.
"""

import math

import torch
import triton
import triton.language as tl

from vllm_specx.ops._triton_utils import check_tensor, interpreter_compat, interpreter_mode

if interpreter_mode():
    interpreter_compat()  # Triton 3.4/3.6's interpreter with numpy >= 2.4

RADIX_BITS = 11  # bits fixed per histogram pass (vLLM's and FlashInfer's 2,048-bin histogram)
HIST_BINS: tl.constexpr = tl.constexpr(2048)  # histogram width; a pass uses 2**BITS of them


@triton.jit
def _float_key(x):
    """Order-preserving fp32 -> uint32 map: `a < b` iff `key(a) < key(b)` (for non-NaN)."""
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 -> +0.0: the two zeros must tie, as in the reference
    bits = x.to(tl.uint32, bitcast=True)
    # Negative floats order backwards by bit pattern: flip all bits; positives: set the sign bit.
    return tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)  # not ~bits: Triton 3.6's interpreter overflows it


NOT_A_KEY: tl.constexpr = tl.constexpr(0)  # a stored key below key(-inf) = 0x007FFFFF: no candidate
NEG_INF_KEY: tl.constexpr = tl.constexpr(0x007FFFFF)


@triton.jit
def _load(x_row, key_row, col_row, pos, hi, FROM_CANDS: tl.constexpr):
    """(key, is a candidate, column) at positions `pos` (< hi) of a program's range: scores of a
    row (candidates: `x > -inf`, so NaN and -inf never count), a first launch's candidates
    (key and column; `column < 0` marks a padding slot), or (FROM_CANDS == 2) keys a program
    stored for its own columns (`key_row + pos`, column `pos`; `NOT_A_KEY` marks no candidate)."""
    inside = pos < hi
    if FROM_CANDS == 2:
        key = tl.load(key_row + pos, mask=inside, other=0).to(tl.uint32, bitcast=True)
        return key, inside & (key > NEG_INF_KEY), pos
    if FROM_CANDS:
        col = tl.load(col_row + pos, mask=inside, other=-1)
        key = tl.load(key_row + pos, mask=inside, other=0).to(tl.uint32, bitcast=True)
        return key, col >= 0, col
    x = tl.load(x_row + pos, mask=inside, other=float("-inf")).to(tl.float32)
    return _float_key(x), inside & (x > float("-inf")), pos


@triton.jit
def _digit_pass(x_row, key_row, col_row, lo, hi, prefix, k_rem,
                SHIFT: tl.constexpr, WIDTH: tl.constexpr, FIRST: tl.constexpr,
                FROM_CANDS: tl.constexpr, BLOCK: tl.constexpr):
    """One radix pass over [lo, hi): the histogram of key bits [SHIFT, SHIFT + WIDTH) among the
    candidates whose higher bits equal `prefix`, then the digit of the bin that holds the
    `k_rem`-th largest of them. Returns (prefix extended by that digit, keys still to take inside
    the bin, keys in the bin)."""
    acc = tl.zeros((HIST_BINS,), tl.int32)
    for start in range(lo, hi, BLOCK):
        key, ok, _ = _load(x_row, key_row, col_row, start + tl.arange(0, BLOCK), hi, FROM_CANDS)
        if not FIRST:
            ok &= (key >> (SHIFT + WIDTH)) == prefix
        digit = ((key >> SHIFT) & ((1 << WIDTH) - 1)).to(tl.int32)
        acc += tl.histogram(digit, HIST_BINS, mask=ok)
    return _pick_digit(acc, prefix, k_rem, WIDTH, FIRST)


@triton.jit
def _pick_digit(acc, prefix, k_rem, WIDTH: tl.constexpr, FIRST: tl.constexpr):
    """From one pass's histogram `acc`: the digit of the bin that holds the `k_rem`-th largest
    key; (prefix extended by it, keys still to take inside the bin, keys in the bin)."""
    bins = tl.arange(0, HIST_BINS)
    total = tl.sum(acc)
    if FIRST:
        k_rem = tl.minimum(total, k_rem)  # a chunk with fewer than k candidates takes them all
    ge = total - tl.cumsum(acc, 0) + acc  # keys whose digit is >= d (non-increasing in d)
    digit = tl.sum((ge >= k_rem).to(tl.int32)) - 1  # the largest d with ge[d] >= k_rem
    n_above = tl.sum(tl.where(bins == digit, ge - acc, 0))  # keys strictly above that bin
    in_bin = tl.sum(tl.where(bins == digit, acc, 0))
    return (prefix << WIDTH) | digit.to(tl.uint32), k_rem - n_above, in_bin


@triton.jit
def _radix_step(x_row, key_row, col_row, lo, hi, prefix, k_rem, lo_key, hi_key, active,
                P: tl.constexpr, BITS: tl.constexpr, FROM_CANDS: tl.constexpr, BLOCK: tl.constexpr):
    """Pass P (while `active`): key bits [SHIFT, SHIFT + WIDTH), BITS at a time from the top and
    the rest last; the threshold bin's key range [lo_key, hi_key], and whether it must be split."""
    SHIFT: tl.constexpr = (32 - BITS * (P + 1)) * (BITS * (P + 1) <= 32)
    WIDTH: tl.constexpr = 32 - BITS * P - SHIFT
    if BITS * P < 32:
        if active:
            prefix, k_rem, in_bin = _digit_pass(x_row, key_row, col_row, lo, hi, prefix, k_rem,
                                                SHIFT, WIDTH, P == 0, FROM_CANDS, BLOCK)
            lo_key = prefix << SHIFT
            hi_key = lo_key | ((1 << SHIFT) - 1)
            active = in_bin != k_rem  # the bin's keys are all taken: no need to split it
    return prefix, k_rem, lo_key, hi_key, active


@triton.jit
def _topk_kernel(
    x_ptr,  # [R, S] scores (fp32 / bf16 / fp16), row stride `stride_x` (not FROM_CANDS)
    len_ptr,  # [R] int32 valid prefix per row (HAS_LEN)
    key_in_ptr,  # [R, N_IN] int32 keys (FROM_CANDS: the first launch's candidates)
    col_in_ptr,  # [R, N_IN] int32 columns, -1 = empty (FROM_CANDS)
    out_ptr,  # [R, num_programs(1), k] int32 columns, ascending, -1 padded
    key_out_ptr,  # [R, num_programs(1), k] int32 keys of the written columns (WRITE_KEYS)
    S,
    stride_x,
    CHUNK,  # columns per program (a multiple of BLOCK)
    N_IN,
    k,
    HAS_LEN: tl.constexpr,
    FROM_CANDS: tl.constexpr,
    WRITE_KEYS: tl.constexpr,
    BITS: tl.constexpr,  # radix bits per pass: 8 (4 passes) or 11 (3 passes)
    BLOCK: tl.constexpr,
    KBLOCK: tl.constexpr,
):
    row, split = tl.program_id(0).to(tl.int64), tl.program_id(1)
    x_row, key_row, col_row = x_ptr, key_in_ptr + row * N_IN, col_in_ptr + row * N_IN
    if FROM_CANDS:
        lo, hi = 0, N_IN
    else:
        end = S
        if HAS_LEN:
            end = tl.minimum(tl.load(len_ptr + row), S)
        lo = split * CHUNK
        hi = tl.maximum(tl.minimum(lo + CHUNK, end), lo)  # a chunk past the row's length is empty
        x_row = x_ptr + row * stride_x
    # The selection is: every candidate with key > hi_key, then the first k_rem candidates with
    # lo_key <= key <= hi_key in column order. A chunk of at most k columns takes every candidate.
    lo_key = tl.full((), 0, tl.uint32)
    hi_key = tl.full((), 0xFFFFFFFF, tl.uint32)
    k_rem = tl.full((), 0, tl.int32) + k
    prefix = tl.full((), 0, tl.uint32)
    active = (hi - lo) > k
    for p in tl.static_range(4):
        prefix, k_rem, lo_key, hi_key, active = _radix_step(
            x_row, key_row, col_row, lo, hi, prefix, k_rem, lo_key, hi_key, active, p, BITS, FROM_CANDS, BLOCK)
    out_row = out_ptr + (row * tl.num_programs(1) + split) * k
    key_out_row = key_out_ptr + (row * tl.num_programs(1) + split) * k
    _emit(x_row, key_row, col_row, lo, hi, lo_key, hi_key, k_rem, out_row, key_out_row, k,
          FROM_CANDS, WRITE_KEYS, BLOCK, KBLOCK)


@triton.jit
def _emit(x_row, key_row, col_row, lo, hi, lo_key, hi_key, k_rem, out_row, key_out_row, k,
          FROM_CANDS: tl.constexpr, WRITE_KEYS: tl.constexpr, BLOCK: tl.constexpr, KBLOCK: tl.constexpr):
    """Write the selection in column order: every candidate with key > hi_key and the first
    k_rem with lo_key <= key <= hi_key; then -1 in the slots left of k."""
    n_gt = tl.full((), 0, tl.int32)
    n_eq = tl.full((), 0, tl.int32)
    for start in range(lo, hi, BLOCK):
        key, ok, col = _load(x_row, key_row, col_row, start + tl.arange(0, BLOCK), hi, FROM_CANDS)
        gt = (ok & (key > hi_key)).to(tl.int32)
        eq = (ok & (key >= lo_key) & (key <= hi_key)).to(tl.int32)
        eq_before = n_eq + tl.cumsum(eq, 0) - eq  # in-bin candidates left of each column
        take = (gt > 0) | ((eq > 0) & (eq_before < k_rem))  # ties: the leftmost k_rem win
        slot = n_gt + tl.cumsum(gt, 0) - gt + tl.minimum(eq_before, k_rem)  # taken left of it
        tl.store(out_row + slot, col, mask=take)
        if WRITE_KEYS:
            tl.store(key_out_row + slot, key.to(tl.int32, bitcast=True), mask=take)
        n_gt += tl.sum(gt)
        n_eq += tl.sum(eq)
    taken = n_gt + tl.minimum(n_eq, k_rem)
    for s in range(0, k, KBLOCK):
        slots = s + tl.arange(0, KBLOCK)
        tl.store(out_row + slots, tl.full((KBLOCK,), -1, tl.int32), mask=(slots >= taken) & (slots < k))


_SM_COUNT: dict = {}


def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (132 for an H100/H200 stand-in off CUDA)."""
    if device.type != "cuda":
        return 132
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _SM_COUNT:
        _SM_COUNT[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _SM_COUNT[i]


def default_splits(num_rows: int, row_len: int, k: int, sm_count: int) -> int:
    """Chunks per row: one unless the rows are long and too few to fill the GPU (two programs
    per SM); then at most ~sqrt(S / k), which keeps the second launch's `splits * k` candidates
    about as many as a chunk's columns."""
    if row_len <= 4 * max(k, 1024):
        return 1
    want = -(-2 * sm_count // max(1, num_rows))
    return max(1, min(want, math.isqrt(row_len // max(1, k))))


def topk_triton(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None = None,
    *,
    block: int | None = None,
    num_splits: int | None = None,
    radix_bits: int = RADIX_BITS,
    num_warps: int = 8,
) -> torch.Tensor:
    """Triton twin of `topk_reference` (same contract, identical output).

    Args:
        scores: `[R, S]` fp32 / bf16 / fp16, unit stride along S.
        k: indices per row, `k >= 0`.
        lengths: optional `[R]` int32 valid prefix per row.
        block: columns per vector step (power of two; tuning / tests).
        num_splits: chunks per row (tuning / tests); default `default_splits`.
        radix_bits: key bits fixed per histogram pass, 8 or 11 (tuning / tests).
        num_warps: warps per program (tuning).

    Returns:
        `[R, k]` int32, ascending within each row, `-1` padded.
    """
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an int >= 0, got {k!r}")
    if radix_bits not in (8, 11):
        raise ValueError(f"radix_bits must be 8 or 11, got {radix_bits!r}")
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
    if num_rows == 0 or row_len == 0 or k == 0:
        return torch.full((num_rows, k), -1, dtype=torch.int32, device=scores.device)

    # One tile width for every shape (short rows mask most of one tile). For sm_90 (`bench_dsa_
    # indexer.py --compile-only`) 1,024 columns at 8 warps take 128 registers under Triton 3.6
    # (the CUDA image's) and 64 under 3.9, no spills; at 4 warps 3.6 took 255 and spilled.
    block = block or 1024
    if block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    num_blocks = triton.cdiv(row_len, block)
    splits = min(num_blocks, num_splits or default_splits(num_rows, row_len, k, _sm_count(scores.device)))
    chunk = triton.cdiv(num_blocks, splits) * block
    splits = triton.cdiv(row_len, chunk)
    kblock = 1024
    has_len = lengths is not None
    dev = scores.device
    out = torch.empty(num_rows, k, dtype=torch.int32, device=dev)
    if splits == 1:
        _topk_kernel[(num_rows, 1)](
            scores, lengths if has_len else out, out, out, out, out, row_len, scores.stride(0), chunk, 0, k,
            HAS_LEN=has_len, FROM_CANDS=False, WRITE_KEYS=False, BITS=radix_bits, BLOCK=block,
            KBLOCK=kblock, num_warps=num_warps,
        )
        return out
    cand_col = torch.empty(num_rows, splits, k, dtype=torch.int32, device=dev)
    cand_key = torch.empty(num_rows, splits, k, dtype=torch.int32, device=dev)
    _topk_kernel[(num_rows, splits)](
        scores, lengths if has_len else out, out, out, cand_col, cand_key, row_len, scores.stride(0), chunk,
        0, k, HAS_LEN=has_len, FROM_CANDS=False, WRITE_KEYS=True, BITS=radix_bits, BLOCK=block,
        KBLOCK=kblock, num_warps=num_warps,
    )
    return merge_candidates(cand_key, cand_col, out, radix_bits=radix_bits, kblock=kblock, num_warps=num_warps)


def merge_candidates(cand_key, cand_col, out, *, radix_bits=RADIX_BITS, kblock=1024, num_warps=8):
    """The k best of each row's candidates into `out [R, k]` (one launch): `cand_key`/`cand_col`
    `[R, chunks, k]` int32 as a first launch wrote them (`WRITE_KEYS`; column -1 = empty), in
    ascending column order across chunks, so the result is ascending and ties go to the lower
    column."""
    num_rows, k = out.shape
    n_in = cand_col.shape[1] * k
    _topk_kernel[(num_rows, 1)](
        out, out, cand_key, cand_col, out, out, 0, 0, n_in, n_in, k,
        HAS_LEN=False, FROM_CANDS=True, WRITE_KEYS=False, BITS=radix_bits,
        BLOCK=1024, KBLOCK=kblock, num_warps=num_warps,
    )
    return out
