"""Training pieces without vLLM: taps storage is resumable, and the trainer learns a pattern."""

import argparse
import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vllm_specx.methods.dspark import train as dspark_train
from vllm_specx.training.data import load_samples, write_taps
from vllm_specx.training.taps import load_target
from vllm_specx.training.trainer import loss_and_accuracy

from .helpers import ASSETS, REF_TARGET
from .test_dspark_torch import tiny


def test_taps_are_written_once_and_reloaded(tmp_path):
    rows = [{"id": i, "prompt_ids": [5, 6, 7], "output_ids": list(range(10, 10 + i + 1))} for i in range(5)]
    (tmp_path / "tokens.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_taps(str(REF_TARGET), tmp_path, (1, 4), shard=2)
    files = sorted((tmp_path / "taps").glob("*.safetensors"))
    assert len(files) == 3
    stamps = [f.stat().st_mtime_ns for f in files]
    write_taps(str(REF_TARGET), tmp_path, (1, 4), shard=2)  # resume: nothing left to do
    assert [f.stat().st_mtime_ns for f in files] == stamps
    samples = {len(s["ids"]): s for s in load_samples(tmp_path)}
    s = samples[3 + 3]  # id 2: 3 prompt + 3 output tokens
    assert s["prompt_len"] == 3 and s["taps"].shape == (6, 2 * 256)
    from vllm_specx.training.taps import target_taps
    ref = target_taps(load_target(REF_TARGET), s["ids"][None], (1, 4))[0]
    torch.testing.assert_close(s["taps"].float(), ref, atol=2e-2, rtol=1e-2)  # stored as fp16


def test_taps_cover_answers_added_after_a_short_last_shard(tmp_path):
    """gen-data resumed with more answers (more data on top, `--from-tokens FILE --prompts A+B`)
    after the taps were stored: the last shard, written short, is made again whole, so every answer
    has taps; the full shards are kept."""
    rows = [{"id": i, "prompt_ids": [5, 6, 7], "output_ids": list(range(10, 10 + i + 1))} for i in range(7)]
    tokens = tmp_path / "tokens.jsonl"
    tokens.write_text("".join(json.dumps(r) + "\n" for r in rows[:5]))
    write_taps(str(REF_TARGET), tmp_path, (1, 4), shard=2)  # shards 0-1, 2-3 and a short one: 4
    full = [tmp_path / "taps" / f"{i:06d}.safetensors" for i in (0, 2)]
    stamps = [f.stat().st_mtime_ns for f in full]
    tokens.write_text("".join(json.dumps(r) + "\n" for r in rows))  # answers 5 and 6 come
    write_taps(str(REF_TARGET), tmp_path, (1, 4), shard=2)
    assert sorted(s["ids"].numel() for s in load_samples(tmp_path)) == [4 + i for i in range(7)]
    assert [f.stat().st_mtime_ns for f in full] == stamps


def test_trainer_learns_a_deterministic_continuation():
    """Sequences count up mod 40; after a few steps the draft predicts every next token."""
    torch.manual_seed(0)
    draft = tiny()
    samples = []
    for i in range(16):
        ids = (torch.arange(48) + i) % 40 + 10
        samples.append({"ids": ids, "taps": torch.nn.functional.one_hot(ids % 32, 32).half(), "prompt_len": 8})
    rng = random.Random(0)
    opt = torch.optim.AdamW(draft.parameters(), lr=3e-2)
    first = None
    for _ in range(80):
        b = dspark_train.make_batch(samples, rng, 4, 32, 4, 4, draft.cfg.mask_token_id)
        loss, acc = loss_and_accuracy(dspark_train.forward(draft, b), "ce", gamma=4.0)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.2 * first
    with torch.no_grad():
        _, acc = loss_and_accuracy(dspark_train.forward(draft, dspark_train.make_batch(samples, rng, 16, 32, 8, 4, 3)),
                                   "ce", 4.0)
    assert acc.min().item() > 0.9, acc  # every draft position, on 16 x 8 fresh blocks


# ---- the trainer, for every trainable method and baseline ----------------------------------------

def _data(tmp_path, n=24, topk=8):
    """A small data folder on the reference target: varied token rows, taps (1, 4, 7) and top-k."""
    g = torch.Generator().manual_seed(0)
    rows = [{"id": i, "prompt_ids": torch.randint(5, 4000, (6,), generator=g).tolist(),
             "output_ids": torch.randint(5, 4000, (40,), generator=g).tolist()} for i in range(n)]
    out = tmp_path / "data"
    out.mkdir()
    (out / "tokens.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "meta.json").write_text(json.dumps({"target": str(REF_TARGET), "taps": [1, 4, 7],
                                               "max_tokens": 40, "temperature": 0.0, "topk": topk}))
    write_taps(str(REF_TARGET), out, (1, 4, 7), shard=8, topk=topk)
    return out


