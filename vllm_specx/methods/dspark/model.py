"""DSpark in plain PyTorch: the reference for the vLLM path and the model the trainer trains.

Notation (one request): target tokens x_0..x_{L-1}; taps[t] = concat of the target's residual
stream after each layer in `target_layer_ids`, for token t; anchor position a (the last verified
token, which has no tap yet); N drafts, N <= `max_drafts` (block_size in the anchor layout,
block_size - 1 in the fill-in layout); o = `slot_offset` (0 anchor layout, 1 fill-in).

    c      = fc(taps[t])                      for every context position t < a
    K_l,V_l = RoPE(k_norm_l(Wk_l hn(c))), Wv_l hn(c)     hn = hidden_norm (RMSNorm)
    block  = [x_a, m, ..., m] at positions a..a+N+o-1    (N + o query slots; m = mask_token_id,
             embedded by the target)
    h      = Qwen3 layers over the block; each layer attends to [context K/V of that layer,
             the block's own K/V] (bidirectional inside the block unless `causal`)
    base_k = lm_head(norm(h[k + o]))
    draft k: logits_k = base_k + W2 W1[prev_k],  prev_0 = x_a, prev_k = draft k-1
             (teacher forcing in training: prev_k = x_{a+k}); draft k predicts x_{a+1+k}.

So the anchor layout drafts a full block: B slots, B drafts (the anchor slot predicts x_{a+1});
the fill-in layout (DFlash's) spends slot 0 on the anchor. Training uses B = block_size slots.

The full recipe (each a switch in `DSparkDraftConfig`; all off = the baseline above):

* final_layer_tap: the last tap is the target's final residual state r_{L-1} (its last layer's
  output, before the final norm; vLLM's aux hidden state L). It is one more column block W_f of
  `fc`, so c = fc(taps) = sum_t W_t tap_t still. Initialisation (`recipe.final_tap_columns`):
  W_f = eh_proj[:, H:] diag(hnorm) when the target has a native MTP layer (GLM / DeepSeek; the
  part of its projection that reads the final residual), else W_f = 0, so the draft starts as
  the baseline's function exactly.
* per_layer_fusion: with c_t = W_t tap_t [.., n_taps, H] (`tap_contributions`) and
  w_l = n_taps * softmax(fusion_logits[l]) (`layer_mixtures`), draft layer l's context is
  hn(sum_t w_{l,t} c_t) instead of hn(c). fusion_logits start at 0: w = 1, every layer's
  context is hn(c) = the baseline's (up to float summation order).
* slot_queries: query slot j >= 1 of a block starts from row j-1 of a learned table
  [block_size - 1, H] instead of embed(m) (`with_slot_queries`; rows start as embed(m), so the
  draft starts as the baseline). Slot 0 (the anchor) keeps its token's embedding; RoPE unchanged.
* recurrent head: markov_head_type "rnn" (`MarkovHead`): a state carried across the block's
  slots, stepped by `sequential_drafts` in serving as in training.

The next-token stream (`next_token_stream`, not part of the recipe): context row t also carries
the realised next token x_{t+1} (known for every verified row; for row a - 1 it is the anchor),
the copy path EAGLE-3's and MTP's context rows have:

    s_t = W_e tn(embed(x_{t+1}))          tn = next_token_norm (RMSNorm), W_e = next_token_proj
    "fused": layer context hn(c_t + s_t)  (inside the context projection, before hidden_norm)
    "added": layer context hn(c_t) + s_t  (beside the normed taps)

with c_t the layer's fused taps (fc(taps_t), or its per-layer mixture). The `next_ids` arguments give
x_{t+1} per context row (`next_ids_of` builds them).

This is exactly what `proposer.DSparkProposer` + `vllm_model.SpecxDSparkForCausalLM` compute inside
vLLM; both use `MarkovHead` and `sequential_drafts` from here, so the head and the left-to-right
draft loop are written once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vllm_specx import vocab
from vllm_specx.layers import ContextDecoderLayer, RMSNorm
from vllm_specx.methods.dspark.config import DSparkDraftConfig


class MarkovHead(nn.Module):
    """DSpark's sequential head: the logit correction of draft slot k from the previous token
    (and, for "gated" / "rnn", the slot's hidden state), added to the slot's base logits.

    With e_k = W1[prev_k] (Embedding [vocab, r]), W2 = Linear r -> draft_vocab (no bias) and h_k
    the slot's post-norm hidden state [H] (speculators' `MarkovHead.block_bias`, same tensor names):

        vanilla: bias_k = W2 e_k
        gated:   bias_k = W2 (sigmoid(gate_proj([h_k; e_k])) * e_k)        gate_proj: H + r -> r
        rnn:     g, c, o = split3(joint_proj([s_{k-1}; e_k; h_k]))         joint_proj: 2r + H -> 3r
                 s_k = sigmoid(g) * s_{k-1} + (1 - sigmoid(g)) * tanh(c),  s_{-1} = 0
                 bias_k = W2 tanh(o)

    The recurrent state runs over every query slot of the block in order (in the fill-in layout
    slot 0, the anchor's, too: its bias is unused, its state is not). The same module is used by
    the reference, the trainer and vLLM.
    """

    def __init__(self, vocab_size: int, draft_vocab_size: int, rank: int, hidden_size: int = 0,
                 head_type: str = "vanilla"):
        super().__init__()
        self.head_type, self.rank = head_type, rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)
        if head_type == "gated":
            self.gate_proj = nn.Linear(hidden_size + rank, rank)
        elif head_type == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)
        elif head_type != "vanilla":
            raise ValueError(f"markov_head_type {head_type!r} not one of vanilla, gated, rnn")

    @property
    def recurrent(self) -> bool:
        return self.head_type == "rnn"

    def step(self, prev: torch.Tensor, hidden: torch.Tensor | None = None,
             state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One slot: prev [B] ids, hidden [B, H] (not read by "vanilla"), state [B, r] or None
        (the zero state) -> (bias [B, draft_vocab], the state after this slot; None unless "rnn")."""
        e = self.markov_w1(prev.long())
        if self.head_type == "vanilla":
            return self.markov_w2(e), None
        hidden = hidden.to(e.dtype)
        if self.head_type == "gated":
            return self.markov_w2(torch.sigmoid(self.gate_proj(torch.cat([hidden, e], -1))) * e), None
        if state is None:
            state = e.new_zeros(*e.shape[:-1], self.rank)
        g, c, o = self.joint_proj(torch.cat([state, e, hidden], -1)).chunk(3, -1)
        g = torch.sigmoid(g)
        return self.markov_w2(torch.tanh(o)), g * state + (1.0 - g) * torch.tanh(c)

    def block_bias(self, prev: torch.Tensor, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher-forced bias of every slot of a block: prev [..., n] ids, hidden [..., n, H]
        (slot order; the recurrent state starts at zero at slot 0) -> [..., n, draft_vocab]."""
        if self.head_type == "vanilla":
            return self.markov_w2(self.markov_w1(prev.long()))
        if self.head_type == "gated":
            return torch.stack([self.step(prev[..., k], hidden[..., k, :])[0]
                                for k in range(prev.shape[-1])], -2)
        state, out = None, []
        for k in range(prev.shape[-1]):
            bias, state = self.step(prev[..., k], hidden[..., k, :], state)
            out.append(bias)
        return torch.stack(out, -2)

    def forward(self, prev: torch.Tensor) -> torch.Tensor:
        """prev: [...] token ids -> [..., draft_vocab]: the "vanilla" bias `W2 W1[prev]`."""
        if self.head_type != "vanilla":
            raise RuntimeError(f"a {self.head_type!r} Markov head needs hidden states: use step()")
        return self.markov_w2(self.markov_w1(prev.long()))


class ConfidenceHead(nn.Module):
    """Per-slot acceptance-probability logit (speculators' `ConfidenceHead`): `proj([h_k (; e_k)])`,
    `proj`: Linear(H [+ r], 1). Trained against the slot's acceptance rate; loaded so adaptive
    drafting can read it, not used to draft."""

    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1)


def sequential_drafts(base_logits: torch.Tensor, anchor_ids: torch.Tensor,
                      markov_step: Callable[[torch.Tensor, int, object], tuple[torch.Tensor, object]],
                      pick: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]],
                      state=None, target_ids: torch.Tensor | None = None, vocab_size: int = 0):
    """DSpark's left-to-right draft loop: `logits_k = base_k + bias_k`, where
    `bias_k, state = markov_step(prev_k, k, state)`, prev_0 = the anchor, prev_k = draft k-1
    (a target id), and draft k = pick(logits_k).

    Args:
        base_logits: [B, N, Vd] base logits of the N sample slots over the draft vocabulary.
        anchor_ids: [B] last verified token per request.
        markov_step: (prev [B] target ids, draft index k, state) -> (bias [B, Vd], state).
        pick: [B, Vd] logits -> (ids [B], probabilities [B, Vd] or None for greedy).
        state: the head's state before draft 0 (None: the zero state, or no state).
        target_ids: a reduced draft vocabulary's target id per draft id [Vd] (`vocab.target_ids`);
            None for the full vocabulary (Vd = V).
        vocab_size: V, with `target_ids`.
    Returns:
        drafts [B, N] (target ids) and their distributions [B, N, V] over the target vocabulary
        (zero outside a reduced draft vocabulary; None when `pick` returns none).
    """
    prev, tokens, probs = anchor_ids, [], []
    for k in range(base_logits.shape[1]):
        bias, state = markov_step(prev, k, state)
        tok, p = pick(base_logits[:, k] + bias)
        tok = vocab.to_target(tok, target_ids)
        tokens.append(tok)
        if p is not None:
            probs.append(vocab.scatter_to_target(p, target_ids, vocab_size))
        prev = tok
    return torch.stack(tokens, 1), (torch.stack(probs, 1) if probs else None)


def head_stepper(head: MarkovHead, slot_hidden: torch.Tensor | None, scale: float = 1.0):
    """`markov_step` for `sequential_drafts` over the N sample slots' hidden states
    slot_hidden [B, N, H] (None for a vanilla head)."""
    def markov_step(prev, k, state):
        bias, state = head.step(prev, None if slot_hidden is None else slot_hidden[:, k], state)
        return (bias if scale == 1.0 else scale * bias), state
    return markov_step


def reads_anchor_slot(cfg: DSparkDraftConfig) -> bool:
    """Whether drafting reads the anchor slot's state although no draft comes from it: the
    recurrent head in the fill-in layout (its state runs over slot 0 first, as it was trained)."""
    return cfg.markov_head_type == "rnn" and cfg.slot_offset == 1


def initial_state(head: MarkovHead, cfg: DSparkDraftConfig, anchor_ids: torch.Tensor,
                  slot0: torch.Tensor | None):
    """The head's state before draft 0: after slot 0 (prev = the anchor, slot0 [B, H] its state)
    when `reads_anchor_slot`, else None (the zero state, or a head without state)."""
    if reads_anchor_slot(cfg):
        return head.step(anchor_ids, slot0)[1]
    return None


def tap_contributions(taps: torch.Tensor, fc_weight: torch.Tensor, n_taps: int) -> torch.Tensor:
    """Per-tap parts of the fused context: taps [..., n_taps * Ht], fc_weight [H, n_taps * Ht]
    -> c [..., n_taps, H] with c_t = W_t tap_t, so sum_t c_t = fc(taps)."""
    x = taps.unflatten(-1, (n_taps, -1))
    w = fc_weight.to(x.dtype).unflatten(1, (n_taps, -1))  # [H, n, Ht]
    return torch.einsum("...th,dth->...td", x, w)


def layer_mixtures(fusion_logits: torch.Tensor) -> torch.Tensor:
    """[L, n_taps] logits -> weights n_taps * softmax over taps (all 1 at zero logits)."""
    return fusion_logits.shape[-1] * torch.softmax(fusion_logits.float(), -1)


def layer_contexts(contributions: torch.Tensor, fusion_logits: torch.Tensor) -> torch.Tensor:
    """Per-layer fused contexts before hidden_norm: contributions [..., n_taps, H] ->
    [L, ..., H], layer l's = sum_t w_{l,t} c_t."""
    w = layer_mixtures(fusion_logits).to(contributions.dtype)
    return torch.einsum("lt,...td->l...d", w, contributions)


def with_slot_queries(embeds: torch.Tensor, table: torch.Tensor, slots: int) -> torch.Tensor:
    """embeds [..., S, H] of consecutive blocks of `slots` query slots -> slot j >= 1 of every
    block replaced by table[j - 1] (table [block_size - 1, H]); slot 0 kept."""
    j = torch.arange(embeds.shape[-2], device=embeds.device) % slots
    rows = table[(j - 1).clamp(min=0)].to(embeds.dtype)  # [S, H]
    return torch.where((j >= 1)[:, None], rows, embeds)


def greedy_pick(logits: torch.Tensor) -> tuple[torch.Tensor, None]:
    return logits.argmax(-1), None


class DSparkDraft(vocab.ReferenceVocabMap, nn.Module):
    """The DSpark head. `embed` and `lm_head` are the target's, frozen (not saved with the draft;
    a reduced draft vocabulary saves its rows of lm_head, still frozen)."""

    def __init__(self, cfg: DSparkDraftConfig, embed: torch.Tensor, lm_head: torch.Tensor,
                 draft_vocab: torch.Tensor | None = None):
        """embed, lm_head: the target's [V, H]. A reduced draft vocabulary (`cfg.reduced_vocab`,
        `vllm_specx.vocab`) keeps the rows of `draft_vocab` (its target ids) as its own
        `lm_head` [Vd, H], saved with the draft with the maps `d2t` and `t2d`; without
        `draft_vocab` (a draft about to be loaded) they are placeholders the checkpoint fills."""
        super().__init__()
        self.cfg = cfg
        self.register_buffer("embed", embed.detach().clone(), persistent=False)  # [V, H]
        vocab.add_output_head(self, lm_head, cfg.vocab_size, cfg.draft_vocab_size, draft_vocab)
        h = cfg.hidden_size
        self.fc = nn.Linear(cfg.target_hidden_size * len(cfg.target_layer_ids), h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(ContextDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.markov_head = MarkovHead(cfg.vocab_size, cfg.draft_vocab_size, cfg.markov_rank, h,
                                      cfg.markov_head_type)
        if cfg.confidence_head is not None:
            self.confidence_head = ConfidenceHead(h + (cfg.markov_rank if cfg.confidence_head ==
                                                       "hidden+markov" else 0))
        if cfg.per_layer_fusion:  # zero: every layer an equal mixture = the baseline's context
            self.fusion_logits = nn.Parameter(torch.zeros(cfg.num_hidden_layers, len(cfg.target_layer_ids)))
        if cfg.slot_queries:  # every row the mask embedding: the baseline's query slots
            self.slot_queries = nn.Parameter(self.embed[cfg.mask_token_id].float().repeat(cfg.block_size - 1, 1))
        if cfg.next_token_stream is not None:
            self.next_token_norm = RMSNorm(h, cfg.rms_norm_eps)
            self.next_token_proj = nn.Linear(h, h, bias=False)

    def markov_bias(self, prev: torch.Tensor) -> torch.Tensor:
        """The vanilla head's bias `W2 W1[prev]` (other head types: `markov_head.step`)."""
        return self.markov_head(prev)

    def next_token_state(self, next_ids: torch.Tensor) -> torch.Tensor:
        """s_t = W_e tn(embed(x_{t+1})) [..., H] of the next-token stream, next_ids [...]."""
        return self.next_token_proj(self.next_token_norm(self.embed[next_ids.long()]))

    def contexts(self, taps: torch.Tensor, next_ids: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Each draft layer's normed context [..., H] from taps [..., n_taps * Ht]: hn(fc(taps))
        for every layer, or per layer hn(sum_t w_{l,t} c_t) with per_layer_fusion; with the
        next-token stream, s_t of next_ids [...] (x_{t+1} per row) fused or added (module doc)."""
        mode = self.cfg.next_token_stream
        if mode is not None and next_ids is None:
            raise ValueError("this DSpark draft has a next-token stream: its context rows need the "
                             "next token of every row (next_ids)")
        if not self.cfg.per_layer_fusion:
            fused = [self.fc(taps)]
        else:
            c = tap_contributions(taps, self.fc.weight, len(self.cfg.target_layer_ids))
            fused = list(layer_contexts(c, self.fusion_logits))
        if mode is None:
            out = [self.hidden_norm(x) for x in fused]
        else:
            st = self.next_token_state(next_ids).to(fused[0].dtype)
            out = ([self.hidden_norm(x + st) for x in fused] if mode == "fused"
                   else [self.hidden_norm(x) + st for x in fused])
        return out * self.cfg.num_hidden_layers if len(out) == 1 else out

    def slot_embeds(self, ids: torch.Tensor, slots: int) -> torch.Tensor:
        """Embeddings [B, Q, H] of query ids [B, Q] laid out as blocks of `slots` slots."""
        h = self.embed[ids]
        return with_slot_queries(h, self.slot_queries, slots) if self.cfg.slot_queries else h

    def block_states(self, taps, ctx_pos, ids, pos, mask, slots: int, next_ids=None):
        """Post-norm hidden states of the query slots.

        Args:
            taps: [B, T, n_taps * Ht] target taps of the context rows.
            ctx_pos: [B, T] their positions.
            ids, pos: [B, Q] query-slot token ids and positions, blocks of `slots` slots.
            mask: [B, Q, T + Q] bool, True where a query may attend (context keys, then slots).
            next_ids: [B, T] x_{t+1} of each context row (read by the next-token stream only).
        Returns:
            [B, Q, H].
        """
        h = self.slot_embeds(ids, slots)
        for layer, ctx in zip(self.layers, self.contexts(taps, next_ids)):
            k, v = layer.kv(ctx, ctx_pos)
            h = layer(h, pos, k, v, mask)
        return self.norm(h)

    def slot_of_draft(self, k: int) -> int:
        return k + self.cfg.slot_offset

    def slot_logits(self, h: torch.Tensor, slot_prev: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits of every query slot: base + Markov bias.

        Args:
            h: [..., Q, H] post-norm slot states (all Q slots of a block, slot order).
            slot_prev: [..., Q] each slot's previous token (anchor layout: x_{a+k} for slot k;
                fill-in: x_a for slots 0 and 1, x_{a+k-1} after).
        Returns:
            [..., Q, V]; draft k is slot `slot_of_draft(k)`.
        """
        return h @ self.lm_head.t() + self.markov_head.block_bias(slot_prev, h)

    def confidence_logits(self, h: torch.Tensor, slot_prev: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """The confidence head's logit per slot (shapes as `slot_logits`, minus V); `detach`: its
        inputs (h, W1[prev]) carry no gradient back, so a loss on it trains the head alone."""
        if self.cfg.confidence_head is None:
            raise ValueError("this DSpark draft has no confidence head")
        if self.cfg.confidence_head == "hidden+markov":
            h = torch.cat([h, self.markov_head.markov_w1(slot_prev.long()).to(h.dtype)], -1)
        return self.confidence_head(h.detach() if detach else h)

    @torch.no_grad()
    def query_states(self, taps: torch.Tensor, anchor: int, num_drafts: int,
                     tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Post-norm states [Q, H] of the Q = `cfg.query_slots(num_drafts)` slots of one request's
        pass, as vLLM runs it: context = taps [T, n*Ht] at positions 0..T-1, block
        [anchor, mask, ...] at positions T..T+Q-1. tokens: the context's ids x_0..x_{T-1} [T]
        (the next-token stream reads x_1..x_{T-1} and the anchor; unused without it)."""
        t, q = taps.shape[0], self.cfg.query_slots(num_drafts)
        dev = taps.device
        ids = torch.full((1, q), self.cfg.mask_token_id, dtype=torch.long, device=dev)
        ids[0, 0] = anchor
        pos = torch.arange(t, t + q, device=dev)[None]
        mask = block_mask(torch.tensor([[t]], device=dev), t, q, self.cfg.causal, self.cfg.sliding_window)
        nxt = None
        if self.cfg.next_token_stream is not None:
            if tokens is None or len(tokens) != t:
                raise ValueError(f"this DSpark draft has a next-token stream: give the context's {t} "
                                 "token ids (tokens)")
            nxt = next_ids_of(torch.as_tensor(tokens, device=dev)[None], ids[:, :1])
        return self.block_states(taps[None], torch.arange(t, device=dev)[None], ids, pos, mask, q, nxt)[0]

    @torch.no_grad()
    def base_logits(self, taps: torch.Tensor, anchor: int, num_drafts: int,
                    tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Base logits [N, V] of the N sample slots for one request (see `query_states`), before
        the Markov correction."""
        return self.query_states(taps, anchor, num_drafts, tokens)[self.cfg.slot_offset:] @ self.lm_head.t()

    @torch.no_grad()
    def draft(self, taps: torch.Tensor, anchor: int, num_drafts: int, pick=None,
              tokens: torch.Tensor | None = None):
        """Reference drafts for one request: (ids [N], distributions [N, V] or None); tokens: the
        context's ids (see `query_states`)."""
        h = self.query_states(taps, anchor, num_drafts, tokens)
        o = self.cfg.slot_offset
        slots = h[o:][None]  # [1, N, H]
        a = torch.tensor([anchor], device=taps.device)
        drafts, probs = sequential_drafts(slots @ self.lm_head.t(), a, head_stepper(self.markov_head, slots),
                                          pick or greedy_pick,
                                          initial_state(self.markov_head, self.cfg, a, h[:1]),
                                          self.draft_target_ids, self.cfg.vocab_size)
        return drafts[0], (None if probs is None else probs[0])

    @torch.no_grad()
    def greedy_drafts(self, taps: torch.Tensor, anchor: int, num_drafts: int,
                      tokens: torch.Tensor | None = None) -> list[int]:
        """Reference greedy drafts for one request (see `query_states`). Returns the N draft ids."""
        return self.draft(taps, anchor, num_drafts, tokens=tokens)[0].tolist()


def next_ids_of(tokens: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """x_{t+1} of every context row: tokens [B, T] (x_0..x_{T-1}), last [B, 1] (x_T, the token
    after the last row: the anchor) -> [B, T] = tokens shifted left by one, `last` appended."""
    return torch.cat([tokens[:, 1:], last.to(tokens.dtype)], 1)


def context_next_ids(target_token_ids: torch.Tensor, next_token_ids: torch.Tensor,
                     query_start_loc: torch.Tensor, num_rejected: torch.Tensor | None, batch: int) -> torch.Tensor:
    """x_{t+1} of every context row of a serving pass (`next_ids_of` for a batch as vLLM lays it
    out; both vLLM paths call it): request r's rows are target_token_ids[qsl[r]:qsl[r+1]] (the
    tokens the target just verified, the last `num_rejected[r]` of them rejected drafts); a row's
    next token is the row after it, and for the request's last accepted row the token just sampled
    (`next_token_ids[r]`: the bonus token, the next draft pass's anchor). A rejected row's value
    does not matter: it lies at or past the anchor's position, which the draft's attention never
    reads and the next pass rewrites. No host sync (vLLM 0.34 runs it inside a CUDA graph): a
    request with no accepted row writes into a spare row that is dropped."""
    n = target_token_ids.shape[0]
    nxt = target_token_ids.new_zeros(n + 1)
    nxt[: n - 1] = target_token_ids[1:]
    qsl = query_start_loc[: batch + 1].long().to(target_token_ids.device)
    last = qsl[1:] - 1
    if num_rejected is not None:
        last = last - num_rejected[:batch].long().to(last.device)
    ok = (last >= qsl[:-1]) & (last < n)
    nxt[torch.where(ok, last, n)] = next_token_ids[:batch].to(nxt.dtype)
    return nxt[:n]


def reduced(draft: DSparkDraft, ids: torch.Tensor) -> DSparkDraft:
    """`draft` restricted to a draft vocabulary (target ids `ids`, `vllm_specx.vocab`): the same
    weights, its output rows (lm_head, the Markov head's W2) cut to `ids`. Its logits are the full
    draft's at `ids`, so its drafts are the full draft's with every other token masked out: a warm
    start for training with `--draft-vocab`, and the tests' reference."""
    import dataclasses

    ids = torch.as_tensor(ids, dtype=torch.long).sort().values
    full = draft.draft_target_ids
    if full is not None:  # already reduced: `ids` must be a subset of its vocabulary
        rows = vocab.from_target(ids, draft.t2d)
        if bool((rows < 0).any()):
            raise ValueError("reduced(): ids outside the draft's vocabulary")
    else:
        rows = ids
    cfg = dataclasses.replace(draft.cfg, draft_vocab_size=int(ids.numel()))
    out = DSparkDraft(cfg, draft.embed, draft.lm_head if full is None else draft.embed, ids)
    out.lm_head.copy_(draft.lm_head[rows])
    state = {k: v for k, v in draft.state_dict().items() if k not in ("lm_head", "d2t", "t2d")}
    state["markov_head.markov_w2.weight"] = state["markov_head.markov_w2.weight"][rows]
    out.load_state_dict(state, strict=False)
    return out


def block_mask(anchors: torch.Tensor, seq_len: int, q: int, causal: bool,
               window: int | None = None) -> torch.Tensor:
    """Attention mask for M blocks of q slots per sequence.

    Args:
        anchors: [B, M] anchor positions a (context keys are positions < a, and >= a - window
            when a sliding window is set).
    Returns:
        [B, M*q, seq_len + M*q] bool: slot i of block j sees context a_j - window <= t < a_j and
        the slots of block j (only slots <= i when causal).
    """
    b, m = anchors.shape
    dev = anchors.device
    t = torch.arange(seq_len, device=dev)[None, None, None, :]
    a = anchors[:, :, None, None]
    ctx = t < a  # [B, M, 1, T]
    if window is not None:
        ctx = ctx & (t >= a - window)
    ctx = ctx.expand(b, m, q, seq_len)
    same = torch.eye(m, dtype=torch.bool, device=dev)[:, None, :, None].expand(m, q, m, q)  # [M, q, M, q]
    if causal:
        same = same & torch.ones(q, q, dtype=torch.bool, device=dev).tril()[None, :, None, :]
    blk = same.reshape(1, m, q, m * q).expand(b, m, q, m * q)
    return torch.cat([ctx, blk], -1).reshape(b, m * q, seq_len + m * q)
