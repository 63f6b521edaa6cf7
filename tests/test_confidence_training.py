"""The confidence head trained for real, small: the reference target's committed DSpark head
(`assets/drafts/ref-dspark`) gets a confidence head with `--train-only confidence`, on on-policy
data made here (the target's greedy answers to training prompts); its BCE drops, it beats every
constant predictor on held-out samples (the run's validation split, as the calibration report
re-draws it), and the checkpoint keeps every other tensor bit for bit. Also: the flags that would
train nothing are refused, `--unseen-by` drops the samples a draft was trained on, and the
calibration report writes its files (and refuses evaluation data). The tests of the training run
are in the full tier (`full` marker); the refusals and `--unseen-by` in the quick tier."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest
import torch

from vllm_specx.checkpoint import load_tensors
from vllm_specx.training import trainer
from vllm_specx.training.data import write_taps

from .helpers import ASSETS, REF_TARGET, load_prompts, load_target

BASE = ASSETS / "drafts" / "ref-dspark"
# ref-dspark's own flags (its training.json): taps 1,4,6, the baseline recipe, vanilla head.
BASE_FLAGS = ["--block-size", "8", "--layers", "2", "--markov-rank", "64", "--mask-token-id", "2",
              "--no-final-layer-tap", "--no-per-layer-fusion", "--no-slot-queries", "--markov-head-type", "vanilla",
              "--next-token-stream", "none"]
REPO = Path(__file__).resolve().parents[1]


def _calibration():
    spec = importlib.util.spec_from_file_location("confidence_calibration", REPO / "benchmarks" / "confidence_calibration.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """96 on-policy samples: the first 32 tokens of training prompts and the target's 48 greedy
    tokens after them (transformers, batched), taps 1, 4, 6 and top-8, as `gen-data` stores them."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(REF_TARGET))
    prompts = [(i, tok(p)["input_ids"][:32]) for i, p in enumerate(load_prompts("train"))]
    prompts = [(i, p) for i, p in prompts if len(p) == 32][:96]
    x = torch.tensor([p for _, p in prompts])
    with torch.no_grad():
        gen = load_target(REF_TARGET).generate(x, attention_mask=torch.ones_like(x), max_new_tokens=48,
                                               min_new_tokens=48, do_sample=False, pad_token_id=1)
    out = tmp_path_factory.mktemp("confdata")
    rows = [{"id": i, "prompt_ids": p, "output_ids": gen[n, 32:].tolist()} for n, (i, p) in enumerate(prompts)]
    (out / "tokens.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "meta.json").write_text(json.dumps({"target": str(REF_TARGET), "taps": [1, 4, 6], "max_tokens": 48,
                                               "temperature": 0.0, "prompts": "train", "topk": 8}))
    write_taps(str(REF_TARGET), out, (1, 4, 6), shard=32, topk=8)
    return out


def _argv(data, out, *extra, steps=100):
    return ["--method", "dspark", "--target", str(REF_TARGET), "--data", str(data), "--out", str(out),
            "--steps", str(steps), "--batch", "4", "--lr", "0.005", "--val-samples", "32",
            "--val-every", "50", "--save-every", "1000", "--seq-len", "80", "--anchors", "16", *BASE_FLAGS,
            "--init-from", str(BASE), "--train-only", "confidence", "--confidence-head", "hidden+markov", *extra]


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("conf") / "draft"
    return trainer.train(trainer.parse_args(_argv(data, out))), out


@pytest.mark.full  # a real training run (100 steps)
def test_the_confidence_head_learns_and_beats_every_constant_on_held_out_samples(data, trained):
    record, out = trained
    first, last = record["log"][0], record["log"][-1]
    assert last["val_conf_bce"] < first["val_conf_bce"] - 0.05, record["log"]
    assert last["val_loss"] < first["val_loss"]  # --train-only confidence: the loss is the BCE
    assert last["val_acc_per_pos"] == first["val_acc_per_pos"]  # and the drafts do not change
    cal = _calibration()
    # Every prompt here was in ref-dspark's training data (all 640 training prompts were): kept, and counted.
    with pytest.raises(SystemExit, match="32 more whose prompts an earlier draft was trained on"):
        cal.held_out(out, data, 32)
    store, info, meta = cal.held_out(out, data, 32, drop_seen=False)
    assert info["prompt_ids"] == record["val_prompt_ids"]  # the run's own validation split
    assert info["used_seen_by_earlier_drafts"] == 32
    from vllm_specx.methods.dspark.checkpoint import load_draft
    from vllm_specx.training.taps import embed_and_head

    draft = load_draft(out, *embed_and_head(load_target(REF_TARGET))).eval()
    p, p_drafted, c, valid = cal.predict(draft, store, meta["taps"], 80, stride=2)
    m = cal.metrics(p, c, valid, p_drafted)
    assert m["drafted_equals_teacher_forced_on_reached"] < 1e-5
    assert m["slots"] > 1000 and 0.2 < m["realised"] < 0.9
    # The best constant on the held-out set itself scores rate * (1 - rate); the head does better.
    assert m["brier"] < m["constant"]["brier"] - 0.01, m
    assert m["bce"] < m["constant"]["bce"], m
    # Negative control: the same predictions against shuffled labels lose to the constant.
    perm = torch.randperm(len(c), generator=torch.Generator().manual_seed(0))
    assert cal.metrics(p, c[perm], valid[perm])["brier"] > m["constant"]["brier"] - 0.005
    # The survival check: blocks the head expects more accepted drafts of do get more.
    assert m["accepted_length"]["correlation"] > 0.2, m["accepted_length"]


