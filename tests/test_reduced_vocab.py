"""Reduced draft vocabularies (`vllm_specx.vocab`): the maps, the DSpark reference with a reduced
vocabulary against the full draft it was cut from, the checkpoint round trip in both formats,
start-up refusal of bad maps (naming the tensor), and the training losses in draft ids.

The serving path (drafts and q equal to this reference inside vLLM, losslessness) is tested in
`tests/e2e/test_reduced_vocab_vllm.py`."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from vllm_specx import registry, vocab
from vllm_specx.methods.dspark.checkpoint import load_draft
from vllm_specx.training.losses import IGNORE, DraftOutput, cross_entropy, to_draft_vocab, total_variation

from .helpers import REF_TARGET, embed_and_head, load_target, random_draft, target_taps, write

V = 4096  # the reference target's vocabulary
IDS = torch.arange(3, V, 5)  # a draft vocabulary of 819 target ids, never the mask token 2


@pytest.fixture(scope="module")
def target():
    return load_target(REF_TARGET)


@pytest.fixture(scope="module")
def pair(target):
    """(full draft, the same draft cut to IDS)."""
    return random_draft(target), random_draft(target, draft_vocab=IDS)


# ---- the maps ----------------------------------------------------------------------------

def test_maps_follow_vllm_and_speculators_layout():
    d2t, t2d = vocab.maps([9, 2, 5], 12)
    assert d2t.tolist() == [2, 4, 7] and d2t.dtype == torch.int64  # target = draft + d2t[draft]
    assert vocab.target_ids(d2t).tolist() == [2, 5, 9]
    assert t2d.nonzero().flatten().tolist() == [2, 5, 9] and t2d.dtype == torch.bool
    assert vocab.from_target(torch.tensor([9, 3, 2, IGNORE]), t2d).tolist() == [2, -1, 0, -1]
    vocab.check_maps(d2t, t2d, 12, 3, "x")


@pytest.mark.parametrize("ids,why", [([], "1..12"), ([1, 1], "distinct"), ([12], r"\[0, 12\)")])
def test_maps_refuse_a_bad_vocabulary(ids, why):
    with pytest.raises(ValueError, match=why):
        vocab.maps(ids, 12)


def test_check_maps_names_the_tensor():
    d2t, t2d = vocab.maps([2, 5, 9], 12)
    with pytest.raises(ValueError, match=r"'d2t' maps draft id 2 to target id 12, outside"):
        vocab.check_maps(d2t + torch.tensor([0, 0, 3]), None, 12, 3, "x")
    with pytest.raises(ValueError, match="'d2t' must map draft ids to distinct target ids"):
        vocab.check_maps(torch.tensor([5, 4, 7]), None, 12, 3, "x")
    other = t2d.clone()
    other[5], other[6] = False, True
    with pytest.raises(ValueError, match="tensors 't2d' and 'd2t' disagree"):
        vocab.check_maps(d2t, other, 12, 3, "x")
    with pytest.raises(ValueError, match=r"'t2d' must be bool of shape \[12\]"):
        vocab.check_maps(d2t, t2d[:11], 12, 3, "x")
    with pytest.raises(ValueError, match=r"'d2t' must be int64 of shape \[3\]"):
        vocab.check_maps(d2t.float(), None, 12, 3, "x")


def test_scatter_is_exact_and_zero_outside():
    p = torch.softmax(torch.randn(2, 3), -1)
    full = vocab.scatter_to_target(p, torch.tensor([2, 5, 9]), 12)
    assert full.shape == (2, 12) and torch.equal(full[:, [2, 5, 9]], p)
    assert full.sum(-1).allclose(torch.ones(2)) and int((full > 0).sum()) == 6


def test_by_frequency_takes_the_most_frequent_then_lower_ids():
    ids, counts = vocab.by_frequency([[4, 4, 4, 1, 1, 7], [7, 3]], 3, 10)
    assert counts[4] == 3 and ids.tolist() == [1, 4, 7]  # 1 and 7 tie at 2; 3 has 1
    ids, _ = vocab.by_frequency([[4, 4, 1]], 2, 10, always=[9])
    assert ids.tolist() == [4, 9]
    assert vocab.coverage(torch.tensor([4, 4, 1, 0]), vocab.maps(ids, 10)[1]) == 0.5


# ---- the reference: a reduced draft is the full draft with other tokens masked ------------------

def _masked(logits: torch.Tensor) -> torch.Tensor:
    out = torch.full_like(logits, float("-inf"))
    out[..., IDS] = logits[..., IDS]
    return out


def test_reduced_reference_drafts_are_the_full_drafts_masked_to_the_vocabulary(target, pair):
    """Greedy and sampled drafts: the reduced draft picks among IDS exactly as the full draft
    does when every other token's logit is -inf (its Markov bias rows and lm_head rows are the
    full draft's at IDS), and hands q scattered to the target vocabulary."""
    full, small = pair
    assert small.cfg.draft_vocab_size == len(IDS) and small.lm_head.shape == (len(IDS), 256)
    prompt = torch.tensor([[5, 17, 300, 41, 8, 99, 1000, 7]])
    taps = target_taps(target, prompt, full.cfg.target_layer_ids)[0]
    anchor = 77

    def masked_pick(logits):  # the full draft restricted to IDS
        return _masked(logits).argmax(-1), None

    want = full.draft(taps, anchor, 5, masked_pick)[0]
    got = small.draft(taps, anchor, 5)[0]
    assert torch.equal(got, want) and all(int(t) in set(IDS.tolist()) for t in got)
    # negative control: the full draft unmasked drafts tokens outside the vocabulary
    assert not all(int(t) in set(IDS.tolist()) for t in full.draft(taps, anchor, 5)[0])

    def with_q(mask):  # q of every slot along the greedy chain (same chain in both drafts)
        return lambda logits: (lambda z: (z.argmax(-1), torch.softmax(z.float(), -1)))(mask(logits))

    t_full, q_full = full.draft(taps, anchor, 5, with_q(_masked))
    t_small, q_small = small.draft(taps, anchor, 5, with_q(lambda z: z))
    assert torch.equal(t_small, t_full) and q_small.shape == (5, V)
    assert torch.allclose(q_small, q_full, atol=1e-6)
    assert float(q_small[:, ~vocab.maps(IDS, V)[1]].abs().max()) == 0.0

