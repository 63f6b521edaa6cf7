"""Vectorised PyTorch acceptance sampler: the CPU fast path (`impl="torch"`).

Same contract and the same elementwise fp32/fp64 operations as `reference.py`, so it returns the
same token ids; the work is batched instead of looped. Token-wise verification reads only the
drafted tokens' probabilities (`O(T)` gathers) plus one `[V]` row per request for the resample or
bonus draw; greedy requests add an argmax over their own rows; block verification adds one pass
over the rows `1..n-1` of each random request (the residual masses `R_i`), chunked to bound memory.
It is not a Triton kernel and has no vLLM dependency.
"""

import torch

from vllm_specx.ops.acceptance.reference import AcceptanceInputs, _counts

__all__ = ["acceptance_sample_torch"]

# Rows per chunk when block verification reads whole [V] rows in fp64 (bounds the temporaries).
_CHUNK_ELEMS = 1 << 24


def _race_exact(w: torch.Tensor, p: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Row-wise `Sample(w)` exactly as the reference writes it, with the fallback `Sample(p)`.

    w: `[R, V]` fp32 or fp64; p, noise: `[R, V]` fp32. Returns `[R]` int64.
    """
    pos = w > 0
    tok = torch.where(pos, w / noise.to(w.dtype), -1.0).argmax(-1)
    empty = ~pos.any(-1)
    if bool(empty.any()):
        rows = empty.nonzero().squeeze(1)
        pk = torch.where(p[rows] > 0, p[rows] / noise[rows], -1.0)
        tok[rows] = pk.argmax(-1)  # an all-zero p row gives 0, as the reference
    return tok


def _race(w: torch.Tensor, noise: torch.Tensor, exact_rows) -> torch.Tensor:
    """`Sample(w)` per row in two passes: `argmax(w / noise)`, overwriting `w` (a fresh tensor).

    `w` may be unclamped (`p - q`, negative where the residual is 0). With `noise > 0`
    (validated), a row whose best key is `> 0` has the reference's answer: the keys of `w > 0`
    entries are the reference's keys, every other key is `<= 0` and cannot be the maximum.
    Rows whose best key is 0 (no positive weight, or keys underflowing to 0) are redone by
    `_race_exact` on `exact_rows(rows) -> (w, p, noise)`, rebuilt from the inputs.
    """
    key = w.div_(noise)
    tok = key.argmax(-1)
    redo = (key.gather(1, tok[:, None]).squeeze(1) <= 0).nonzero().squeeze(1)
    if redo.numel():
        tok[redo] = _race_exact(*exact_rows(redo))
    return tok


def _ratio_steps(px: torch.Tensor, qx: torch.Tensor) -> torch.Tensor:
    """`P_0..P_K` for every request from `[B, K]` fp64 drafted-token probabilities."""
    B, K = px.shape
    P = torch.ones(B, K + 1, dtype=torch.float64, device=px.device)
    for k in range(K):
        pp = P[:, k] * px[:, k]
        ratio = torch.minimum(pp / torch.where(qx[:, k] == 0, 1.0, qx[:, k]), torch.ones_like(pp))
        P[:, k + 1] = torch.where(pp == 0, 0.0, torch.where(qx[:, k] == 0, 1.0, ratio))
    return P


def _residual_mass(target_probs, draft_probs, drafts, rows, Pi) -> torch.Tensor:
    """`R = P * sum_v max(p(v) - q(v) / P, 0)` for flattened `rows` with `Pi > 0`, in fp64."""
    V = target_probs.shape[1]
    out = torch.zeros(rows.shape[0], dtype=torch.float64, device=target_probs.device)
    step = max(1, _CHUNK_ELEMS // V)
    for c in range(0, rows.shape[0], step):
        r, P = rows[c:c + step], Pi[c:c + step]
        w = target_probs.index_select(0, r).double()  # in place from here: fewer fresh buffers
        if draft_probs is None:  # one-hot q: only column x changes (p - 0 / P == p exactly)
            j, x = torch.arange(r.shape[0], device=w.device), drafts[r]
            w[j, x] = w[j, x] - 1.0 / P
        else:
            w.sub_(draft_probs.index_select(0, r).double().div_(P[:, None]))
        out[c:c + step] = w.clamp_min_(0).sum(-1) * P
    return out


def acceptance_sample_torch(
    inputs: AcceptanceInputs,
    method: str = "token",
    *,
    max_num_draft_tokens: int | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Batched `acceptance_sample_reference`: identical outputs, `[B, max_K + 1]` int32."""
    max_k = inputs.check(method, max_num_draft_tokens=max_num_draft_tokens, validate=validate)
    tp, dp, is_greedy = inputs.target_probs, inputs.draft_probs, inputs.is_greedy
    cu, uniforms = inputs.cu_num_draft_tokens.long(), inputs.uniforms
    dev = tp.device
    T = tp.shape[0]
    B = cu.shape[0]
    out = torch.full((B, max_k + 1), -1, dtype=torch.int32, device=dev)
    if B == 0:
        return out
    counts = _counts(cu)
    starts = cu - counts
    rows = torch.arange(T, device=dev)
    req = torch.searchsorted(cu, rows, right=True)  # row -> request
    pos = rows - starts.index_select(0, req)
    drafts = inputs.draft_token_ids.long()
    px = tp.gather(1, drafts[:, None]).squeeze(1).double()
    qx = None if dp is None else dp.gather(1, drafts[:, None]).squeeze(1).double()
    any_greedy = bool(is_greedy.any())
    greedy_row = is_greedy.index_select(0, req)

    # Greedy targets g_i, only for the rows of greedy requests.
    g = torch.full((T,), -1, dtype=torch.long, device=dev)
    if any_greedy:
        g_rows = greedy_row.nonzero().squeeze(1)
        g[g_rows] = tp.index_select(0, g_rows).argmax(-1)

    # Per-row acceptance -> [B, max_k] (padding accepts, so the scan stops at n by the clamp).
    acc_row = uniforms < px if qx is None else uniforms * qx < px  # u * 1.0 == u exactly
    if any_greedy:
        acc_row = torch.where(greedy_row, drafts == g, acc_row)
    W = max(max_k, 1)
    acc = torch.ones(B * W, dtype=torch.bool, device=dev)
    acc = acc.scatter_(0, req * W + pos, acc_row).view(B, W)
    a = torch.minimum(acc.long().cumprod(1).sum(1), counts)  # token-wise / greedy prefix
    P_tau = torch.ones(B, dtype=torch.float64, device=dev)
    if method == "block":
        qx = torch.ones_like(px) if qx is None else qx
        a, P_tau = _block_tau(a, counts, req, pos, px, qx, uniforms, is_greedy, greedy_row,
                              tp, dp, drafts, max_k)

    # Accepted prefix.
    keep = pos < a.index_select(0, req)
    out.view(-1).scatter_(0, req * (max_k + 1) + pos, torch.where(keep, drafts, -1).int())
    out.scatter_(1, a[:, None], _final_tokens(a, counts, starts, g, drafts, tp,
                                              inputs.bonus_probs, dp, is_greedy,
                                              inputs.exp_noise, P_tau, method)[:, None].int())
    return out


def _block_tau(a, counts, req, pos, px, qx, uniforms, is_greedy, greedy_row, target_probs,
               draft_probs, drafts, max_k):
    """Block verification's `tau` and `P_tau` per request (greedy requests keep `a`, `P = 1`)."""
    B = counts.shape[0]
    dev = px.device
    pxm = torch.zeros(B, max_k, dtype=torch.float64, device=dev)
    qxm = torch.ones(B, max_k, dtype=torch.float64, device=dev)
    pxm[req, pos], qxm[req, pos] = px, qx
    P = _ratio_steps(pxm, qxm)  # [B, max_k + 1]
    Pi = P[req, pos]  # P_i for row i (prefix x_0..x_{i-1})
    # h_i for i = 1..n-1 lives on row i; the last decision h_n = P_n.
    mid = ((pos >= 1) & ~greedy_row & (Pi > 0)).nonzero().squeeze(1)
    R = torch.zeros_like(px)
    if mid.numel():
        R[mid] = _residual_mass(target_probs, draft_probs, drafts, mid, Pi[mid])
    denom = R + (1.0 - Pi)
    h_row = torch.where(denom > 0, R / torch.where(denom > 0, denom, 1.0), 1.0)
    # Decision i (1..n) uses u_{i-1}, i.e. row i-1, and h_i: h on row i for i < n, P_n for i = n.
    H = torch.zeros(B, max_k, dtype=torch.float64, device=dev)  # H[b, c] = h_{c+1}
    inner = pos >= 1
    H[req[inner], pos[inner] - 1] = h_row[inner]
    last = torch.arange(B, device=dev)[counts > 0]
    H[last, counts[last] - 1] = P[last, counts[last]]
    U = torch.ones(B, max_k, dtype=torch.float64, device=dev)  # padding: u = 1 never accepts
    U[req, pos] = uniforms
    ok = U < H
    cols = torch.arange(1, max_k + 1, device=dev)
    tau = (ok.long() * cols).amax(1) if max_k else torch.zeros(B, dtype=torch.long, device=dev)
    tau = torch.where(is_greedy, a, tau)
    P_tau = torch.where(is_greedy, 1.0, P.gather(1, tau[:, None]).squeeze(1))
    return tau, P_tau


def _final_tokens(a, counts, starts, g, drafts, target_probs, bonus_probs, draft_probs,
                  is_greedy, exp_noise, P_tau, method) -> torch.Tensor:
    """`y` per request: greedy argmax, or the race on the residual / bonus row."""
    B, V = bonus_probs.shape
    dev = bonus_probs.device
    y = torch.zeros(B, dtype=torch.long, device=dev)
    rejected = a < counts
    row = (starts + a).clamp(max=max(target_probs.shape[0] - 1, 0))
    random = ~is_greedy
    if bool(is_greedy.any()):  # greedy: the mismatching argmax, or the bonus argmax
        gr = (is_greedy & rejected).nonzero().squeeze(1)
        y[gr] = g[row[gr]]
        gb = (is_greedy & ~rejected).nonzero().squeeze(1)
        if gb.numel():
            y[gb] = bonus_probs.index_select(0, gb).argmax(-1)
    # Random, all accepted: Sample(p_n).
    rb = (random & ~rejected).nonzero().squeeze(1)
    if rb.numel():
        p = bonus_probs.index_select(0, rb)

        def bonus_rows(i):
            p_i = bonus_probs[rb[i]]
            return p_i, p_i, exp_noise[rb[i]]

        noise = exp_noise if rb.numel() == B else exp_noise.index_select(0, rb)
        y[rb] = _race(p, noise, bonus_rows)
    # Random, rejected at row a: Sample(max(p_a - q_a, 0)) (block: q_a / P_a, fp64).
    rr = (random & rejected).nonzero().squeeze(1)
    if rr.numel():
        r = row[rr]

        def weights(i, clamp):
            """`p_a - q_a` (block: `p_a - q_a / P_a` in fp64) of the rejected rows `rr[i]`."""
            w = target_probs.index_select(0, r[i])  # a fresh copy of p, updated in place
            j, x = torch.arange(i.numel(), device=dev), drafts[r[i]]
            if method == "block":
                w, P = w.double(), P_tau[rr[i]]
            if draft_probs is None:  # one-hot q: only column x changes (p - 0 == p exactly)
                w[j, x] = w[j, x] - (1.0 if method == "token" else 1.0 / P)
            elif method == "token":
                w.sub_(draft_probs.index_select(0, r[i]))
            else:
                w.sub_(draft_probs.index_select(0, r[i]).double().div_(P[:, None]))
            return w.clamp_min_(0) if clamp else w

        def exact_rows(i):
            return weights(i, True), target_probs.index_select(0, r[i]), exp_noise[rr[i]]

        # Unclamped weights: negative keys never beat a positive one, and the rows without a
        # positive key are redone exactly, so the fast pass skips the clamp.
        noise = exp_noise if rr.numel() == B else exp_noise.index_select(0, rr)
        y[rr] = _race(weights(torch.arange(rr.numel(), device=dev), False), noise, exact_rows)
    return y
