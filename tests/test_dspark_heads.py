"""DSpark's Markov head variants (vanilla / gated / rnn), the confidence head, sliding-window
attention and how both checkpoint formats express them (speculators 0.9.0's fields)."""

import json

import pytest
import torch

from vllm_specx.methods.dspark.checkpoint import load_draft, read_config, save_specx, save_speculators
from vllm_specx.methods.dspark.config import DSparkDraftConfig
from vllm_specx.methods.dspark.model import DSparkDraft, MarkovHead, block_mask

TARGET = {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
          "intermediate_size": 32, "vocab_size": 50, "rms_norm_eps": 1e-6, "rope_theta": 100.0}


def draft(head="vanilla", anchor=True, confidence=None, window=None, causal=False, seed=0) -> DSparkDraft:
    cfg = DSparkDraftConfig.for_target(TARGET, target_layer_ids=(0, 2), num_hidden_layers=1, block_size=5,
                                       mask_token_id=3, markov_rank=4, sample_from_anchor=anchor,
                                       markov_head_type=head, confidence_head=confidence,
                                       sliding_window=window, causal=causal)
    torch.manual_seed(seed)
    emb = torch.randn(50, 16)
    d = DSparkDraft(cfg, emb, emb)
    for p in d.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return d


def test_head_formulas():
    """Each head type against its formula written out here (speculators' MarkovHead.block_bias)."""
    torch.manual_seed(0)
    h, r, v = 6, 3, 11
    prev, hid = torch.randint(0, v, (2, 4)), torch.randn(2, 4, h)
    heads = {t: MarkovHead(v, v, r, h, t) for t in ("vanilla", "gated", "rnn")}
    for head in heads.values():
        for p in head.parameters():
            torch.nn.init.normal_(p)
    w1, w2 = heads["vanilla"].markov_w1.weight, heads["vanilla"].markov_w2.weight
    torch.testing.assert_close(heads["vanilla"].block_bias(prev, hid), w1[prev] @ w2.t())
    g = heads["gated"]
    e = g.markov_w1.weight[prev]
    gate = torch.sigmoid(torch.cat([hid, e], -1) @ g.gate_proj.weight.t() + g.gate_proj.bias)
    torch.testing.assert_close(g.block_bias(prev, hid), (gate * e) @ g.markov_w2.weight.t())
    rnn = heads["rnn"]
    e, s, want = rnn.markov_w1.weight[prev], torch.zeros(2, r), []
    for k in range(4):
        z = torch.cat([s, e[:, k], hid[:, k]], -1) @ rnn.joint_proj.weight.t() + rnn.joint_proj.bias
        gk, ck, ok = z[:, :r].sigmoid(), z[:, r:2 * r].tanh(), z[:, 2 * r:].tanh()
        s = gk * s + (1 - gk) * ck
        want.append(ok @ rnn.markov_w2.weight.t())
    torch.testing.assert_close(rnn.block_bias(prev, hid), torch.stack(want, 1))
    with pytest.raises(RuntimeError, match="needs hidden states"):
        rnn(prev)


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("anchor", [True, False])
def test_sequential_drafts_equal_teacher_forcing_on_their_own_drafts(head, anchor):
    """Serving (left to right, prev = the previous draft) and training (the whole block with
    teacher-forced prev tokens) are one computation: fed its own greedy drafts as the teacher
    tokens, the trainer's logits pick exactly those drafts. For rnn in the fill-in layout the state
    runs over slot 0 first; skipping it changes the logits (negative control)."""
    d = draft(head, anchor)
    taps = torch.randn(9, 32)
    n, anchor_id = d.cfg.max_drafts, 7
    drafts = d.greedy_drafts(taps, anchor_id, n)
    h = d.query_states(taps, anchor_id, n)
    slot_prev = torch.tensor(([anchor_id] if not anchor else []) + [anchor_id] + drafts[:-1])
    logits = d.slot_logits(h, slot_prev)[d.cfg.slot_offset:]
    assert logits.argmax(-1).tolist() == drafts
    _, seen = d.draft(taps, anchor_id, n, pick=lambda x: (x.argmax(-1), x))  # the serving logits
    torch.testing.assert_close(seen, logits)
    if head == "rnn" and not anchor:  # slot 0's state matters: a head that skipped it differs
        assert not torch.allclose(logits, d.slot_logits(h[1:], slot_prev[1:]))


def test_confidence_head_inputs():
    d = draft("vanilla", confidence="hidden+markov")
    h, prev = torch.randn(5, 16), torch.randint(0, 50, (5,))
    w = d.confidence_head.proj
    want = torch.cat([h, d.markov_head.markov_w1.weight[prev]], -1) @ w.weight[0] + w.bias
    torch.testing.assert_close(d.confidence_logits(h, prev), want)
    d2 = draft("vanilla", confidence="hidden")
    torch.testing.assert_close(d2.confidence_logits(h, prev), h @ d2.confidence_head.proj.weight[0]
                               + d2.confidence_head.proj.bias)
    with pytest.raises(ValueError, match="no confidence head"):
        draft().confidence_logits(h, prev)


