"""The MTP draft on vLLM's layers: `model.py`'s math with vLLM's Llama decoder layer (its
attention writes/reads the draft's paged KV cache under the layer index `target layers + 0`, as a
native MTP layer's does), the target's embeddings and LM head (shared by vLLM's loading:
`has_own_lm_head` is False) - except a reduced draft vocabulary's, whose own lm_head rows
[Vd, H] and `d2t` the checkpoint carries (`has_own_lm_head` True; logits in draft ids).

`forward` returns (g, g): the post-norm output is both what the logits read and what the next
draft step is fed (`model.py`). The K3 variant's `fc` is `combine_hidden_states`, which vLLM's
EAGLE-3 plumbing applies to the captured target layers; the class is an `Eagle3LlamaForCausalLM`
only so that plumbing accepts it (none of that class's own code runs). Imported only inside
vLLM processes.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.llama import LlamaDecoderLayer
from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM

from vllm_specx import registry, vocab

_STACKED = ((".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"), (".qkv_proj", ".v_proj", "v"),
            (".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1))


class _SharedHead(nn.Module):
    def __init__(self, h: int, eps: float):
        super().__init__()
        self.norm = RMSNorm(h, eps=eps)


class _MTPLayer(nn.Module):
    def __init__(self, vllm_config, config, cfg, prefix: str):
        super().__init__()
        h = cfg.hidden_size
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, h)  # replaced by the target's
        self.enorm = RMSNorm(h, eps=cfg.rms_norm_eps)
        self.hnorm = RMSNorm(h, eps=cfg.rms_norm_eps)
        self.eh_proj = ReplicatedLinear(2 * h, h, bias=False, return_bias=False,
                                        params_dtype=vllm_config.model_config.dtype)
        # The KV-cache layer name is the native MTP layer's index: target layers + 0.
        self.mtp_block = LlamaDecoderLayer(vllm_config, prefix=f"{prefix}.layers.{cfg.target_num_hidden_layers}",
                                           config=config)
        self.shared_head = _SharedHead(h, cfg.rms_norm_eps)
        if cfg.fusion_layer_ids:
            self.fc = ReplicatedLinear(len(cfg.fusion_layer_ids) * cfg.target_hidden_size, h, bias=False,
                                       return_bias=False, params_dtype=vllm_config.model_config.dtype)


class SpecxMTPForCausalLM(vocab.ServedVocabMap, Eagle3LlamaForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        nn.Module.__init__(self)  # not Eagle3LlamaForCausalLM's layers: ours
        self.config = vllm_config.speculative_config.draft_model_config.hf_config
        _, cfg = registry.config_of(self.config)  # validated again here, in the worker
        self.mtp = cfg
        self.model = _MTPLayer(vllm_config, self.config, cfg, prefix=(prefix + ".model") if prefix else "model")
        # A reduced draft vocabulary keeps its own lm_head rows [Vd, H] and d2t; else the LM head
        # is replaced by the target's (vLLM shares it: has_own_lm_head False).
        self.has_own_lm_head = cfg.reduced_vocab
        self.lm_head = ParallelLMHead(cfg.draft_vocab_size, cfg.hidden_size)
        self.logits_processor = LogitsProcessor(cfg.draft_vocab_size)
        self.draft_id_to_target_id = (torch.nn.Parameter(torch.zeros(cfg.draft_vocab_size, dtype=torch.long),
                                                         requires_grad=False) if cfg.reduced_vocab else None)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.model
        e = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        u = m.eh_proj(torch.cat([m.enorm(e), m.hnorm(hidden_states)], -1))
        x, residual = m.mtp_block(positions, u, None)
        g = m.shared_head.norm(x + residual)
        return g, g

    def store_context_kv(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                         slot_mapping: torch.Tensor | None) -> None:
        """Write step 0's K/V for rows (input_ids [N], positions [N], hidden_states [N, H]) into
        the layer's paged cache at slot_mapping [N] (None: compute only) - what `forward`'s
        attention writes for them, without the attention, the MLP or the logits: K = RoPE(k_proj(
        input_layernorm(eh_proj(cat[enorm(embed(x)), hnorm(h)])))), V = v_proj(same). Used for
        the context a skipped adaptive pass defers (`MTPProposer._flush_context`)."""
        m = self.model
        u = m.eh_proj(torch.cat([m.enorm(self.embed_input_ids(input_ids)), m.hnorm(hidden_states)], -1))
        blk = m.mtp_block
        sa = blk.self_attn
        qkv, _ = sa.qkv_proj(blk.input_layernorm(u))
        q, k, v = qkv.split([sa.q_size, sa.kv_size, sa.kv_size], dim=-1)
        _, k = sa.rotary_emb(positions, q, k)
        if slot_mapping is None:
            return
        attn = sa.attn
        if not hasattr(attn.impl, "do_kv_cache_update"):
            raise RuntimeError(f"vllm-specx MTP adaptive drafting: the attention backend "
                               f"{type(attn.impl).__name__} cannot write K/V outside its forward")
        attn.impl.do_kv_cache_update(attn, k.reshape(-1, attn.num_kv_heads, attn.head_size),
                                     v.reshape(-1, attn.num_kv_heads, attn.head_size_v), attn.kv_cache,
                                     slot_mapping)

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """K3: the fused step-0 hidden input from the captured target layers [N, n*H] -> [N, H]."""
        return self.model.fc(hidden_states)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary [.., Vd] (draft ids; `draft_target_ids` maps them)."""
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.model.named_parameters())
        loaded = set()
        own = set()
        for name, w in weights:
            if self.mtp.reduced_vocab and name in (vocab.HEAD, vocab.D2T, vocab.T2D):
                if name == vocab.HEAD and self.mtp.lm_head_from_target:
                    raise ValueError(f"MTP checkpoint: tensor '{vocab.HEAD}' is present, but the config "
                                     f"says {vocab.FROM_TARGET}: true (the rows come from the target)")
                if name == vocab.HEAD:
                    getattr(self.lm_head.weight, "weight_loader", default_weight_loader)(self.lm_head.weight, w)
                elif name == vocab.D2T:
                    self.draft_id_to_target_id.data.copy_(w.long())
                own.add(name)  # t2d: for training only
                continue
            for param_name, shard_name, shard_id in _STACKED:
                if shard_name in name:
                    key = name.replace(shard_name, param_name)
                    param = params.get(key)
                    if param is None:
                        break
                    param.weight_loader(param, w, shard_id)
                    loaded.add(key)
                    break
            else:
                param = params.get(name)
                if param is None or name.startswith("embed_tokens."):
                    raise ValueError(f"MTP checkpoint: tensor '{name}' does not belong to this draft")
                getattr(param, "weight_loader", default_weight_loader)(param, w)
                loaded.add(name)
        missing = sorted(set(params) - loaded - {"embed_tokens.weight"})
        if missing:
            raise ValueError(f"MTP checkpoint: missing tensors {missing}")
        if self.mtp.reduced_vocab:
            # lm_head_from_target: MTPProposer copies the target's rows in (`vocab.TargetHeadRows`)
            lost = sorted(({vocab.D2T} | (set() if self.mtp.lm_head_from_target else {vocab.HEAD})) - own)
            if lost:
                raise ValueError(f"MTP checkpoint with a reduced draft vocabulary: missing tensors {lost}")
            return {"model." + n for n in params} | {"lm_head.weight", "draft_id_to_target_id"}
        # Embeddings and LM head come from the target (shared after loading).
        return {"model." + n for n in params} | {"lm_head.weight"}
