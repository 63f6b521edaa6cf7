"""Shared builders for the end-to-end tests: random DSpark drafts for the reference target."""

from __future__ import annotations

import torch

from vllm_specx.config import DSparkDraftConfig
from vllm_specx.models.dspark_io import save_specx, save_speculators
from vllm_specx.models.dspark_torch import DSparkDraft
from vllm_specx.testing import REF_TARGET
from vllm_specx.training.taps import embed_and_head, load_target, target_taps


def random_draft(target, taps=(1, 4, 6), block_size=8, layers=1, anchor=True, seed=0) -> DSparkDraft:
    cfg = DSparkDraftConfig.for_target(
        target.config.to_dict(), target_layer_ids=taps, num_hidden_layers=layers, block_size=block_size,
        mask_token_id=2, markov_rank=32, sample_from_anchor=anchor)
    torch.manual_seed(seed)
    draft = DSparkDraft(cfg, *embed_and_head(target))
    for p in draft.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.05)  # large enough that argmaxes are far from ties
    return draft


def write(draft: DSparkDraft, path, fmt="specx") -> str:
    if fmt == "specx":
        save_specx(draft, path)
    else:
        save_speculators(draft, path, verifier=str(REF_TARGET))
    return str(path)


def reference_drafts(target, draft: DSparkDraft, prefix: list[int], anchor: int, n: int) -> list[int]:
    taps = target_taps(target, torch.tensor([prefix]), draft.cfg.target_layer_ids)[0]
    return draft.greedy_drafts(taps, anchor, n)


__all__ = ["random_draft", "write", "reference_drafts", "load_target", "REF_TARGET"]


def write_eagle3_head(target, path, taps=(1, 4, 6), seed=0) -> str:
    """A random-init EAGLE-3 head in vLLM's native format (llama_eagle3), sharing the target's
    embeddings and lm_head: enough to exercise vLLM's built-in EAGLE-3 path end to end."""
    import json
    from pathlib import Path

    from vllm_specx.checkpoint import save_tensors

    c = target.config
    h, hd, kv, inter = c.hidden_size, c.head_dim, c.num_key_value_heads * c.head_dim, c.intermediate_size
    q = c.num_attention_heads * hd
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=g) * 0.05  # noqa: E731
    tensors = {
        "fc.weight": rnd(h, h * len(taps)), "norm.weight": torch.ones(h),
        "midlayer.input_layernorm.weight": torch.ones(h), "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": rnd(q, 2 * h), "midlayer.self_attn.k_proj.weight": rnd(kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": rnd(kv, 2 * h), "midlayer.self_attn.o_proj.weight": rnd(h, q),
        "midlayer.mlp.gate_proj.weight": rnd(inter, h), "midlayer.mlp.up_proj.weight": rnd(inter, h),
        "midlayer.mlp.down_proj.weight": rnd(h, inter),
    }
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
              "num_hidden_layers": 1, "num_attention_heads": c.num_attention_heads,
              "num_key_value_heads": c.num_key_value_heads, "head_dim": hd, "intermediate_size": inter,
              "rms_norm_eps": c.rms_norm_eps, "vocab_size": c.vocab_size, "draft_vocab_size": c.vocab_size,
              "max_position_embeddings": c.max_position_embeddings, "rope_theta": 10000.0,
              "target_hidden_size": h, "num_aux_hidden_states": len(taps),
              "eagle_aux_hidden_state_layer_ids": [i + 1 for i in taps], "tie_word_embeddings": False}
    Path(path).mkdir(parents=True, exist_ok=True)
    (Path(path) / "config.json").write_text(json.dumps(config, indent=2))
    save_tensors(path, tensors)
    return str(path)
