"""Triton acceptance sampler: token-wise and block verification on injected randomness.

Four launches, all reading the flattened ragged batch in place (no host-side expansion):

1. `_row_stats_kernel`, grid `[B, max_K, NB]` (one program per draft row and vocab block):
   greedy rows: the block's (max, first argmax) of `p_i`; block-verification rows `i >= 1`: the
   block's share of `sum_v max(p_i(v) - q_i(v) / P_i, 0)` in fp64 (each program rebuilds `P_i`
   from the `i` drafted-token probabilities before it: `O(K)` gathers).
2. `_decide_kernel`, grid `[B]`: scans the request's rows (accept tests, `P_i`, `h_i`), writes
   the accepted prefix, and for greedy rejections the target argmax.
3. `_final_partial_kernel`, grid `[B, NB]`: per vocab block, the best race key of the residual
   (or bonus) row and of the fallback `Sample(p)`.
4. `_final_combine_kernel`, grid `[B]`: reduces the blocks and writes the emitted token.

Bit-exactness with `reference.py`: the same fp32/fp64 elementwise operations in the same order,
IEEE division (`div_rn` for fp32; fp64 division is IEEE on every backend) and
`enable_fp_fusion=False`, so no multiply-add is contracted differently from PyTorch. Argmaxes take
the first index inside a block and the lowest block among equal maxima, i.e. `torch.argmax`'s
first-index rule. Only the fp64 vocab sums of block verification run in a different order (see
the rounding contract in `reference.py`). The formulas are in `reference.py`'s docstring.
"""

import torch
import triton
import triton.language as tl

from vllm_specx.ops._triton_utils import interpreter_compat, interpreter_mode, next_pow2

if interpreter_mode():
    interpreter_compat()  # Triton 3.6's interpreter with numpy >= 2.4
from vllm_specx.ops.acceptance.reference import AcceptanceInputs

__all__ = ["acceptance_sample_triton"]


@triton.jit
def _req_span(cu_ptr, b):
    """(first row, number of drafts) of request `b` from the cumulative counts."""
    end = tl.load(cu_ptr + b).to(tl.int64)
    start = tl.load(cu_ptr + b - 1, mask=b > 0, other=0).to(tl.int64)
    return start, end - start


@triton.jit
def _drafted_pq(tp_ptr, dp_ptr, draft_ptr, row, V, HAS_DRAFT: tl.constexpr):
    """(x, p(x), q(x)) of flattened draft row `row`, probabilities widened to fp64."""
    x = tl.load(draft_ptr + row).to(tl.int64)
    px = tl.load(tp_ptr + row * V + x).to(tl.float64)
    if HAS_DRAFT:
        qx = tl.load(dp_ptr + row * V + x).to(tl.float64)
    else:
        qx = tl.full([], 1.0, tl.float64)
    return x, px, qx


@triton.jit
def _ratio_step(P, px, qx):
    """`P_i` from `P_{i-1}`: 0 if `P p == 0`, 1 if `q == 0`, else `min(P p / q, 1)` (fp64)."""
    pp = P * px
    r = tl.minimum(pp / tl.where(qx == 0.0, 1.0, qx), 1.0)
    return tl.where(pp == 0.0, 0.0, tl.where(qx == 0.0, 1.0, r))


@triton.jit
def _row_pq(tp_ptr, dp_ptr, row, x, cols, mask, V, HAS_DRAFT: tl.constexpr):
    """Block `cols` of target row `row` and of its draft row (one-hot at `x` without probs)."""
    p = tl.load(tp_ptr + row * V + cols, mask=mask, other=0.0)
    if HAS_DRAFT:
        q = tl.load(dp_ptr + row * V + cols, mask=mask, other=0.0)
    else:
        q = tl.where(cols == x, 1.0, 0.0)
    return p, q


