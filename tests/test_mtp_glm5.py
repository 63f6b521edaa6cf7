"""Native GLM-5 MTP layers on CPU: a tiny random GLM-5 (`glm_moe_dsa`) checkpoint with an MTP layer
is written the way GLM-5 checkpoints store it (`model.layers.{num_hidden_layers}.*`, per-expert
MoE tensors), loaded by `methods.mtp.glm5.Glm5MTPLayer` (our MLA + DSA indexer through
`ops.dsa_indexer`/`ops.topk` + MoE), and its K-step drafts are checked against an independent
forward built from transformers' own `GlmMoeDsaDecoderLayer` - for KVShare on/off and IndexShare
on/off, where the four modes must also differ from one another (so the check can fail)."""

import json

import pytest
import torch
from safetensors.torch import save_file

from vllm_specx.methods.mtp.glm5 import Glm5MTPLayer

transformers = pytest.importorskip("transformers")
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM  # noqa: E402
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import (  # noqa: E402
    GlmMoeDsaDecoderLayer,
    GlmMoeDsaRMSNorm,
    GlmMoeDsaRotaryEmbedding,
)

L = 2  # main layers; the MTP layer is layer 2
TINY = dict(vocab_size=96, hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24,
            kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, index_n_heads=8,
            index_head_dim=16, index_topk=4, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
            topk_group=1, moe_intermediate_size=24, n_shared_experts=1, intermediate_size=48,
            first_k_dense_replace=1, max_position_embeddings=128, routed_scaling_factor=2.5,
            rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}, rms_norm_eps=1e-5)
A, N = 10, 5  # context rows (more than index_topk: the selection matters), draft steps


