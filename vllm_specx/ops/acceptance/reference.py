"""Lossless acceptance sampling for speculative decoding: the PyTorch reference (the spec).

This module is the contract every other implementation (`torch_path.py`, `kernel.py`) must match
token for token on the same injected randomness. It loops over requests and draft positions in
Python, so it is readable and slow; it is not the CPU fast path (`impl="torch"` is). It imports
nothing from vLLM; in serving, `vllm_specx/sample/rejection_sampler.py` calls the dispatcher
`acceptance_sample` from inside vLLM's V1 `RejectionSampler` (see `docs/acceptance.md`).

Notation (fixed here, used by the kernel, the fast path, the tests and `docs/acceptance.md`).
Request `b` owns the flattened rows `s = cu[b-1] .. cu[b]-1` (`cu[-1] := 0`), `n = cu[b] - cu[b-1]`
drafts (`n` may be 0). For local position `i = 0..n-1`:

    x_i = draft_token_ids[s+i]     p_i = target_probs[s+i]     u_i = uniforms[s+i]
    q_i = draft_probs[s+i]  (one-hot at x_i when draft_probs is None: greedy / n-gram drafters)
    p_n = bonus_probs[b]           E = exp_noise[b]  (Exp(1) noise, > 0; one draw per request)

`Sample(w)` is the exponential race `argmax_v w(v) / E(v)` over the `v` with `w(v) > 0`
(first index on ties). With `E` i.i.d. Exp(1) it draws `v` with probability `w(v) / sum(w)`, so
`w` need not be normalised. If no `v` has `w(v) > 0` (the residual of `p == q`: a rejection of
probability zero in exact arithmetic, reachable only by rounding), it falls back to `Sample(p)` of
the same row, `p` being the target row that was being resampled. Zero-probability columns
(vocab padding, top-k/top-p cuts) are never emitted while the target row has positive mass; an
all-zero target row is not a distribution and yields token 0 (greedy: the argmax of zeros).

Every request emits `a + 1` tokens `x_0 .. x_{a-1}, y` (`a` accepted drafts, then one sampled
token), written to `out[b, :a+1]` of the `[B, max_K + 1]` int32 output; the rest is `-1`.

Greedy requests (`is_greedy[b]`, both methods; uniforms and noise unused):
    g_i = argmax p_i (first index);  a = first i with x_i != g_i (else n);  y = g_a.

Token-wise verification (`method="token"`, Leviathan et al. 2023):
    accept x_i  iff  u_i * q_i(x_i) < p_i(x_i)           (fp64; p, q are fp32 widened exactly)
i.e. `u_i < min(1, p_i(x_i) / q_i(x_i))`, and for one-hot q: `u_i < p_i(x_i)`.
    a = first rejected i (else n);   y = Sample(max(p_a - q_a, 0)) if a < n else Sample(p_n)
(fp32; one-hot q: `p_a` with `x_a` zeroed). A drafted token with `q_i(x_i) = 0` (off the draft's
support, so the caller's q is not the distribution it was drawn from) is accepted iff
`p_i(x_i) > 0`: the ratio is +inf, as in vLLM V2. vLLM V1 rejects it instead (`q > 0 and
p/q >= u`). Neither choice is lossless for a mis-specified q; ours needs no division.

Block verification (`method="block"`, Sun et al. 2024, "Block Verification Accelerates
Speculative Decoding", Algorithm 2; vLLM V2's `use_block_verification`), all in fp64:
    P_0 = 1
    P_i = 0 if P_{i-1} p_{i-1}(x_{i-1}) == 0;  1 if q_{i-1}(x_{i-1}) == 0;
          min(P_{i-1} p_{i-1}(x_{i-1}) / q_{i-1}(x_{i-1}), 1) otherwise                 (i = 1..n)
    R_i = P_i * sum_v max(p_i(v) - q_i(v) / P_i, 0)   (= sum_v max(P_i p_i(v) - q_i(v), 0);
          R_i = 0 if P_i == 0)                                                         (i = 1..n-1)
    h_i = R_i / (R_i + (1 - P_i))  (1 if the denominator is 0)  for i < n;   h_n = P_n
    a = tau = max({0} u {i in 1..n : u_{i-1} < h_i})        (every row is scanned, no early exit)
    y = Sample(max(p_a - q_a / P_a, 0)) if a < n else Sample(p_n)
`P_i` is the capped likelihood ratio of the prefix `x_0..x_{i-1}`; `R_i` is the mass the target
still owes at position `i` after a rejection there, so `h_i` is the probability of ending the
block at `i` given it does not end later. `P_a > 0` whenever `a >= 1` is chosen (`u < h_a`
needs `h_a > 0`), and `P_0 = 1`, so the residual division is safe; dividing by `P_a` rescales
`max(P_a p_a - q_a, 0)` by a positive constant, which the race ignores (and it leaves no
multiply-add a GPU compiler could fuse differently from the reference). For `n = 1` this is
token-wise verification (`h_1 = min(1, p/q)`) up to the rounding of `u q < p` vs `u < p/q`.
Block verification is lossless and its expected accepted length is never below token-wise
(Sun et al., Theorems 1-2; `tests/ops/test_acceptance_distribution.py` checks both).

Rounding contract: the decisions use the same fp64 elementwise operations in every
implementation; only the order of the vocab sums in `R_i` differs (blocked in Triton), so a block
decision can differ only when `u` falls within ~1e-16 relative of `h_i`: never observed, and
probability ~1e-13 per decision. Greedy argmax, the token-wise test and the race keys are
bit-identical.
"""