@pytest.mark.parametrize("fmt", ["specx", "speculators"])
def test_checkpoint_round_trip(tmp_path, target, pair, fmt):
    _, small = pair
    path = write(small, tmp_path / fmt, fmt)
    tensors = load_file(f"{path}/model.safetensors")
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert tensors["lm_head.weight"].shape == (len(IDS), 256)
    assert tensors["markov_head.markov_w2.weight"].shape[0] == len(IDS)
    assert tensors["markov_head.markov_w1.weight"].shape[0] == V  # previous tokens: target ids
    back = load_draft(path, *embed_and_head(target))
    assert back.cfg.draft_vocab_size == len(IDS)
    for k, v in small.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    cfg = json.loads((tmp_path / fmt / "config.json").read_text())
    assert (cfg["specx"] if fmt == "specx" else cfg)["draft_vocab_size"] == len(IDS)


def test_a_checkpoint_without_t2d_loads(tmp_path, target, pair):
    _, small = pair
    path = write(small, tmp_path / "d")
    t = load_file(f"{path}/model.safetensors")
    del t["t2d"]
    save_file(t, f"{path}/model.safetensors")
    assert torch.equal(load_draft(path, *embed_and_head(target)).t2d, small.t2d)


def _check(path):
    method, cfg = registry.read_checkpoint(path)
    registry.check_draft(method, cfg, path, {"hidden_size": 256, "num_hidden_layers": 8, "vocab_size": V}, 7)


@pytest.mark.parametrize("case,edit,why", [
    ("d2t-outside", lambda t: t["d2t"].__setitem__(-1, 10_000), r"tensor 'd2t' maps draft id 818 to target id "),
    ("maps-disagree", lambda t: (t["t2d"].__setitem__(3, True), t["t2d"].__setitem__(8, False)),
     r"tensors 't2d' and 'd2t' disagree"),
    ("no-d2t", lambda t: t.pop("d2t"), r"missing tensor\(s\) \['d2t'\]"),
    ("d2t-float", lambda t: t.__setitem__("d2t", t["d2t"].float()), r"tensor 'd2t' in model\.safetensors has dtype F32; expected I64"),
    ("lm-head-full", lambda t: t.__setitem__("lm_head.weight", torch.zeros(V, 256)),
     r"tensor 'lm_head\.weight' has shape \[4096, 256\], expected \[819, 256\]"),
])
def test_bad_maps_are_refused_at_start_up_naming_the_tensor(tmp_path, pair, case, edit, why):
    _, small = pair
    path = write(small, tmp_path / case)
    _check(path)  # negative control: the unbroken draft passes
    t = load_file(f"{path}/model.safetensors")
    edit(t)
    save_file(t, f"{path}/model.safetensors")
    with pytest.raises(ValueError, match=why):
        _check(path)