def _randomise(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(module.named_parameters()) + list(module.named_buffers()):
            if p.dim() == 1 and "bias" not in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


@pytest.fixture(scope="module")
def glm5(tmp_path_factory):
    """(checkpoint dir, the transformers MTP block, its extra modules)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("glm5")
    cfg = GlmMoeDsaConfig(num_hidden_layers=L, num_nextn_predict_layers=1, **TINY)
    GlmMoeDsaForCausalLM(cfg).save_pretrained(path)
    full = GlmMoeDsaConfig(num_hidden_layers=L + 1, **TINY)  # so layer index L exists
    full._attn_implementation = "eager"
    block = GlmMoeDsaDecoderLayer(full, layer_idx=L).eval()
    _randomise(block, 1)
    h = TINY["hidden_size"]
    extra = {"eh_proj": torch.nn.Linear(2 * h, h, bias=False), "enorm": GlmMoeDsaRMSNorm(h, 1e-5),
             "hnorm": GlmMoeDsaRMSNorm(h, 1e-5), "shared_head.norm": GlmMoeDsaRMSNorm(h, 1e-5),
             "shared_head.head": torch.nn.Linear(h, TINY["vocab_size"], bias=False)}
    for i, m in enumerate(extra.values()):
        _randomise(m, 10 + i)
    tensors = {}
    for k, v in block.state_dict().items():
        if k == "mlp.experts.gate_up_proj":  # GLM-5 checkpoints store one tensor per expert
            inter = v.shape[1] // 2
            for e in range(v.shape[0]):
                tensors[f"mlp.experts.{e}.gate_proj.weight"] = v[e, :inter]
                tensors[f"mlp.experts.{e}.up_proj.weight"] = v[e, inter:]
        elif k == "mlp.experts.down_proj":
            for e in range(v.shape[0]):
                tensors[f"mlp.experts.{e}.down_proj.weight"] = v[e]
        else:
            tensors[k] = v
    for name, m in extra.items():
        tensors[f"{name}.weight"] = m.weight
    save_file({f"model.layers.{L}.{k}": v.detach().contiguous() for k, v in tensors.items()},
              str(path / "mtp.safetensors"))
    return path, block, extra, GlmMoeDsaRotaryEmbedding(full)


@torch.no_grad()
def _reference(glm5, hidden, ids, n, kv_share, index_share, drafts):
    """The drafting chain with transformers' layer: each step re-runs the block over the rows it
    may see (context rows + the step's own earlier rows for mixed KV), with an explicit mask."""
    path, block, extra, rotary = glm5
    embed = GlmMoeDsaForCausalLM.from_pretrained(path).model.embed_tokens  # the target's own

    def inp(e, h):
        return extra["eh_proj"](torch.cat([extra["enorm"](embed(e)), extra["hnorm"](h)], -1))

    def run(u, pos, allowed, prev=None):
        mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[None, None]
        cos_sin = rotary(u[None], pos[None])
        out, topk = block(u[None], attention_mask=mask, position_ids=pos[None], position_embeddings=cos_sin,
                          prev_topk_indices=prev)
        return extra["shared_head.norm"](out[0]), topk[0]

    a = hidden.shape[0]
    u_ctx = inp(ids[1:a + 1], hidden)
    g_all, top0 = run(u_ctx, torch.arange(a), torch.ones(a, a, dtype=torch.bool).tril())
    g = g_all[-1:]
    logits = [extra["shared_head.head"](g)]
    own = []
    indexer = block.self_attn.indexer
    for j in range(1, n):
        u = inp(torch.tensor([drafts[j - 1]]), g)
        rows = torch.cat([u_ctx, *([] if kv_share else own), u])
        s = rows.shape[0]
        pos = torch.cat([torch.arange(a), torch.arange(a, s) if not kv_share else torch.tensor([a - 1 + j])])
        allowed = torch.ones(s, s, dtype=torch.bool).tril()
        if kv_share:
            allowed[-1, -1] = False  # the step attends to step 0's keys only, not its own
        prev = None
        if index_share:  # no indexer: every later row reuses step 0's last-row top-k
            prev = torch.cat([top0, top0[-1:].expand(s - a, -1)])[None]
            block.self_attn.indexer = None
        try:
            g = run(rows, pos, allowed, prev)[0][-1:]
        finally:
            block.self_attn.indexer = indexer
        own.append(u)
        logits.append(extra["shared_head.head"](g))
    return torch.cat(logits)


@pytest.mark.parametrize("kv_share", [True, False], ids=["kv_share", "mixed_kv"])
@pytest.mark.parametrize("index_share", [True, False], ids=["index_share", "own_indexer"])
def test_native_mtp_drafts_equal_transformers_layer(glm5, kv_share, index_share):
    path = glm5[0]
    mtp = Glm5MTPLayer.from_pretrained(path)
    assert mtp.moe  # the config's MTP layer is MoE (layer index >= first_k_dense_replace)
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(A, TINY["hidden_size"], generator=g)
    ids = torch.randint(0, TINY["vocab_size"], (A + 1,), generator=g)
    drafts = torch.randint(0, TINY["vocab_size"], (N - 1,), generator=g).tolist()
    got = mtp.draft_logits(hidden, ids, N, kv_share, index_share, drafts)
    want = _reference(glm5, hidden, ids, N, kv_share, index_share, drafts)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)
    # IndexShare runs the indexer on step 0's rows only
    mtp.stats.update(indexer_rows=0, indexer_rows_skipped=0)
    mtp.draft_logits(hidden, ids, N, kv_share, index_share, drafts)
    assert mtp.stats["indexer_rows"] == A + (0 if index_share else N - 1)
    assert mtp.stats["indexer_rows_skipped"] == (N - 1 if index_share else 0)


def test_the_modes_are_different_drafts(glm5):
    """So the comparison above can fail: step 0 is the same in every mode; from step 1 on,
    KVShare on/off and IndexShare on/off give different drafts - except that with IndexShare the
    KV mode does not matter (steps >= 1 attend to step 0's indices, all target-derived keys)."""
    mtp = Glm5MTPLayer.from_pretrained(glm5[0])
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(A, TINY["hidden_size"], generator=g)
    ids = torch.randint(0, TINY["vocab_size"], (A + 1,), generator=g)
    drafts = torch.randint(0, TINY["vocab_size"], (N - 1,), generator=g).tolist()
    out = {(ks, ish): mtp.draft_logits(hidden, ids, N, ks, ish, drafts)
           for ks in (True, False) for ish in (True, False)}
    for v in out.values():
        torch.testing.assert_close(v[0], out[True, True][0])
    torch.testing.assert_close(out[True, True], out[False, True])
    for x, y in (((True, True), (True, False)), ((True, False), (False, False)), ((False, False), (False, True))):
        assert (out[x][1:] - out[y][1:]).abs().max() > 1e-2, (x, y)


def test_native_loader_names_what_is_missing(glm5, tmp_path):
    import shutil

    from safetensors.torch import load_file

    src = glm5[0]
    for f in src.iterdir():
        shutil.copy(f, tmp_path / f.name)
    t = load_file(str(tmp_path / "mtp.safetensors"))
    t.pop(f"model.layers.{L}.self_attn.indexer.wk.weight")
    save_file(t, str(tmp_path / "mtp.safetensors"))
    with pytest.raises(ValueError, match="indexer.wk.weight"):
        Glm5MTPLayer.from_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 0
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="num_nextn_predict_layers is 0"):
        Glm5MTPLayer.from_pretrained(tmp_path)