import dataclasses
import math

import torch

__all__ = ["AcceptanceInputs", "acceptance_sample_reference", "block_thresholds"]

METHODS = ("token", "block")


def _counts(cu_num_draft_tokens: torch.Tensor) -> torch.Tensor:
    cu = cu_num_draft_tokens.long()
    return torch.diff(cu, prepend=cu.new_zeros(1))


def _check_range(name: str, x: torch.Tensor, lo: float, hi: float, what: str) -> None:
    """`lo <= x` and `x < hi` elementwise: one fused min/max pass (a host sync on CUDA)."""
    if x.numel() == 0:
        return
    mn, mx = (v.item() for v in torch.aminmax(x))
    if not (mn >= lo and mx < hi):  # NaN fails both comparisons
        raise ValueError(f"{name} must be {what} (found min {mn}, max {mx})")


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: tensors have no boolean `==`
class AcceptanceInputs:
    """The tensors of one verification call, in vLLM V1's flattened ragged layout.

    `T` is the total number of drafts, `B` the number of requests, `V` the vocabulary size. Every
    implementation (`acceptance_sample_reference`, `acceptance_sample_torch`,
    `acceptance_sample_triton`) takes one of these, and the dispatcher `acceptance_sample` builds
    one from its arguments of the same names; `dataclasses.replace` swaps fields (e.g. fresh
    `uniforms` and `exp_noise`). All tensors live on `target_probs`'s device and are contiguous.

    Attributes:
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
        exp_noise: `[B, V]` fp32 Exp(1) noise (> 0), one vector per request (the race
            `argmax(weights / exp_noise)` draws the single resampled or bonus token).
    """

    draft_token_ids: torch.Tensor
    cu_num_draft_tokens: torch.Tensor
    target_probs: torch.Tensor
    bonus_probs: torch.Tensor
    draft_probs: torch.Tensor | None
    is_greedy: torch.Tensor
    uniforms: torch.Tensor
    exp_noise: torch.Tensor

    def tensors(self) -> dict[str, torch.Tensor | None]:
        """The fields by name (shallow: the tensors themselves, not copies)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to(self, device) -> "AcceptanceInputs":
        """The same inputs on `device`."""
        return AcceptanceInputs(**{k: None if t is None else t.to(device)
                                   for k, t in self.tensors().items()})

    def check(self, method: str, *, max_num_draft_tokens: int | None = None,
              validate: bool = True) -> int:
        """Raise ValueError naming the offending field; return `max_K` (drafts per request).

        Dtypes, ranks, shapes, devices and contiguity are always checked (free). With `validate`,
        the values are checked too: probabilities and noise finite and `>= 0`, draft ids in
        `[0, V)`, `cu_num_draft_tokens` non-decreasing and ending at `T`. That costs one read of
        every input (dominated by `target_probs`, `[T, V]`, about the cost of one softmax) and a
        host sync on CUDA. `max_num_draft_tokens`, when given, is trusted and avoids the sync
        that deriving it needs.
        """
        from vllm_specx.ops._triton_utils import check_shape, check_tensor

        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        check_tensor("target_probs", self.target_probs, ndim=2, dtypes=(torch.float32,))
        dev = self.target_probs.device
        T, V = self.target_probs.shape
        check_tensor("cu_num_draft_tokens", self.cu_num_draft_tokens, ndim=1,
                     dtypes=(torch.int32, torch.int64), device=dev)
        B = self.cu_num_draft_tokens.shape[0]
        ids, f32 = (torch.int32, torch.int64), (torch.float32,)
        for name, ndim, dtypes, shape in (
            ("draft_token_ids", 1, ids, (T,)),
            ("bonus_probs", 2, f32, (B, V)),
            ("draft_probs", 2, f32, (T, V)),
            ("is_greedy", 1, (torch.bool,), (B,)),
            ("uniforms", 1, (torch.float64,), (T,)),
            ("exp_noise", 2, f32, (B, V)),
        ):
            t = getattr(self, name)
            if t is None and name == "draft_probs":
                continue
            check_tensor(name, t, ndim=ndim, dtypes=dtypes, device=dev)
            check_shape(name, t, shape)
        if V == 0:
            raise ValueError("target_probs must have a non-empty vocab dimension")
        if max_num_draft_tokens is not None and not validate:
            return int(max_num_draft_tokens)
        counts = _counts(self.cu_num_draft_tokens)
        max_k = int(counts.max()) if B else 0
        if validate:
            cu = self.cu_num_draft_tokens
            if (B and (int(counts.min()) < 0 or int(cu[-1]) != T)) or (not B and T):
                raise ValueError(f"cu_num_draft_tokens must be non-decreasing and end at T={T}")
            _check_range("draft_token_ids", self.draft_token_ids, 0, V, f"in [0, {V})")
            inf = float("inf")
            for name in ("target_probs", "bonus_probs", "draft_probs"):
                if getattr(self, name) is not None:
                    _check_range(name, getattr(self, name), 0.0, inf, "finite and non-negative")
            _check_range("exp_noise", self.exp_noise, math.ulp(0.0), inf, "finite and positive")
            _check_range("uniforms", self.uniforms, 0.0, 1.0, "in [0, 1)")
            if max_num_draft_tokens is not None and max_num_draft_tokens < max_k:
                raise ValueError(f"max_num_draft_tokens={max_num_draft_tokens} < the largest "
                                 f"per-request draft count {max_k}")
        return max_k if max_num_draft_tokens is None else int(max_num_draft_tokens)


def _race(w: torch.Tensor, noise: torch.Tensor) -> int | None:
    """`Sample(w)`: argmax of `w / noise` over `w > 0` (first index), or None if `w <= 0`."""
    pos = w > 0
    if not bool(pos.any()):
        return None
    key = torch.where(pos, w / noise.to(w.dtype), -1.0)
    return int(torch.argmax(key))


def _sample(w: torch.Tensor, p: torch.Tensor, noise: torch.Tensor) -> int:
    """`Sample(w)` with the documented fallback to `Sample(p)` (p: the fp32 target row)."""
    tok = _race(w, noise)
    if tok is None:
        tok = _race(p, noise)
    return 0 if tok is None else tok  # all-zero target row: not a distribution (documented)


def _ratio_step(P: float, px: float, qx: float) -> float:
    """`P_i` from `P_{i-1}` and the drafted token's target/draft probabilities (fp64)."""
    pp = P * px
    if pp == 0.0:
        return 0.0
    if qx == 0.0:
        return 1.0
    return min(pp / qx, 1.0)


