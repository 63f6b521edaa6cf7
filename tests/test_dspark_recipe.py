"""The DSpark full recipe (final-layer tap, per-layer tap fusion, per-slot learned queries,
recurrent head): each switch is wired in and starts at the baseline's function, the formulas
match a naive rewrite, checkpoints carry the switches (and refuse what cannot hold them), the
trainer builds heads that start where the recipe says, and a baseline checkpoint warm-starts a
full-recipe head. The vLLM side is in tests/e2e (test_dspark_vllm, test_draft_probs)."""

import argparse
import json

import pytest
import torch
from safetensors.torch import save_file

from vllm_specx.methods.dspark import train as dspark_train
from vllm_specx.methods.dspark.checkpoint import load_draft, read_config, save_specx, save_speculators
from vllm_specx.methods.dspark.config import BASELINE, RECIPE, DSparkDraftConfig
from vllm_specx.methods.dspark.model import DSparkDraft
from vllm_specx.methods.dspark.recipe import init_final_tap, native_mtp_final_columns, warm_start

TARGET = {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
          "intermediate_size": 32, "vocab_size": 50, "rms_norm_eps": 1e-6, "rope_theta": 100.0,
          "num_hidden_layers": 4}
EMB = torch.randn(50, 16, generator=torch.Generator().manual_seed(7))
LAST = TARGET["num_hidden_layers"] - 1


def make(seed=0, block=6, **switches) -> DSparkDraft:
    """A random head; recipe parameters keep their initialisation (they start at the baseline)."""
    taps = (0, 2, LAST) if switches.get("final_layer_tap") else (0, 2)
    cfg = DSparkDraftConfig.for_target(TARGET, target_layer_ids=taps, num_hidden_layers=2, block_size=block,
                                       mask_token_id=3, markov_rank=4, **switches)
    torch.manual_seed(seed)
    d = DSparkDraft(cfg, EMB, EMB)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if name not in ("fusion_logits", "slot_queries"):
                p.normal_(std=0.3)
    return d


def copy_baseline(base: DSparkDraft, d: DSparkDraft) -> DSparkDraft:
    """d with every tensor of `base` (its fc columns for base's taps), new parameters as initialised."""
    own = d.state_dict()
    with torch.no_grad():
        for k, v in base.state_dict().items():
            if k == "fc.weight":
                own[k][:, :v.shape[1]].copy_(v)
            else:
                own[k].copy_(v)
    return d


def taps_for(d: DSparkDraft, full: torch.Tensor) -> torch.Tensor:
    """The draft's taps out of `full` [T, 3 * 16] (layers 0, 2, LAST)."""
    return full if d.cfg.final_layer_tap else full[:, :32]


SINGLE = [{"final_layer_tap": True}, {"per_layer_fusion": True}, {"slot_queries": True},
          {k: v for k, v in RECIPE.items() if k != "markov_head_type"}]


@pytest.mark.parametrize("switches", SINGLE, ids=["final-tap", "fusion", "slot-queries", "all-three"])
def test_each_switch_starts_at_the_baseline_and_is_wired_in(switches):
    base = make()
    d = copy_baseline(base, make(seed=1, **switches))
    assert init_final_tap(d, None) == ("zero" if d.cfg.final_layer_tap else "none")
    full = torch.randn(9, 48)
    anchor, n = 11, 6
    ref = base.base_logits(taps_for(base, full), anchor, n)
    assert (d.base_logits(taps_for(d, full), anchor, n) - ref).abs().max() < 1e-5
    assert d.greedy_drafts(taps_for(d, full), anchor, n) == base.greedy_drafts(taps_for(base, full), anchor, n)
    # Negative controls: moving the new parameters moves the output, so each is wired in.
    with torch.no_grad():
        if d.cfg.final_layer_tap:
            d.fc.weight[:, -16:].normal_(std=0.3)
        if d.cfg.per_layer_fusion:
            d.fusion_logits.copy_(torch.tensor([[3.0, -3.0] + [0.0] * (d.fusion_logits.shape[1] - 2),
                                                [-3.0, 3.0] + [0.0] * (d.fusion_logits.shape[1] - 2)]))
        if d.cfg.slot_queries:
            d.slot_queries.normal_(std=1.0)
    assert (d.base_logits(taps_for(d, full), anchor, n) - ref).abs().max() > 1e-2


