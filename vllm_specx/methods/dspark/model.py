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

This is exactly what `proposer.DSparkProposer` + `vllm_model.SpecxDSparkForCausalLM` compute inside
vLLM; both use `MarkovHead` and `sequential_drafts` from here, so the head and the left-to-right
draft loop are written once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vllm_specx.layers import ContextDecoderLayer, RMSNorm
from vllm_specx.methods.dspark.config import DSparkDraftConfig


class MarkovHead(nn.Module):
    """The low-rank Markov logit correction `bias(prev) = W2 W1[prev]`.

    `markov_w1`: Embedding [vocab, r] indexed by target-vocab token ids; `markov_w2`: Linear r ->
    draft_vocab (weight [draft_vocab, r]). The same module (and tensor names) in the reference,
    the trainer and vLLM.
    """

    def __init__(self, vocab_size: int, draft_vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)

    def forward(self, prev: torch.Tensor) -> torch.Tensor:
        """prev: [...] token ids -> [..., draft_vocab] logit correction."""
        return self.markov_w2(self.markov_w1(prev.long()))


def sequential_drafts(base_logits: torch.Tensor, anchor_ids: torch.Tensor,
                      markov_bias: Callable[[torch.Tensor], torch.Tensor],
                      pick: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]):
    """DSpark's left-to-right draft loop: `logits_k = base_k + markov_bias(prev_k)`, prev_0 = the
    anchor, prev_k = draft k-1, draft k = pick(logits_k).

    Args:
        base_logits: [B, N, V] base logits of the N sample slots.
        anchor_ids: [B] last verified token per request.
        markov_bias: [B] ids -> [B, V].
        pick: [B, V] logits -> (ids [B], probabilities [B, V] or None for greedy).
    Returns:
        drafts [B, N] and their distributions [B, N, V] (None when `pick` returns none).
    """
    prev, tokens, probs = anchor_ids, [], []
    for k in range(base_logits.shape[1]):
        tok, p = pick(base_logits[:, k] + markov_bias(prev))
        tokens.append(tok)
        if p is not None:
            probs.append(p)
        prev = tok
    return torch.stack(tokens, 1), (torch.stack(probs, 1) if probs else None)


def greedy_pick(logits: torch.Tensor) -> tuple[torch.Tensor, None]:
    return logits.argmax(-1), None


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
        self.layers = nn.ModuleList(ContextDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.markov_head = MarkovHead(cfg.vocab_size, cfg.draft_vocab_size, cfg.markov_rank)

    def markov_bias(self, prev: torch.Tensor) -> torch.Tensor:
        return self.markov_head(prev)

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
        return k + self.cfg.slot_offset

    @torch.no_grad()
    def base_logits(self, taps: torch.Tensor, anchor: int, num_drafts: int) -> torch.Tensor:
        """Base logits [N, V] of the N sample slots for one request: context = taps [T, n*Ht] at
        positions 0..T-1, anchor token at position T (no Markov correction yet)."""
        t, q = taps.shape[0], num_drafts + 1
        ids = torch.full((1, q), self.cfg.mask_token_id, dtype=torch.long)
        ids[0, 0] = anchor
        pos = torch.arange(t, t + q)[None]
        mask = block_mask(torch.tensor([[t]]), t, q, self.cfg.causal)[0][None].reshape(1, q, t + q)
        h = self.block_states(taps[None], torch.arange(t)[None], ids, pos, mask)[0]
        slots = [self.slot_of_draft(k) for k in range(num_drafts)]
        return h[slots] @ self.lm_head.t()

    @torch.no_grad()
    def greedy_drafts(self, taps: torch.Tensor, anchor: int, num_drafts: int) -> list[int]:
        """Reference greedy drafts for one request (see `base_logits`). Returns the N draft ids."""
        base = self.base_logits(taps, anchor, num_drafts)[None]  # [1, N, V]
        drafts, _ = sequential_drafts(base, torch.tensor([anchor]), self.markov_bias, greedy_pick)
        return drafts[0].tolist()


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
