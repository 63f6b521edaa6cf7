"""Shared PyTorch layers of the reference / trainer models (`methods/*/model.py`).

Plain PyTorch, no vLLM: these define the math the vLLM-side models must match token for token.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight in fp32 (returns fp32)."""
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in fp32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding. x: [..., T, heads, hd]; pos: [..., T]."""
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    ang = pos.float()[..., None] * inv  # [..., T, hd/2]
    cos, sin = ang.cos()[..., None, :], ang.sin()[..., None, :]
    x1, x2 = x[..., : hd // 2].float(), x[..., hd // 2:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention.

    Args:
        q: [B, Q, heads, hd]; k, v: [B, S, kv_heads, hd] (heads a multiple of kv_heads);
        mask: [B, Q, S] bool, True where a query may attend.
    Returns:
        [B, Q, heads * hd].
    """
    rep = q.shape[2] // k.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q, k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)))
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=1 / math.sqrt(q.shape[-1]))
    return o.transpose(1, 2).flatten(2)


class ContextDecoderLayer(nn.Module):
    """One Qwen3 decoder layer (q/k RMSNorm, RoPE, GQA, SwiGLU MLP) whose attention also sees
    externally supplied context K/V, as draft heads that attend to the target's states do.

    `cfg` needs hidden_size, head_dim, num_attention_heads, num_key_value_heads,
    intermediate_size, rms_norm_eps, rope_theta. Parameter names are vLLM's / transformers'.
    """

    def __init__(self, cfg):
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.rope_theta = cfg.rope_theta
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = nn.Module()
        a = self.self_attn
        a.q_proj = nn.Linear(h, self.heads * hd, bias=False)
        a.k_proj = nn.Linear(h, self.kv_heads * hd, bias=False)
        a.v_proj = nn.Linear(h, self.kv_heads * hd, bias=False)
        a.o_proj = nn.Linear(self.heads * hd, h, bias=False)
        a.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        a.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)

    def kv(self, x: torch.Tensor, pos: torch.Tensor):
        """K/V of inputs x [B, T, H] (already normed) at positions pos [B, T]."""
        a = self.self_attn
        k = a.k_norm(a.k_proj(x).unflatten(-1, (self.kv_heads, self.head_dim)))
        v = a.v_proj(x).unflatten(-1, (self.kv_heads, self.head_dim))
        return rope(k, pos, self.rope_theta), v

    def forward(self, h, pos, ctx_k, ctx_v, mask):
        """h: [B, Q, H] states; pos: [B, Q]; ctx_k/v: [B, T, kvh, hd]; mask: [B, Q, T+Q] bool."""
        a = self.self_attn
        x = self.input_layernorm(h)
        q = rope(a.q_norm(a.q_proj(x).unflatten(-1, (self.heads, self.head_dim))), pos, self.rope_theta)
        k, v = self.kv(x, pos)
        h = h + a.o_proj(gqa_attention(q, torch.cat([ctx_k, k], 1), torch.cat([ctx_v, v], 1), mask))
        x = self.post_attention_layernorm(h)
        return h + self.mlp.down_proj(F.silu(self.mlp.gate_proj(x)) * self.mlp.up_proj(x))