def test_sliding_window_limits_the_context():
    m = block_mask(torch.tensor([[6]]), seq_len=8, q=2, causal=True, window=3)[0]
    assert m[0, :8].tolist() == [False] * 3 + [True] * 3 + [False] * 2  # t in [a - 3, a)
    assert m[0, 8:].tolist() == [True, False] and m[1, 8:].tolist() == [True, True]
    taps = torch.randn(9, 32)
    wide, narrow = draft(window=None), draft(window=2)
    assert torch.equal(draft(window=9).base_logits(taps, 7, 5), wide.base_logits(taps, 7, 5))
    assert not torch.allclose(narrow.base_logits(taps, 7, 5), wide.base_logits(taps, 7, 5))


@pytest.mark.parametrize("head,confidence,window,causal", [
    ("gated", "hidden+markov", None, False), ("rnn", "hidden", 64, True), ("vanilla", None, 64, False)])
def test_both_formats_round_trip_every_field(tmp_path, head, confidence, window, causal):
    d = draft(head, confidence=confidence, window=window, causal=causal)
    for fmt, save in (("specx", save_specx), ("speculators", lambda m, p: save_speculators(m, p, "t"))):
        save(d, tmp_path / fmt)
        back = load_draft(tmp_path / fmt, d.embed, d.lm_head)
        assert back.cfg == DSparkDraftConfig(**{**d.cfg.__dict__, "source_format": fmt})
        taps = torch.randn(7, 32)
        assert back.greedy_drafts(taps, 5, 5) == d.greedy_drafts(taps, 5, 5)


def _speculators_raw(**kw) -> dict:
    layer = {"model_type": "qwen3", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 32, "vocab_size": 50}
    layer.update(kw.pop("layer", {}))
    return {"speculators_model_type": "dspark", "transformer_layer_config": layer,
            "aux_hidden_state_layer_ids": [1, 3], "block_size": 8, "mask_token_id": 3, "markov_rank": 4,
            "sample_from_anchor": True, **kw}


def test_speculators_attention_fields_as_its_trainer_masks_them():
    """speculators 0.9.0: sliding_attention layers are causal inside the block unless
    sliding_window_non_causal, and see a window of context; full_attention layers are
    bidirectional over the whole context."""
    sliding = {"layer_types": ["sliding_attention"] * 2, "sliding_window": 2048}
    c = read_config(_speculators_raw(layer=sliding))
    assert (c.causal, c.sliding_window) == (True, 2048)
    c = read_config(_speculators_raw(layer=sliding, sliding_window_non_causal=True))
    assert (c.causal, c.sliding_window) == (False, 2048)
    c = read_config(_speculators_raw(layer={"layer_types": ["full_attention"] * 2}))
    assert (c.causal, c.sliding_window) == (False, None)
    c = read_config(_speculators_raw())  # no layer_types: full attention
    assert (c.causal, c.sliding_window) == (False, None)
    assert read_config(_speculators_raw()).confidence_head == "hidden+markov"  # speculators' default
    assert read_config(_speculators_raw(enable_confidence_head=False)).confidence_head is None
    assert read_config(_speculators_raw(confidence_head_with_markov=False)).confidence_head == "hidden"
    assert read_config(_speculators_raw(markov_head_type="rnn")).markov_head_type == "rnn"


@pytest.mark.parametrize("raw,match", [
    (_speculators_raw(layer={"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8}),
     "mixes or names unknown attention types"),
    (_speculators_raw(layer={"layer_types": ["sliding_attention"] * 2}), "need transformer_layer_config.sliding_window"),
    (_speculators_raw(layer={"layer_types": ["full_attention"]}), "layer_types has 1 entries for 2 layers"),
    (_speculators_raw(markov_head_type="lstm"), "markov_head_type 'lstm' not one of"),
    ({k: v for k, v in _speculators_raw().items() if k != "sample_from_anchor"},
     "missing required field 'sample_from_anchor'"),
])
def test_speculators_fields_we_cannot_serve_are_refused_by_name(raw, match):
    with pytest.raises(ValueError, match=match):
        read_config(raw, "ckpt/config.json")


def test_causal_without_window_cannot_be_written_as_speculators(tmp_path):
    with pytest.raises(ValueError, match="only as sliding-window layers"):
        save_speculators(draft(causal=True), tmp_path, "t")
    save_specx(draft(causal=True), tmp_path / "ok")
    assert json.loads((tmp_path / "ok" / "config.json").read_text())["specx"]["causal"] is True