# ---- training in draft ids -------------------------------------------------------------------

def _out(logits_full, targets, ids, logp):
    return DraftOutput(logits=logits_full, targets=targets, target_ids=ids, target_logp=logp)


def test_losses_in_draft_ids_equal_the_full_vocabulary_losses_on_the_masked_logits():
    """Cross-entropy and TV on a reduced draft's logits [.., Vd] with targets mapped
    (`to_draft_vocab`) equal, in value and gradient, the full-vocabulary losses on logits whose
    out-of-vocabulary entries are -inf, with out-of-vocabulary targets ignored and the target's
    top-k renormalised over the vocabulary's part."""
    torch.manual_seed(0)
    vs, keep = 12, torch.tensor([1, 2, 5, 7, 9])
    t2d = vocab.maps(keep, vs)[1]
    small = torch.randn(2, 3, 4, len(keep), requires_grad=True)
    targets = torch.tensor([[[1, 5, 3, 9]] * 3] * 2)  # 3 is outside
    targets[0, 0, 3] = IGNORE
    ids = torch.stack([torch.tensor([1, 3, 5]), torch.tensor([5, 2, 0]), torch.tensor([9, 7, 4]),
                       torch.tensor([9, 1, 2])]).expand(2, 3, 4, 3).clone()
    ids[..., 2, :] = torch.tensor([3, 5, 7])  # top-1 outside: that position is ignored
    logp = torch.log_softmax(torch.randn(2, 3, 4, 3), -1) - 0.1
    w = torch.tensor([1.0, 0.7, 0.5, 0.3])
    red = to_draft_vocab(_out(small, targets, ids, logp), t2d)

    full = torch.full((2, 3, 4, vs), -1e4)  # probability 0 in float32, yet 0 * it stays 0
    full[..., keep] = small.detach()
    full.requires_grad_(True)
    outside = ~t2d[targets.clamp(min=0)] | (targets == IGNORE) | ~t2d[ids].any(-1)
    ref_targets = torch.where(outside, IGNORE, targets)
    ref_logp = torch.where(t2d[ids], logp, float("-inf"))
    ref = _out(full, ref_targets, ids, ref_logp)
    for loss in (cross_entropy, total_variation):
        a, b = loss(red, w), loss(ref, w)
        assert torch.isfinite(a) and torch.allclose(a, b, atol=1e-6), loss.__name__
        ga, = torch.autograd.grad(a, small)
        gb, = torch.autograd.grad(b, full)
        assert torch.allclose(ga, gb[..., keep], atol=1e-6), loss.__name__
    assert int((red.targets == IGNORE).sum()) == int((ref_targets == IGNORE).sum())


def test_to_draft_vocab_ignores_positions_with_no_target_token_inside():
    t2d = vocab.maps(torch.tensor([1, 2]), 6)[1]
    out = to_draft_vocab(_out(torch.zeros(1, 2, 2), torch.tensor([[1, 1]]),
                              torch.tensor([[[1, 4], [4, 5]]]), torch.tensor([[[-0.1, -3.0], [-0.2, -2.0]]])), t2d)
    assert out.targets.tolist() == [[0, IGNORE]]
    assert torch.isfinite(cross_entropy(out, torch.ones(2))) and torch.isfinite(total_variation(out, torch.ones(2)))


# ---- MTP with a reduced draft vocabulary ------------------------------------------------------

@pytest.fixture(scope="module")
def mtp_pair(target):
    """(full MTP layer, the same layer with the draft vocabulary IDS)."""
    from .helpers import random_mtp

    return random_mtp(target, kv_share=True), random_mtp(target, kv_share=True, draft_vocab=IDS)