def test_per_layer_fusion_equals_a_naive_rewrite():
    d = make(per_layer_fusion=True, final_layer_tap=True)
    with torch.no_grad():
        d.fusion_logits.normal_()
    taps = torch.randn(5, 48)
    ctxs = d.contexts(taps)
    w, h = d.fc.weight, 16
    for layer in range(2):
        mix = 3 * torch.softmax(d.fusion_logits[layer], -1)
        naive = sum(mix[t] * (taps[:, t * h:(t + 1) * h] @ w[:, t * h:(t + 1) * h].t()) for t in range(3))
        assert torch.allclose(ctxs[layer], d.hidden_norm(naive), atol=1e-5)
    assert (ctxs[0] - ctxs[1]).abs().max() > 1e-3  # each layer its own context


def test_slot_queries_start_as_the_mask_embedding_and_replace_mask_slots_only():
    d = make(slot_queries=True, block=6)
    assert d.slot_queries.shape == (5, 16)
    assert torch.equal(d.slot_queries, EMB[3].repeat(5, 1))
    with torch.no_grad():
        d.slot_queries.copy_(torch.arange(5.0)[:, None].expand(5, 16))
    ids = torch.tensor([[9, 3, 3, 3, 8, 3, 3, 3]])  # two blocks of 4 slots
    e = d.slot_embeds(ids, 4)[0]
    assert torch.equal(e[0], EMB[9]) and torch.equal(e[4], EMB[8])  # each block's anchor slot
    assert [e[i, 0].item() for i in (1, 2, 3, 5, 6, 7)] == [0, 1, 2, 0, 1, 2]  # slot j -> row j - 1


def test_recurrent_head_training_forward_equals_serving_drafts():
    """The full recipe's trainer forward (teacher-forced on the drafts) gives the logits that the
    sequential serving loop drafted from, slot by slot."""
    from vllm_specx.training.blocks import assemble

    d = make(**RECIPE)
    with torch.no_grad():
        d.fusion_logits.normal_()
        d.slot_queries.normal_(std=0.5)
    prefix = torch.randint(4, 50, (10,)).tolist()
    seen = []

    def pick(logits):
        seen.append(logits[0])
        return logits.argmax(-1), None

    full = torch.randn(10, 48)
    drafts = d.draft(full, 17, d.cfg.max_drafts, pick)[0].tolist()
    ids = torch.tensor(prefix + [17] + drafts)
    taps = torch.cat([full, torch.randn(1 + len(drafts), 48)])  # rows past the anchor are never read
    b = assemble([{"ids": ids, "taps": taps}], [[10]], len(ids), d.cfg.max_drafts, 3, q=d.cfg.block_size)
    logits = dspark_train.forward(d, b).logits[0, 0]
    assert torch.allclose(logits, torch.stack(seen), atol=1e-4)


def test_config_and_checkpoint_carry_the_switches(tmp_path):
    d = make(**RECIPE)
    save_specx(d, tmp_path / "full")
    raw = json.loads((tmp_path / "full/config.json").read_text())
    assert raw["specx"]["format_version"] == 2
    assert {k: raw["specx"][k] for k in RECIPE} == RECIPE
    back = load_draft(tmp_path / "full", EMB, EMB)
    assert back.cfg == d.cfg and back.cfg.recipe == ["final_layer_tap", "per_layer_fusion", "slot_queries",
                                                      "recurrent head"]
    for k, v in d.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k
    assert make().cfg.recipe == [] and {k: getattr(make().cfg, k) for k in BASELINE} == BASELINE
    with pytest.raises(ValueError, match="speculators format has no field for final_layer_tap"):
        save_speculators(d, tmp_path / "spec", "tgt")


