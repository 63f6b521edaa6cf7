"""The EAGLE-3 draft in plain PyTorch: vLLM's `llama_eagle3` math (the contract), unrolled for
training the way vLLM's EAGLE proposer drafts.

Notation: taps_t = the fused target taps at position t (`Eagle3Config.target_layer_ids`),
x_t the tokens, embed / lm_head the target's. One decoder layer, inputs (token e, hidden g):

    a   = attn(cat[input_layernorm(embed(e)), hidden_norm(g)])    RoPE at the step's position,
                                                                  q/k/v: 2H -> heads
    r   = a + g
    out = mlp(post_attention_layernorm(r)) + r                    (pre-norm output)
    logits = lm_head(norm(out));  the next step's g = out
    (a reduced draft vocabulary: lm_head is its Vd rows, logits in draft ids; a pick is mapped to
    its target id, `vocab.to_target`, before it is a draft or the next step's token)

Drafting from anchor a (the last verified token; the target's taps exist for positions < a):

    step 0, every position p:  (e, g) = (x_{p+1}, fc(taps_p)) at position p;  its K/V are the
                               draft's KV cache (so they are recomputed from the target's taps
                               for every verified position)
    draft 0 = argmax logits of step 0 at p = a - 1             (predicts x_{a+1})
    step j >= 1:  (e, g) = (draft j-1, out of step j-1) at position a - 1 + j; attends to step-0
                  K/V at positions <= a - 1 and to its own chain's steps 1..j (positions
                  a .. a - 1 + j); draft j predicts x_{a+1+j}.

Training (`chain_logits`) unrolls exactly this for M anchors per sequence (training-time test):
step j's token is x_{a+j} (the target's; `chain_tokens="target"`, exact whenever the chain's
earlier drafts are accepted at temperature 0) or the chain's own greedy draft j-1 ("draft").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vllm_specx import vocab
from vllm_specx.layers import RMSNorm, causal_gqa, rope, unroll_chain
from vllm_specx.methods.eagle3.config import Eagle3Config


class Eagle3Draft(vocab.ReferenceVocabMap, nn.Module):
    def __init__(self, cfg: Eagle3Config, embed: torch.Tensor, lm_head: torch.Tensor,
                 draft_vocab: torch.Tensor | None = None):
        """embed, lm_head: the target's [V, H]. A reduced draft vocabulary (`cfg.reduced_vocab`)
        keeps the rows of `draft_vocab` (its target ids; None: placeholders a checkpoint fills)."""
        super().__init__()
        self.cfg = cfg
        self.register_buffer("embed", embed.detach().clone(), persistent=False)
        vocab.add_output_head(self, lm_head, cfg.vocab_size, cfg.draft_vocab_size, draft_vocab)
        h, hd = cfg.hidden_size, cfg.head_dim
        self.fc = nn.Linear(cfg.target_hidden_size * len(cfg.target_layer_ids), h, bias=False)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(2 * h, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(2 * h, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(2 * h, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, h, bias=False)
        self.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)

    # vLLM-native tensor names (`midlayer.*`), as `Eagle3LlamaForCausalLM.load_weights` maps them.
    def vllm_state_dict(self) -> dict[str, torch.Tensor]:
        m = "midlayer."
        out = {"fc.weight": self.fc.weight, "norm.weight": self.norm.weight,
               m + "input_layernorm.weight": self.input_layernorm.weight,
               m + "hidden_norm.weight": self.hidden_norm.weight,
               m + "post_attention_layernorm.weight": self.post_attention_layernorm.weight}
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[f"{m}self_attn.{n}.weight"] = getattr(self, n).weight
        for n in ("gate_proj", "up_proj", "down_proj"):
            out[f"{m}mlp.{n}.weight"] = getattr(self, n).weight
        if self.cfg.reduced_vocab:
            out.update({"lm_head.weight": self.lm_head, vocab.D2T: self.d2t, vocab.T2D: self.t2d})
        return out

    def load_vllm_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        if self.cfg.reduced_vocab:
            tensors = vocab.loaded_maps(tensors, self.cfg.vocab_size, self.cfg.draft_vocab_size, "EAGLE-3 checkpoint")
        own = self.vllm_state_dict()
        missing = sorted(set(own) - set(tensors))
        if missing:
            raise ValueError(f"EAGLE-3 checkpoint: missing tensor(s) {missing}")
        with torch.no_grad():
            for k, p in own.items():
                if tuple(tensors[k].shape) != tuple(p.shape):
                    raise ValueError(f"EAGLE-3 checkpoint: {k} has shape {list(tensors[k].shape)}, "
                                     f"expected {list(p.shape)}")
                p.copy_(tensors[k].to(p.dtype))

    def _qkv(self, e_ids: torch.Tensor, g: torch.Tensor, pos: torch.Tensor):
        """q [.., heads, hd], k, v [.., kv_heads, hd] of inputs (token ids e, hidden g) at pos."""
        c = self.cfg
        x = torch.cat([self.input_layernorm(self.embed[e_ids]), self.hidden_norm(g)], -1)
        q = self.q_proj(x).unflatten(-1, (c.num_attention_heads, c.head_dim))
        k = self.k_proj(x).unflatten(-1, (c.num_key_value_heads, c.head_dim))
        v = self.v_proj(x).unflatten(-1, (c.num_key_value_heads, c.head_dim))
        return rope(q, pos, c.rope_theta), rope(k, pos, c.rope_theta), v

    def _finish(self, attn: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        r = self.o_proj(attn) + g
        x = self.post_attention_layernorm(r)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)) + r

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.norm(out) @ self.lm_head.t()

    def context(self, taps: torch.Tensor, ids: torch.Tensor):
        """Step 0 at every position. taps [B, S, n*Ht], ids [B, S] (ids[:, p+1] is step 0's token
        at p; the last position takes token 0, unused). Returns (out [B, S, H], k, v [B, S, kvh, hd])."""
        b, s = ids.shape
        g = self.fc(taps)
        nxt = torch.cat([ids[:, 1:], ids.new_zeros(b, 1)], 1).clamp(min=0)
        pos = torch.arange(s, device=ids.device).expand(b, s)
        q, k, v = self._qkv(nxt, g, pos)
        return self._finish(causal_gqa(q, k, v), g), k, v

    def chain_logits(self, taps: torch.Tensor, ids: torch.Tensor, anchors: torch.Tensor, n: int,
                     chain_tokens: str = "target") -> torch.Tensor:
        """Logits [B, M, n, V] (V: the draft vocabulary) of drafts 0..n-1 from each anchor a ([B, M], 1 <= a): the module
        docstring's chain, with step j's token x_{a+j} ("target"; ids [B, S], -100 = padding) or
        the previous draft ("draft")."""
        c = self.cfg
        out0, k0, v0 = self.context(taps, ids)
        return unroll_chain(out0, k0, v0, ids, anchors, n,
                            (lambda tok, g, pos: (*self._qkv(tok, g, pos), g), self._finish), self.logits,
                            c.num_attention_heads // c.num_key_value_heads, own_kv=True,
                            chain_tokens=chain_tokens, target_ids=self.draft_target_ids)

    @torch.no_grad()
    def greedy_drafts(self, taps: torch.Tensor, ids: torch.Tensor, n: int) -> list[int]:
        """Reference greedy drafts for one request: context taps [T, n*Ht] of positions 0..T-1
        and the verified tokens ids [T + 1] (the last one is the anchor, position T)."""
        a = torch.tensor([[ids.shape[0] - 1]], device=ids.device)
        pad = F.pad(ids, (0, n))[None]
        taps = F.pad(taps, (0, 0, 0, n + 1))[None]
        return vocab.to_target(self.chain_logits(taps, pad, a, n, "draft")[0, 0].argmax(-1),
                               self.draft_target_ids).tolist()
