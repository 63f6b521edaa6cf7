"""The MTP method without vLLM engines: config and checkpoint checks, routing, and the KVShare
contract of the reference (`methods/mtp/model.py`) against an independent step-by-step forward."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from vllm_specx import registry
from vllm_specx.layers import rope
from vllm_specx.methods.mtp import checkpoint
from vllm_specx.methods.mtp.config import MTPDraftConfig

from . import helpers as T


@pytest.fixture(scope="module")
def target():
    return T.load_target(T.REF_TARGET)


def _cfg(**kw):
    base = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                intermediate_size=128, rms_norm_eps=1e-5, vocab_size=100, rope_theta=10000.0,
                max_position_embeddings=512, target_hidden_size=64, target_num_hidden_layers=4)
    return MTPDraftConfig(**{**base, **kw})


@pytest.mark.parametrize("field,value,needle", [
    ("hidden_size", 0, "hidden_size"), ("num_key_value_heads", 3, "num_key_value_heads"),
    ("target_hidden_size", 32, "target_hidden_size"), ("kv_share", "yes", "kv_share"),
    ("attention", "dsa", "attention 'dsa'"), ("max_drafts", True, "max_drafts"),
    ("rope_theta", -1.0, "rope_theta")])
def test_config_refuses_bad_fields_naming_them(field, value, needle):
    with pytest.raises(ValueError, match=needle):
        _cfg(**{field: value})


def test_config_checks_the_target():
    cfg = _cfg()
    cfg.check_target({"hidden_size": 64, "vocab_size": 100, "num_hidden_layers": 4}, 7)
    for key, bad in (("hidden_size", 32), ("vocab_size", 99), ("num_hidden_layers", 5)):
        with pytest.raises(ValueError, match="another target"):
            cfg.check_target({"hidden_size": 64, "vocab_size": 100, "num_hidden_layers": 4, key: bad}, 7)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        cfg.check_target({"hidden_size": 64, "vocab_size": 100, "num_hidden_layers": 4}, 0)


def test_checkpoint_round_trip_and_routing(tmp_path, target):
    draft = T.random_mtp(target, kv_share=True)
    checkpoint.save(draft, tmp_path / "d")
    method, cfg = registry.read_checkpoint(tmp_path / "d")
    assert method.name == "mtp" and cfg == draft.cfg
    registry.check_draft(method, cfg, tmp_path / "d", registry.target_dims(target.config), 7)
    back = checkpoint.load(tmp_path / "d", *T.embed_and_head(target))
    h = torch.randn(1, 12, 256)
    ids = torch.randint(0, 4096, (1, 12))
    a = torch.tensor([[6, 9]])
    assert torch.equal(back.chain_logits(h, ids, a, 4), draft.chain_logits(h, ids, a, 4))
    # routing: our checkpoint under "mtp" (or no method) is ours; "mtp" without a draft of ours
    # (a native MTP target) stays vLLM's
    assert registry.choose("mtp", str(tmp_path / "d"), False)[0].name == "mtp"
    assert registry.choose(None, str(tmp_path / "d"), False)[0].name == "mtp"
    assert registry.choose("mtp", None, False) is None
    off = checkpoint.with_options(tmp_path / "d", tmp_path / "off", kv_share=False)
    assert registry.read_checkpoint(off)[1].kv_share is False


@pytest.mark.parametrize("edit,needle", [
    (lambda s: s.pop("format_version"), "specx.format_version"),
    (lambda s: s.update(format_version=2), "format_version 2"),
    (lambda s: s.update(index_share=True), "specx.index_share"),
    (lambda s: s.pop("head_dim"), "specx.head_dim"),
    (lambda s: s.update(kv_share="on"), "kv_share")])
def test_bad_checkpoint_config_names_the_field_and_file(tmp_path, target, edit, needle):
    checkpoint.save(T.random_mtp(target, True), tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    edit(raw["specx"])
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=needle) as e:
        registry.read_checkpoint(tmp_path)
    assert "config.json" in str(e.value)


def _naive_chain(draft, hidden, ids, a, n, kv_share):
    """The KVShare definition written step by step, one anchor, with explicit key lists:
    step 0's keys K_0..K_{a-1} from (x_{p+1}, H_p); step j's query at position a-1+j attends to
    those keys, plus (kv_share off) the keys of its own steps 1..j."""
    c = draft.cfg
    rep = c.num_attention_heads // c.num_key_value_heads

    def block(e, h, pos):
        u = draft.eh_proj(torch.cat([draft.enorm(draft.embed[e]), draft.hnorm(h)], -1))
        x = draft.input_layernorm(u)
        q = rope(draft.q_proj(x).view(1, c.num_attention_heads, c.head_dim), torch.tensor([pos]), c.rope_theta)
        k = rope(draft.k_proj(x).view(1, c.num_key_value_heads, c.head_dim), torch.tensor([pos]), c.rope_theta)
        v = draft.v_proj(x).view(1, c.num_key_value_heads, c.head_dim)
        return u, q[0], k[0].repeat_interleave(rep, 0), v[0].repeat_interleave(rep, 0)

    def finish(u, q, keys, values):
        kk, vv = torch.stack(keys), torch.stack(values)  # [n_keys, heads, hd]
        w = torch.softmax(torch.einsum("hd,nhd->hn", q, kk) / math.sqrt(c.head_dim), -1)
        o = torch.einsum("hn,nhd->hd", w, vv).reshape(-1)
        r = u + draft.o_proj(o)
        y = draft.post_attention_layernorm(r)
        return draft.norm(r + draft.down_proj(F.silu(draft.gate_proj(y)) * draft.up_proj(y)))

    ctx = [block(ids[p + 1], hidden[p], p) for p in range(a)]
    keys, values = [x[2] for x in ctx], [x[3] for x in ctx]
    u, q, _, _ = ctx[a - 1]
    g = finish(u, q, keys, values)
    out = [g @ draft.lm_head.t()]
    own_k, own_v = [], []
    for j in range(1, n):
        u, q, k, v = block(ids[a + j], g, a - 1 + j)
        if not kv_share:
            own_k.append(k)
            own_v.append(v)
        g = finish(u, q, keys + own_k, values + own_v)
        out.append(g @ draft.lm_head.t())
    return torch.stack(out)


@pytest.mark.parametrize("kv_share", [True, False])
def test_chain_logits_equal_the_kvshare_definition(target, kv_share):
    """The training forward (all anchors of a batch at once) equals the definition per anchor;
    the two modes differ from step 1 on and agree at step 0 (so the test tells them apart)."""
    draft = T.random_mtp(target, kv_share)
    torch.manual_seed(1)
    b, s, n = 2, 20, 5
    hidden = torch.randn(b, s, 256)
    ids = torch.randint(0, 4096, (b, s))
    anchors = torch.tensor([[1, 7, 13], [4, 9, 14]])
    with torch.no_grad():
        got = draft.chain_logits(hidden, ids, anchors, n)
        other = draft.chain_logits(hidden, ids, anchors, n, kv_share=not kv_share)
        for bi in range(b):
            for mi, a in enumerate(anchors[bi].tolist()):
                ref = _naive_chain(draft, hidden[bi], ids[bi], a, n, kv_share)
                torch.testing.assert_close(got[bi, mi], ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[:, :, 0], other[:, :, 0])
    assert (got[:, :, 1:] - other[:, :, 1:]).abs().max() > 1e-2


def test_mtp_options_refused_at_config_time():
    from vllm_specx._vllm_compat.route import option_table

    table = option_table(registry.get("mtp"))
    assert table["index_share_for_mtp_iteration"][0] == "refused"
    assert table["dspark_draft_topk"][0] == "refused"


def test_k3_fusion_initialised_to_the_last_layer_is_the_plain_layer(target):
    """Kimi K3's start: fc over (low, mid, high) taps set to [0, 0, diag(final norm)] drafts what
    the plain layer drafts from the target's final hidden state (hnorm is scale-invariant)."""
    from vllm_specx.methods.mtp.model import MTPDraft, final_hidden

    plain = T.random_mtp(target, kv_share=True)
    cfg = MTPDraftConfig(**{**plain.cfg.to_dict(), "fusion_layer_ids": [1, 4, 7]})
    k3 = MTPDraft(cfg, *T.embed_and_head(target))
    k3.load_specx_state_dict({**plain.specx_state_dict(), "fc.weight": torch.zeros(256, 768)})
    k3.init_fusion_as_final_norm(target.model.norm.weight)
    ids = torch.randint(0, 4096, (1, 24), generator=torch.Generator().manual_seed(5))
    taps = T.target_taps(target, ids, (1, 4, 7))
    hidden = final_hidden(target.model.norm.weight, target.config.rms_norm_eps, taps[..., 512:])
    a = torch.tensor([[8, 15]])
    with torch.no_grad():
        torch.testing.assert_close(k3.chain_logits(taps, ids, a, 5), plain.chain_logits(hidden, ids, a, 5),
                                   atol=1e-3, rtol=1e-3)
        k3.fc.weight[:, :256] += 0.05  # the low layer now counts: the drafts change
        assert (k3.chain_logits(taps, ids, a, 5) - plain.chain_logits(hidden, ids, a, 5)).abs().max() > 1e-2
    with pytest.raises(ValueError, match="fusion_layer_ids"):
        MTPDraftConfig(**{**plain.cfg.to_dict(), "fusion_layer_ids": [4, 1]})
    assert registry.get("mtp").internal(cfg) == "eagle3" and registry.get("mtp").internal(plain.cfg) == "eagle"
