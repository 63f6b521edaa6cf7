"""The EAGLE-3 baseline's PyTorch model: the batched training chain (training-time test) equals
an independent step-by-step drafting loop with an explicit KV cache, as vLLM's EAGLE proposer
drafts; vLLM-native checkpoints round-trip; bad configs are refused naming the field."""

import math

import pytest
import torch
import torch.nn.functional as F

from vllm_specx.layers import rope
from vllm_specx.methods.eagle3.checkpoint import load, save
from vllm_specx.methods.eagle3.config import Eagle3Config
from vllm_specx.methods.eagle3.model import Eagle3Draft

TARGET = {"hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
          "intermediate_size": 24, "vocab_size": 40, "rms_norm_eps": 1e-6, "rope_theta": 100.0,
          "max_position_embeddings": 128}


def tiny(seed=0) -> Eagle3Draft:
    cfg = Eagle3Config.for_target(TARGET, (0, 2))
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(40, 16, generator=g)
    d = Eagle3Draft(cfg, emb, emb)
    with torch.no_grad():
        for p in d.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.4 if p.dim() > 1 else 1.0) + (1.0 if p.dim() == 1 else 0))
    return d.double()


def kv_cache_drafts(d: Eagle3Draft, taps, ids, n):
    """vLLM's loop, written out: a KV cache of step-0 entries for positions 0..a-1 (token
    x_{p+1}, hidden fc(taps_p)), then each step appends its own entry at the next position."""
    c = d.cfg

    def layer(tok, g, pos, cache):
        x = torch.cat([d.input_layernorm(d.embed[tok]), d.hidden_norm(g)], -1)
        q = rope(d.q_proj(x).view(1, c.num_attention_heads, c.head_dim), torch.tensor([pos]), c.rope_theta)
        k = rope(d.k_proj(x).view(1, c.num_key_value_heads, c.head_dim), torch.tensor([pos]), c.rope_theta)
        v = d.v_proj(x).view(1, c.num_key_value_heads, c.head_dim)
        cache.append((k[0], v[0]))
        K = torch.stack([e[0] for e in cache]).repeat_interleave(2, 1)  # [L, heads, hd]
        V = torch.stack([e[1] for e in cache]).repeat_interleave(2, 1)
        w = torch.softmax(torch.einsum("hd,lhd->hl", q[0], K) / math.sqrt(c.head_dim), -1)
        attn = torch.einsum("hl,lhd->hd", w, V).reshape(-1)
        r = d.o_proj(attn) + g
        y = d.post_attention_layernorm(r)
        return d.down_proj(F.silu(d.gate_proj(y)) * d.up_proj(y)) + r

    a = len(ids) - 1
    cache, out = [], None
    for p in range(a):  # the prefill of the draft's cache; the last one is draft 0's step
        out = layer(int(ids[p + 1]), d.fc(taps[p]), p, cache)
    drafts = []
    for j in range(n):
        drafts.append(int(d.logits(out).argmax()))
        if j + 1 < n:
            out = layer(drafts[-1], out, a + j, cache)
    return drafts


@torch.no_grad()
def test_training_chain_equals_a_kv_cache_drafting_loop():
    d = tiny()
    g = torch.Generator().manual_seed(1)
    for length in (3, 9, 14):
        taps = torch.randn(length, 32, generator=g, dtype=torch.float64)
        ids = torch.randint(0, 40, (length + 1,), generator=g)
        assert d.greedy_drafts(taps, ids, 5) == kv_cache_drafts(d, taps, ids, 5), length


@torch.no_grad()
def test_teacher_forced_chain_is_the_draft_chain_when_drafts_equal_the_tokens():
    """With chain_tokens="target", step j reads x_{a+j}; when those are the chain's own drafts the
    logits are the drafting chain's (so teacher forcing is exactly serving on accepted prefixes)."""
    d = tiny(2)
    g = torch.Generator().manual_seed(2)
    taps = torch.randn(1, 20, 32, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 40, (1, 20), generator=g)
    for anchor in (6, 11):
        a = torch.tensor([[anchor]])
        own = d.chain_logits(taps, ids, a, 4, "draft")
        forced = ids.clone()  # the chain's context reads ids[: a + 1] only: rewriting later ones is safe
        forced[0, anchor + 1: anchor + 4] = own[0, 0, :3].argmax(-1)
        torch.testing.assert_close(d.chain_logits(taps, forced, a, 4, "target"), own)
        assert not torch.allclose(d.chain_logits(taps, ids, a, 4, "target"), own)  # negative control


def test_checkpoint_round_trip_in_vllm_format(tmp_path):
    d = tiny().float()
    save(d, tmp_path / "e3")
    import json
    raw = json.loads((tmp_path / "e3" / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLMEagle3"] and raw["eagle_aux_hidden_state_layer_ids"] == [1, 3]
    back = load(tmp_path / "e3", d.embed, d.lm_head)
    assert back.cfg == d.cfg
    for k, v in d.vllm_state_dict().items():
        assert torch.equal(v, back.vllm_state_dict()[k]), k


@pytest.mark.parametrize("field,value,match", [
    ("num_key_value_heads", 3, "multiple of num_key_value_heads"),
    ("hidden_size", 0, "hidden_size must be a positive integer"),
    ("target_layer_ids", (2, 1), "distinct ascending"),
])
def test_bad_config_is_refused_naming_the_field(field, value, match):
    cfg = Eagle3Config.for_target(TARGET, (0, 2))
    with pytest.raises(ValueError, match=match):
        Eagle3Config(**{**cfg.__dict__, field: value})
