"""Native GLM-5 / DeepSeek-V3.2-style MTP layers, loaded from the target's own checkpoint and run
as a K-step shared-parameter draft in plain PyTorch (the CPU path: vLLM's GLM-5 MTP layer needs
its GPU kernels - FlashMLA-sparse, DeepGEMM - and vLLM's CPU build has none).

The layer (index L = `num_hidden_layers` in the checkpoint, weights `model.layers.{L}.*`):

    u   = eh_proj(cat[enorm(embed(e)), hnorm(h)])
    x   = input_layernorm(u)
    a   = MLA-DSA attention(x)                                        (below)
    r   = u + a
    g   = shared_head.norm(r + mlp(post_attention_layernorm(r)))     MoE or dense, as the config says
    logits = shared_head.head(g) (or the target's lm_head);  the next step's h = g (post-norm, as
    vLLM's DeepseekV32 MTP recycles it)

MLA-DSA attention of a query row t at position pos_t over a visible key set S_t:

    qc   = q_a_layernorm(q_a_proj(x_t));  q = q_b_proj(qc) -> [heads, nope | rope], rope part
           rotated (GPT-J pairs, "interleaved") at pos_t
    latent of key s: c_s = kv_a_layernorm(kv_a_proj(x_s)[:kv_lora]), k_rope_s = RoPE(kv_a_proj(x_s)[kv_lora:], pos_s)
    k_s  = [kv_b_proj(c_s)_nope, k_rope_s] (per head),  v_s = kv_b_proj(c_s)_v
    DSA: indexer scores I(t, s) for s in S_t (`ops.dsa_indexer`'s formula, interleaved RoPE,
         indexer key from wk/k_norm of x_s), top-`index_topk` of them (`ops.topk`) = T_t
    a_t  = o_proj( softmax_{s in T_t}( q . k_s * (nope + rope)^-0.5 ) v_s )

Drafting from anchor a (context rows 0..a-1, each (x_{p+1}, H_p) at position p, attending
causally - step 0) follows `model.py`'s KVShare definition, with IndexShare on top:

    kv_share on:  step j >= 1 (position a-1+j) sees S = {0..a-1}: step 0's latent KV and indexer keys
    kv_share off: S = {0..a-1} plus its own chain's steps 1..j (their latents and indexer keys)
    index_share on: step j >= 1 runs no indexer: T = step 0's top-k of row a-1 (so it attends to
                  target-derived keys only, whatever kv_share says - vLLM's behaviour)
    index_share off: step j runs its own indexer over S.

`stats` counts indexer query rows run and skipped (the work IndexShare saves).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vllm_specx.checkpoint import load_tensors
from vllm_specx.layers import rms_norm
from vllm_specx.ops.dsa_indexer import IndexShareCache, prepare_indexer_k, prepare_indexer_q, prepare_indexer_weights
from vllm_specx.ops.topk import topk as topk_op

NATIVE_MODEL_TYPES = ("glm_moe_dsa", "deepseek_v32")


def _rope_tables(pos: torch.Tensor, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=pos.device) / dim))
    ang = pos.float()[:, None] * inv[None, :]
    return ang.cos(), ang.sin()  # [N, dim / 2]


def _rope_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-J ("interleaved") rotation of the last dim of x [N, (heads,) R]: pairs (2i, 2i+1)."""
    if x.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    out = torch.empty_like(x, dtype=torch.float32)
    out[..., 0::2], out[..., 1::2] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return out