@triton.jit
def _row_stats_kernel(
    tp_ptr,  # [T, V] fp32 target probs
    dp_ptr,  # [T, V] fp32 draft probs (HAS_DRAFT)
    draft_ptr,  # [T] int32/int64 draft ids
    cu_ptr,  # [B] int32/int64 cumulative draft counts
    greedy_ptr,  # [B] bool
    amax_val_ptr,  # [T, NB] fp32 out: block max of p (greedy rows)
    amax_idx_ptr,  # [T, NB] int32 out: its first column
    mass_ptr,  # [T, NB] fp64 out: block sum of max(p - q / P, 0) (block method, rows i >= 1)
    V,
    NB,
    BLOCK_V: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    BLOCK_METHOD: tl.constexpr,
):
    b = tl.program_id(0)
    i = tl.program_id(1)
    blk = tl.program_id(2)
    start, n = _req_span(cu_ptr, b)
    if i >= n:
        return
    row = start + i
    cols = blk * BLOCK_V + tl.arange(0, BLOCK_V)
    mask = cols < V
    out = row * NB + blk
    if tl.load(greedy_ptr + b):
        p = tl.load(tp_ptr + row * V + cols, mask=mask, other=-1.0)
        v, j = tl.max(p, 0, return_indices=True, return_indices_tie_break_left=True)
        tl.store(amax_val_ptr + out, v)
        tl.store(amax_idx_ptr + out, (blk * BLOCK_V + j).to(tl.int32))
    elif BLOCK_METHOD:
        if i >= 1:
            P = tl.full([], 1.0, tl.float64)
            for j in range(0, i):
                _, px, qx = _drafted_pq(tp_ptr, dp_ptr, draft_ptr, start + j, V, HAS_DRAFT)
                P = _ratio_step(P, px, qx)
            x = tl.load(draft_ptr + row).to(tl.int64)
            p, q = _row_pq(tp_ptr, dp_ptr, row, x, cols, mask, V, HAS_DRAFT)
            w = tl.maximum(p.to(tl.float64) - q.to(tl.float64) / tl.where(P > 0.0, P, 1.0), 0.0)
            mass = tl.where(P > 0.0, tl.sum(tl.where(mask, w, 0.0), 0), 0.0)
            tl.store(mass_ptr + out, mass)


@triton.jit
def _row_argmax(amax_val_ptr, amax_idx_ptr, row, NB, NB_P2: tl.constexpr):
    """First-index argmax of a greedy row from its per-block (max, argmax) partials."""
    blocks = tl.arange(0, NB_P2)
    m = blocks < NB
    v = tl.load(amax_val_ptr + row * NB + blocks, mask=m, other=float("-inf"))
    j = tl.load(amax_idx_ptr + row * NB + blocks, mask=m, other=0)
    best = tl.max(v, 0)
    return tl.min(tl.where(m & (v == best), j, 2147483647), 0).to(tl.int64)


@triton.jit
def _decide_kernel(
    tp_ptr,  # [T, V] fp32
    dp_ptr,  # [T, V] fp32 (HAS_DRAFT)
    draft_ptr,  # [T] int ids
    cu_ptr,  # [B] int cumulative counts
    greedy_ptr,  # [B] bool
    u_ptr,  # [T] fp64 uniforms
    amax_val_ptr,  # [T, NB] fp32 greedy partials
    amax_idx_ptr,  # [T, NB] int32
    mass_ptr,  # [T, NB] fp64 block-verification partial residual masses
    out_ptr,  # [B, OUT_W] int32, pre-filled with -1
    acc_ptr,  # [B] int64 out: accepted drafts a
    ptau_ptr,  # [B] fp64 out: P_a (block method; 1 otherwise)
    V,
    NB,
    OUT_W,
    NB_P2: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    BLOCK_METHOD: tl.constexpr,
):
    b = tl.program_id(0)
    start, n = _req_span(cu_ptr, b)
    greedy = tl.load(greedy_ptr + b)
    a = tl.zeros([], tl.int64)
    verifying = tl.full([], 1, tl.int1)
    y = tl.full([], -1, tl.int64)  # greedy: the target argmax at the first mismatch
    P = tl.full([], 1.0, tl.float64)
    p_tau = tl.full([], 1.0, tl.float64)
    blocks = tl.arange(0, NB_P2)
    for i in range(0, n):
        row = start + i
        x, px, qx = _drafted_pq(tp_ptr, dp_ptr, draft_ptr, row, V, HAS_DRAFT)
        u = tl.load(u_ptr + row)
        if greedy:
            g = _row_argmax(amax_val_ptr, amax_idx_ptr, row, NB, NB_P2)
            y = tl.where(verifying & (g != x), g, y)
            verifying = verifying & (g == x)
            a += verifying.to(tl.int64)
        elif BLOCK_METHOD:
            P = _ratio_step(P, px, qx)  # P_{i+1}
            h = P  # decision i+1 uses u_i; the last one uses h_n = P_n
            if i + 1 < n:
                part = tl.load(mass_ptr + (row + 1) * NB + blocks, mask=blocks < NB, other=0.0)
                R = tl.where(P > 0.0, P * tl.sum(part, 0), 0.0)
                denom = R + (1.0 - P)
                h = tl.where(denom > 0.0, R / tl.where(denom > 0.0, denom, 1.0), 1.0)
            take = u < h
            a = tl.where(take, i + 1, a)
            p_tau = tl.where(take, P, p_tau)
        else:
            verifying = verifying & (u * qx < px)
            a += verifying.to(tl.int64)
    for i in range(0, a):
        tl.store(out_ptr + b * OUT_W + i, tl.load(draft_ptr + start + i).to(tl.int32))
    if greedy & (a < n):
        tl.store(out_ptr + b * OUT_W + a, y.to(tl.int32))
    tl.store(acc_ptr + b, a)
    tl.store(ptau_ptr + b, p_tau)