def _train_argv(method, data, out, *extra):
    return ["--method", method, "--target", str(REF_TARGET), "--data", str(data), "--out", str(out),
            "--steps", "12", "--batch", "2", "--val-samples", "4", "--val-every", "6", "--save-every", "6",
            "--seq-len", "32", "--anchors", "4", *extra]


def test_topk_rows_are_the_targets_next_token_distribution(tmp_path):
    data = _data(tmp_path, n=2)
    s = load_samples(data)[0]
    logits = load_target(REF_TARGET)(s["ids"][None]).logits[0].float()
    want = torch.log_softmax(logits, -1).topk(8, -1)
    torch.testing.assert_close(s["topk_logp"], want.values, atol=1e-4, rtol=1e-4)
    assert torch.equal(s["topk_ids"][:, :3], want.indices[:, :3])  # ties below the top few may swap
    assert (s["topk_logp"].exp().sum(-1) < 1).all()  # full-softmax log-probs: not renormalised


# One trainer serves every method: DSpark in the quick tier, the other methods in the full tier.
@pytest.mark.parametrize("method", [m if m == "dspark" else pytest.param(m, marks=pytest.mark.full)
                                    for m in sorted(__import__("vllm_specx.registry", fromlist=["x"]).trainers())])
def test_every_method_trains_resumes_and_reruns_from_its_record(tmp_path, method):
    """12 steps lower the validation loss; stopping at step 6 and `--resume` gives the same weights
    as an uninterrupted run; `--config training.json` re-runs it; the checkpoint loads back."""
    from vllm_specx.training import trainer

    data = _data(tmp_path)
    extra = ["--loss", "tv"]  # DSpark: its default --mask-token-id, resolved at build (a resume must accept it)
    full = trainer.train(trainer.parse_args(_train_argv(method, data, tmp_path / "full", *extra)))
    first, last = full["log"][0], full["log"][-1]
    assert first["step"] == 0 and last["step"] == 12
    assert last["val_loss"] < first["val_loss"], full["log"]
    assert "tau_sampled" in last and len(last["val_alpha_per_pos"]) == len(last["val_acc_per_pos"])

    # Interrupted after the step-6 state write, then resumed.
    hooks = trainer.hooks(method)
    orig, calls = hooks.forward, {"n": 0}

    def dies_at_step_7(model, b):
        calls["n"] += 1
        if calls["n"] == 2 + 6 + 2 + 1:  # step-0 validation (2 batches), 6 steps, step-6 validation, step 7
            raise KeyboardInterrupt
        return orig(model, b)

    hooks.forward = dies_at_step_7
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.train(trainer.parse_args(_train_argv(method, data, tmp_path / "cut", *extra)))
    finally:
        hooks.forward = orig
    assert torch.load(tmp_path / "cut" / trainer.STATE_FILE, weights_only=False)["step"] == 6  # what resume starts from
    with pytest.raises(SystemExit, match="--loss ce differs from the interrupted run's tv"):
        trainer.train(trainer.parse_args(_train_argv(method, data, tmp_path / "cut", *extra, "--resume", "--loss", "ce")))
    resumed = trainer.train(trainer.parse_args(_train_argv(method, data, tmp_path / "cut", *extra, "--resume")))
    assert [r["val_loss"] for r in resumed["log"]] == [r["val_loss"] for r in full["log"]]
    a = torch.load(tmp_path / "full" / trainer.STATE_FILE, weights_only=False)["model"]
    b = torch.load(tmp_path / "cut" / trainer.STATE_FILE, weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)

    again = trainer.train(trainer.parse_args(["--config", str(tmp_path / "full" / trainer.RECORD_FILE),
                                              "--out", str(tmp_path / "again")]))
    assert [r["val_loss"] for r in again["log"]] == [r["val_loss"] for r in full["log"]]
    assert (tmp_path / "again" / "config.json").is_file() and (tmp_path / "again" / "model.safetensors").is_file()


