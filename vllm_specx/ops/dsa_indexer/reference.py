r"""Pure-PyTorch spec of the DeepSeek Sparse Attention (DSA) indexer, as vLLM runs it for
DeepSeek-V3.2 and GLM-5 (`index_n_heads` H = 64, `index_head_dim` D = 128, RoPE'd prefix R = 64,
`index_topk` k = 2048).

What the indexer computes, per query token `t` (at request-local position `pos_t`) and key `s`:

    I(t, s) = sum_h  w(t, h) * ReLU( q(t, h, :) . k(s, :) ) * k_scale(s)      for 0 <= s <= pos_t
    I(t, s) = -inf                                                            otherwise (causal)
    topk(t) = indices of the k largest I(t, :), ascending, -1 padded    (see `ops/topk/reference`)

with the inputs prepared as follows (the `prepare_*` helpers below):

    k(s)    = RoPE_R( LayerNorm(wk x_s; gamma, beta, eps=1e-6), pos_s )     # key norm, partial RoPE
    q(t, h) = RoPE_R( (wq_b qc_t)[h], pos_t )                               # partial RoPE only
    w(t, h) = weights_proj(x_t)[h] * q_scale(t, h) * D**-0.5 * H**-0.5      # weight scaling

`RoPE_R` rotates only dims `[0, R)`: NeoX pairs `(i, i + R/2)` by default, GPT-J pairs
`(2i, 2i + 1)` when `interleave=True`; dims `[R, D)` pass through. All keys of a request share
one K row per token (MQA), so one key read serves all H heads.

The unquantised path uses `q_scale = k_scale = 1`. vLLM's fp8 path stores
`q8 = q / q_scale`, `k8 = k / k_scale` as e4m3 with power-of-two (ue8m0) scales
(`quantize_fp8_ue8m0`) and computes exactly the formula above on (q8, k8); since every e4m3 value
is exact in bf16, casting q8/k8 to bf16 and passing `k_scale` (with `q_scale` folded into `w`)
gives the kernels the same maths.

Layouts (request-local key indices everywhere; this is what sparse MLA consumes):
* prefill / varlen: queries of all requests concatenated `[T, H, D]`, delimited by
  `cu_seqlens_q [B+1]`; keys concatenated `[S_total, D]`, delimited by `cu_seqlens_k [B+1]`.
  The queries of request b are its *last* `q_len_b` tokens: `pos = kv_len_b - q_len_b + i`.
* decode / paged: `N` query tokens per request (1 + draft tokens) `[B, N, H, D]`; keys in a paged
  cache `[num_pages, page_size, D]` addressed by `block_table [B, max_pages]`, with `seq_lens [B]`
  counting the N new tokens (so `pos = seq_len_b - N + i`, vLLM's `row_end - 1`).

All maths here is fp32 whatever the input dtype; it is the spec, not a fast path.
"""

import torch

from vllm_specx.ops.topk.reference import topk_reference

FP8_E4M3_MAX = 448.0


# --------------------------------------------------------------------------- input preparation