class Glm5MTPLayer(nn.Module):
    """One native MTP layer of a GLM-5 / DeepSeek-V3.2 checkpoint (weights as tensors, no grad)."""

    def __init__(self, config: dict, tensors: dict[str, torch.Tensor], embed: torch.Tensor, head: torch.Tensor):
        super().__init__()
        self.c = config
        self.w = tensors  # names relative to model.layers.{L}.
        self.embed, self.head = embed.float(), head.float()
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        self.theta = float((config.get("rope_parameters") or {}).get("rope_theta") or config.get("rope_theta", 10000.0))
        rp = config.get("rope_parameters") or {}
        if rp.get("rope_type", "default") != "default":
            raise ValueError(f"GLM-5 MTP: rope_type {rp.get('rope_type')!r} is not supported on the CPU path yet")
        self.moe = "mlp.gate.weight" in tensors
        self.stats = {"indexer_rows": 0, "indexer_rows_skipped": 0}

    # ---- loading -------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | Path, layer: int = 0) -> Glm5MTPLayer:
        """The MTP layer `layer` (0-based among `num_nextn_predict_layers`) of a target checkpoint."""
        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        where = path / "config.json"
        if cfg.get("model_type") not in NATIVE_MODEL_TYPES:
            raise ValueError(f"{where}: model_type {cfg.get('model_type')!r} has no native MTP layer "
                             f"this loader knows (known: {list(NATIVE_MODEL_TYPES)})")
        n = int(cfg.get("num_nextn_predict_layers") or 0)
        if not 0 <= layer < n:
            raise ValueError(f"{where}: num_nextn_predict_layers is {n}; no MTP layer {layer}")
        idx = cfg["num_hidden_layers"] + layer
        prefix = f"model.layers.{idx}."
        every = load_tensors(path)
        mine = {k[len(prefix):]: v for k, v in every.items() if k.startswith(prefix)}
        need = ["eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight",
                "input_layernorm.weight", "post_attention_layernorm.weight",
                "self_attn.q_a_proj.weight", "self_attn.q_a_layernorm.weight", "self_attn.q_b_proj.weight",
                "self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_layernorm.weight",
                "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight", "self_attn.indexer.wq_b.weight",
                "self_attn.indexer.wk.weight", "self_attn.indexer.k_norm.weight",
                "self_attn.indexer.k_norm.bias", "self_attn.indexer.weights_proj.weight"]
        missing = [prefix + k for k in need if k not in mine]
        if missing:
            raise ValueError(f"{path}: MTP layer {idx} lacks tensor(s) {missing}")
        embed = mine.get("embed_tokens.weight", every.get("model.embed_tokens.weight"))
        head = mine.get("shared_head.head.weight", every.get("lm_head.weight"))
        if embed is None or head is None:
            raise ValueError(f"{path}: no embedding / LM head for MTP layer {idx} (looked for "
                             f"{prefix}embed_tokens / model.embed_tokens and {prefix}shared_head.head / lm_head)")
        return cls(cfg, {k: v.float() for k, v in mine.items()}, embed, head)

    # ---- the block -----------------------------------------------------------------------
    def _lin(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w[name + ".weight"].t()

    def _input(self, e_ids: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        w = self.w
        x = torch.cat([rms_norm(self.embed[e_ids], w["enorm.weight"], self.eps), rms_norm(h, w["hnorm.weight"], self.eps)], -1)
        return self._lin("eh_proj", x)

    def _keys(self, x: torch.Tensor, pos: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-key state of rows x [N, H] at pos [N]: MLA latent, rotated rope key, indexer key."""
        c, a = self.c, "self_attn."
        kv = self._lin(a + "kv_a_proj_with_mqa", x)
        lat = rms_norm(kv[:, : c["kv_lora_rank"]], self.w[a + "kv_a_layernorm.weight"], 1e-6)
        cos, sin = _rope_tables(pos, c["qk_rope_head_dim"], self.theta)
        k_rope = _rope_pairs(kv[:, c["kv_lora_rank"]:], cos, sin)
        ik = self._lin(a + "indexer.wk", x)
        ikey = prepare_indexer_k(ik, self.w[a + "indexer.k_norm.weight"], self.w[a + "indexer.k_norm.bias"],
                                 cos, sin, 1e-6, interleave=True)
        return {"lat": lat, "k_rope": k_rope, "ikey": ikey}

    def _queries(self, x: torch.Tensor, pos: torch.Tensor):
        c, a = self.c, "self_attn."
        qc = rms_norm(self._lin(a + "q_a_proj", x), self.w[a + "q_a_layernorm.weight"], 1e-6)
        nh, dn, dr = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"]
        q = self._lin(a + "q_b_proj", qc).view(-1, nh, dn + dr)
        cos, sin = _rope_tables(pos, dr, self.theta)
        q_rope = _rope_pairs(q[..., dn:], cos, sin)
        iq = self._lin(a + "indexer.wq_b", qc).view(-1, c["index_n_heads"], c["index_head_dim"])
        iq = prepare_indexer_q(iq, cos, sin, interleave=True)
        iw = prepare_indexer_weights(self._lin(a + "indexer.weights_proj", x), c["index_head_dim"])
        return q[..., :dn], q_rope, iq, iw

    def indexer_topk(self, iq: torch.Tensor, iw: torch.Tensor, ikeys: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """Top-k key indices [Q, k] (-1 padded) of queries over keys, `visible [Q, S]` bool."""
        scores = torch.zeros(iq.shape[0], ikeys.shape[0], device=iq.device)
        for h in range(iq.shape[1]):
            scores += iw[:, h, None] * torch.relu(iq[:, h] @ ikeys.t())
        scores = scores.masked_fill(~visible, float("-inf"))
        self.stats["indexer_rows"] += iq.shape[0]
        return topk_op(scores, min(self.c["index_topk"], ikeys.shape[0]), impl="reference")

    def _attend(self, q_nope, q_rope, keys, sel: torch.Tensor) -> torch.Tensor:
        """MLA attention of Q query rows over the selected keys (`sel [Q, k]` indices into keys)."""
        c, a = self.c, "self_attn."
        nh, dn, dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
        kvb = self._lin(a + "kv_b_proj", keys["lat"]).view(-1, nh, dn + dv)  # [S, heads, nope + v]
        k_nope, v = kvb[..., :dn], kvb[..., dn:]
        scale = (dn + c["qk_rope_head_dim"]) ** -0.5
        s = (torch.einsum("qhd,shd->qhs", q_nope, k_nope) + torch.einsum("qhd,sd->qhs", q_rope, keys["k_rope"])) * scale
        mask = torch.zeros(sel.shape[0], keys["lat"].shape[0], dtype=torch.bool, device=sel.device)
        valid = sel >= 0
        mask[torch.arange(sel.shape[0], device=sel.device)[:, None].expand_as(sel)[valid], sel[valid].long()] = True
        s = s.masked_fill(~mask[:, None, :], float("-inf"))
        o = torch.einsum("qhs,shd->qhd", torch.softmax(s, -1), v).reshape(sel.shape[0], -1)
        return self._lin(a + "o_proj", o)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        w, c = self.w, self.c
        if not self.moe:
            return self._lin("mlp.down_proj", F.silu(self._lin("mlp.gate_proj", x)) * self._lin("mlp.up_proj", x))
        n_exp = c.get("n_routed_experts") or c.get("num_local_experts")
        scores = (x.float() @ w["mlp.gate.weight"].t()).sigmoid()
        choice = scores + w.get("mlp.gate.e_score_correction_bias", torch.zeros(n_exp, device=x.device))
        groups, tg = c.get("n_group", 1), c.get("topk_group", 1)
        g_scores = choice.view(-1, groups, n_exp // groups).topk(min(2, n_exp // groups), -1)[0].sum(-1)
        keep = torch.zeros_like(g_scores).scatter_(1, g_scores.topk(tg, -1)[1], 1).bool()
        choice = choice.masked_fill(~keep.repeat_interleave(n_exp // groups, 1), float("-inf"))
        idx = choice.topk(c["num_experts_per_tok"], -1)[1]
        wt = scores.gather(1, idx)
        if c.get("norm_topk_prob", True):
            wt = wt / (wt.sum(-1, keepdim=True) + 1e-20)
        wt = wt * c.get("routed_scaling_factor", 1.0)
        out = torch.zeros_like(x)
        for e in range(n_exp):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel():
                xe = x[rows]
                y = (F.silu(xe @ w[f"mlp.experts.{e}.gate_proj.weight"].t()) * (xe @ w[f"mlp.experts.{e}.up_proj.weight"].t())) \
                    @ w[f"mlp.experts.{e}.down_proj.weight"].t()
                out.index_add_(0, rows, y * wt[rows, slot, None])
        sh = "mlp.shared_experts."
        return out + self._lin(sh + "down_proj", F.silu(self._lin(sh + "gate_proj", x)) * self._lin(sh + "up_proj", x))

    def _finish(self, u: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        r = u + attn
        y = r + self._mlp(rms_norm(r, self.w["post_attention_layernorm.weight"], self.eps))
        return rms_norm(y, self.w["shared_head.norm.weight"], self.eps)

    # ---- drafting ------------------------------------------------------------------------
    @torch.no_grad()
    def draft_logits(self, hidden: torch.Tensor, ids: torch.Tensor, n: int, kv_share: bool = True,
                     index_share: bool = True, drafts: list[int] | None = None) -> torch.Tensor:
        """Per-step logits [n, V] from one request: the target's hidden states hidden [a, H] of
        positions 0..a-1, the verified tokens ids [a + 1] (the last is the anchor); step j's input
        token is drafts[j - 1] when given, else the greedy draft."""
        a, dev = hidden.shape[0], hidden.device
        pos = torch.arange(a, device=dev)
        u0 = self._input(ids[1:a + 1], hidden.float())
        x0 = rms_norm(u0, self.w["input_layernorm.weight"], self.eps)
        keys = self._keys(x0, pos)
        qn, qr, iq, iw = self._queries(x0, pos)
        causal = torch.ones(a, a, dtype=torch.bool, device=dev).tril()
        share = IndexShareCache()  # step 0's top-k of the anchor's row, reused by later steps
        sel0 = share.get_or_compute(0, lambda: self.indexer_topk(iq, iw, keys["ikey"], causal),
                                    keep_rows=torch.tensor([a - 1], device=dev))
        g = self._finish(u0, self._attend(qn, qr, keys, sel0))[a - 1:a]
        out = [g @ self.head.t()]
        for j in range(1, n):
            tok = torch.tensor([drafts[j - 1]], device=dev) if drafts else out[-1].argmax(-1)
            p = torch.tensor([a - 1 + j], device=dev)
            u = self._input(tok, g)
            x = rms_norm(u, self.w["input_layernorm.weight"], self.eps)
            qn, qr, iq, iw = self._queries(x, p)
            if not kv_share:
                own = self._keys(x, p)
                keys = {k: torch.cat([keys[k], own[k]]) for k in keys}
            visible = torch.ones(1, keys["lat"].shape[0], dtype=torch.bool, device=dev)
            if index_share:
                sel = share.get_or_compute(j, lambda: None)
                self.stats["indexer_rows_skipped"] += 1
            else:
                sel = self.indexer_topk(iq, iw, keys["ikey"], visible)
            g = self._finish(u, self._attend(qn, qr, keys, sel))
            out.append(g @ self.head.t())
        return torch.cat(out)
