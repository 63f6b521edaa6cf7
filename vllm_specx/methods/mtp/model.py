"""The MTP draft in plain PyTorch: the contract the vLLM model and proposer match token for token.

One MTP layer (DeepSeek-V3 / GLM-5 style), its parameters shared by every draft step. Notation:
x_t the tokens, H_t the target's final hidden state at position t (after its final norm: what
vLLM hands an EAGLE/MTP drafter), embed / lm_head the target's own (shared, full vocabulary).
One step of the layer, inputs (token e, hidden h) at RoPE position p:

    u   = eh_proj(cat[enorm(embed(e)), hnorm(h)])                       [2H -> H]
    a   = attn(input_layernorm(u))        q, k, v: H -> heads; RoPE (NeoX) at p
    r   = u + o_proj(a)
    g   = norm(r + mlp(post_attention_layernorm(r)))                     (`shared_head.norm`)
    logits = lm_head(g);   the next step's h = g (the post-norm output is recycled)

A reduced draft vocabulary (`cfg.reduced_vocab`, `vllm_specx.vocab`): lm_head is the Vd rows of
the target's LM head for the draft vocabulary, so logits are [.., Vd] in draft ids; a pick is
mapped to its target id (`vocab.to_target`) before it is the next step's input token or a draft.

Drafting from anchor a (the last verified token, at position a; H exists for positions < a):

    step 0, every position p < a:  (e, h) = (x_{p+1}, H_p) at position p. Its keys/values K_p,
        V_p are the draft's KV cache: they come from the target's hidden states only, and are
        (re)computed for every verified position. Query p attends to K_0..K_p (causal).
        draft 1 = pick(logits of step 0 at p = a - 1)       (predicts x_{a+1})
    step j >= 1:  (e, h) = (draft j, g of step j - 1) at RoPE position a - 1 + j; draft j + 1
        predicts x_{a+1+j}. Which keys it attends to is the one option, `kv_share`:

    KVShare ON (GLM-5.2): step j's query attends to exactly step 0's key set for the anchor,
        K_0..K_{a-1} (all from the target's hidden states; RoPE positions 0..a-1 as written),
        and nothing else - not even its own key. Steps >= 1 compute no key/value at all and
        write nothing to the draft's KV cache. In vLLM: the step's position advances (RoPE),
        its sequence length stays a (step 0's), its slot mapping is padding (no write).
    KVShare OFF (mixed KV, GLM-5.1 / vLLM's MTP default): step j's query attends to K_0..K_{a-1}
        and to the keys of its own chain's steps 1..j (positions a .. a - 1 + j, computed from the
        layer's own outputs); each step writes its key/value at its position. In vLLM: the
        standard EAGLE step (position, sequence length and slot advance by one).

    Masks: no other position is visible (positions >= a hold rejected drafts' rows in vLLM's
    padded drafter batch; the sequence length excludes them).

Kimi-K3 variant (`fusion_layer_ids`): H_p is replaced by fc(cat[taps_p]), the residual streams
after the fused target layers (what vLLM's EAGLE-3 plumbing captures); everything else is the
same. `fc` initialised to [0, ..., diag(w_norm)] on the target's last layer gives the
plain layer up to the norms' epsilon (hnorm is scale-invariant: hnorm(w_norm * x) = hnorm(finalnorm(x))).

Training (`chain_logits`) unrolls exactly this for M anchors per sequence in parallel, with
step j's token x_{a+j} (the target's: exact whenever the chain's earlier drafts are accepted;
`chain_tokens="target"`) or the chain's own greedy draft ("draft"); step 0's K/V are computed
once per sequence and shared by every step and anchor, the way serving shares them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vllm_specx import vocab
from vllm_specx.layers import RMSNorm, causal_gqa, rms_norm, rope, unroll_chain
from vllm_specx.methods.mtp.config import MTPDraftConfig


class MTPDraft(vocab.ReferenceVocabMap, nn.Module):
    def __init__(self, cfg: MTPDraftConfig, embed: torch.Tensor, lm_head: torch.Tensor,
                 draft_vocab: torch.Tensor | None = None):
        """embed, lm_head: the target's [V, H]. A reduced draft vocabulary (`cfg.reduced_vocab`)
        keeps the rows of `draft_vocab` (its target ids; None: placeholders a checkpoint fills)."""
        super().__init__()
        self.cfg = cfg
        self.register_buffer("embed", embed.detach().clone(), persistent=False)
        vocab.add_output_head(self, lm_head, cfg.vocab_size, cfg.draft_vocab_size, draft_vocab)
        h, hd = cfg.hidden_size, cfg.head_dim
        eps = cfg.rms_norm_eps
        self.enorm, self.hnorm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.q_proj = nn.Linear(h, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, h, bias=False)
        self.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.norm = RMSNorm(h, eps)
        if cfg.fusion_layer_ids:
            self.fc = nn.Linear(len(cfg.fusion_layer_ids) * cfg.target_hidden_size, h, bias=False)

    def step0_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """H_p: the target's final hidden state, or (K3) the fusion of the tapped layers."""
        return self.fc(hidden) if self.cfg.fusion_layer_ids else hidden

    def init_fusion_as_final_norm(self, norm_weight: torch.Tensor) -> None:
        """fc = [0, ..., diag(norm_weight)]: the fused input equals the plain layer's (the last
        fused layer must be the target's last)."""
        c = self.cfg
        if not c.fusion_layer_ids or c.fusion_layer_ids[-1] != c.target_num_hidden_layers - 1:
            raise ValueError("init_fusion_as_final_norm: the last fused layer must be the target's last")
        h = c.target_hidden_size
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.weight[:, -h:] = torch.diag(norm_weight.float())

    # Checkpoint tensor names (`MTPDraftConfig.expected_tensors`).
    def specx_state_dict(self) -> dict[str, torch.Tensor]:
        b = "mtp_block."
        out = {"enorm.weight": self.enorm.weight, "hnorm.weight": self.hnorm.weight,
               "eh_proj.weight": self.eh_proj.weight, "shared_head.norm.weight": self.norm.weight,
               b + "input_layernorm.weight": self.input_layernorm.weight,
               b + "post_attention_layernorm.weight": self.post_attention_layernorm.weight}
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[f"{b}self_attn.{n}.weight"] = getattr(self, n).weight
        for n in ("gate_proj", "up_proj", "down_proj"):
            out[f"{b}mlp.{n}.weight"] = getattr(self, n).weight
        if self.cfg.fusion_layer_ids:
            out["fc.weight"] = self.fc.weight
        if self.cfg.reduced_vocab:
            out.update({"lm_head.weight": self.lm_head, vocab.D2T: self.d2t, vocab.T2D: self.t2d})
        return out

    def load_specx_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        own = self.specx_state_dict()
        if self.cfg.reduced_vocab:
            tensors = vocab.loaded_maps(tensors, self.cfg.vocab_size, self.cfg.draft_vocab_size, "MTP checkpoint")
        missing = sorted(set(own) - set(tensors))
        extra = sorted(set(tensors) - set(own))
        if missing or extra:
            raise ValueError(f"MTP checkpoint: missing tensor(s) {missing}, unexpected {extra}")
        with torch.no_grad():
            for k, p in own.items():
                if tuple(tensors[k].shape) != tuple(p.shape):
                    raise ValueError(f"MTP checkpoint: {k} has shape {list(tensors[k].shape)}, "
                                     f"expected {list(p.shape)}")
                p.copy_(tensors[k].to(p.dtype))

    def _input(self, e_ids: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return self.eh_proj(torch.cat([self.enorm(self.embed[e_ids]), self.hnorm(h)], -1))

    def _qkv(self, u: torch.Tensor, pos: torch.Tensor):
        c = self.cfg
        x = self.input_layernorm(u)
        q = self.q_proj(x).unflatten(-1, (c.num_attention_heads, c.head_dim))
        k = self.k_proj(x).unflatten(-1, (c.num_key_value_heads, c.head_dim))
        v = self.v_proj(x).unflatten(-1, (c.num_key_value_heads, c.head_dim))
        return rope(q, pos, c.rope_theta), rope(k, pos, c.rope_theta), v

    def _finish(self, attn: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        r = u + self.o_proj(attn)
        x = self.post_attention_layernorm(r)
        return self.norm(r + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)))

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return g @ self.lm_head.t()

    def context(self, hidden: torch.Tensor, ids: torch.Tensor):
        """Step 0 at every position. hidden [B, S, H] (the target's H_p; K3: the taps [B, S, n*H]), ids [B, S] (ids[:, p+1]
        is step 0's token at p; the last position takes token 0, unused; -100 = padding).
        Returns (g [B, S, H], k, v [B, S, kv_heads, hd])."""
        b, s = ids.shape
        nxt = torch.cat([ids[:, 1:], ids.new_zeros(b, 1)], 1).clamp(min=0)
        pos = torch.arange(s, device=ids.device).expand(b, s)
        u = self._input(nxt, self.step0_hidden(hidden))
        q, k, v = self._qkv(u, pos)
        return self._finish(causal_gqa(q, k, v), u), k, v

    def chain_logits(self, hidden: torch.Tensor, ids: torch.Tensor, anchors: torch.Tensor, n: int,
                     kv_share: bool | None = None, chain_tokens: str = "target") -> torch.Tensor:
        """Logits [B, M, n, V] (V: the draft vocabulary) of drafts 1..n from each anchor a ([B, M], 1 <= a): the module
        docstring's chain, with `kv_share` (default: the config's) and step j's token x_{a+j}
        ("target"; ids [B, S], -100 = padding) or the previous draft ("draft")."""
        c = self.cfg
        kv_share = c.kv_share if kv_share is None else kv_share
        g0, k0, v0 = self.context(hidden, ids)

        def step(tok, g, pos):
            u = self._input(tok, g)
            return (*self._qkv(u, pos), u)

        return unroll_chain(g0, k0, v0, ids, anchors, n, (step, self._finish), self.logits,
                            c.num_attention_heads // c.num_key_value_heads, own_kv=not kv_share,
                            chain_tokens=chain_tokens, target_ids=self.draft_target_ids)

    @torch.no_grad()
    def draft_logits(self, hidden: torch.Tensor, ids: torch.Tensor, n: int, kv_share: bool | None = None,
                     drafts: list[int] | None = None) -> torch.Tensor:
        """Per-step draft logits [n, V] (draft ids) for one request: the target's hidden states [T, H] of
        positions 0..T-1 and the verified tokens ids [T + 1] (the last is the anchor, position T).
        Step j's input token is `drafts[j - 1]` when given (e.g. the drafts vLLM sampled),
        else the greedy draft."""
        a = torch.tensor([[ids.shape[0] - 1]], device=ids.device)
        rest = torch.tensor(drafts[: n - 1] if drafts else [0] * (n - 1), dtype=ids.dtype, device=ids.device)
        seq = torch.cat([ids, rest])
        pad = F.pad(seq, (0, 1))[None]
        hid = F.pad(hidden, (0, 0, 0, pad.shape[1] - hidden.shape[0]))[None]
        return self.chain_logits(hid, pad, a, n, kv_share, "target" if drafts else "draft")[0, 0]

    def greedy_drafts(self, hidden: torch.Tensor, ids: torch.Tensor, n: int,
                      kv_share: bool | None = None) -> list[int]:
        return vocab.to_target(self.draft_logits(hidden, ids, n, kv_share).argmax(-1),
                               self.draft_target_ids).tolist()