@pytest.mark.parametrize("edit, match", [
    ({"format_version": 1}, "specx.final_layer_tap needs format_version 2"),
    ({"per_layer_fusoin": True}, r"unknown field\(s\) \['specx.per_layer_fusoin'\]"),
    ({"slot_queries": "yes"}, "slot_queries must be true or false"),
])
def test_bad_recipe_fields_are_refused_by_name(tmp_path, edit, match):
    save_specx(make(**RECIPE), tmp_path / "d")
    raw = json.loads((tmp_path / "d/config.json").read_text())
    raw["specx"].update(edit)
    with pytest.raises(ValueError, match=match):
        read_config(raw, "d/config.json")


def test_checkpoint_without_a_recipe_tensor_is_refused(tmp_path):
    from vllm_specx.checkpoint import check_tensors, load_tensors

    save_specx(make(per_layer_fusion=True), tmp_path / "d")
    tensors = load_tensors(tmp_path / "d")
    del tensors["fusion_logits"]
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "d/model.safetensors"))
    cfg = read_config(json.loads((tmp_path / "d/config.json").read_text()))
    with pytest.raises(ValueError, match="fusion_logits"):
        check_tensors(tmp_path / "d", cfg.expected_tensors())


def test_final_layer_tap_must_be_the_targets_last_layer():
    cfg = make(final_layer_tap=True).cfg
    cfg.check_target(TARGET, 4)
    with pytest.raises(ValueError, match="final_layer_tap: its last tap is layer 3, not the target's last layer 5"):
        cfg.check_target({**TARGET, "num_hidden_layers": 6}, 4)


def _native_mtp_target(path, with_eh=True):
    h = 16
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "num_nextn_predict_layers": 1,
                                                  "hidden_size": h}))
    g = torch.Generator().manual_seed(3)
    t = {"model.layers.4.hnorm.weight": torch.rand(h, generator=g) + 0.5,
         "model.layers.0.mlp.weight": torch.randn(h, h, generator=g)}
    if with_eh:
        t["model.layers.4.eh_proj.weight"] = torch.randn(h, 2 * h, generator=g)
    save_file(t, str(path / "model.safetensors"))
    return t


def test_final_tap_columns_from_a_native_mtp_projection(tmp_path):
    t = _native_mtp_target(tmp_path / "glm")
    want = t["model.layers.4.eh_proj.weight"][:, 16:] * t["model.layers.4.hnorm.weight"][None]
    assert torch.allclose(native_mtp_final_columns(tmp_path / "glm"), want)
    d = make(final_layer_tap=True)
    before = d.fc.weight[:, :32].clone()
    assert init_final_tap(d, tmp_path / "glm") == "eh_proj"
    assert torch.equal(d.fc.weight[:, -16:], want) and torch.equal(d.fc.weight[:, :32], before)
    # A target without an MTP layer: zero columns (the baseline's function).
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain/config.json").write_text(json.dumps({"num_hidden_layers": 4}))
    assert native_mtp_final_columns(tmp_path / "plain") is None
    assert init_final_tap(d, tmp_path / "plain") == "zero" and not d.fc.weight[:, -16:].any()
    _native_mtp_target(tmp_path / "broken", with_eh=False)
    with pytest.raises(ValueError, match=r"model.layers.4.eh_proj.weight .* missing"):
        native_mtp_final_columns(tmp_path / "broken")


