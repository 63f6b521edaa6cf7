"""The PyTorch DSpark model: checkpoint round trips, the block mask, and greedy drafting invariants."""

import torch

from vllm_specx.methods.dspark.checkpoint import load_draft, save_specx, save_speculators
from vllm_specx.methods.dspark.config import DSparkDraftConfig
from vllm_specx.methods.dspark.model import DSparkDraft, block_mask


def tiny(anchor=True, **options) -> DSparkDraft:
    target = {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
              "intermediate_size": 32, "vocab_size": 50, "rms_norm_eps": 1e-6, "rope_theta": 100.0}
    cfg = DSparkDraftConfig.for_target(target, target_layer_ids=(0, 2), num_hidden_layers=2,
                                       block_size=5, mask_token_id=3, markov_rank=4,
                                       sample_from_anchor=anchor, **options)
    torch.manual_seed(0)
    emb = torch.randn(50, 16)
    d = DSparkDraft(cfg, emb, emb)
    for p in d.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return d


def test_both_checkpoint_formats_round_trip(tmp_path):
    for anchor, save in ((True, save_specx), (False, lambda d, p: save_speculators(d, p, "tgt"))):
        d = tiny(anchor)
        save(d, tmp_path / str(anchor))
        back = load_draft(tmp_path / str(anchor), d.embed, d.lm_head)
        assert back.cfg == d.cfg.__class__(**{**d.cfg.__dict__, "source_format": back.cfg.source_format})
        for k, v in d.state_dict().items():
            assert torch.equal(v, back.state_dict()[k]), k
        taps = torch.randn(7, 32)
        assert back.greedy_drafts(taps, 5, 4) == d.greedy_drafts(taps, 5, 4)


def test_block_mask_sees_prefix_and_own_block_only():
    m = block_mask(torch.tensor([[2, 4]]), seq_len=5, q=3, causal=False)[0]  # [6, 5 + 6]
    assert m[0, :5].tolist() == [True, True, False, False, False]  # block 0: context t < 2
    assert m[3, :5].tolist() == [True, True, True, True, False]  # block 1: context t < 4
    assert m[0, 5:].tolist() == [True] * 3 + [False] * 3  # bidirectional inside its own block
    causal = block_mask(torch.tensor([[2]]), seq_len=5, q=3, causal=True)[0]
    assert causal[0, 5:].tolist() == [True, False, False] and causal[2, 5:].tolist() == [True] * 3


def test_drafts_depend_on_the_markov_head_and_the_context():
    d = tiny()
    taps = torch.randn(6, 32)
    base = d.greedy_drafts(taps, 7, 4)
    assert len(base) == 4 and all(0 <= t < 50 for t in base)
    assert d.greedy_drafts(taps * -1, 7, 4) != base  # context K/V matter
    with torch.no_grad():
        d.markov_head.markov_w2.weight.mul_(50)
    assert d.greedy_drafts(taps, 7, 4) != base  # the Markov bias matters


def _one_sample(length=24, prompt=6, vocab=50, taps_dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"ids": torch.randint(4, vocab, (length,), generator=g),
            "taps": torch.randn(length, taps_dim, generator=g), "prompt_len": prompt}


def test_trainer_trains_every_slot_of_the_block_and_serving_runs_the_same_block():
    """A block of B slots: the anchor layout trains (and serves) B drafts, the fill-in layout B-1;
    the trainer's teacher-forced logits equal the reference's serving-path logits for a full block
    (same slots, same positions, same mask), so a head is served exactly as it was trained."""
    import random
    from types import SimpleNamespace

    from vllm_specx.methods.dspark import train

    for anchor, drafts in ((True, 5), (False, 4)):
        d = tiny(anchor)
        assert d.cfg.block_size == 5 and d.cfg.max_drafts == drafts
        assert d.cfg.query_slots(drafts) == 5  # a full-width pass runs exactly the training block
        args = SimpleNamespace(seq_len=24, anchors=3)
        s = _one_sample()
        b = train.batch(d, [s], random.Random(1), 1, args)
        assert b["targets"].shape == (1, 3, drafts) and b["pos"].shape == (1, 3 * 5)
        with torch.no_grad():
            out = train.forward(d, b)
        for j, a in enumerate(b["anchors"][0].tolist()):
            base = d.base_logits(s["taps"][:a], int(s["ids"][a]), drafts)  # [drafts, V]
            prev = b["prev"][0, j]
            want = base + d.markov_bias(prev)
            valid = b["targets"][0, j] != -100
            assert valid.any()
            k = int(valid.sum())  # targets are valid up to the end of the sequence
            assert valid[:k].all() and prev[:k].tolist() == s["ids"][a:a + k].tolist()  # prev_k = x_{a+k}
            torch.testing.assert_close(out.logits[0, j][valid], want[valid], atol=1e-4, rtol=1e-4)
            assert b["targets"][0, j][:k].tolist() == s["ids"][a + 1:a + 1 + k].tolist()
