"""tau as serving counts it (`training.serving_count`): the walk over an answer, and the accepted
lengths it walks on, against an independent count that drafts each pass with the draft's own
chain (what a served greedy pass does) instead of teacher forcing. Its equality with vLLM's own
counters is `tests/e2e/test_serving_count.py`."""

import json
import random

import pytest
import torch

from vllm_specx import registry
from vllm_specx.training import losses, serving_count, trainer
from vllm_specx.training.data import load_samples

from ..test_training import _data, _train_argv


def test_walk_jumps_past_each_accepted_run():
    # prompt of 3 tokens, 12 in all: passes at 3 (accepts 2), 6 (0), 7 (3); then 11 is the last token
    passes, per_pos = serving_count.walk(3, 12, {3: 2, 4: 7, 5: 7, 6: 0, 7: 3, 8: 7, 9: 7, 10: 1}, 4)
    assert passes == 3 and per_pos == [2, 2, 1, 0]
    # the anchors a pass can start from: the first generated token .. the second-to-last token
    assert serving_count.answer_anchors(3, 12) == list(range(3, 11))
    # every pass rejects: one pass per generated token but the last
    assert serving_count.walk(3, 12, {a: 0 for a in range(3, 11)}, 4) == (8, [0, 0, 0, 0])


def test_served_tau_is_one_plus_accepted_per_pass(monkeypatch):
    fake = [(3, 12, {3: 2, 4: 7, 5: 7, 6: 0, 7: 3, 8: 7, 9: 7, 10: 1}), (2, 5, {2: 0, 3: 0})]
    monkeypatch.setattr(serving_count, "accepted_lengths", lambda *a, **k: fake)
    # copyable anchors (x_a seen before and followed then by x_{a+1}): 3 and 6 of the first answer
    # (5 -> 6 both times), 2 and 3 of the second; the first draft hits at 3 only
    samples = [{"ids": torch.tensor([5, 6, 7, 5, 6, 9, 5, 6, 1, 2, 3, 4])}, {"ids": torch.tensor([1] * 5)}]
    got = serving_count.served_tau(None, None, samples, type("A", (), {"anchors": 4, "batch": 2}), "cpu", None, 4)
    assert got["served_passes"] == 5 and got["tau_served"] == pytest.approx(1 + 5 / 5)
    assert got["served_acc_per_pos"] == [0.4, 0.4, 0.2, 0.0]
    assert (got["copyable_anchors"], got["other_anchors"]) == (4, 6)
    assert got["first_hit_copyable"] == 0.25 and got["first_hit_other"] == 1.0


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _data(tmp_path_factory.mktemp("serving-count"), n=8)


@pytest.mark.parametrize("method", sorted(registry.trainers()))
def test_accepted_lengths_equal_the_drafts_own_chain(data, tmp_path, method):
    """At every anchor of every answer, the teacher-forced accepted length equals the one of the
    draft's own greedy chain (`--chain-tokens draft`: each step reads the previous draft, as a
    served pass does). The answers here are made to continue with the draft's own drafts for a
    random number of steps at random anchors, so accepted lengths of 0 to K all occur."""
    args = trainer.parse_args(_train_argv(method, data, tmp_path / "o", "--steps", "0"))
    h = trainer.hooks(method)
    from vllm_specx.targets import resolve
    from vllm_specx.training.taps import embed_and_head, load_target

    target = load_target(resolve(args.target))
    meta = json.loads((data / "meta.json").read_text())
    torch.manual_seed(0)
    model = h.build(target, args, meta, *embed_and_head(target)).eval()
    samples = load_samples(data)
    k = 3
    own = _own_chain_samples(h, model, samples, args, k)
    teacher = serving_count.accepted_lengths(h, model, own, k, args.anchors, args.batch, "cpu",
                                             torch.autocast("cpu", enabled=False), args)
    args.chain_tokens = "draft"
    chained = serving_count.accepted_lengths(h, model, own, k, args.anchors, args.batch, "cpu",
                                             torch.autocast("cpu", enabled=False), args)
    assert teacher == chained
    lengths = [m for _, _, acc in teacher for m in acc.values()]
    assert max(lengths) == k and min(lengths) == 0, lengths  # not a vacuous equality


def _own_chain_samples(h, model, samples, args, k):
    """The samples with stretches of each answer replaced by the draft's own greedy drafts: at
    anchors k + 2 apart, a random number of the next tokens (0 to k), one at a time, each the
    teacher-forced draft given the tokens before it (taps kept: a draft at anchor a reads only
    taps before a, so this only makes acceptance likely; the equality checked stays exact)."""
    rng, out = random.Random(0), []
    for i in range(len(samples)):
        s = dict(samples[i])
        ids = s["ids"].clone()
        for a in range(s["prompt_len"], len(ids) - k - 1, k + 2):
            for j in range(rng.randint(0, k)):
                b = h.batch(model, [dict(s, ids=ids)], None, 1, args, at=[[a]])
                with torch.no_grad():
                    res = losses.first_positions(h.forward(model, b), k)
                ids[a + 1 + j] = res.logits.argmax(-1).reshape(-1)[j]
        s["ids"] = ids
        out.append(s)
    return out
