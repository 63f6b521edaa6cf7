"""DSpark's next-token stream (issue 45 item 1) and the references' anchor draw (item 2), engine-free:
the trainer's teacher-forced forward equals the serving reference, the stream reads x_{t+1} of
each context row (a negative control without it differs), the checkpoint formats carry or refuse
it, old checkpoints read as before, the proposer's next-token rows, and the anchor draw."""

import json
import random
from types import SimpleNamespace

import pytest
import torch

from vllm_specx.methods.dspark import train
from vllm_specx.methods.dspark.checkpoint import load_draft, read_config, save_specx, save_speculators
from vllm_specx.methods.dspark.model import DSparkDraft, next_ids_of
from vllm_specx.training.blocks import anchor_positions

from .test_dspark_torch import tiny as tiny_draft

def tiny(stream="fused", anchor=True, **options) -> DSparkDraft:
    """`test_dspark_torch.tiny` (same shapes, seed and init) with the next-token stream `stream`."""
    return tiny_draft(anchor, next_token_stream=stream, **options)


def _sample(length=24, prompt=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"ids": torch.randint(4, 50, (length,), generator=g), "taps": torch.randn(length, 32, generator=g),
            "prompt_len": prompt}


@pytest.mark.parametrize("stream", ["fused", "added"])
@pytest.mark.parametrize("fusion", [False, True])
def test_training_forward_equals_the_serving_reference(stream, fusion):
    """Every block's teacher-forced logits equal the one-request serving reference on the same
    prefix, whose context rows carry x_1..x_{a-1} and the anchor x_a as next tokens."""
    d = tiny(stream, per_layer_fusion=fusion)
    s = _sample()
    b = train.batch(d, [s], random.Random(1), 1, SimpleNamespace(seq_len=24, anchors=3, anchor_draw="unique"))
    with torch.no_grad():
        out = train.forward(d, b)
    for j, a in enumerate(b["anchors"][0].tolist()):
        base = d.base_logits(s["taps"][:a], int(s["ids"][a]), 5, tokens=s["ids"][:a])
        want = base + d.markov_bias(b["prev"][0, j])
        torch.testing.assert_close(out.logits[0, j], want, atol=1e-4, rtol=1e-4)
        # negative control: the same rows with the next-token stream cut (s_t = 0) draft otherwise
        with torch.no_grad():
            saved = d.next_token_proj.weight.clone()
            d.next_token_proj.weight.zero_()
            cut = d.base_logits(s["taps"][:a], int(s["ids"][a]), 5, tokens=s["ids"][:a])
            d.next_token_proj.weight.copy_(saved)
        assert not torch.allclose(cut, base, atol=1e-3)


def test_the_stream_reads_each_rows_next_token():
    d = tiny("added")
    s = _sample()
    a = 12
    ref = d.base_logits(s["taps"][:a], int(s["ids"][a]), 5, tokens=s["ids"][:a])
    for t in (0, 5, a - 2):  # row t's next token x_{t+1} changed: the logits change
        ids = s["ids"].clone()
        ids[t + 1] = (ids[t + 1] + 1) % 50
        assert not torch.allclose(d.base_logits(s["taps"][:a], int(s["ids"][a]), 5, tokens=ids[:a]), ref)
    # row a-1's next token is the anchor itself
    other = d.base_logits(s["taps"][:a], (int(s["ids"][a]) + 1) % 50, 5, tokens=s["ids"][:a])
    assert not torch.allclose(other[0], ref[0])
    assert next_ids_of(torch.tensor([[7, 8, 9]]), torch.tensor([[4]])).tolist() == [[8, 9, 4]]
    with pytest.raises(ValueError, match="next-token stream"):
        d.base_logits(s["taps"][:a], int(s["ids"][a]), 5)  # no tokens: refused, not guessed


