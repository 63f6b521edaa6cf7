"""Reference outputs of speculators' own DSpark forward, for one saved checkpoint.

Loads ``<fixture>/config.json`` + ``model.safetensors`` with speculators 0.9.0
(``DSparkDraftModel.from_pretrained``, which also runs ``load_verifier_weights`` so
embed_tokens / lm_head / verifier_norm / verifier_lm_head come from the target named
in ``speculators_config.verifier.name_or_path``; that path is repo-relative, so run
this from the repo root or pass ``--verifier``), in float32, eval mode, with the
draft attention implementation ``--attn-impl`` (sdpa, as trained).

Two sequences are taken from rows of the prepared training dataset that fall in
speculators' validation split (never code.jsonl / prose.jsonl), with the exact
aux-tap / last-hidden tensors that the trainer's data loader builds from
``hidden_states/hs_{row}.safetensors``. Anchors are fixed per sequence (see
``ANCHORS``); they are forced by giving speculators a loss_mask that is 1 exactly at
those positions and ``max_anchors = len(anchors)``, and the anchors that
``select_anchors`` actually returned are recorded and checked.

``DSparkDraftModel.forward`` is run once; hooks on ``_backbone_forward`` and on the
``compute_metrics`` name used by dspark/core.py capture ``hidden`` (post-norm),
base logits, the final (Markov-biased) logits and confidence logits. The
teacher-forced ``prev`` ids are rebuilt as core.py builds them and
``markov_head.block_bias`` is re-applied to check that base + bias == the logits the
forward produced. Greedy drafts use speculators' own ``markov_head.block_bias`` with
drafted (not ground-truth) previous tokens.

A reduced draft vocabulary (config ``draft_vocab_size`` < the target's ``vocab_size``:
the checkpoint then holds speculators' ``lm_head.weight`` [Vd, H], ``d2t`` and ``t2d``):
logits are over the Vd draft ids (speculators' order, ascending target id); a greedy draft
is the argmax draft id mapped to its target id with speculators' own ``d2t`` buffer
(target = draft + d2t[draft]), and that target id is the next slot's previous token
(``markov_w1`` indexes the target vocabulary). ``greedy_drafts`` are target ids.

Writes ``<fixture>.reference.safetensors`` (beside the checkpoint directory) with, for s in {0, 1}:
    s{s}.input_ids [S] i64, s{s}.taps [S, n_aux*H], s{s}.anchors [M] i64,
    s{s}.hidden [M, B, H], s0.logits [M, B, V] (base logits are checked here, not stored),
    s{s}.prev [M, B] i64, s{s}.confidence_logits [M, B] (if the head exists),
    s{s}.greedy_drafts [M, n_drafts] i64 target ids (n_drafts = B if sample_from_anchor else B-1),
plus safetensors metadata (dataset rows used, anchors, loss, eager-vs-sdpa check).

Command (from the repo root):
    python scripts/speculators_interop/dump_reference.py \
        --fixture tests/fixtures/speculators/default --data $WORK/data
"""

import argparse
import json
from pathlib import Path

import torch
from datasets import load_from_disk
from safetensors.torch import load_file, save_file

from importlib.metadata import version as pkg_version

import speculators.models.dflash.core as dflash_core
import speculators.models.dspark.core as dspark_core
from speculators.models.dspark import DSparkDraftModel
from speculators.models.dspark.config import DSparkSpeculatorConfig

# Sequence length, and anchors per sequence (sorted: select_anchors sorts them).
SEQ_LEN = 200
ANCHORS = [
    [7, 63, 64, 101, 150, 191],
    [1, 40, 88, 120, 163, 185],
]


def load_model(fixture: str, attn_impl: str, verifier: str | None):
    config = DSparkSpeculatorConfig.from_pretrained(fixture)
    if verifier is not None:
        config.speculators_config.verifier.name_or_path = verifier
    config.transformer_layer_config._attn_implementation = attn_impl  # noqa: SLF001
    model = DSparkDraftModel.from_pretrained(
        fixture, config=config, dtype=torch.float32
    )
    model = model.float().eval()
    assert model._attn_impl == attn_impl, model._attn_impl  # noqa: SLF001
    for n, p in model.named_parameters():
        assert p.dtype == torch.float32, n
        assert torch.isfinite(p).all(), n
    return model


def pick_rows(data_path: str, train_ratio: float, n: int):
    ds = load_from_disk(data_path)
    split = int(len(ds) * train_ratio)
    rows = [i for i in range(split, len(ds)) if len(ds[i]["input_ids"]) >= SEQ_LEN]
    assert len(rows) >= n, "not enough validation rows of SEQ_LEN tokens"
    return ds, rows[:n]