@triton.jit
def _final_partial_kernel(
    tp_ptr,  # [T, V] fp32
    dp_ptr,  # [T, V] fp32 (HAS_DRAFT)
    bp_ptr,  # [B, V] fp32 bonus probs
    e_ptr,  # [B, V] fp32 Exp(1) noise
    draft_ptr,  # [T] int ids
    cu_ptr,  # [B] int cumulative counts
    greedy_ptr,  # [B] bool
    acc_ptr,  # [B] int64 accepted drafts
    ptau_ptr,  # [B] fp64 P_a
    key_ptr,  # [B, NB, 2] fp64 out: block-best key of (main, fallback)
    idx_ptr,  # [B, NB, 2] int32 out: its first column
    V,
    NB,
    BLOCK_V: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    BLOCK_METHOD: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    start, n = _req_span(cu_ptr, b)
    a = tl.load(acc_ptr + b)
    greedy = tl.load(greedy_ptr + b)
    rejected = a < n
    if greedy & rejected:
        return  # the decide kernel already wrote the target argmax
    cols = blk * BLOCK_V + tl.arange(0, BLOCK_V)
    mask = cols < V
    e = tl.load(e_ptr + b * V + cols, mask=mask, other=1.0)
    if rejected:
        row = start + a
        x = tl.load(draft_ptr + row).to(tl.int64)
        p, q = _row_pq(tp_ptr, dp_ptr, row, x, cols, mask, V, HAS_DRAFT)
        if BLOCK_METHOD:
            w = tl.maximum(p.to(tl.float64) - q.to(tl.float64) / tl.load(ptau_ptr + b), 0.0)
            key = tl.where(w > 0.0, w / e.to(tl.float64), -1.0)
        else:
            w = tl.maximum(p - q, 0.0)
            key = tl.where(w > 0.0, tl.math.div_rn(w, e), -1.0).to(tl.float64)
    else:
        p = tl.load(bp_ptr + b * V + cols, mask=mask, other=0.0)
        if greedy:
            key = p.to(tl.float64)
        else:
            key = tl.where(p > 0.0, tl.math.div_rn(p, e), -1.0).to(tl.float64)
    fkey = tl.where(p > 0.0, tl.math.div_rn(p, e), -1.0).to(tl.float64)
    key = tl.where(mask, key, -2.0)  # padded tail never wins, not even over a zero weight
    fkey = tl.where(mask, fkey, -2.0)
    kv, kj = tl.max(key, 0, return_indices=True, return_indices_tie_break_left=True)
    fv, fj = tl.max(fkey, 0, return_indices=True, return_indices_tie_break_left=True)
    base = (b * NB + blk) * 2
    tl.store(key_ptr + base, kv)
    tl.store(idx_ptr + base, (blk * BLOCK_V + kj).to(tl.int32))
    tl.store(key_ptr + base + 1, fv)
    tl.store(idx_ptr + base + 1, (blk * BLOCK_V + fj).to(tl.int32))


@triton.jit
def _best(key_ptr, idx_ptr, b, NB, SLOT: tl.constexpr, NB_P2: tl.constexpr):
    blocks = tl.arange(0, NB_P2)
    m = blocks < NB
    v = tl.load(key_ptr + (b * NB + blocks) * 2 + SLOT, mask=m, other=-3.0)
    j = tl.load(idx_ptr + (b * NB + blocks) * 2 + SLOT, mask=m, other=0)
    best = tl.max(v, 0)
    return best, tl.min(tl.where(m & (v == best), j, 2147483647), 0)


@triton.jit
def _final_combine_kernel(
    cu_ptr,  # [B] int cumulative counts
    greedy_ptr,  # [B] bool
    acc_ptr,  # [B] int64 accepted drafts
    key_ptr,  # [B, NB, 2] fp64 partial keys
    idx_ptr,  # [B, NB, 2] int32 partial argmaxes
    out_ptr,  # [B, OUT_W] int32
    NB,
    OUT_W,
    NB_P2: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    _, n = _req_span(cu_ptr, b)
    a = tl.load(acc_ptr + b)
    if tl.load(greedy_ptr + b) & (a < n):
        return
    kv, kj = _best(key_ptr, idx_ptr, b, NB, 0, NB_P2)
    fv, fj = _best(key_ptr, idx_ptr, b, NB, 1, NB_P2)
    # No positive weight: fall back to Sample(p); an all-zero p row emits 0 (as the reference).
    tok = tl.where(kv >= 0.0, kj, tl.where(fv >= 0.0, fj, 0))
    tl.store(out_ptr + b * OUT_W + a, tok.to(tl.int32))


def acceptance_sample_triton(
    inputs: AcceptanceInputs,
    method: str = "token",
    *,
    max_num_draft_tokens: int | None = None,
    validate: bool = True,
    block_v: int | None = None,
) -> torch.Tensor:
    """Launch the four kernels; same contract and output as `acceptance_sample_reference`.

    `block_v` (a power of two) is the vocab tile; the default is `min(4096, next_pow2(V))`.
    """
    max_k = inputs.check(method, max_num_draft_tokens=max_num_draft_tokens, validate=validate)
    x = inputs
    tp, ids, cu, greedy = x.target_probs, x.draft_token_ids, x.cu_num_draft_tokens, x.is_greedy
    dev = tp.device
    T, V = tp.shape
    B = cu.shape[0]
    out = torch.full((B, max_k + 1), -1, dtype=torch.int32, device=dev)
    if B == 0:
        return out
    BLOCK_V = block_v or min(4096, next_pow2(V))
    if BLOCK_V & (BLOCK_V - 1):
        raise ValueError(f"block_v must be a power of two, got {block_v}")
    NB = triton.cdiv(V, BLOCK_V)
    NB_P2 = next_pow2(NB)
    has_draft = x.draft_probs is not None
    blk_method = method == "block"
    dp = x.draft_probs if has_draft else tp  # placeholder pointer, never read
    opts = dict(num_warps=8 if BLOCK_V >= 2048 else 4, enable_fp_fusion=False)

    amax_val = torch.empty(max(T, 1), NB, dtype=torch.float32, device=dev)
    amax_idx = torch.empty(max(T, 1), NB, dtype=torch.int32, device=dev)
    mass = torch.empty(max(T, 1), NB, dtype=torch.float64, device=dev)
    if max_k > 0:
        _row_stats_kernel[(B, max_k, NB)](
            tp, dp, ids, cu, greedy, amax_val, amax_idx, mass, V, NB, BLOCK_V=BLOCK_V,
            HAS_DRAFT=has_draft, BLOCK_METHOD=blk_method, **opts)
    acc = torch.empty(B, dtype=torch.int64, device=dev)
    ptau = torch.empty(B, dtype=torch.float64, device=dev)
    _decide_kernel[(B,)](
        tp, dp, ids, cu, greedy, x.uniforms, amax_val, amax_idx, mass, out, acc, ptau, V, NB,
        max_k + 1, NB_P2=NB_P2, HAS_DRAFT=has_draft, BLOCK_METHOD=blk_method, num_warps=1,
        enable_fp_fusion=False)
    keys = torch.empty(B, NB, 2, dtype=torch.float64, device=dev)
    idxs = torch.empty(B, NB, 2, dtype=torch.int32, device=dev)
    _final_partial_kernel[(B, NB)](
        tp, dp, x.bonus_probs, x.exp_noise, ids, cu, greedy, acc, ptau, keys, idxs, V, NB,
        BLOCK_V=BLOCK_V, HAS_DRAFT=has_draft, BLOCK_METHOD=blk_method, **opts)
    _final_combine_kernel[(B,)](
        cu, greedy, acc, keys, idxs, out, NB, max_k + 1, NB_P2=NB_P2, num_warps=1)
    return out