def test_reduced_mtp_is_the_full_layer_masked_to_the_vocabulary(target, mtp_pair):
    """Per-step logits are the full layer's at IDS (fed the same step tokens), and the greedy
    chain is the full layer's chain with every other token's logit at -inf: picks mapped back to
    target ids before they are the next step's input."""
    from .helpers import target_final_hidden

    full, small = mtp_pair
    assert small.cfg.reduced_vocab and small.lm_head.shape == (len(IDS), 256)
    seq = [5, 17, 300, 41, 8, 99, 1000, 7]
    hidden, ids = target_final_hidden(target, seq[:-1]), torch.tensor(seq)
    fed = [int(IDS[i]) for i in (3, 100, 7, 500, 9)]
    got = small.draft_logits(hidden, ids, 6, drafts=fed)
    want = full.draft_logits(hidden, ids, 6, drafts=fed)
    assert got.shape == (6, len(IDS)) and torch.allclose(got, want[:, IDS], atol=1e-5)
    # the greedy chain: the full layer's with logits masked to IDS
    chain, toks = [], []
    for j in range(6):
        z = full.draft_logits(hidden, ids, j + 1, drafts=toks or None)[j]
        toks.append(int(_masked(z).argmax()))
        chain.append(toks[-1])
    assert small.greedy_drafts(hidden, ids, 6) == chain and set(chain) <= set(IDS.tolist())
    assert not set(full.greedy_drafts(hidden, ids, 6)) <= set(IDS.tolist())  # negative control


def test_reduced_mtp_checkpoint_round_trip_and_refusals(tmp_path, target, mtp_pair):
    from vllm_specx.methods.mtp.checkpoint import load, save

    _, small = mtp_pair
    save(small, tmp_path / "m")
    t = load_file(f"{tmp_path}/m/model.safetensors")
    assert t["d2t"].dtype == torch.int64 and t["t2d"].dtype == torch.bool and t["lm_head.weight"].shape == (len(IDS), 256)
    assert json.loads((tmp_path / "m" / "config.json").read_text())["specx"]["draft_vocab_size"] == len(IDS)
    back = load(tmp_path / "m", *embed_and_head(target))
    for k, v in small.specx_state_dict().items():
        assert torch.equal(back.specx_state_dict()[k], v), k
    _check(str(tmp_path / "m"))  # negative control: the unbroken draft passes
    del t["t2d"]  # optional on disk
    save_file(t, f"{tmp_path}/m/model.safetensors")
    _check(str(tmp_path / "m"))
    assert torch.equal(load(tmp_path / "m", *embed_and_head(target)).t2d, small.t2d)
    t["d2t"][-1] = 10_000
    save_file(t, f"{tmp_path}/m/model.safetensors")
    with pytest.raises(ValueError, match=r"tensor 'd2t' maps draft id 818 to target id"):
        _check(str(tmp_path / "m"))


# ---- the EAGLE-3 baseline with a reduced draft vocabulary (vLLM's llama_eagle3 reads d2t) -------

def test_reduced_eagle3_is_the_full_draft_masked_and_its_checkpoint_is_checked(tmp_path, target):
    from vllm_specx.methods.eagle3.checkpoint import check_vllm_draft, load, save
    from vllm_specx.methods.eagle3.config import Eagle3Config
    from vllm_specx.methods.eagle3.model import Eagle3Draft

    tc = target.config.to_dict()
    torch.manual_seed(0)
    full = Eagle3Draft(Eagle3Config.for_target(tc, (1, 4, 6)), *embed_and_head(target))
    small = Eagle3Draft(Eagle3Config.for_target(tc, (1, 4, 6), len(IDS)), *embed_and_head(target), IDS)
    for p in full.parameters():
        torch.nn.init.normal_(p, std=0.05)
    small.load_state_dict(full.state_dict(), strict=False)
    seq = torch.tensor([5, 17, 300, 41, 8, 99, 1000, 7])
    taps = target_taps(target, seq[None, :-1], (1, 4, 6))[0]
    chain = []
    for j in range(5):  # the full draft's greedy chain with logits masked to IDS (teacher-forced on it)
        ids = torch.cat([seq, torch.tensor(chain + [0] * (5 - j), dtype=torch.long)])  # [13]
        z = full.chain_logits(torch.nn.functional.pad(taps, (0, 0, 0, 6))[None], ids[None],
                              torch.tensor([[7]]), j + 1, "target")[0, 0, j]
        chain.append(int(_masked(z).argmax()))
    assert small.greedy_drafts(taps, seq, 5) == chain and set(chain) <= set(IDS.tolist())
    assert not set(full.greedy_drafts(taps, seq, 5)) <= set(IDS.tolist())  # negative control
    save(small, tmp_path / "e")
    t = load_file(f"{tmp_path}/e/model.safetensors")
    assert t["d2t"].dtype == torch.int64 and t["lm_head.weight"].shape == (len(IDS), 256)
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    assert cfg["draft_vocab_size"] == len(IDS) and cfg["vocab_size"] == V  # what vLLM reads
    back = load(tmp_path / "e", *embed_and_head(target))
    assert back.greedy_drafts(taps, seq, 5) == chain
    dims = {"hidden_size": 256, "num_hidden_layers": 8, "vocab_size": V}
    check_vllm_draft(tmp_path / "e", dims, 5)  # negative control: the unbroken draft passes
    t["d2t"][0] = -5
    save_file(t, f"{tmp_path}/e/model.safetensors")
    with pytest.raises(ValueError, match=r"tensor 'd2t' maps draft id 0 to target id -5"):
        check_vllm_draft(tmp_path / "e", dims, 5)