def block_thresholds(
    target_rows: torch.Tensor,  # [n, V] fp32: p_0 .. p_{n-1}
    draft_rows: torch.Tensor,  # [n, V] fp32: q_0 .. q_{n-1} (one-hot rows for one-hot drafts)
    drafts: torch.Tensor,  # [n] int: x_0 .. x_{n-1}
) -> tuple[list[float], list[float]]:
    """Block verification's `P_0..P_n` and `h_1..h_n` (as `h[0..n-1]`) for one request.

    The request ends its block at `tau = max{i : u_{i-1} < h_i}` (0 if none). Exposed so tests
    can compute exact expected accepted lengths, `E[tau] = sum_i i h_i prod_{j>i} (1 - h_j)`.
    """
    n = drafts.shape[0]
    P = [1.0]
    for i in range(n):
        x = int(drafts[i])
        P.append(_ratio_step(P[-1], float(target_rows[i, x]), float(draft_rows[i, x])))
    h = []
    for i in range(1, n + 1):
        if i == n:
            h.append(P[n])
            continue
        Pi = P[i]
        if Pi == 0.0:
            R = 0.0
        else:
            resid = (target_rows[i].double() - draft_rows[i].double() / Pi).clamp_min(0)
            R = Pi * float(resid.sum())
        denom = R + (1.0 - Pi)
        h.append(R / denom if denom > 0 else 1.0)
    return P, h


