"""Triton DSA indexer: causal logits (varlen or paged K) and a fused logits -> top-k path.

`_indexer_logits_kernel` treats the (query token, head) pairs of `BLOCK_T` tokens as the rows of
one matrix product with a `[BLOCK_S, D]` key tile (all heads share one key: MQA), applies ReLU and
the head weights, and sums over heads. One program handles `T_PER_PROG` tokens of one request, so
each key tile is read once and reused by every token and head. The same kernel serves prefill
(keys concatenated per request) and decode (keys in a paged cache), chosen by `PAGED`.

The fused path never writes the `[T, S]` logits. It rests on one fact: if `G_max(j)` is the largest
logit of key group `j` (G consecutive keys), the top-k keys of a row all lie in the top-k groups by
`G_max` (each of the k best groups holds a key at least as large as the k-th best group max, so
the k-th best key is too; with lowest-index tie breaking at both levels the sets agree exactly).
So: (1) the logits kernel writes only group maxima `[T, S/G]`; (2) radix top-k picks k groups;
(3) `_indexer_gather_kernel` recomputes the k*G candidate logits; (4) the top-k merge picks k of them.
Extra work is k*G recomputed keys per row, so it pays off once `S >> k*G` (see `choose_group`).
Passes (1) and (3) may round the same logit differently (different MMA tile shapes), so keys
within rounding of the k-th score can differ from the materialised path; tests compare sets.

A third path (`chunk=`, `_indexer_chunk_topk_kernel`) keeps per-chunk candidates instead: one
program per (query row, chunk) selects its chunk's top-k from logits it has just computed (the
first radix histogram built as they are made), then one merge launch selects k of the chunks'
candidates. Opt-in until a GPU has timed it against the other two.

Every path takes each query row's request and causal key count from `_row_meta_kernel`, and the
kernels read key counts from `cu_seqlens_k` / `seq_lens` themselves: a call is its Triton launches
and allocations, no PyTorch op and (with the longest spans given) no host sync.
"""

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from vllm_specx.ops._triton_utils import check_shape, check_tensor, interpreter_compat, interpreter_mode, next_pow2

if interpreter_mode():
    interpreter_compat()  # Triton 3.6's interpreter with numpy >= 2.4
from vllm_specx.ops.topk.kernel import (
    HIST_BINS, NOT_A_KEY, RADIX_BITS, _emit, _float_key, _pick_digit, _radix_step, merge_candidates, topk_triton,
)

_FP8 = torch.float8_e4m3fn  # vLLM's indexer K cache (and q) dtype, with ue8m0 scales
_QK_DTYPES = (torch.float32, torch.bfloat16, torch.float16, _FP8)
_INT = (torch.int32,)


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """`a @ b` with fp32 accumulation.

    UPCAST (set only under TRITON_INTERPRET): Triton 3.9's interpreter multiplies bf16 operands
    as their raw uint16 bits. Upcasting first is exact (a bf16 x bf16 product fits in fp32), so
    the interpreter still checks the maths the GPU's bf16 MMA does, up to summation order.
    """
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _flat(x):
    """`[A, B]` -> `[A * B]`, row-major."""
    return tl.reshape(x, (x.shape[0] * x.shape[1],))