@pytest.mark.full  # a real training run (100 steps)
def test_train_only_confidence_keeps_every_other_tensor_bit_for_bit(trained):
    record, out = trained
    base, got = load_tensors(BASE), load_tensors(out)
    assert set(got) - set(base) == {"confidence_head.proj.weight", "confidence_head.proj.bias"}
    for k, v in base.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    cfg = json.loads((out / "config.json").read_text())["specx"]
    assert cfg["confidence_head"] == "hidden+markov"
    assert record["args"]["train_only"] == "confidence" and record["args"]["confidence_head"] == "hidden+markov"
    assert "--train-only confidence" in record["command"] and "--no-final-layer-tap" in record["command"]
    rerun = trainer.parse_args(["--config", str(out / trainer.RECORD_FILE)])
    assert {k: v for k, v in vars(rerun).items() if k != "config"} == \
        {k: v for k, v in record["args"].items() if k != "config"}
    assert vars(trainer.parse_args(record["command"].split()[2:])) == vars(rerun)  # the command re-runs it too


@pytest.mark.parametrize("drop,extra,match", [
    (["--init-from"], [], "--train-only confidence: give the trained draft"),
    ([], ["--per-layer-fusion"], r"\['fusion_logits'\] would start anew"),
    ([], ["--markov-head-type", "rnn"], "would start anew or be dropped"),
    (["--train-only"], [], "has a confidence head but nothing trains it"),
    (["--train-only", "--confidence-head"], ["--confidence-weight", "0.5"], "has no confidence head"),
    (["--confidence-head"], [], "--train-only confidence: this draft has no such part"),
])
def test_flags_that_would_train_nothing_or_change_the_draft_are_refused(data, tmp_path, drop, extra, match):
    argv = _argv(data, tmp_path / "o", steps=1)
    for opt in drop:
        i = argv.index(opt)
        del argv[i:i + 2]
    with pytest.raises(SystemExit, match=match):
        trainer.train(trainer.parse_args(argv + extra))


def test_unseen_by_drops_the_samples_a_draft_was_trained_on(data, tmp_path):
    """A record whose data folder is gone: its prompts are re-derived from its meta (the first
    `data_samples` prompts of the set, in order); samples of those prompts are not used."""
    from vllm_specx.training.data import load_samples

    store = load_samples(data)
    rec = {"args": {"data": str(tmp_path / "gone")}, "data": {"prompts": "train"}, "data_samples": 20}
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "training.json").write_text(json.dumps(rec))
    pool = trainer.usable(store, {"prompts": "train"}, str(tmp_path / "old"))
    ids = [store.index[i][1] for i in range(len(store))]
    assert [ids[i] for i in pool] == [x for x in ids if x >= 20] and len(pool) < len(store)
    assert trainer.usable(store, {"prompts": "train"}, None) == list(range(len(store)))
    with pytest.raises(SystemExit, match="cannot be compared"):
        trainer.usable(store, {"prompts": "chat-train"}, str(tmp_path / "old"))
    # With the folder present, its tokens.jsonl says which: here every sample.
    rec["args"]["data"] = str(data)
    (tmp_path / "old" / "training.json").write_text(json.dumps(rec))
    assert trainer.usable(store, {"prompts": "train"}, str(tmp_path / "old")) == []
    # The trainer's split is unchanged without it (the seed's shuffle of every index).
    val, rest = trainer.split(10, 3, random.Random(0))
    order = list(range(10))
    random.Random(0).shuffle(order)
    assert val + rest == order


@pytest.mark.full  # a real training run (100 steps)
def test_the_calibration_report_writes_its_files_and_refuses_eval_data(data, trained, tmp_path):
    _, out = trained
    cal = _calibration()
    res = cal.main(["--draft", str(out), "--target", str(REF_TARGET), "--data", str(data), "--samples", "6",
                    "--stride", "6", "--keep-seen", "--out", str(tmp_path / "rep")])
    for f in ("results.json", "results.md", "reliability.png", "survival.png"):
        assert (tmp_path / "rep" / f).stat().st_size > 500, f
    m = res["metrics"]
    assert sum(r["count"] for r in m["reliability"]) == m["slots"]
    assert abs(sum(r["count"] * r["rate"] for r in m["reliability"] if r["count"]) / m["slots"] - m["realised"]) < 1e-9
    assert len(m["per_slot"]["mean_p"]) == 8 and m["survival"]["realised"][0] == pytest.approx(m["per_slot"]["realised"][0], abs=0.05)
    assert json.loads((tmp_path / "rep" / "results.json").read_text())["held_out"]["prompt_ids"] == res["held_out"]["prompt_ids"]
    bad = tmp_path / "evaldata"
    bad.mkdir()
    (bad / "meta.json").write_text(json.dumps({**json.loads((data / "meta.json").read_text()), "prompts": "humaneval"}))
    with pytest.raises(SystemExit, match="evaluation set"):
        cal.held_out(out, bad, 4)
    with pytest.raises(SystemExit, match="--samples 33: only 32 held-out samples"):
        cal.held_out(out, data, 33, drop_seen=False)