def test_checkpoint_carries_the_stream_and_old_versions_read_unchanged(tmp_path):
    d = tiny("fused")
    save_specx(d, tmp_path / "new")
    raw = json.loads((tmp_path / "new" / "config.json").read_text())
    assert raw["specx"]["format_version"] == 3 and raw["specx"]["next_token_stream"] == "fused"
    back = load_draft(tmp_path / "new", d.embed, d.lm_head)
    assert back.cfg.next_token_stream == "fused"
    s = _sample()
    assert back.greedy_drafts(s["taps"][:9], 5, 5, tokens=s["ids"][:9]) == d.greedy_drafts(
        s["taps"][:9], 5, 5, tokens=s["ids"][:9])
    # a draft without the stream is still written as version 2, without the field
    save_specx(tiny(None), tmp_path / "old")
    raw = json.loads((tmp_path / "old" / "config.json").read_text())
    assert raw["specx"]["format_version"] == 2 and "next_token_stream" not in raw["specx"]
    assert read_config(raw).next_token_stream is None
    # a version-2 block carrying the field is refused by name
    raw["specx"]["next_token_stream"] = "fused"
    with pytest.raises(ValueError, match="specx.next_token_stream needs format_version 3"):
        read_config(raw)
    with pytest.raises(ValueError, match="next_token_stream"):
        tiny("sideways")
    # the speculators format has no such stream: refused, not dropped
    with pytest.raises(ValueError, match="no next-token stream"):
        save_speculators(d, tmp_path / "spec", "tgt")


def test_proposer_next_ids_of_each_context_row():
    from vllm_specx.methods.dspark.model import context_next_ids

    # two requests: 4 rows (the last 2 rejected drafts) and 3 rows (none rejected)
    ids = torch.tensor([10, 11, 12, 13, 20, 21, 22])
    qsl = torch.tensor([0, 4, 7])
    nxt = context_next_ids(ids, torch.tensor([99, 98]), qsl, torch.tensor([2, 0]), 2)
    assert nxt[:2].tolist() == [11, 99]  # row 1 is the last accepted: its next is the bonus token
    assert nxt[4:].tolist() == [21, 22, 98]
    nxt = context_next_ids(ids, torch.tensor([99, 98]), qsl, None, 2)  # unpadded: every row accepted
    assert nxt.tolist() == [11, 12, 13, 99, 21, 22, 98]
    # a padded request (no rows, as in a CUDA graph's padding) writes nowhere
    nxt = context_next_ids(ids, torch.tensor([99, 98, 97]), torch.tensor([0, 4, 7, 7]), torch.tensor([2, 0, 0]), 3)
    assert nxt.tolist() == [11, 99, 13, 20, 21, 22, 98]


def test_unique_anchor_draw():
    rng = random.Random(0)
    for _ in range(50):
        length, prompt_end, n = rng.randint(12, 60), rng.randint(-5, 10), 5
        got = anchor_positions(rng, prompt_end, length, 8, n, "unique")
        assert got == sorted(set(got)) and len(got) == min(8, len(got))  # no anchor twice
        if length - 1 - n >= max(1, prompt_end):
            assert all(max(1, prompt_end) <= a <= length - 1 - n for a in got)  # generated, whole blocks
        every = anchor_positions(rng, prompt_end, length, 0, n, "unique")
        assert set(got) <= set(every) and every == sorted(set(every))
    # the draw with replacement is the trainer's earlier one, draw for draw
    r1, r2 = random.Random(3), random.Random(3)
    old = sorted(r2.randint(4, 22) for _ in range(24))  # lo = prompt_end - 1, hi = length - 2
    assert anchor_positions(r1, 5, 24, 24, 5, "replace") == old


def test_unique_draw_pads_short_sequences_with_blocks_that_carry_no_target():
    d = tiny(None)
    short, long = _sample(length=10, prompt=3), _sample(length=40, prompt=3, seed=1)
    b = train.batch(d, [short, long], random.Random(0), 2,
                    SimpleNamespace(seq_len=40, anchors=0, anchor_draw="unique"))
    m = b["anchors"].shape[1]
    assert m == 40 - 1 - 5 - 3 + 1  # every valid anchor of the longer sequence
    real = (b["targets"] != -100).any(-1)  # [2, M]; the batch's order is drawn
    assert sorted(int(r.sum()) for r in real) == [10 - 1 - 5 - 3 + 1, m]
    with pytest.raises(SystemExit, match="--anchor-draw unique"):
        train.batch(d, [short], random.Random(0), 1, SimpleNamespace(seq_len=40, anchors=0, anchor_draw="replace"))