@triton.jit
def _key_rows(b, s, s_ok, kv_ptr, bt_ptr, stride_bt, PAGED: tl.constexpr, PAGE: tl.constexpr):
    """Physical K row of request `b`'s local keys `s`: a page lookup when PAGED, else an offset
    into the concatenated keys (`kv_ptr` is `cu_seqlens_k`)."""
    if PAGED:
        page = tl.load(bt_ptr + b * stride_bt + s // PAGE, mask=s_ok, other=0)
        return page.to(tl.int64) * PAGE + s % PAGE
    return tl.load(kv_ptr + b).to(tl.int64) + s


@triton.jit
def _kv_len(b, kv_ptr, PAGED: tl.constexpr):
    """Keys of request `b`: `seq_lens[b]` when PAGED, else `cu_seqlens_k[b + 1] - cu_seqlens_k[b]`
    (read here, so no launch computes the lengths)."""
    if PAGED:
        return tl.load(kv_ptr + b)
    return tl.load(kv_ptr + b + 1) - tl.load(kv_ptr + b)


@triton.jit
def _row_meta_kernel(
    cu_q_ptr,  # [B+1] int32 query offsets (q_per_req == 0)
    kv_ptr,  # cu_seqlens_k [B+1] | seq_lens [B] (PAGED) int32
    req_ptr,  # [T] int32 out: the request of each query row
    len_ptr,  # [T] int32 out: the keys a row may see, pos + 1 (its causal prefix)
    num_rows,
    num_reqs,
    n_steps,  # binary-search steps: num_reqs.bit_length()
    q_per_req,  # > 0: every request has this many query rows (decode); 0: varlen
    PAGED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Request and causal key count of every query row, in one launch (in PyTorch: `arange`,
    `searchsorted` and a dozen index and arithmetic ops, each a launch)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = rows < num_rows
    if q_per_req > 0:
        req = tl.where(ok, rows // q_per_req, 0)
        q_start = req * q_per_req
        q_len = tl.zeros((BLOCK,), tl.int32) + q_per_req
    else:  # the request whose [cu_q[b], cu_q[b + 1]) holds the row: #{b : cu_q[b + 1] <= row}
        lo = tl.zeros((BLOCK,), tl.int32)
        hi = tl.zeros((BLOCK,), tl.int32) + num_reqs
        for _ in range(n_steps):
            mid = (lo + hi) // 2
            live = ok & (lo < hi)
            right = tl.load(cu_q_ptr + mid + 1, mask=live, other=0) <= rows
            hi = tl.where(live & right, hi, tl.where(live, mid, hi))
            lo = tl.where(live & right, mid + 1, lo)
        req = tl.where(ok, lo, 0)
        q_start = tl.load(cu_q_ptr + req, mask=ok, other=0)
        q_len = tl.load(cu_q_ptr + req + 1, mask=ok, other=0) - q_start
    kv_len = _kv_len(req, kv_ptr, PAGED)
    tl.store(req_ptr + rows, req, mask=ok)
    tl.store(len_ptr + rows, kv_len - q_len + (rows - q_start) + 1, mask=ok)


@triton.jit
def _as_fp8(x, FP8: tl.constexpr):
    """fp8 (e4m3) data passed as its bytes (uint8: a masked load's zero is then +0.0, which
    Triton's interpreter cannot write as fp8) back to fp8."""
    if FP8:
        x = x.to(tl.float8e4nv, bitcast=True)
    return x


@triton.jit
def _load_k_tile(k_ptr, ks_ptr, rows, s_ok, D, HAS_K_SCALE: tl.constexpr, D_PAD: tl.constexpr,
                 K_FP8: tl.constexpr, K_TO_BF16: tl.constexpr):
    """`[BLOCK_S, D_PAD]` key tile (zeros where masked) and its `[BLOCK_S]` fp32 scale.
    K_FP8: an fp8 cache, read as fp8 (half the bytes of bf16); K_TO_BF16: widened on chip,
    exactly, for bf16 queries."""
    d = tl.arange(0, D_PAD)
    mask = s_ok[:, None] & (d < D)[None, :]
    k = _as_fp8(tl.load(k_ptr + rows[:, None] * D + d[None, :], mask=mask, other=0), K_FP8)
    if K_TO_BF16:
        k = k.to(tl.bfloat16)
    scale = tl.full(s_ok.shape, 1.0, tl.float32)
    if HAS_K_SCALE:
        scale = tl.load(ks_ptr + rows, mask=s_ok, other=0.0)
    return k, scale


@triton.jit
def _indexer_logits_kernel(
    q_ptr,  # [T, H, D] prepared queries, contiguous
    w_ptr,  # [T, H] fp32 scaled head weights
    k_ptr,  # flat [S_total, D] | paged [num_pages, PAGE, D]
    ks_ptr,  # k_scale: flat [S_total] | paged [num_pages, PAGE] fp32 (HAS_K_SCALE)
    out_ptr,  # [T, n_out] fp32: logits (GROUP == 1) or max over each group of GROUP keys
    cu_q_ptr,  # [B+1] int32 query offsets (q_per_req == 0)
    kv_ptr,  # cu_seqlens_k [B+1] | seq_lens [B] (PAGED) int32
    bt_ptr,  # [B, max_pages] int32 block table (PAGED only)
    stride_bt,
    n_out,  # columns of out
    q_per_req,  # > 0: every request has this many queries (decode); 0: offsets from cu_q
    H,
    D,
    PAGED: tl.constexpr,
    PAGE: tl.constexpr,
    HAS_K_SCALE: tl.constexpr,
    GROUP: tl.constexpr,
    T_PER_PROG: tl.constexpr,  # tokens per program (multiple of BLOCK_T); they share key tiles
    BLOCK_T: tl.constexpr,  # tokens per matrix product: its rows are BLOCK_T * H_PAD
    BLOCK_S: tl.constexpr,
    H_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
    PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (match the reference; no tf32)
    UPCAST: tl.constexpr,  # interpreter only, see _dot
    Q_FP8: tl.constexpr,  # q / K in fp8, passed as bytes (see _as_fp8)
    K_FP8: tl.constexpr,
    K_TO_BF16: tl.constexpr,  # fp8 K with bf16 q (see _load_k_tile)
    KEYS_AS_ROWS: tl.constexpr,  # the product as [s, d] @ [d, (t, h)] (see below)
):
    b, pid_t, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    # q_per_req is a runtime value: as a constexpr, the token loop's constant trip count let
    # Triton 3.6 unroll it and spill on sm_90. (+ 0 * b: a tensor even when Triton specialises 1.)
    if q_per_req > 0:
        q_start = b * q_per_req
        q_len = q_per_req + 0 * b
    else:
        q_start = tl.load(cu_q_ptr + b)
        q_len = tl.load(cu_q_ptr + b + 1) - q_start
    kv_len = _kv_len(b, kv_ptr, PAGED)
    s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)  # request-local key ids
    s_ok = s < kv_len
    k_tile, k_scale = _load_k_tile(
        k_ptr, ks_ptr, _key_rows(b, s, s_ok, kv_ptr, bt_ptr, stride_bt, PAGED, PAGE),
        s_ok, D, HAS_K_SCALE, D_PAD, K_FP8, K_TO_BF16,
    )
    h = tl.arange(0, H_PAD)
    d = tl.arange(0, D_PAD)
    for t0 in range(0, T_PER_PROG, BLOCK_T):  # not unrolled: one token tile live at a time
        t = pid_t * T_PER_PROG + t0 + tl.arange(0, BLOCK_T)  # request-local query ids
        t_ok = t < q_len
        pos = kv_len - q_len + t  # queries are the request's last q_len tokens
        logits = tl.full((BLOCK_T, BLOCK_S), float("-inf"), tl.float32)
        # Skip the maths for tiles entirely right of the causal edge (or past the request).
        if (pid_t * T_PER_PROG + t0 < q_len) & (pid_s * BLOCK_S <= tl.max(tl.where(t_ok, pos, -1))):
            row = (q_start + t).to(tl.int64)
            qh_ok = t_ok[:, None] & (h < H)[None, :]
            q = _as_fp8(tl.load(
                q_ptr + (row[:, None, None] * H + h[None, :, None]) * D + d[None, None, :],
                mask=qh_ok[:, :, None] & (d < D)[None, None, :], other=0,
            ), Q_FP8)
            w = tl.load(w_ptr + row[:, None] * H + h[None, :], mask=qh_ok, other=0.0)
            q2, w2 = tl.reshape(q, (BLOCK_T * H_PAD, D_PAD)), tl.reshape(w, (BLOCK_T * H_PAD,))
            if KEYS_AS_ROWS:
                # [s, d] @ [d, (t, h)]: keys are the MMA's rows and heads its columns, so the sum
                # over heads stays within each warp (DeepGEMM's MQA-logits orientation).
                qk = _dot(k_tile, tl.trans(q2), PRECISION, UPCAST)
                qk = tl.maximum(qk, 0.0) * w2[None, :]
                scores = tl.trans(tl.sum(tl.reshape(qk, (BLOCK_S, BLOCK_T, H_PAD)), axis=2))
            else:
                # [(t, h), d] @ [d, s]: every head of every token against the shared key tile.
                qk = _dot(q2, tl.trans(k_tile), PRECISION, UPCAST)
                qk = tl.maximum(qk, 0.0) * w2[:, None]
                scores = tl.sum(tl.reshape(qk, (BLOCK_T, H_PAD, BLOCK_S)), axis=1)
            scores = scores * k_scale[None, :]
            logits = tl.where(s[None, :] <= pos[:, None], scores, float("-inf"))
        out_row = out_ptr + (q_start + t).to(tl.int64)[:, None] * n_out
        if GROUP == 1:
            tl.store(out_row + s[None, :], logits, mask=t_ok[:, None] & (s < n_out)[None, :])
        else:
            gmax = tl.max(tl.reshape(logits, (BLOCK_T, BLOCK_S // GROUP, GROUP)), axis=2)
            g = pid_s * (BLOCK_S // GROUP) + tl.arange(0, BLOCK_S // GROUP)
            tl.store(out_row + g[None, :], gmax, mask=t_ok[:, None] & (g < n_out)[None, :])


@triton.jit
def _indexer_gather_kernel(
    q_ptr,  # [T, H, D]
    w_ptr,  # [T, H] fp32
    k_ptr,  # flat [S_total, D] | paged [num_pages, PAGE, D]
    ks_ptr,  # flat [S_total] | paged [num_pages, PAGE] fp32 (HAS_K_SCALE)
    groups_ptr,  # [T, n_groups] int32 chosen group ids per row, ascending, -1 padded
    row_req_ptr,  # [T] int32 request of each query row
    row_len_ptr,  # [T] int32 keys each query row may see (pos + 1)
    kv_ptr,  # cu_seqlens_k [B+1] (flat only)
    bt_ptr,  # [B, max_pages] int32 (PAGED only)
    stride_bt,
    cand_key_ptr,  # [T, n_groups * GROUP] int32 order-preserving keys of the candidate logits
    cand_col_ptr,  # [T, n_groups * GROUP] int32 their request-local key ids (-1: no candidate)
    n_groups,
    H,
    D,
    PAGED: tl.constexpr,
    PAGE: tl.constexpr,
    HAS_K_SCALE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,  # groups per program: BLOCK_G * GROUP candidate keys
    H_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    Q_FP8: tl.constexpr,
    K_FP8: tl.constexpr,
    K_TO_BF16: tl.constexpr,
):
    row, pid_g = tl.program_id(0), tl.program_id(1)
    b = tl.load(row_req_ptr + row)
    length = tl.load(row_len_ptr + row)
    gi = pid_g * BLOCK_G + tl.arange(0, BLOCK_G)
    grp = tl.load(groups_ptr + row.to(tl.int64) * n_groups + gi, mask=gi < n_groups, other=-1)
    s = _flat(grp[:, None] * GROUP + tl.arange(0, GROUP)[None, :])  # candidate key ids
    s_ok = _flat(tl.broadcast_to((grp >= 0)[:, None], (BLOCK_G, GROUP))) & (s < length)
    k_tile, k_scale = _load_k_tile(
        k_ptr, ks_ptr, _key_rows(b, s, s_ok, kv_ptr, bt_ptr, stride_bt, PAGED, PAGE),
        s_ok, D, HAS_K_SCALE, D_PAD, K_FP8, K_TO_BF16,
    )
    h = tl.arange(0, H_PAD)
    d = tl.arange(0, D_PAD)
    q = _as_fp8(tl.load(q_ptr + (row.to(tl.int64) * H + h[:, None]) * D + d[None, :],
                        mask=(h < H)[:, None] & (d < D)[None, :], other=0), Q_FP8)
    w = tl.load(w_ptr + row.to(tl.int64) * H + h, mask=h < H, other=0.0)
    qk = _dot(q, tl.trans(k_tile), PRECISION, UPCAST)  # [H_PAD, BLOCK_G * GROUP]
    scores = tl.sum(tl.maximum(qk, 0.0) * w[:, None], axis=0) * k_scale
    # As a first top-k launch writes its candidates, so the merge (`topk.kernel.merge_candidates`)
    # selects k of them and emits their key ids directly; NaN and -inf are never candidates.
    ok = s_ok & (scores > float("-inf"))
    c = pid_g * (BLOCK_G * GROUP) + tl.arange(0, BLOCK_G * GROUP)  # candidate slots
    c_ok = c < n_groups * GROUP
    c += row.to(tl.int64) * (n_groups * GROUP)
    tl.store(cand_key_ptr + c, tl.where(ok, _float_key(scores), NOT_A_KEY).to(tl.int32, bitcast=True),
             mask=c_ok)
    tl.store(cand_col_ptr + c, tl.where(ok, s, -1), mask=c_ok)


@triton.jit
def _indexer_chunk_topk_kernel(
    q_ptr,  # [T, H, D]
    w_ptr,  # [T, H] fp32
    k_ptr,  # flat [S_total, D] | paged [num_pages, PAGE, D]
    ks_ptr,  # flat [S_total] | paged [num_pages, PAGE] fp32 (HAS_K_SCALE)
    row_req_ptr,  # [T] int32 request of each query row
    row_len_ptr,  # [T] int32 keys each query row may see (pos + 1)
    kv_ptr,  # cu_seqlens_k [B+1] (flat only)
    bt_ptr,  # [B, max_pages] int32 (PAGED only)
    stride_bt,
    scratch_ptr,  # [T, n_chunks, CHUNK] int32: the chunk's keys, re-read by this program only
    out_ptr,  # [T, n_chunks, k] int32 columns, ascending, -1 padded
    key_out_ptr,  # [T, n_chunks, k] int32 keys of the written columns (WRITE_KEYS)
    k,
    H,
    D,
    PAGED: tl.constexpr,
    PAGE: tl.constexpr,
    HAS_K_SCALE: tl.constexpr,
    CHUNK: tl.constexpr,  # keys per program (a multiple of BLOCK_S and RBLOCK)
    BLOCK_S: tl.constexpr,  # keys per logits tile
    RBLOCK: tl.constexpr,  # keys per vector step of the refining passes and the emission
    WRITE_KEYS: tl.constexpr,
    BITS: tl.constexpr,
    KBLOCK: tl.constexpr,
    H_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    Q_FP8: tl.constexpr,
    K_FP8: tl.constexpr,
    K_TO_BF16: tl.constexpr,
):
    """One query row x one chunk of CHUNK keys: its logits, their top-k, written as candidates.

    The logits of each BLOCK_S-key tile become order-preserving keys (`topk.kernel._float_key`)
    that feed the first 11-bit histogram as they are made, so the first radix pass costs no read;
    they are also stored in the program's own scratch slice, which the same program reads back
    right away for the refining passes and the emission (an L2-sized working set, not a `[T, S]`
    logits round trip through memory). The selection is `topk.kernel._topk_kernel`'s."""
    row, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    n_chunks = tl.num_programs(1)
    b = tl.load(row_req_ptr + row)
    length = tl.load(row_len_ptr + row)
    lo = c * CHUNK
    hi = tl.maximum(tl.minimum(lo + CHUNK, length), lo)  # causal: keys 0..pos; may be empty
    key_row = scratch_ptr + (row * n_chunks + c) * CHUNK - lo  # key_row + s: key s of the chunk
    h = tl.arange(0, H_PAD)
    d = tl.arange(0, D_PAD)
    q = _as_fp8(tl.load(q_ptr + (row * H + h[:, None]) * D + d[None, :],
                        mask=(h < H)[:, None] & (d < D)[None, :], other=0), Q_FP8)
    w = tl.load(w_ptr + row * H + h, mask=h < H, other=0.0)
    SHIFT0: tl.constexpr = 32 - BITS
    acc = tl.zeros((HIST_BINS,), tl.int32)
    for s0 in range(lo, hi, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        s_ok = s < hi
        k_tile, k_scale = _load_k_tile(
            k_ptr, ks_ptr, _key_rows(b, s, s_ok, kv_ptr, bt_ptr, stride_bt, PAGED, PAGE),
            s_ok, D, HAS_K_SCALE, D_PAD, K_FP8, K_TO_BF16,
        )
        qk = _dot(q, tl.trans(k_tile), PRECISION, UPCAST)  # [H_PAD, BLOCK_S]
        scores = tl.sum(tl.maximum(qk, 0.0) * w[:, None], axis=0) * k_scale
        ok = s_ok & (scores > float("-inf"))  # NaN and -inf are never chosen (the contract)
        key = tl.where(ok, _float_key(scores), NOT_A_KEY)
        tl.store(key_row + s, key.to(tl.int32, bitcast=True), mask=s_ok)
        acc += tl.histogram((key >> SHIFT0).to(tl.int32), HIST_BINS, mask=ok)
    # The first pass's digit from the histogram built above, then the remaining passes over
    # the stored keys while the threshold bin must still be split; then the emission.
    prefix, k_rem, in_bin = _pick_digit(acc, tl.full((), 0, tl.uint32), k, BITS, True)
    lo_key = prefix << SHIFT0
    hi_key = lo_key | ((1 << SHIFT0) - 1)
    active = in_bin != k_rem
    for p in tl.static_range(1, 4):
        prefix, k_rem, lo_key, hi_key, active = _radix_step(
            key_row, key_row, key_row, lo, hi, prefix, k_rem, lo_key, hi_key, active, p, BITS, 2, RBLOCK)
    _emit(key_row, key_row, key_row, lo, hi, lo_key, hi_key, k_rem, out_ptr + (row * n_chunks + c) * k,
          key_out_ptr + (row * n_chunks + c) * k, k, 2, WRITE_KEYS, RBLOCK, KBLOCK)


# --------------------------------------------------------------------------- launchers


def _check_qkw(q, k, weights, k_scale, *, q_ndim, k_ndim):
    """q and k of one dtype, or an fp8 (e4m3) K cache with bf16 or fp8 queries."""
    check_tensor("q", q, ndim=q_ndim, dtypes=_QK_DTYPES)
    k_dtypes = (q.dtype, _FP8) if q.dtype == torch.bfloat16 else (q.dtype,)
    check_tensor("k", k, ndim=k_ndim, dtypes=k_dtypes, device=q.device)
    check_tensor("weights", weights, ndim=q_ndim - 1, dtypes=(torch.float32,), device=q.device)
    check_shape("weights", weights, q.shape[:-1])
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k head dim {k.shape[-1]} != q head dim {q.shape[-1]}")
    if k_scale is not None:
        check_tensor("k_scale", k_scale, ndim=k_ndim - 1, dtypes=(torch.float32,), device=q.device)
        check_shape("k_scale", k_scale, k.shape[:-1])


def _dot_flags(dtype: torch.dtype, k_dtype: torch.dtype) -> dict:
    """Constexprs of the q.k product for q of `dtype` against K of `k_dtype`: fp8 x fp8 runs on
    the fp8 tensor cores, an fp8 K with bf16 q is widened to bf16 on chip."""
    return dict(PRECISION="ieee" if dtype == torch.float32 else "tf32",
                UPCAST=interpreter_mode() and dtype != torch.float32,
                Q_FP8=dtype == _FP8, K_FP8=k_dtype == _FP8,
                K_TO_BF16=k_dtype == _FP8 and dtype == torch.bfloat16)


def _bytes(x):
    """fp8 tensors as their bytes (`_as_fp8` reads them back); others as they are."""
    return x.view(torch.uint8) if x is not None and x.dtype == _FP8 else x


def _tiles(num_heads: int, head_dim: int, max_q_len: int, block_s: int | None):
    """Block sizes. `BLOCK_T * H_PAD` ~ 64 rows per product: one Hopper warpgroup MMA with the
    default 4 warps (at H = 64, D = 128 the sm_90 build uses <= 191 registers and no spills, see
    `bench_dsa_indexer.py --compile-only`; 128 rows spilled), and >= 16, the MMA minimum. Up to
    16 tokens of a request share each loaded key tile. Untuned: no GPU was available."""
    h_pad, d_pad = next_pow2(num_heads), max(16, next_pow2(head_dim))
    block_t = max(1, 64 // h_pad)
    block_t = max(min(block_t, next_pow2(max(1, max_q_len))), -(-16 // h_pad))
    t_per_prog = max(block_t, min(16, next_pow2(max(1, max_q_len))))
    return h_pad, d_pad, block_t, t_per_prog, block_s or 64


@dataclass(frozen=True)
class _Rows:
    """Where a call's query rows and keys are, as every kernel here reads them.

    Prefill: `cu_q` `[B+1]`, `kv` = `cu_seqlens_k` `[B+1]` (keys concatenated). Decode:
    `q_per_req` = N rows per request (no offsets tensor), `kv` = `seq_lens` `[B]`, keys paged
    through `block_table`. The kernels read the lengths themselves (`_kv_len`), so no launch
    computes them."""

    kv: torch.Tensor
    num_reqs: int
    max_q_len: int
    width: int  # output columns: the longest key span (or max_seq_len)
    cu_q: torch.Tensor | None = None
    q_per_req: int = 0
    block_table: torch.Tensor | None = None
    page: int = 1

    @property
    def paged(self) -> bool:
        return self.block_table is not None

    def pointers(self) -> tuple:
        """(cu_q, kv, block_table, its row stride); `kv` stands in where a constexpr branch
        never reads."""
        bt = self.block_table
        return (self.kv if self.cu_q is None else self.cu_q, self.kv,
                self.kv if bt is None else bt, 0 if bt is None else bt.stride(0))

    def constexprs(self) -> dict:
        return dict(PAGED=self.paged, PAGE=self.page)


def _launch_logits(q, w, k, k_scale, out, rows: _Rows, *, group, block_s=None, block_t=None,
                   num_warps=None, keys_as_rows=False):
    """Shared launch of `_indexer_logits_kernel` (q `[T, H, D]`, out `[T, n_out]`).
    `block_t` (tokens per matrix product, a power of two), `num_warps` and `keys_as_rows` (the
    product transposed: keys as rows, heads as columns) override `_tiles` and the defaults
    (tuning: `bench_dsa_indexer.py` times them as variants)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    h_pad, d_pad, bt, t_per_prog, block_s = _tiles(num_heads, head_dim, rows.max_q_len, block_s)
    if block_t is not None and (block_t < 1 or block_t & (block_t - 1)):
        raise ValueError(f"block_t must be a power of two, got {block_t}")
    block_t = max(block_t or bt, -(-16 // h_pad))  # >= 16 rows per product: the MMA minimum
    t_per_prog = max(t_per_prog, block_t)  # both powers of two: a multiple of block_t
    block_s = max(block_s, group)
    key_cols = out.shape[1] * group  # keys covered by the output columns
    grid = (rows.num_reqs, triton.cdiv(max(rows.max_q_len, 1), t_per_prog), triton.cdiv(key_cols, block_s))
    if out.numel() == 0 or rows.num_reqs == 0:
        return out
    _indexer_logits_kernel[grid](
        _bytes(q), w, _bytes(k), k_scale if k_scale is not None else q, out, *rows.pointers(),
        out.shape[1], rows.q_per_req, num_heads, head_dim, **rows.constexprs(),
        HAS_K_SCALE=k_scale is not None, GROUP=group,
        T_PER_PROG=t_per_prog, BLOCK_T=block_t, BLOCK_S=block_s, H_PAD=h_pad, D_PAD=d_pad,
        KEYS_AS_ROWS=keys_as_rows, **_dot_flags(q.dtype, k.dtype),
        **({"num_warps": num_warps} if num_warps else {}),
    )
    return out


def _check_varlen(q, cu_seqlens_q, cu_seqlens_k):
    check_tensor("cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=_INT, device=q.device)
    check_tensor("cu_seqlens_k", cu_seqlens_k, ndim=1, dtypes=_INT, device=q.device)
    if cu_seqlens_q.shape != cu_seqlens_k.shape or cu_seqlens_q.shape[0] < 1:
        raise ValueError("cu_seqlens_q and cu_seqlens_k must both have shape [B+1]")


def _prefill_rows(cu_seqlens_q, cu_seqlens_k, max_q_len, max_kv_len) -> _Rows:
    """`_Rows` of a varlen batch; the longest spans are read back (a device sync) only when the
    caller does not give them."""
    if max_q_len is None:
        max_q_len = int(cu_seqlens_q.diff().max()) if cu_seqlens_q.shape[0] > 1 else 0
    if max_kv_len is None:
        max_kv_len = int(cu_seqlens_k.diff().max()) if cu_seqlens_k.shape[0] > 1 else 0
    return _Rows(cu_seqlens_k, cu_seqlens_k.shape[0] - 1, max_q_len, max_kv_len, cu_q=cu_seqlens_q)


def indexer_logits_prefill_triton(
    q, k, weights, cu_seqlens_q, cu_seqlens_k, k_scale=None, *, max_q_len=None, max_kv_len=None,
    block_s=None,
):
    """Triton twin of `indexer_logits_prefill_reference` (same args and output).

    `max_q_len` / `max_kv_len` (longest query span / key span of any request) avoid a device sync
    when given; `max_kv_len` is also the output width.
    """
    _check_qkw(q, k, weights, k_scale, q_ndim=3, k_ndim=2)
    _check_varlen(q, cu_seqlens_q, cu_seqlens_k)
    rows = _prefill_rows(cu_seqlens_q, cu_seqlens_k, max_q_len, max_kv_len)
    out = torch.empty(q.shape[0], rows.width, dtype=torch.float32, device=q.device)
    return _launch_logits(q, weights, k, k_scale, out, rows, group=1, block_s=block_s)


def _check_paged(q, k_cache, block_table, seq_lens):
    check_tensor("block_table", block_table, ndim=2, dtypes=_INT, device=q.device)
    check_tensor("seq_lens", seq_lens, ndim=1, dtypes=_INT, device=q.device)
    if block_table.shape[0] != q.shape[0] or seq_lens.shape[0] != q.shape[0]:
        raise ValueError("block_table and seq_lens must have one row per request (q.shape[0])")
    page = k_cache.shape[1]
    if page & (page - 1):
        raise ValueError(f"k_cache page size must be a power of two, got {page}")


def _decode_rows(q, k_cache, block_table, seq_lens, max_seq_len) -> _Rows:
    """`_Rows` of a decode batch: `q.shape[1]` rows per request; `max_seq_len` (the output width)
    is read back from `seq_lens` (a device sync) only when not given."""
    num_reqs, n = q.shape[:2]
    width = (int(seq_lens.max()) if num_reqs else 0) if max_seq_len is None else max_seq_len
    return _Rows(seq_lens, num_reqs, n, width, q_per_req=n, block_table=block_table,
                 page=k_cache.shape[1])


def indexer_logits_decode_triton(
    q, k_cache, weights, block_table, seq_lens, k_scale=None, max_seq_len=None, *, block_s=None,
    block_t=None, num_warps=None, keys_as_rows=False,
):
    """Triton twin of `indexer_logits_decode_reference` (same args and output); `block_s`,
    `block_t`, `num_warps`, `keys_as_rows`: overrides for tuning (`_launch_logits`). With
    `max_seq_len` given, one launch and no host sync (CUDA-graph capturable)."""
    _check_qkw(q, k_cache, weights, k_scale, q_ndim=4, k_ndim=3)
    _check_paged(q, k_cache, block_table, seq_lens)
    rows = _decode_rows(q, k_cache, block_table, seq_lens, max_seq_len)
    out = torch.empty(rows.num_reqs * rows.q_per_req, rows.width, dtype=torch.float32, device=q.device)
    _launch_logits(q.flatten(0, 1), weights.flatten(0, 1), k_cache, k_scale, out, rows, group=1,
                   block_s=block_s, block_t=block_t, num_warps=num_warps, keys_as_rows=keys_as_rows)
    return out.view(rows.num_reqs, rows.q_per_req, rows.width)


def choose_group(max_kv_len: int, topk: int) -> int:
    """Keys per group for the fused path, or 0 when materialising the logits is cheaper.

    Cost model per query row, in bytes (bf16 K, D = 128): materialised = write the S fp32
    logits once and read them ~3 times in the top-k (a histogram pass, usually one more over
    the threshold bin's keys, the emission pass: ~16 S). Fused = the same for S/G group maxima
    (~16 S/G) plus recomputing k*G candidate keys (~288 B each: 256 B of K, 8 B written, 24 B
    read back). Minimising over G gives G = sqrt(16 S / (288 k)); fused wins at roughly
    S > 72 k (147K keys for k = 2048). Unmeasured: tune on a GPU.
    """
    if max_kv_len <= 72 * topk:
        return 0
    g = math.sqrt(16 * max_kv_len / (288 * topk))
    return int(min(64, max(4, next_pow2(round(g)))))


def _row_meta(rows: _Rows, num_rows: int):
    """Request and causal key count (pos + 1) of every query row, `[T]` int32 each: one launch
    of `_row_meta_kernel`, no host sync."""
    dev = rows.kv.device
    req = torch.empty(num_rows, dtype=torch.int32, device=dev)
    length = torch.empty(num_rows, dtype=torch.int32, device=dev)
    if num_rows:
        block = min(1024, next_pow2(num_rows))
        cu_q, kv, _, _ = rows.pointers()
        _row_meta_kernel[(triton.cdiv(num_rows, block),)](
            cu_q, kv, req, length, num_rows, rows.num_reqs, rows.num_reqs.bit_length(),
            rows.q_per_req, PAGED=rows.paged, BLOCK=block,
        )
    return req, length


def _fused_topk(q, w, k, k_scale, rows: _Rows, topk, *, group, block_s=None):
    """Steps (1)-(4) of the module docstring on flattened rows: q `[T, H, D]` -> `[T, topk]`.
    Step (4) is the merge of `topk.kernel`: the gather writes its candidates as the split top-k's
    first launch does (keys and key ids, ascending), so the merge emits the key ids directly."""
    num_rows, num_heads, head_dim = q.shape
    out = torch.empty(num_rows, topk, dtype=torch.int32, device=q.device)
    if num_rows == 0 or topk == 0:
        return out.fill_(-1)
    n_groups = triton.cdiv(rows.width, group)
    gmax = torch.empty(num_rows, n_groups, dtype=torch.float32, device=q.device)
    _launch_logits(q, w, k, k_scale, gmax, rows, group=group, block_s=block_s)
    groups = topk_triton(gmax, topk)  # [T, topk] ascending, -1 padded
    req, length = _row_meta(rows, num_rows)
    cand_key = torch.empty(num_rows, group, topk, dtype=torch.int32, device=q.device)
    cand_col = torch.empty_like(cand_key)
    h_pad, d_pad = next_pow2(num_heads), max(16, next_pow2(head_dim))
    block_g = max(1, 64 // group)  # 64 candidate keys per program
    _, kv, bt, stride_bt = rows.pointers()
    _indexer_gather_kernel[(num_rows, triton.cdiv(topk, block_g))](
        _bytes(q), w, _bytes(k), k_scale if k_scale is not None else q, groups, req, length,
        kv, bt, stride_bt, cand_key, cand_col, topk, num_heads, head_dim, **rows.constexprs(),
        HAS_K_SCALE=k_scale is not None, GROUP=group, BLOCK_G=block_g, H_PAD=h_pad, D_PAD=d_pad,
        **_dot_flags(q.dtype, k.dtype),
    )
    return merge_candidates(cand_key, cand_col, out)


def _chunk_topk(q, w, k, k_scale, rows: _Rows, topk, *, chunk, block_s=None, num_warps=8):
    """Per-chunk candidates, then one merge: q `[T, H, D]` -> `[T, topk]` (`chunk` keys per
    program, `_indexer_chunk_topk_kernel`). One launch when a row is one chunk; else the merge is
    `topk.kernel._topk_kernel` over the chunks' `n_chunks * topk` candidates (keys and columns),
    as the split top-k merges its chunks. No host synchronisation."""
    num_rows, num_heads, head_dim = q.shape
    block_s = block_s or 64
    if chunk < block_s or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two >= block_s ({block_s}), got {chunk}")
    dev = q.device
    out = torch.empty(num_rows, topk, dtype=torch.int32, device=dev)
    if num_rows == 0 or topk == 0:
        return out.fill_(-1)
    n_chunks = max(1, triton.cdiv(rows.width, chunk))
    req, length = _row_meta(rows, num_rows)
    scratch = torch.empty(num_rows, n_chunks, chunk, dtype=torch.int32, device=dev)
    direct = n_chunks == 1
    cand = out if direct else torch.empty(num_rows, n_chunks, topk, dtype=torch.int32, device=dev)
    cand_key = out if direct else torch.empty_like(cand)
    h_pad, d_pad = next_pow2(num_heads), max(16, next_pow2(head_dim))
    kblock = min(1024, next_pow2(topk))
    _, kv, bt, stride_bt = rows.pointers()
    _indexer_chunk_topk_kernel[(num_rows, n_chunks)](
        _bytes(q), w, _bytes(k), k_scale if k_scale is not None else q, req, length, kv, bt,
        stride_bt, scratch, cand, cand_key, topk, num_heads, head_dim, **rows.constexprs(),
        HAS_K_SCALE=k_scale is not None, CHUNK=chunk, BLOCK_S=block_s,
        RBLOCK=min(chunk, 1024), WRITE_KEYS=not direct, BITS=RADIX_BITS, KBLOCK=kblock,
        H_PAD=h_pad, D_PAD=d_pad, **_dot_flags(q.dtype, k.dtype), num_warps=num_warps,
    )
    return out if direct else merge_candidates(cand_key, cand, out, kblock=kblock)


def _check_path(group, chunk):
    if chunk is not None and group:
        raise ValueError(f"group={group} and chunk={chunk}: choose one fused path")


def _indexer_topk(q, w, k, k_scale, rows: _Rows, topk, *, group, chunk, block_s):
    """The three paths on flattened rows `q [T, H, D]` -> `[T, topk]`; the unfused one
    materialises the logits `[T, width]` and its top-k scans only each row's causal prefix."""
    if chunk is not None:
        return _chunk_topk(q, w, k, k_scale, rows, topk, chunk=chunk, block_s=block_s)
    group = choose_group(rows.width, topk) if group is None else group
    if group:
        return _fused_topk(q, w, k, k_scale, rows, topk, group=group, block_s=block_s)
    logits = torch.empty(q.shape[0], rows.width, dtype=torch.float32, device=q.device)
    _launch_logits(q, w, k, k_scale, logits, rows, group=1, block_s=block_s)
    return topk_triton(logits, topk, lengths=_row_meta(rows, q.shape[0])[1])


def indexer_topk_prefill_triton(
    q, k, weights, cu_seqlens_q, cu_seqlens_k, topk, k_scale=None, *, group=None,
    max_q_len=None, max_kv_len=None, block_s=None, chunk=None,
):
    """Triton twin of `indexer_topk_prefill_reference`: `[T, topk]` int32, `-1` padded.

    `group`: None picks with `choose_group`; 0 forces the materialised path; G > 0 forces the
    fused path with G keys per group (a power of two). `chunk` (a power of two) forces the
    per-chunk-candidates path (`_chunk_topk`); it is not chosen by default until a GPU has timed it.
    `max_q_len` / `max_kv_len` as `indexer_logits_prefill_triton`'s: given, no host sync.
    """
    _check_qkw(q, k, weights, k_scale, q_ndim=3, k_ndim=2)
    _check_varlen(q, cu_seqlens_q, cu_seqlens_k)
    _check_path(group, chunk)
    rows = _prefill_rows(cu_seqlens_q, cu_seqlens_k, max_q_len, max_kv_len)
    return _indexer_topk(q, weights, k, k_scale, rows, topk, group=group, chunk=chunk,
                         block_s=block_s)


def indexer_topk_decode_triton(
    q, k_cache, weights, block_table, seq_lens, topk, k_scale=None, *, group=None,
    max_seq_len=None, block_s=None, chunk=None,
):
    """Triton twin of `indexer_topk_decode_reference`: `[B, N, topk]` int32, `-1` padded
    (`group`, `chunk`: as `indexer_topk_prefill_triton`'s). With `max_seq_len` given, only Triton
    launches (2-5 by path) and no host sync (CUDA-graph capturable)."""
    _check_qkw(q, k_cache, weights, k_scale, q_ndim=4, k_ndim=3)
    _check_paged(q, k_cache, block_table, seq_lens)
    _check_path(group, chunk)
    rows = _decode_rows(q, k_cache, block_table, seq_lens, max_seq_len)
    out = _indexer_topk(q.flatten(0, 1), weights.flatten(0, 1), k_cache, k_scale, rows, topk,
                        group=group, chunk=chunk, block_s=block_s)
    return out.view(*q.shape[:2], topk)