def causal_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal grouped-query attention over one sequence per batch row (a draft's step 0 over every
    position). q [B, S, heads, hd], k/v [B, S, kv_heads, hd] -> [B, S, heads * hd]."""
    s = q.shape[1]
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    return gqa_attention(q, k, v, mask[None].expand(q.shape[0], -1, -1))


def chain_step_attention(q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, ctx_mask: torch.Tensor,
                         own_k: list[torch.Tensor] | None = None, own_v: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Attention of one draft step of M chains per sequence (a recurrent draft unrolled for training).

    Args:
        q: [B, M, heads, hd], the step's queries (RoPE applied).
        k_ctx, v_ctx: [B, S, heads, hd], step 0's keys/values of every position (heads expanded).
        ctx_mask: [B, M, S] bool, True where chain m may attend (positions <= its step-0 row).
        own_k, own_v: the chain's own keys/values of steps 1..j, each [B, M, heads, hd] (None or
            empty: the step attends to the context only - KVShare).
    Returns:
        [B, M, heads, hd].
    """
    scale = 1 / math.sqrt(q.shape[-1])
    sc = torch.einsum("bmhd,bshd->bmhs", q, k_ctx) * scale
    sc = sc.masked_fill(~ctx_mask[:, :, None, :], float("-inf"))
    if not own_k:
        w = torch.softmax(sc.float(), -1).to(q.dtype)
        return torch.einsum("bmhs,bshd->bmhd", w, v_ctx)
    ko, vo = torch.stack(own_k, 2), torch.stack(own_v, 2)  # [B, M, j, h, hd]
    so = torch.einsum("bmhd,bmjhd->bmhj", q, ko) * scale
    w = torch.softmax(torch.cat([sc, so], -1).float(), -1).to(q.dtype)
    s = k_ctx.shape[1]
    return torch.einsum("bmhs,bshd->bmhd", w[..., :s], v_ctx) + torch.einsum("bmhj,bmjhd->bmhd", w[..., s:], vo)


def unroll_chain(step0: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, ids: torch.Tensor,
                 anchors: torch.Tensor, n: int, step, logits_of, rep: int, own_kv: bool,
                 chain_tokens: str = "target", target_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The recurrent chain of a one-layer drafter (MTP, EAGLE-3) unrolled for M anchors per
    sequence in parallel: the one chain loop the MTP layer and the EAGLE-3 baseline share.

    Step 0 ran at every position (`step0` [B, S, H] its outputs, `k0`, `v0` [B, S, kv_heads, hd]
    its keys/values: the draft's KV cache from the target's hidden states). For each anchor a
    ([B, M], 1 <= a), draft 1 is read from step 0's output at p = a - 1; step j >= 1 takes
    token x_{a+j} (`chain_tokens="target"`: ids [B, S], -100 = padding) or the previous draft
    ("draft": its argmax, mapped to a target id through `target_ids` for a reduced draft
    vocabulary) and the previous step's output, at RoPE position p + j, and attends to step 0's
    keys at positions <= p plus, when `own_kv`, its own chain's keys of steps 1..j (mixed KV;
    without it, KVShare: step 0's key set only).

    `step(tok [B, M], g [B, M, H], pos [B, M]) -> (q [B, M, h, hd], k, v [B, M, kvh, hd], carry)`
    and its `finish(attn [B, M, h*hd], carry) -> g` are the method's layer; `logits_of(g)` its head.
    Returns logits [B, M, n, V].
    """
    from vllm_specx import vocab

    step_fn, finish = step
    b, m = anchors.shape
    p = anchors - 1  # step 0's position for each chain
    bi = torch.arange(b, device=ids.device)[:, None]
    g = step0[bi, p]  # [B, M, H]
    logits = [logits_of(g)]
    s = ids.shape[1]
    ctx_mask = torch.arange(s, device=ids.device)[None, None, :] <= p[..., None]  # [B, M, S]
    kc, vc = k0.repeat_interleave(rep, 2), v0.repeat_interleave(rep, 2)  # [B, S, h, hd]
    own_k, own_v = [], []  # stay empty with KVShare
    for j in range(1, n):
        if chain_tokens == "draft":
            tok = vocab.to_target(logits[-1].detach().argmax(-1), target_ids)
        else:
            tok = ids[bi, (anchors + j).clamp(max=s - 1)].clamp(min=0)
        q, k, v, carry = step_fn(tok, g, p + j)
        if own_kv:
            own_k.append(k.repeat_interleave(rep, -2))
            own_v.append(v.repeat_interleave(rep, -2))
        g = finish(chain_step_attention(q, kc, vc, ctx_mask, own_k, own_v).flatten(-2), carry)
        logits.append(logits_of(g))
    return torch.stack(logits, 2)