# ---- lm_head_from_target: a reduced draft whose lm_head rows are the target's leaves them out -----

@pytest.mark.parametrize("method", ["dspark", "mtp"])
def test_a_draft_without_its_target_rows_loads_the_same_draft(tmp_path, target, pair, mtp_pair, method):
    """`vocab.omit_target_head` drops `lm_head.weight` only when it is the target's rows at d2t,
    sets `lm_head_from_target`, and the reference loaders rebuild the same draft from the target;
    `check` passes and `save` keeps the rows out."""
    from vllm_specx.methods.mtp import checkpoint as mtp_ckpt

    small = pair[1] if method == "dspark" else mtp_pair[1]
    path = tmp_path / method
    if method == "dspark":
        write(small, path)
    else:
        mtp_ckpt.save(small, path)
    before = (path / "model.safetensors").stat().st_size
    _, head = embed_and_head(target)
    assert vocab.omit_target_head(path, head)
    t = load_file(f"{path}/model.safetensors")
    assert "lm_head.weight" not in t and "d2t" in t
    assert (path / "model.safetensors").stat().st_size < before - len(IDS) * 256 * 4 + 1024
    assert json.loads((path / "config.json").read_text())["specx"]["lm_head_from_target"] is True
    _check(str(path))
    back = load_draft(path, *embed_and_head(target)) if method == "dspark" else mtp_ckpt.load(path, *embed_and_head(target))
    assert back.cfg.lm_head_from_target
    mine = small.state_dict() if method == "dspark" else small.specx_state_dict()
    theirs = back.state_dict() if method == "dspark" else back.specx_state_dict()
    for k, v in mine.items():
        assert torch.equal(theirs[k], v), k
    again = tmp_path / f"{method}-again"  # saving the loaded draft keeps the rows out
    if method == "dspark":
        write(back, again)
    else:
        mtp_ckpt.save(back, again)
    assert "lm_head.weight" not in load_file(f"{again}/model.safetensors")
    _check(str(again))
    if method == "dspark":  # the speculators format has no such field: it writes the rows
        assert "lm_head.weight" in load_file(f"{write(back, tmp_path / 'spec', 'speculators')}/model.safetensors")


@pytest.mark.parametrize("method", ["dspark", "mtp"])
def test_a_head_that_is_not_the_targets_rows_is_kept(tmp_path, target, pair, mtp_pair, method):
    """Rows that differ from the target's (a trained head) are never dropped; a full-vocabulary
    draft has nothing to drop."""
    from vllm_specx.methods.mtp import checkpoint as mtp_ckpt

    _, head = embed_and_head(target)
    small = pair[1] if method == "dspark" else mtp_pair[1]
    path = tmp_path / method
    write(small, path) if method == "dspark" else mtp_ckpt.save(small, path)
    t = load_file(f"{path}/model.safetensors")
    t["lm_head.weight"][5, 0] += 1e-3
    save_file(t, f"{path}/model.safetensors")
    assert not vocab.omit_target_head(path, head)
    assert "lm_head.weight" in load_file(f"{path}/model.safetensors")
    assert "lm_head_from_target" not in json.loads((path / "config.json").read_text())["specx"]
    full = tmp_path / "full"
    write(pair[0], full) if method == "dspark" else mtp_ckpt.save(mtp_pair[0], full)
    assert not vocab.omit_target_head(full, head)