def load_row(data_path: str, ds, row: int):
    hs = load_file(str(Path(data_path) / "hidden_states" / f"hs_{row}.safetensors"))
    ids = torch.as_tensor(ds[row]["input_ids"]).long()
    assert torch.equal(hs["token_ids"], ids)
    ids = ids[:SEQ_LEN]
    # Exactly what speculators.train.data builds from the file.
    taps = hs["hidden_states"][:SEQ_LEN, :-1].flatten(1).float()
    last = hs["hidden_states"][:SEQ_LEN, -1].float()
    return ids, taps, last


def teacher_prev(block_tokens: torch.Tensor, sample_from_anchor: bool):
    """prev_token_ids exactly as DSparkDraftModel.forward builds them."""
    if sample_from_anchor:
        return block_tokens
    return torch.cat([block_tokens[:, :1], block_tokens[:, :-1]], dim=1)


@torch.no_grad()
def run_sequence(model, ids, taps, last, anchors):
    cfg = model.config
    B = model.block_size
    S = ids.numel()
    M = len(anchors)
    loss_mask = torch.zeros(1, S, dtype=torch.long)
    loss_mask[0, anchors] = 1

    cap = {}
    orig_select = dflash_core.select_anchors
    orig_backbone = model._backbone_forward  # noqa: SLF001
    orig_metrics = dspark_core.compute_metrics

    def select_hook(*a, **k):
        out = orig_select(*a, **k)
        cap["anchors"] = out[0].clone()
        cap["anchor_valid"] = out[1].clone()
        return out

    def backbone_hook(*a, **k):
        out = orig_backbone(*a, **k)
        cap["hidden"] = out[0].clone()
        cap["base_logits"] = out[1].clone()
        cap["block_idx"] = out[4].clone()
        return out

    def metrics_hook(logits, targets, confidence_logits, *a, **k):
        cap["logits"] = logits.clone()
        cap["targets"] = targets.clone()
        cap["confidence_logits"] = (
            None if confidence_logits is None else confidence_logits.clone()
        )
        return orig_metrics(logits, targets, confidence_logits, *a, **k)

    dflash_core.select_anchors = select_hook
    model._backbone_forward = backbone_hook  # noqa: SLF001
    dspark_core.compute_metrics = metrics_hook
    # Same call kwargs as speculators' trainer (eager losses on CPU), M anchors.
    call_kwargs, _ = DSparkDraftModel.get_trainer_kwargs(
        loss_fn="kl_div", loss_implementation="eager", max_anchors=M
    )
    try:
        _, loss, metrics = model(
            hidden_states=taps[None],
            input_ids=ids[None],
            loss_mask=loss_mask,
            verifier_last_hidden_states=last[None],
            document_ids=torch.zeros(1, S, dtype=torch.long),
            **call_kwargs,
        )
    finally:
        dflash_core.select_anchors = orig_select
        del model._backbone_forward  # noqa: SLF001  (instance attr -> class method)
        dspark_core.compute_metrics = orig_metrics

    used = cap["anchors"]
    assert cap["anchor_valid"].all()
    assert used.tolist() == list(anchors), (used.tolist(), anchors)
    assert torch.equal(
        cap["block_idx"].view(M, B), used[:, None] + torch.arange(B)[None]
    )

    V = cap["base_logits"].shape[-1]
    hidden = cap["hidden"].view(M, B, -1)
    base = cap["base_logits"].view(M, B, V)
    logits = cap["logits"].view(M, B, V)
    block_tokens = ids[cap["block_idx"]].view(M, B)
    prev = teacher_prev(block_tokens, cfg.sample_from_anchor)

    head = model.markov_head
    if head is not None:
        bias = head.block_bias(prev_token_ids=prev, hidden_states=hidden)
        recomputed = base + bias
    else:
        recomputed = base
    # base + bias must be what DSparkDraftModel.forward itself produced.
    err = (recomputed - logits).abs().max().item()
    assert err <= 1e-5, f"recomputed logits differ from forward: {err}"

    out = {
        "input_ids": ids.clone(),
        "taps": taps.contiguous(),
        "anchors": used.long(),
        "hidden": hidden.contiguous(),
        "base_logits": base.contiguous(),
        "logits": logits.contiguous(),
        "prev": prev.long().contiguous(),
    }
    if cap["confidence_logits"] is not None:
        out["confidence_logits"] = cap["confidence_logits"].view(M, B).contiguous()

    # Greedy sequential drafting with speculators' modules.
    anchor_tok = ids[used]  # [M]
    if cfg.sample_from_anchor:
        slots = list(range(B))  # draft k at slot k; prev(slot k) = token p+k
    else:
        slots = list(range(1, B))  # draft k at slot k+1; prev(slot k+1) = p+k
    n_drafts = len(slots)
    drafts = torch.zeros(M, n_drafts, dtype=torch.long)
    to_target = draft_to_target(model)
    prev_d = anchor_tok[:, None].repeat(1, B)  # slots not yet drafted: unused
    for k, slot in enumerate(slots):
        if k > 0:
            prev_d[:, slot] = drafts[:, k - 1]
        if head is not None:
            step = base + head.block_bias(prev_token_ids=prev_d, hidden_states=hidden)
        else:
            step = base
        drafts[:, k] = to_target(step[:, slot].argmax(-1))
    # With teacher forcing and drafts equal to the truth, this is the forward path.
    out["greedy_drafts"] = drafts
    stats = {
        "loss": float(loss),
        "greedy_match_teacher_argmax_slot0": bool(
            torch.equal(drafts[:, 0], to_target(logits[:, slots[0]].argmax(-1)))
        ),
    }
    return out, stats