def test_final_tap_columns_from_the_target_final_norm(tmp_path):
    """--final-tap-init final-norm (issue 45 item 4): a target without an MTP layer starts the final
    tap's columns at diag(its final norm), so with the other columns at zero the context is
    hidden_norm(w * r) = the target's final-normed state up to hidden_norm's own weight."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain/config.json").write_text(json.dumps({"num_hidden_layers": 4}))
    w = torch.rand(16, generator=torch.Generator().manual_seed(5)) + 0.5
    d = make(final_layer_tap=True)
    before = d.fc.weight[:, :32].clone()
    assert init_final_tap(d, tmp_path / "plain", final_norm=w) == "final-norm"
    assert torch.equal(d.fc.weight[:, -16:], torch.diag(w)) and torch.equal(d.fc.weight[:, :32], before)
    with torch.no_grad():
        d.fc.weight[:, :32].zero_()
        d.hidden_norm.weight.fill_(1.0)
    taps = torch.randn(5, 48)
    r = taps[:, -16:]
    want = (w * r) * torch.rsqrt((w * r).pow(2).mean(-1, keepdim=True) + d.hidden_norm.eps)
    assert torch.allclose(d.contexts(taps)[0], want, atol=1e-5)
    # the native projection still wins where the target has one; a wrong size is refused
    t = _native_mtp_target(tmp_path / "glm")
    assert init_final_tap(d, tmp_path / "glm", final_norm=w) == "eh_proj"
    assert torch.equal(d.fc.weight[:, -16:], t["model.layers.4.eh_proj.weight"][:, 16:]
                       * t["model.layers.4.hnorm.weight"][None])
    with pytest.raises(ValueError, match="final norm"):
        init_final_tap(d, tmp_path / "plain", final_norm=torch.ones(8))
    assert init_final_tap(make(), tmp_path / "plain", final_norm=w) == "none"


@pytest.mark.parametrize("fmt", ["specx", "speculators"])
def test_a_baseline_checkpoint_warm_starts_the_full_recipe(tmp_path, fmt):
    base = make()
    if fmt == "specx":
        save_specx(base, tmp_path / "base")
    else:
        save_speculators(base, tmp_path / "base", "tgt")
    same_head = make(seed=5, **{**RECIPE, "markov_head_type": "vanilla"})
    init_final_tap(same_head, None)
    fresh = warm_start(same_head, tmp_path / "base")
    assert set(fresh) == {"fusion_logits", "slot_queries", f"fc.weight[tap {LAST}]"}
    full = torch.randn(9, 48)
    for k in (1, 4, 6):  # every draft of the block: the baseline's function exactly
        assert (same_head.base_logits(full, 12, k) - base.base_logits(full[:, :32], 12, k)).abs().max() < 1e-5
    assert same_head.greedy_drafts(full, 12, 6) == base.greedy_drafts(full[:, :32], 12, 6)
    # The full recipe: vanilla -> recurrent head, bias = W2 tanh(W1[prev]) (documented).
    rec = make(seed=6, **RECIPE)
    warm_start(rec, tmp_path / "base")
    head, prev, hidden = rec.markov_head, torch.tensor([5, 9]), torch.randn(2, 16)
    assert torch.equal(head.markov_w1.weight, base.markov_head.markov_w1.weight)
    bias, _ = head.step(prev, hidden)
    assert torch.allclose(bias, base.markov_head.markov_w2(torch.tanh(base.markov_head.markov_w1(prev))), atol=1e-6)
    with pytest.raises(ValueError, match="has shape"):
        warm_start(make(block=6, **RECIPE).__class__(
            DSparkDraftConfig.for_target({**TARGET, "intermediate_size": 24}, target_layer_ids=(0, 2, LAST),
                                         num_hidden_layers=2, block_size=6, mask_token_id=3, markov_rank=4,
                                         **RECIPE), EMB, EMB), tmp_path / "base")


def _trainer_args(**kw):
    ap = argparse.ArgumentParser()
    dspark_train.add_args(ap)
    args = ap.parse_args([])
    args.mask_token_id = 3
    for k, v in kw.items():
        setattr(args, k, v)
    return args


class _Target:
    """What `train.build` reads of a transformers target."""
    def __init__(self, path):
        self.name_or_path = str(path)
        self.config = argparse.Namespace(to_dict=lambda: dict(TARGET))


def test_the_trainer_defaults_to_the_ablations_winner_and_the_recipe_starts_at_the_baseline(tmp_path):
    defaults = _trainer_args(layers=2, block_size=6)
    assert {k: getattr(defaults, k) for k in BASELINE} == BASELINE
    assert (defaults.next_token_stream, defaults.markov_rank) == ("added", 256)
    args = _trainer_args(layers=2, block_size=6, markov_rank=4, **RECIPE)
    d = dspark_train.build(_Target(tmp_path), args, {"taps": [0, 2, LAST]}, EMB, EMB)
    assert d.cfg.target_layer_ids == (0, 2, LAST) and d.cfg.recipe == ["final_layer_tap", "per_layer_fusion",
                                                                       "slot_queries", "recurrent head"]
    assert not d.fusion_logits.any() and torch.equal(d.slot_queries, EMB[3].repeat(5, 1))
    assert not d.fc.weight[:, -16:].any() and d.fc.weight[:, :32].std() > 0.01
    base = dspark_train.build(_Target(tmp_path), _trainer_args(
        layers=2, block_size=6, markov_rank=4, **BASELINE), {"taps": [0, 2, LAST]}, EMB, EMB)
    assert base.cfg.target_layer_ids == (0, 2) and base.cfg.recipe == [] and base.tap_slices == [0, 1]
    assert base.cfg.next_token_stream == "added"
    # Training batches carry the draft's taps only, in its order, cut out of the data's.
    import random
    taps = torch.randn(40, 3 * 16)
    sample = {"ids": torch.randint(4, 50, (40,)), "taps": taps, "prompt_len": 5}
    args = _trainer_args(seq_len=32, anchors=2)
    for head, cols in ((d, taps), (base, taps[:, :32])):
        b = dspark_train.batch(head, [sample], random.Random(0), 1, args)
        assert b["taps"].shape[-1] == cols.shape[-1]
        assert any(torch.equal(b["taps"][0, :8], cols[i:i + 8]) for i in range(33))
    with pytest.raises(SystemExit, match=r"lack layer\(s\) \[3\].*--final-layer-tap needs the target's last layer 3"):
        dspark_train.build(_Target(tmp_path), _trainer_args(layers=2, block_size=6, markov_rank=4, **RECIPE),
                           {"taps": [0, 2]}, EMB, EMB)


def test_an_old_training_record_reruns_as_the_baseline():
    """`--config` of a record written before the recipe flags existed keeps its meaning."""
    from vllm_specx import assets
    from vllm_specx.training.trainer import parse_args

    args = parse_args(["--config", str(assets.root() / "drafts/ref-dspark/training.json")])
    assert {k: getattr(args, k) for k in BASELINE} == BASELINE and args.taps == "" and args.init_from is None
    new = parse_args(["--method", "dspark", "--target", "t", "--data", "d", "--out", "o"])
    assert args.next_token_stream is None and new.next_token_stream == "added" and not new.per_layer_fusion



def test_a_speculators_trained_checkpoint_warm_starts_a_recipe_head():
    """speculators 0.9.0's own trainer wrote this DSpark (taps 1, 4, 6 of the reference target,
    sliding-window causal layers, a confidence head): loaded into a head with the final-layer tap,
    per-layer fusion and slot queries (same layers, window and vanilla head), it drafts exactly
    what the speculators checkpoint drafts."""
    import dataclasses
    from pathlib import Path

    from tests.helpers import REF_TARGET, embed_and_head, load_target, target_taps

    src = Path(__file__).parent / "fixtures/speculators/default"
    target = load_target(REF_TARGET)
    emb, head = embed_and_head(target)
    spec = load_draft(src, emb, head)
    cfg = dataclasses.replace(spec.cfg, source_format="specx", target_layer_ids=spec.cfg.target_layer_ids + (7,),
                              final_layer_tap=True, per_layer_fusion=True, slot_queries=True)
    d = DSparkDraft(cfg, emb, head)
    init_final_tap(d, REF_TARGET)
    fresh = warm_start(d, src)
    assert set(fresh) == {"fusion_logits", "slot_queries", "fc.weight[tap 7]"}
    ids = torch.tensor([list(range(40, 90))])
    taps = target_taps(target, ids, cfg.target_layer_ids)[0]
    got, want = d.base_logits(taps, 95, 8), spec.base_logits(taps[:, :-256], 95, 8)
    assert (got - want).abs().max() < 1e-4
    assert d.greedy_drafts(taps, 95, 8) == spec.greedy_drafts(taps[:, :-256], 95, 8)