def acceptance_sample_reference(
    inputs: AcceptanceInputs,
    method: str = "token",
    *,
    max_num_draft_tokens: int | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """The module docstring's algorithm, one request and one position at a time.

    Returns:
        `[B, max_K + 1]` int32: accepted drafts, then the resampled or bonus token, `-1` after.
    """
    max_k = inputs.check(method, max_num_draft_tokens=max_num_draft_tokens, validate=validate)
    target_probs, bonus_probs = inputs.target_probs, inputs.bonus_probs
    B, V = bonus_probs.shape
    out = torch.full((B, max_k + 1), -1, dtype=torch.int32)
    cu = inputs.cu_num_draft_tokens.long().cpu().tolist()
    tp, bp, ep = target_probs.cpu(), bonus_probs.cpu(), inputs.exp_noise.cpu()
    dp = None if inputs.draft_probs is None else inputs.draft_probs.cpu()
    drafts, us = inputs.draft_token_ids.long().cpu(), inputs.uniforms.cpu()
    greedy = inputs.is_greedy.cpu()
    for b in range(B):
        s = cu[b - 1] if b else 0
        n = cu[b] - s
        x = drafts[s:s + n]
        p_rows = tp[s:s + n]
        if dp is None:
            q_rows = torch.zeros(n, V)
            q_rows[torch.arange(n), x] = 1.0
        else:
            q_rows = dp[s:s + n]
        if bool(greedy[b]):
            a, y = _greedy(p_rows, x, bp[b])
        elif method == "token":
            a, y = _token(p_rows, q_rows, x, us[s:s + n], bp[b], ep[b])
        else:
            a, y = _block(p_rows, q_rows, x, us[s:s + n], bp[b], ep[b])
        out[b, :a] = x[:a].int()
        out[b, a] = y
    return out.to(target_probs.device)


def _greedy(p_rows, x, bonus) -> tuple[int, int]:
    for i in range(x.shape[0]):
        g = int(torch.argmax(p_rows[i]))
        if g != int(x[i]):
            return i, g
    return x.shape[0], int(torch.argmax(bonus))


def _token(p_rows, q_rows, x, u, bonus, noise) -> tuple[int, int]:
    for i in range(x.shape[0]):
        xi = int(x[i])
        if not float(u[i]) * float(q_rows[i, xi]) < float(p_rows[i, xi]):
            return i, _sample((p_rows[i] - q_rows[i]).clamp_min(0), p_rows[i], noise)
    return x.shape[0], _sample(bonus, bonus, noise)


def _block(p_rows, q_rows, x, u, bonus, noise) -> tuple[int, int]:
    n = x.shape[0]
    P, h = block_thresholds(p_rows, q_rows, x)
    tau = 0
    for i in range(1, n + 1):
        if float(u[i - 1]) < h[i - 1]:
            tau = i
    if tau == n:
        return n, _sample(bonus, bonus, noise)
    w = (p_rows[tau].double() - q_rows[tau].double() / P[tau]).clamp_min(0)
    return tau, _sample(w, p_rows[tau], noise)