def _with_flag(path, value=True):
    cfg = json.loads((path / "config.json").read_text())
    cfg["specx"]["lm_head_from_target"] = value
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("method", ["dspark", "mtp"])
def test_lm_head_from_target_is_refused_where_it_cannot_hold(tmp_path, target, pair, mtp_pair, method):
    """The flag with the rows still on disk (an unexpected tensor), on a full-vocabulary draft, or
    not a boolean: refused naming the field or tensor."""
    from vllm_specx.methods.mtp import checkpoint as mtp_ckpt

    small, full = (pair[1], pair[0]) if method == "dspark" else (mtp_pair[1], mtp_pair[0])
    save = write if method == "dspark" else mtp_ckpt.save
    save(small, tmp_path / "r")
    _check(str(tmp_path / "r"))  # negative control: the unbroken draft passes
    _with_flag(tmp_path / "r")
    with pytest.raises(ValueError, match=r"unexpected tensor\(s\) \['lm_head.weight'\]"):
        _check(str(tmp_path / "r"))
    if method == "mtp":
        with pytest.raises(ValueError, match="'lm_head.weight' is present, but config.json says"):
            mtp_ckpt.load(tmp_path / "r", *embed_and_head(target))
    save(full, tmp_path / "f")
    _with_flag(tmp_path / "f")
    with pytest.raises(ValueError, match="lm_head_from_target needs a reduced draft vocabulary"):
        _check(str(tmp_path / "f"))
    save(small, tmp_path / "b")
    _with_flag(tmp_path / "b", "yes")
    with pytest.raises(ValueError, match="lm_head_from_target must be true or false"):
        _check(str(tmp_path / "b"))


def test_eagle3_drafts_keep_their_rows(tmp_path, target):
    """vLLM's own EAGLE-3 loader reads the rows from the file: `omit_target_head` leaves them."""
    from vllm_specx.methods.eagle3.checkpoint import save
    from vllm_specx.methods.eagle3.config import Eagle3Config
    from vllm_specx.methods.eagle3.model import Eagle3Draft

    tc = target.config.to_dict()
    small = Eagle3Draft(Eagle3Config.for_target(tc, (1, 4, 6), len(IDS)), *embed_and_head(target), IDS)
    save(small, tmp_path / "e")
    assert not vocab.omit_target_head(tmp_path / "e", embed_and_head(target)[1])
    assert "lm_head.weight" in load_file(f"{tmp_path}/e/model.safetensors")


def test_the_served_head_takes_the_targets_rows_or_refuses(pair):
    """`vocab.TargetHeadRows` without an engine: with lm_head_from_target it copies the target's
    rows at d2t into the draft's head and has vLLM prepare the head again; a target head split
    over ranks, or stored quantised, is refused naming the field; without the flag vLLM's own
    sharing runs."""
    import dataclasses
    from types import SimpleNamespace

    cfg = dataclasses.replace(pair[1].cfg, lm_head_from_target=True)
    calls = []

    class Base:
        def _maybe_share_lm_head(self, target):
            calls.append("vllm")

    class Proposer(vocab.TargetHeadRows, Base):
        pass

    def proposer(cfg, rows=len(IDS) + 5):
        p = Proposer()
        p.draft_model_config = SimpleNamespace(hf_config=SimpleNamespace(specx_route="dspark",
                                                                         specx_config=cfg.to_dict()))
        head = torch.nn.Module()
        head.weight = torch.nn.Parameter(torch.zeros(rows, 256), requires_grad=False)  # vLLM pads rows
        head.quant_method = SimpleNamespace(process_weights_after_loading=lambda layer: calls.append("prepared"))
        p.model = SimpleNamespace(lm_head=head, draft_id_to_target_id=torch.nn.Parameter(pair[1].d2t.clone(),
                                                                                         requires_grad=False))
        return p

    target_head = torch.randn(V + 64, 256)  # padded like vLLM's ParallelLMHead
    p = proposer(cfg)
    p._maybe_share_lm_head(SimpleNamespace(lm_head=SimpleNamespace(weight=target_head)))
    assert torch.equal(p.model.lm_head.weight[:len(IDS)], target_head[IDS]) and calls == ["prepared"]
    assert p.model.has_own_lm_head
    with pytest.raises(ValueError, match=r"lm_head_from_target: .* holds 1024 of its 4096 rows"):
        proposer(cfg)._maybe_share_lm_head(SimpleNamespace(lm_head=SimpleNamespace(weight=target_head[:1024])))
    with pytest.raises(ValueError, match=r"lm_head_from_target: the target's LM head is stored as torch.int32"):
        proposer(cfg)._maybe_share_lm_head(
            SimpleNamespace(lm_head=SimpleNamespace(weight=torch.zeros(V, 32, dtype=torch.int32))))
    calls.clear()
    proposer(pair[1].cfg)._maybe_share_lm_head(SimpleNamespace(lm_head=SimpleNamespace(weight=target_head)))
    assert calls == ["vllm"]