def test_dspark_final_tap_init_from_the_target_final_norm(tmp_path):
    """`--final-tap-init final-norm` reaches the built draft: its final-layer tap's fc columns are
    diag(the target's final norm); zero by default; refused without --final-layer-tap."""
    from vllm_specx.training import trainer
    from vllm_specx.training.taps import embed_and_head

    data = _data(tmp_path, n=2)
    target = load_target(REF_TARGET)
    meta = json.loads((data / "meta.json").read_text())
    ht = int(target.config.hidden_size)

    def built(*extra):
        args = trainer.parse_args(_train_argv("dspark", data, tmp_path / "o", "--taps", "1,4", *extra))
        return dspark_train.build(target, args, meta, *embed_and_head(target))

    d = built("--final-layer-tap", "--final-tap-init", "final-norm")
    assert d.cfg.target_layer_ids == (1, 4, 7)
    want = torch.diag(target.get_decoder().norm.weight.detach().float())
    assert torch.equal(d.fc.weight[:, -ht:].float(), want) and d.fc.weight[:, :-ht].abs().max() > 0
    assert not built("--final-layer-tap").fc.weight[:, -ht:].any()
    with pytest.raises(SystemExit, match="add --final-layer-tap"):
        built("--final-tap-init", "final-norm")


def test_a_distribution_loss_on_token_only_data_is_refused(tmp_path):
    from vllm_specx.training import trainer

    data = _data(tmp_path, n=6, topk=0)
    meta = json.loads((data / "meta.json").read_text())
    meta.pop("topk")
    (data / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SystemExit, match=r"--loss chain-tv needs the target's distribution: .* or train with --loss ce"):
        trainer.train(trainer.parse_args(_train_argv("eagle3", data, tmp_path / "o", "--loss", "chain-tv")))


@torch.no_grad()
def test_dspark_own_chain_tokens_are_the_teacher_forced_chain_on_its_own_drafts():
    """`--chain-tokens draft` feeds the Markov head its own greedy drafts; on a block whose
    continuation is those drafts it equals the teacher-forced (`target`) forward."""
    from vllm_specx.training.blocks import assemble

    draft = tiny()
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(5, 50, (30,), generator=g)
    crops = [{"ids": ids, "taps": torch.randn(30, 32, generator=g)}]
    n = draft.cfg.max_drafts
    b = assemble(crops, [[9]], 30, n, draft.cfg.mask_token_id, q=draft.cfg.block_size)
    own = dspark_train.forward(draft, {**b, "chain_tokens": "draft"}).logits[0, 0]
    forced_ids = ids.clone()
    forced_ids[10:10 + n - 1] = own[:-1].argmax(-1)
    fb = assemble([{**crops[0], "ids": forced_ids}], [[9]], 30, n, draft.cfg.mask_token_id, q=draft.cfg.block_size)
    torch.testing.assert_close(dspark_train.forward(draft, fb).logits[0, 0], own)
    assert not torch.allclose(dspark_train.forward(draft, b).logits[0, 0], own)  # negative control