def rope_cos_sin(
    positions: torch.Tensor, rope_dim: int, base: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain RoPE tables (no YaRN scaling; callers with scaled RoPE pass their own tables).

    Args:
        positions: `[N]` int positions.
        rope_dim: R, the rotated prefix width (even).

    Returns:
        `(cos, sin)`, each `[N, R // 2]` fp32.
    """
    inv_freq = base ** (-torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim)
    angles = positions.double()[:, None] * inv_freq.to(positions.device)[None, :]
    return angles.cos().float(), angles.sin().float()


def apply_partial_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool = False
) -> torch.Tensor:
    """Rotate dims `[0, R)` of `x` (`R = 2 * cos.shape[-1]`); the rest passes through.

    Args:
        x: `[N, D]` or `[N, H, D]`.
        cos, sin: `[N, R // 2]`, broadcast over heads.
        interleave: GPT-J pairs `(2i, 2i+1)` instead of NeoX pairs `(i, i + R/2)`.

    Returns:
        fp32 tensor shaped like `x`.
    """
    x = x.float().clone()
    half = cos.shape[-1]
    if x.dim() == 3:
        cos, sin = cos[:, None, :], sin[:, None, :]
    if interleave:
        x1, x2 = x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2]
    else:
        x1, x2 = x[..., :half], x[..., half : 2 * half]
    r1, r2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if interleave:
        x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2] = r1, r2
    else:
        x[..., :half], x[..., half : 2 * half] = r1, r2
    return x


def prepare_indexer_k(
    k_proj: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float = 1e-6,
    interleave: bool = False,
) -> torch.Tensor:
    """Indexer key: LayerNorm (fp32, with bias) then partial RoPE.

    Args:
        k_proj: `[S, D]`, the output of `wk` (any float dtype).
        norm_weight, norm_bias: `[D]`, `k_norm` parameters.
        cos, sin: `[S, R // 2]` RoPE tables at the keys' positions.

    Returns:
        `[S, D]` fp32.
    """
    k = torch.nn.functional.layer_norm(
        k_proj.float(), (k_proj.shape[-1],), norm_weight.float(), norm_bias.float(), eps
    )
    return apply_partial_rope(k, cos, sin, interleave)


def prepare_indexer_q(
    q_proj: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool = False
) -> torch.Tensor:
    """Indexer query: partial RoPE only, no norm.

    `q_proj [T, H, D]`, `cos/sin [T, R // 2]` -> `[T, H, D]` fp32.
    """
    return apply_partial_rope(q_proj, cos, sin, interleave)


def prepare_indexer_weights(
    weights_proj: torch.Tensor, head_dim: int, q_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """Fold the softmax scale `D**-0.5`, the head average `H**-0.5` and (fp8) `q_scale` into `w`.

    Args:
        weights_proj: `[T, H]` (or `[..., H]`), the output of `weights_proj`.
        head_dim: D.
        q_scale: optional, shaped like `weights_proj`: per (token, head) fp8 scale of q.

    Returns:
        fp32 tensor shaped like `weights_proj`.
    """
    n_heads = weights_proj.shape[-1]
    w = weights_proj.float() * (head_dim**-0.5 * n_heads**-0.5)
    return w if q_scale is None else w * q_scale.float()


def quantize_fp8_ue8m0(
    x: torch.Tensor, eps: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's indexer fp8 quantisation, one power-of-two scale per last-dim vector.

        s = 2 ** ceil(log2(max(amax|x|, eps) / 448));   x8 = e4m3(x / s)

    Args:
        x: `[..., D]`, e.g. k `[S, D]` or q `[T, H, D]`.
        eps: 1e-4 (the K cache and the fused q kernel; `sparse_attn_indexer` uses 1e-10 for q).

    Returns:
        `(x8 [..., D] float8_e4m3fn, s [...] fp32)` with `x ~= x8.float() * s[..., None]`.
    """
    amax = x.float().abs().amax(dim=-1).clamp(min=eps)
    scale = torch.exp2(torch.ceil(torch.log2(amax / FP8_E4M3_MAX)))
    x8 = (x.float() / scale[..., None]).to(torch.float8_e4m3fn)
    return x8, scale


# --------------------------------------------------------------------------- logits


def _request_logits(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, k_scale: torch.Tensor | None, width: int
) -> torch.Tensor:
    """Causal logits of one request: `q [Tq, H, D]`, `k [Sk, D]`, `w [Tq, H]` -> `[Tq, width]`.

    The queries are the last `Tq` of the `Sk` keys. Heads are accumulated one at a time so the
    peak memory is `[Tq, Sk]`, not `[Tq, H, Sk]` (the benchmark runs this at 1M keys).
    """
    num_q, num_k = q.shape[0], k.shape[0]
    q, k, w = q.float(), k.float(), w.float()
    acc = torch.zeros(num_q, num_k, dtype=torch.float32, device=q.device)
    for h in range(q.shape[1]):
        acc += w[:, h, None] * torch.relu(q[:, h] @ k.T)
    if k_scale is not None:
        acc *= k_scale.float()[None, :]
    pos = torch.arange(num_k - num_q, num_k, device=q.device)
    causal = torch.arange(num_k, device=q.device)[None, :] <= pos[:, None]
    out = torch.full((num_q, width), float("-inf"), dtype=torch.float32, device=q.device)
    out[:, :num_k] = torch.where(causal, acc, float("-inf"))
    return out


def indexer_logits_prefill_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    k_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal varlen indexer logits `I(t, s)` (formula in the module docstring).

    Args:
        q: `[T, H, D]` prepared queries of all requests, concatenated.
        k: `[S_total, D]` prepared keys of all requests, concatenated.
        weights: `[T, H]` scaled head weights (`prepare_indexer_weights`).
        cu_seqlens_q: `[B+1]` int, query offsets; `cu_seqlens_k`: `[B+1]` int, key offsets.
            Needs `q_len_b <= kv_len_b`: the queries are the last tokens of their request.
        k_scale: optional `[S_total]` fp32 per-key scale (fp8 cache).

    Returns:
        `[T, S_max]` fp32 with `S_max = max_b kv_len_b`; column `s` is the request-local key `s`,
        `-inf` where `s > pos_t` (which includes `s >= kv_len_b`).
    """
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    width = max([b - a for a, b in zip(ck[:-1], ck[1:])] + [0])
    out = torch.full((q.shape[0], width), float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(len(cq) - 1):
        if cq[b + 1] > cq[b]:
            ks = None if k_scale is None else k_scale[ck[b] : ck[b + 1]]
            out[cq[b] : cq[b + 1]] = _request_logits(
                q[cq[b] : cq[b + 1]], k[ck[b] : ck[b + 1]], weights[cq[b] : cq[b + 1]], ks, width
            )
    return out


def gather_paged(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` rows of one request from a paged cache.

    Args:
        cache: `[num_pages, page_size, ...]`.
        block_table: `[max_pages]` int, this request's page ids.

    Returns:
        `[length, ...]`.
    """
    page_size = cache.shape[1]
    num_pages = -(-length // page_size)
    pages = cache[block_table[:num_pages].long()]
    return pages.reshape(num_pages * page_size, *cache.shape[2:])[:length]


def indexer_logits_decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    weights: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """Paged decode indexer logits, `N` query tokens per request (1 + draft tokens).

    Args:
        q: `[B, N, H, D]` prepared queries.
        k_cache: `[num_pages, page_size, D]` prepared keys.
        weights: `[B, N, H]` scaled head weights.
        block_table: `[B, max_pages]` int page ids.
        seq_lens: `[B]` int, keys per request including the N new tokens (`>= N`).
        k_scale: optional `[num_pages, page_size]` fp32 per-key scale.
        max_seq_len: output width (default `max(seq_lens)`); must be `>= max(seq_lens)`.

    Returns:
        `[B, N, max_seq_len]` fp32; query i of request b sees keys `s <= seq_len_b - N + i`.
    """
    lens = seq_lens.tolist()
    width = max(lens + [0]) if max_seq_len is None else max_seq_len
    out = torch.full((*q.shape[:2], width), float("-inf"), dtype=torch.float32, device=q.device)
    for b, length in enumerate(lens):
        k = gather_paged(k_cache, block_table[b], length)
        ks = None if k_scale is None else gather_paged(k_scale, block_table[b], length)
        out[b] = _request_logits(q[b], k, weights[b], ks, width)
    return out


# --------------------------------------------------------------------------- fused -> top-k


def indexer_topk_prefill_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    topk: int,
    k_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """`[T, topk]` int32 request-local key indices: `topk_reference` of the prefill logits."""
    logits = indexer_logits_prefill_reference(q, k, weights, cu_seqlens_q, cu_seqlens_k, k_scale)
    return topk_reference(logits, topk)


def indexer_topk_decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    weights: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    k_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """`[B, N, topk]` int32 request-local key indices: `topk_reference` of the decode logits."""
    logits = indexer_logits_decode_reference(q, k_cache, weights, block_table, seq_lens, k_scale)
    return topk_reference(logits.flatten(0, 1), topk).view(*q.shape[:2], topk)