def draft_to_target(model):
    """Draft ids -> target ids with speculators' own d2t buffer (identity for a full vocabulary)."""
    if not model.use_draft_vocab:
        return lambda ids: ids
    d2t = model.d2t.long()
    return lambda ids: ids + d2t[ids]


def check_draft_vocab(model, fixture: str, tgt_head: torch.Tensor) -> dict:
    """A reduced draft vocabulary as speculators loaded it: t2d and d2t (from the checkpoint) name
    the same ascending target ids, lm_head is the checkpoint's rows = the target's rows at those ids
    (in the checkpoint's dtype), verifier_lm_head the target's rows in float32."""
    t2d, d2t = model.t2d, model.d2t
    assert t2d.dtype == torch.bool and d2t.dtype == torch.long, (t2d.dtype, d2t.dtype)
    ids = torch.arange(d2t.numel()) + d2t
    assert torch.equal(t2d.nonzero().flatten(), ids), "t2d and d2t disagree"
    ckpt = load_file(str(Path(fixture) / "model.safetensors"))
    assert torch.equal(ckpt["d2t"], d2t) and torch.equal(ckpt["t2d"], t2d)
    head = ckpt["lm_head.weight"]
    assert torch.equal(model.lm_head.weight, head.float())
    assert torch.equal(head, tgt_head[ids].to(head.dtype))
    assert torch.equal(model.verifier_lm_head.weight, tgt_head[ids])
    return {"draft_vocab_size": int(d2t.numel()), "lm_head_dtype_on_disk": str(head.dtype)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fixture", required=True, help="dir with config.json + model")
    p.add_argument("--data", required=True, help="prepared dataset dir")
    p.add_argument("--train-ratio", type=float, default=0.9)
    p.add_argument("--attn-impl", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--verifier", default=None, help="override verifier path")
    p.add_argument("--cross-check-eager", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)

    model = load_model(args.fixture, args.attn_impl, args.verifier)
    # Verifier-owned weights really came from the target.
    vpath = model.config.speculators_config.verifier.name_or_path
    tgt = load_file(str(Path(vpath) / "model.safetensors"))
    emb = tgt["model.embed_tokens.weight"].float()
    assert torch.equal(model.embed_tokens.weight, emb)
    tgt_head = tgt.get("lm_head.weight", emb).float()
    if model.use_draft_vocab:
        vocab_meta = check_draft_vocab(model, args.fixture, tgt_head)
    else:
        assert torch.equal(model.lm_head.weight, tgt_head)
        vocab_meta = {}
    assert torch.equal(model.verifier_norm.weight, tgt["model.norm.weight"].float())

    ds, rows = pick_rows(args.data, args.train_ratio, len(ANCHORS))
    tensors, meta = {}, {"rows": rows, "seq_len": SEQ_LEN, "anchors": ANCHORS, **vocab_meta}
    eager = None
    if args.cross_check_eager:
        eager = load_model(args.fixture, "eager", args.verifier)
    for s, (row, anchors) in enumerate(zip(rows, ANCHORS)):
        ids, taps, last = load_row(args.data, ds, row)
        out, stats = run_sequence(model, ids, taps, last, anchors)
        meta[f"s{s}"] = stats
        if eager is not None:
            out_e, _ = run_sequence(eager, ids, taps, last, anchors)
            meta[f"s{s}"]["eager_vs_sdpa_logits_maxabs"] = (
                (out_e["logits"] - out["logits"]).abs().max().item()
            )
            meta[f"s{s}"]["eager_greedy_equal"] = bool(
                torch.equal(out_e["greedy_drafts"], out["greedy_drafts"])
            )
        for k, v in out.items():
            if k == "base_logits" or (k == "logits" and s > 0):
                continue  # checked above; left out to keep the fixture small (hidden + lm_head give them)
            tensors[f"s{s}.{k}"] = v.contiguous()
    save_file(
        tensors,
        reference_path(args.fixture),
        metadata={
            "speculators_version": pkg_version("speculators"),
            "torch_version": torch.__version__,
            "attn_impl": args.attn_impl,
            "dtype": "float32",
            "meta": json.dumps(meta),
        },
    )
    print(json.dumps(meta))


def reference_path(fixture) -> str:
    """Beside the checkpoint, not inside it: vLLM and vllm-specx load every *.safetensors of a
    checkpoint directory."""
    return str(Path(fixture).parent / (Path(fixture).name + ".reference.safetensors"))


if __name__ == "__main__":
    main()