@pytest.mark.parametrize("method", ["dspark", "mtp", "eagle3"])
def test_trains_with_a_reduced_draft_vocabulary(tmp_path, method):
    """`--draft-vocab N`: the N tokens most frequent in the data's responses (DSpark: the mask
    token excluded); the loss falls, the checkpoint carries lm_head rows and maps, loads back, and
    passes the start-up checks against the target."""
    from collections import Counter

    from vllm_specx import registry, vocab
    from vllm_specx.methods.dspark.checkpoint import load_draft
    from vllm_specx.methods.mtp.checkpoint import load as load_mtp
    from vllm_specx.training import trainer
    from vllm_specx.training.data import response_ids
    from vllm_specx.training.taps import embed_and_head

    data = _data(tmp_path)
    extra = ["--loss", "tv", "--draft-vocab", "600"] + (["--mask-token-id", "2"] if method == "dspark" else [])
    rec = trainer.train(trainer.parse_args(_train_argv(method, data, tmp_path / "d", *extra)))
    assert rec["log"][-1]["val_loss"] < rec["log"][0]["val_loss"]
    from vllm_specx.methods.eagle3.checkpoint import check_vllm_draft, load as load_eagle3

    load = {"dspark": load_draft, "mtp": load_mtp, "eagle3": load_eagle3}[method]
    draft = load(tmp_path / "d", *embed_and_head(load_target(REF_TARGET)))
    assert draft.cfg.draft_vocab_size == 600 and draft.lm_head.shape == (600, 256)
    counts = Counter(t for r in response_ids(data) for t in r if not (method == "dspark" and t == 2))
    got = vocab.target_ids(draft.d2t).tolist()
    assert 2 not in got and min(counts[t] for t in got) >= max(c for t, c in counts.items() if t not in got)
    # the learning/compute curve's export: bf16, and the lm_head rows (the target's, never
    # trained) left out where the method can take them from the target (not vLLM's EAGLE-3)
    export = _bench_module("bench_learning_curve").export
    export(tmp_path / "d", tmp_path / "x", argparse.Namespace(target=str(REF_TARGET)))
    assert ("lm_head.weight" in load_file(str(tmp_path / "x" / "model.safetensors"))) == (method == "eagle3")
    if method == "eagle3":  # vLLM's built-in eagle3 serves it; vllm-specx checks it first
        check_vllm_draft(tmp_path / "d", {"hidden_size": 256, "num_hidden_layers": 8, "vocab_size": 4096}, 7)
        return
    back = load(tmp_path / "x", *embed_and_head(load_target(REF_TARGET)))
    assert back.cfg.lm_head_from_target and torch.equal(back.lm_head, draft.lm_head)
    for d in ("d", "x"):
        method_, cfg = registry.read_checkpoint(tmp_path / d)
        registry.check_draft(method_, cfg, tmp_path / d, {"hidden_size": 256, "num_hidden_layers": 8,
                                                          "vocab_size": 4096}, 8)
    # a warm start from the exported draft takes its vocabulary and the target's rows for it
    trainer.train(trainer.parse_args(_train_argv(method, data, tmp_path / "w", *extra, "--init-from",
                                                 str(tmp_path / "x"), "--steps", "0")))
    warm = load(tmp_path / "w", *embed_and_head(load_target(REF_TARGET)))
    assert torch.equal(warm.d2t, back.d2t) and torch.equal(warm.lm_head, back.lm_head)


