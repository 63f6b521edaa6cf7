"""DSpark in plain PyTorch: the reference for the vLLM path and the model the trainer trains.

Notation (one request): target tokens x_0..x_{L-1}; taps[t] = concat of the target's residual
stream after each layer in `target_layer_ids`, for token t; anchor position a (the last verified
token, which has no tap yet); N = block_size - 1 drafts.

    c      = fc(taps[t])                      for every context position t < a
    K_l,V_l = RoPE(k_norm_l(Wk_l hn(c))), Wv_l hn(c)     hn = hidden_norm (RMSNorm)
    block  = [x_a, m, ..., m] at positions a..a+N        m = mask_token_id, embedded by the target
    h      = Qwen3 layers over the block; each layer attends to [context K/V of that layer,
             the block's own K/V] (bidirectional inside the block unless `causal`)
    base_k = lm_head(norm(h[s_k]))            s_k = k (anchor layout) or k + 1 (fill-in)
    draft k: logits_k = base_k + W2 W1[prev_k],  prev_0 = x_a, prev_k = draft k-1
             (teacher forcing in training: prev_k = x_{a+k}); draft k predicts x_{a+1+k}.

This is exactly what `DSparkProposer` + `SpecxDSparkForCausalLM` compute inside vLLM.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vllm_specx.config import DSparkDraftConfig


class RMSNorm(nn.Module):
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


class DraftLayer(nn.Module):
    """One Qwen3 decoder layer whose attention also sees externally supplied context K/V."""

    def __init__(self, cfg: DSparkDraftConfig):
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = nn.Module()
        a = self.self_attn
        a.q_proj = nn.Linear(h, cfg.num_attention_heads * hd, bias=False)
        a.k_proj = nn.Linear(h, cfg.num_key_value_heads * hd, bias=False)
        a.v_proj = nn.Linear(h, cfg.num_key_value_heads * hd, bias=False)
        a.o_proj = nn.Linear(cfg.num_attention_heads * hd, h, bias=False)
        a.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        a.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)

    def kv(self, x: torch.Tensor, pos: torch.Tensor):
        """K/V of inputs x [B, T, H] (already normed) at positions pos [B, T]."""
        c, a = self.cfg, self.self_attn
        k = a.k_norm(a.k_proj(x).unflatten(-1, (c.num_key_value_heads, c.head_dim)))
        v = a.v_proj(x).unflatten(-1, (c.num_key_value_heads, c.head_dim))
        return rope(k, pos, c.rope_theta), v

    def forward(self, h, pos, ctx_k, ctx_v, mask):
        """h: [B, Q, H] block states; pos: [B, Q]; ctx_k/v: [B, T, kvh, hd]; mask: [B, Q, T+Q] bool."""
        c, a = self.cfg, self.self_attn
        x = self.input_layernorm(h)
        q = rope(a.q_norm(a.q_proj(x).unflatten(-1, (c.num_attention_heads, c.head_dim))), pos, c.rope_theta)
        k, v = self.kv(x, pos)
        k, v = torch.cat([ctx_k, k], 1), torch.cat([ctx_v, v], 1)
        rep = c.num_attention_heads // c.num_key_value_heads
        q, k, v = (t.transpose(1, 2) for t in (q, k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=1 / math.sqrt(c.head_dim))
        h = h + a.o_proj(o.transpose(1, 2).flatten(2))
        x = self.post_attention_layernorm(h)
        return h + self.mlp.down_proj(F.silu(self.mlp.gate_proj(x)) * self.mlp.up_proj(x))


class DSparkDraft(nn.Module):
    """The DSpark head. `embed` and `lm_head` are the target's, frozen (not saved with the draft)."""

    def __init__(self, cfg: DSparkDraftConfig, embed: torch.Tensor, lm_head: torch.Tensor):
        super().__init__()
        self.cfg = cfg
        self.register_buffer("embed", embed.detach().clone(), persistent=False)  # [V, H]
        self.register_buffer("lm_head", lm_head.detach().clone(), persistent=False)  # [V, H]
        h = cfg.hidden_size
        self.fc = nn.Linear(cfg.target_hidden_size * len(cfg.target_layer_ids), h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.markov_head = nn.Module()
        self.markov_head.markov_w1 = nn.Embedding(cfg.vocab_size, cfg.markov_rank)
        self.markov_head.markov_w2 = nn.Linear(cfg.markov_rank, cfg.draft_vocab_size, bias=False)

    def markov_bias(self, prev: torch.Tensor) -> torch.Tensor:
        return self.markov_head.markov_w2(self.markov_head.markov_w1(prev))

    def block_states(self, taps, ctx_pos, ids, pos, mask):
        """Post-norm hidden states of the query slots.

        Args:
            taps: [B, T, n_taps * Ht] target taps of the context rows.
            ctx_pos: [B, T] their positions.
            ids, pos: [B, Q] query-slot token ids and positions.
            mask: [B, Q, T + Q] bool, True where a query may attend (context keys, then slots).
        Returns:
            [B, Q, H].
        """
        ctx = self.hidden_norm(self.fc(taps))
        h = self.embed[ids]
        for layer in self.layers:
            k, v = layer.kv(ctx, ctx_pos)
            h = layer(h, pos, k, v, mask)
        return self.norm(h)

    def slot_of_draft(self, k: int) -> int:
        return k if self.cfg.sample_from_anchor else k + 1

    @torch.no_grad()
    def greedy_drafts(self, taps: torch.Tensor, anchor: int, num_drafts: int) -> list[int]:
        """Reference drafts for one request: context = taps [T, n*Ht] at positions 0..T-1,
        anchor token at position T. Returns the N greedy draft ids."""
        t, q = taps.shape[0], num_drafts + 1
        ids = torch.full((1, q), self.cfg.mask_token_id, dtype=torch.long)
        ids[0, 0] = anchor
        pos = torch.arange(t, t + q)[None]
        mask = block_mask(torch.tensor([[t]]), t, q, self.cfg.causal)[0][None].reshape(1, q, t + q)
        h = self.block_states(taps[None], torch.arange(t)[None], ids, pos, mask)[0]
        prev, out = torch.tensor([anchor]), []
        for k in range(num_drafts):
            logits = h[self.slot_of_draft(k)] @ self.lm_head.t() + self.markov_bias(prev)[0]
            prev = logits.argmax(-1, keepdim=True)
            out.append(int(prev))
        return out


def block_mask(anchors: torch.Tensor, seq_len: int, q: int, causal: bool) -> torch.Tensor:
    """Attention mask for M blocks of q slots per sequence.

    Args:
        anchors: [B, M] anchor positions a (context keys are positions < a).
    Returns:
        [B, M*q, seq_len + M*q] bool: slot i of block j sees context t < a_j and slots of block j
        (only slots <= i when causal).
    """
    b, m = anchors.shape
    ctx = torch.arange(seq_len)[None, None, None, :] < anchors[:, :, None, None]  # [B, M, 1, T]
    ctx = ctx.expand(b, m, q, seq_len)
    same = torch.eye(m, dtype=torch.bool)[:, None, :, None].expand(m, q, m, q)  # [M, q, M, q]
    if causal:
        same = same & torch.ones(q, q, dtype=torch.bool).tril()[None, :, None, :]
    blk = same.reshape(1, m, q, m * q).expand(b, m, q, m * q)
    return torch.cat([ctx, blk], -1).reshape(b, m * q, seq_len + m * q)
