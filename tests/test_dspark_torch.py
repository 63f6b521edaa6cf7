"""The PyTorch DSpark model: checkpoint round trips, the block mask, and greedy drafting invariants."""

import torch

from vllm_specx.methods.dspark.checkpoint import load_draft, save_specx, save_speculators
from vllm_specx.methods.dspark.config import DSparkDraftConfig
from vllm_specx.methods.dspark.model import DSparkDraft, block_mask


def tiny(anchor=True) -> DSparkDraft:
    target = {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
              "intermediate_size": 32, "vocab_size": 50, "rms_norm_eps": 1e-6, "rope_theta": 100.0}
    cfg = DSparkDraftConfig.for_target(target, target_layer_ids=(0, 2), num_hidden_layers=2,
                                       block_size=5, mask_token_id=3, markov_rank=4,
                                       sample_from_anchor=anchor)
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