def _bench_module(name: str):
    import importlib.util
    import sys

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location(name, bench / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("specials,want", [
    ({"mask_token": "<m>"}, 3), ({"pad_token": "<p>", "eos_token": "<e>"}, 4),
    ({"pad_token": "<e>", "eos_token": "<e>", "unk_token": "<u>"}, 5), ({}, 9)])
def test_dspark_mask_token_default_for_a_tokenizer_without_one(tmp_path, specials, want):
    """A target whose tokenizer has no <|mask|> trains without --mask-token-id: its mask token, a
    pad token that is not its end of text, its unknown token, else the last id (recorded)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from vllm_specx.methods.dspark.train import default_mask_token

    words = ["a", "b", "c", "<m>", "<p>", "<u>", "<e>"]
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(
        {w: i for i, w in enumerate(words)}, unk_token="<u>")), **specials)
    tok.save_pretrained(tmp_path)
    assert default_mask_token(str(tmp_path), 10) == want


def test_train_samples_and_eval_data(tmp_path):
    """`--train-samples N` splits in data order: the same validation samples, the next N train;
    `--eval-data` records tau on a `gen-data --for-eval` folder, which `--data` refuses."""
    from vllm_specx.training import trainer

    data = _data(tmp_path)
    ev = tmp_path / "ev"
    ev.mkdir()
    rows = [json.loads(line) for line in (data / "tokens.jsonl").read_text().splitlines()][:6]
    (ev / "tokens.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = {**json.loads((data / "meta.json").read_text()), "purpose": "evaluation"}
    (ev / "meta.json").write_text(json.dumps(meta))
    write_taps(str(REF_TARGET), ev, (1, 4, 7), shard=8, topk=8)
    small = trainer.train(trainer.parse_args(_train_argv("dspark", data, tmp_path / "a", "--mask-token-id", "2",
                                                         "--train-samples", "5", "--eval-data", str(ev),
                                                         "--eval-drafts", "3")))
    more = trainer.train(trainer.parse_args(_train_argv("dspark", data, tmp_path / "b", "--mask-token-id", "2",
                                                        "--train-samples", "12")))
    assert small["train_samples"] == 5 and more["train_samples"] == 12
    assert small["val_prompt_ids"] == more["val_prompt_ids"] == [0, 1, 2, 3]  # data order: the first 4
    got = small["eval"]["ev"]
    assert got["samples"] == 6 and got["blocks"] > 0 and 1.0 <= got["tau_greedy"] <= 4.0
    assert len(got["val_acc_per_pos"]) == 3 and got["prompts"] is None  # --eval-drafts 3 of 8
    # the recorded command re-runs it: a repeatable option once per value (not a Python list)
    rerun = trainer.parse_args(small["command"].split()[2:])
    assert rerun.eval_data == [str(ev)] and rerun.train_samples == 5, small["command"]
    with pytest.raises(SystemExit, match="--for-eval"):
        trainer.train(trainer.parse_args(_train_argv("dspark", ev, tmp_path / "c", "--mask-token-id", "2")))
    with pytest.raises(SystemExit, match="--train-samples 99: the data holds 24 samples"):
        trainer.train(trainer.parse_args(_train_argv("dspark", data, tmp_path / "c", "--mask-token-id", "2",
                                                     "--train-samples", "99")))


def test_an_mtp_draft_restricted_to_a_reduced_vocabulary_without_training(tmp_path):
    """`--init-from FULL --draft-vocab N --steps 0`: the trained layer unchanged, the output rows
    the target's LM head at the N most frequent tokens, so the reduced draft's logits are the full
    draft's at those tokens (what `vllm-specx train` writes for the SmolLM2 16k MTP draft)."""
    from vllm_specx.checkpoint import load_tensors
    from vllm_specx.methods.mtp.checkpoint import load as load_mtp
    from vllm_specx.training import trainer
    from vllm_specx.training.taps import embed_and_head

    data = _data(tmp_path)
    trainer.train(trainer.parse_args(_train_argv("mtp", data, tmp_path / "full", "--loss", "ce")))
    argv = _train_argv("mtp", data, tmp_path / "small", "--loss", "ce", "--init-from", str(tmp_path / "full"),
                       "--draft-vocab", "600")
    argv[argv.index("--steps") + 1] = "0"
    rec = trainer.train(trainer.parse_args(argv))
    assert len(rec["log"]) == 1 and rec["log"][0]["step"] == 0  # validated, not trained
    full, small = load_tensors(tmp_path / "full"), load_tensors(tmp_path / "small")
    for k, v in full.items():
        assert torch.equal(small[k], v), k
    embed, head = embed_and_head(load_target(REF_TARGET))
    a, b = load_mtp(tmp_path / "full", embed, head), load_mtp(tmp_path / "small", embed, head)
    ids = b.draft_target_ids
    assert ids is not None and ids.numel() == 600
    torch.testing.assert_close(b.lm_head, head[ids])
    h = torch.randn(5, head.shape[1])
    torch.testing.assert_close(b.logits(h), a.logits(h)[:, ids])


def test_a_repeatable_option_given_with_config_replaces_the_recorded_values():
    """`--config REC --eval-data D` measures on D alone (the recorded --eval-data folders are
    replaced, not extended); without it the recorded ones stay."""
    from vllm_specx.training import trainer

    rec = str(ASSETS / "drafts" / "smollm2-mtp" / "training.json")
    recorded = trainer.parse_args(["--config", rec])
    assert len(recorded.eval_data) == 3
    assert trainer.parse_args(["--config", rec, "--eval-data", "/x/ev"]).eval_data == ["/x/ev"]
    assert trainer.parse_args(["--config", rec, "--eval-data=/x/ev"]).eval_data == ["/x/ev"]


def test_an_eagle3_warm_start_with_another_config_is_refused(tmp_path):
    """`--method eagle3 --init-from DRAFT` loads the draft only when its config is this run's: the
    committed reference head fuses layers 1,4,6, this data's default taps are 1,4,7."""
    from vllm_specx.training import trainer

    data = _data(tmp_path, n=8)
    draft = str(ASSETS / "drafts" / "ref-eagle3")
    with pytest.raises(SystemExit, match=f"--init-from {draft}: its config"):
        trainer.train(trainer.parse_args(_train_argv("eagle3", data, tmp_path / "o", "--steps", "0",
                                                     "--val-samples", "2", "--init-from", draft)))


def test_dspark_ablation_variants_and_conditional_acceptance():
    """benchmarks/bench_dspark_ablation.py: a variant is the baseline's flags with its own last (so
    they override), combinations join variants in order, unknown names are refused before anything
    trains, and the per-slot conditional acceptance is accepted-at-k over accepted-at-(k-1)."""
    ab = _bench_module("bench_dspark_ablation")
    assert ab.flags_of("baseline", {}) == ab.BASE and "--next-token-stream" in ab.BASE  # spelled out
    assert ab.flags_of("next-added", {})[-2:] == ["--next-token-stream", "added"]
    combos = ab.parse_combine(["both=next-added+rank-256"])
    assert ab.flags_of("both", combos)[len(ab.BASE):] == ["--next-token-stream", "added", "--markov-rank", "256"]
    assert ab.flags_of("eagle3", {})[:2] == ["--method", "eagle3"]
    assert ab.flags_of("final-tap-norm", {})[-3:] == ["--final-layer-tap", "--final-tap-init", "final-norm"]
    for bad in (lambda: ab.flags_of("nope", {}), lambda: ab.parse_combine(["x=next-added+nope"])):
        with pytest.raises(SystemExit, match="nope"):
            bad()
    assert ab.conditional([0.5, 0.25, 0.2, 0.0]) == [0.5, 0.5, 0.8, 0.0]
    assert ab.conditional([0.0, 0.0]) == [0.0, None]


def test_curve_reports_keep_the_points_of_earlier_sessions(tmp_path):
    """benchmarks/_report.earlier_rows + bench_compute_curve.with_earlier: a report re-made from the
    runs on this machine keeps the earlier results.json's other points (with their date), drops
    the ones it re-made, and drops an earlier committed-draft row whose folder is replaced now."""
    import argparse

    cc = _bench_module("bench_compute_curve")
    old = {"meta": {"date": "2026-12-05", "args": {"committed": ["dspark-baseline=assets/drafts/smollm2-dspark",
                                                                 "eagle3=assets/drafts/smollm2-eagle3"]}},
           "rows": [{"provider": "eagle3", "sample_draws": 35200, "committed_draft": True},
                    {"provider": "dspark-baseline", "sample_draws": 35200, "committed_draft": True},
                    {"provider": "dspark-baseline", "sample_draws": 35200},
                    {"provider": "eagle3", "sample_draws": 8000}]}
    (tmp_path / "results.json").write_text(json.dumps(old))
    args = argparse.Namespace(out=tmp_path, committed=[], export=["dspark-stream-r96=assets/drafts/smollm2-dspark"])
    new = [{"provider": "dspark-stream-r96", "sample_draws": 35200}, {"provider": "eagle3", "sample_draws": 8000}]
    rows = cc.with_earlier(args, new)
    kept = [(r["provider"], r["sample_draws"], bool(r.get("committed_draft")), r.get("measured")) for r in rows]
    assert kept == [("eagle3", 8000, False, None),  # re-made now: the new row only
                    ("dspark-baseline", 35200, False, "2026-12-05"),
                    ("dspark-stream-r96", 35200, False, None),
                    ("eagle3", 35200, True, "2026-12-05")]  # its committed folder is not replaced
    alone = cc.with_earlier(argparse.Namespace(out=tmp_path / "none", committed=[], export=[]), new)
    assert alone == [new[1], new[0]]  # no earlier report: this run's rows, by budget


def test_curve_trend_names_the_budget_and_overfitting_shows():
    """bench_compute_curve: the DSpark/EAGLE-3 ratio's least-squares line against log10(draws)
    names where it reaches 1.0 and 1.3 (none when it falls); a run tagged with other data (x2) is
    a point beside the untagged one of the same budget; a validation loss that rises between
    validations is reported as over-fitting."""
    import argparse

    cc = _bench_module("bench_compute_curve")

    def row(p, n, tau, **kw):
        return {"provider": p, "sample_draws": n, "eval": {"he": {"tau_served": tau}}, **kw}

    rows = [row("eagle3", 1000, 2.0), row("dspark", 1000, 1.8), row("eagle3", 10000, 2.0), row("dspark", 10000, 2.0),
            row("mtp", 1000, 2.2), row("mtp", 10000, 2.1)]
    t = {x["provider"]: x for x in cc.trends(rows, ["he"], ["dspark", "mtp"])}
    assert t["dspark"]["slope_per_10x"] == pytest.approx(0.1) and t["dspark"]["cross"][1.0] == "reached"
    assert t["dspark"]["cross"][1.3] == pytest.approx(10 ** 7, rel=1e-5)  # 0.6 + 0.1 log10(n) = 1.3
    assert t["mtp"]["slope_per_10x"] < 0 and t["mtp"]["cross"] == {1.0: "reached", 1.3: None}
    assert "no trend" in "\n".join(cc.trend_table(list(t.values())))
    assert cc.run_name("eagle3", 4400, 32, "x2") == "eagle3-4400x32-x2" and cc.run_name("eagle3", 4400, 32) == "eagle3-4400x32"
    assert cc.point(row("eagle3", 1000, 2.0)) != cc.point(row("eagle3", 1000, 2.0, run_tag="x2"))
    args = argparse.Namespace(out=Path("/nonexistent"), committed=[], export=[])
    assert len(cc.with_earlier(args, [row("eagle3", 1000, 2.0), row("eagle3", 1000, 2.1, run_tag="x2")])) == 2
    assert cc.val_every(1100) == 1100 and cc.val_every(4400) == 1100
    fit = row("dspark", 140800, 2.0, losses=[[0, None, 9.0], [1100, 2.1, 2.3], [2200, 2.0, 2.2], [3300, 1.9, 2.1], [4400, 1.8, 2.0]])
    over = row("eagle3", 140800, 2.0, data_samples=7150,
               losses=[[0, None, 9.0], [1100, 2.1, 2.3], [2200, 1.9, 2.2], [3300, 1.6, 2.25], [4400, 1.4, 2.3]])
    lines = cc.overfit_table([fit, over, row("mtp", 1000, 2.0, losses=[[0, None, 9.0], [100, 2.0, 2.1]])])
    assert [x.split(" | ")[-1] for x in lines if x.startswith("| dspark") or x.startswith("| eagle3")] == ["no |", "yes |"]
    assert "7,150 answers" in "\n".join(lines) and not any(x.startswith("| mtp") for x in lines)