def final_hidden(norm_weight: torch.Tensor, eps: float, last_layer_tap: torch.Tensor) -> torch.Tensor:
    """H_t from the residual stream after the target's last layer (a data tap): its final norm."""
    return rms_norm(last_layer_tap, norm_weight, eps)


def reduced(draft: MTPDraft, ids: torch.Tensor, full_lm_head: torch.Tensor | None = None) -> MTPDraft:
    """`draft` (full vocabulary) with a reduced draft vocabulary `ids` (target ids): the same layer
    weights, lm_head = the target's rows at `ids` (`full_lm_head`, default the draft's own [V, H]).
    Its logits are the full draft's at `ids`; its greedy drafts the full draft's with every other
    token masked."""
    import dataclasses

    if draft.cfg.reduced_vocab:
        raise ValueError("reduced(): the draft already has a reduced vocabulary")
    head = draft.lm_head if full_lm_head is None else full_lm_head
    cfg = dataclasses.replace(draft.cfg, draft_vocab_size=int(torch.as_tensor(ids).numel()))
    out = MTPDraft(cfg, draft.embed, head, ids)
    state = {**draft.specx_state_dict(), **{k: v for k, v in out.specx_state_dict().items()
                                            if k in ("lm_head.weight", vocab.D2T, vocab.T2D)}}
    out.load_specx_state_dict(state)
    return out
