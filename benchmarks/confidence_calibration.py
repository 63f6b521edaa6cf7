"""Calibration of a DSpark draft's confidence head on held-out on-policy data: does p_k, the head's
probability that draft slot k is accepted given slots < k were, match how often it is?

    python benchmarks/confidence_calibration.py --draft assets/drafts/smollm2-dspark-conf \
        --target smollm2 --data runs/smollm2-data-recipe --samples 64 \
        --out benchmarks/results/confidence-smollm2

Held-out samples: when `--data` is the folder the draft's confidence head was trained on (its
training.json's `data`), the trainer's validation split of it, re-drawn from the record
(`trainer.usable` + `trainer.split` with the run's `--unseen-by`, `--seed` and `--val-samples`;
checked against the record's `val_prompt_ids`), never a training sample; any other data folder
is used whole, and must not be one a draft of the warm-start chain (`--init-from`, recursively)
was trained on. Samples whose prompts an earlier draft of the chain was trained on are dropped
(`--keep-seen` keeps them; the report counts them either way): a draft accepts more on prompts it
has seen, which is not what serving meets. Data made from an evaluation prompt set is refused.

Every held-out sample is cropped as the trainer crops (`--seq-len` of the run, starting half a
crop before the answer) and gets a block at every `--stride`-th anchor of its answer; each block is
the trainer's teacher-forced forward (previous tokens the target's), so slot k's realised
acceptance c_k = [draft k == the target's greedy token] is the acceptance of draft k given drafts
< k were accepted (`training.losses.confidence_labels`), and p_k = sigmoid(confidence logit).

The calibration is over the slots a greedy-verified block reaches (slot k of blocks whose drafts
< k were all accepted; `training.losses.confidence_weights`): that is the population p_k speaks
about, and the one serving meets. The same numbers over every valid slot are reported too
(`all_slots`): acceptance runs in streaks, so the rate over all blocks is lower at later slots.

Numbers: Brier = mean (p - c)^2; ECE = sum_b (n_b / n) |mean p_b - mean c_b| over 10 equal-width
bins; BCE; the same for two constant predictors as yardsticks (one rate for every slot, and one
rate per slot position, both the held-out set's own realised rates: the best any constant can do
there). Survival check, per block with all N slots in the sequence: the predicted accepted
drafts sum_k prod_{i<=k} p_i, with p as the proposer has it before verification (previous token
= its own draft; `drafted_confidence`), against the realised sum_k prod_{i<=k} c_i (the drafts
greedy verification accepts); per slot, the predicted survival prod_{i<=k} p_i against the
realised fraction of blocks whose drafts 0..k all pass.

Writes to `--out`: results.json (provenance, every number), results.md (the tables),
reliability.png (reliability diagram over a histogram of p) and survival.png (per-slot mean p vs
realised acceptance, survival, predicted vs realised accepted drafts per block).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing the package
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

BINS = 10


# ---- which samples are held out -----------------------------------------------------------------

def _record(draft_dir: Path) -> dict | None:
    f = Path(draft_dir) / "training.json"
    return json.loads(f.read_text()) if f.is_file() else None


def _same(a, b) -> bool:
    return a is not None and Path(a).resolve() == Path(b).resolve()


def _chain(draft_dir: Path) -> list[tuple[str, dict]]:
    """(draft, its training record) for the draft and every draft it was warm-started from."""
    out, d = [], str(draft_dir)
    while d and len(out) < 8:
        rec = _record(Path(d))
        if rec is None:
            break
        out.append((d, rec))
        d = rec["args"].get("init_from")
    return out


def held_out(draft_dir: Path, data_dir: Path, samples: int, drop_seen: bool = True):
    """(the held-out samples, a dict saying how they were chosen, the data's meta). See the module
    docstring; also drops (`drop_seen`; else counts) samples whose prompt an earlier draft of the
    warm-start chain was trained on (`data.trained_prompt_ids`), as `--unseen-by` does in training."""
    from vllm_specx import assets
    from vllm_specx.training.data import load_samples, trained_prompt_ids
    from vllm_specx.training.trainer import split, usable

    meta = json.loads((Path(data_dir) / "meta.json").read_text())
    prompts = str(meta.get("prompts", ""))
    name = Path(prompts).stem if prompts.endswith(".jsonl") else prompts
    if assets.PROMPT_SETS.get(name, (None, None))[1] == "eval":
        raise SystemExit(f"--data {data_dir}: made from the evaluation set {prompts!r}; calibrate on "
                         "held-out training data (the trainer's validation split)")
    store = load_samples(Path(data_dir))
    chain = _chain(draft_dir)
    if not chain:
        raise SystemExit(f"--draft {draft_dir}: no training.json, so which samples it saw is unknown")
    args = chain[0][1]["args"]
    if _same(args.get("data"), data_dir):
        pool = usable(store, meta, args.get("unseen_by"))
        val, _ = split(len(pool), int(args["val_samples"]), random.Random(int(args["seed"])))
        idx = [pool[i] for i in val]
        recorded = chain[0][1].get("val_prompt_ids")
        if recorded is not None and recorded != [store.index[i][1] for i in idx]:
            raise SystemExit(f"--data {data_dir}: the re-drawn validation split is not the one the run "
                             "recorded (the data changed since?)")
        how = (f"the validation split of the draft's training run (trainer.split, seed {args['seed']}, "
               f"{args['val_samples']} held back" + (f", samples unseen by {args['unseen_by']}" if args.get("unseen_by") else "")
               + ")")
        earlier = chain[1:]
    else:
        seen = [d for d, rec in chain if _same(rec["args"].get("data"), data_dir)]
        if seen:
            raise SystemExit(f"--data {data_dir}: {seen[0]} was trained on it (give its training data "
                             "to use the validation split, or data it never saw)")
        idx, how, earlier = list(range(len(store))), "a data folder no draft of the chain was trained on", chain
    seen = set()
    for _, rec in earlier:
        got = trained_prompt_ids(rec)
        if got is not None and got[0] == meta.get("prompts"):
            seen |= got[1]
    n_seen = sum(store.index[i][1] in seen for i in idx)
    if drop_seen:
        idx = [i for i in idx if store.index[i][1] not in seen]
    if samples > len(idx):
        raise SystemExit(f"--samples {samples}: only {len(idx)} held-out samples ({how}"
                         + (f"; {n_seen} more whose prompts an earlier draft was trained on" if drop_seen and n_seen else "")
                         + ")")
    idx = idx[:samples]
    info = {"data": str(data_dir), "data_prompts": prompts, "how": how,
            ("dropped_as_seen_by_earlier_drafts" if drop_seen else "kept_though_seen_by_earlier_drafts"): n_seen,
            "used_seen_by_earlier_drafts": sum(store.index[i][1] in seen for i in idx), "sample_indices": idx,
            "prompt_ids": [store.index[i][1] for i in idx],
            "training_chain": [{"draft": d, "data": rec["args"].get("data"),
                                "data_prompts": (rec.get("data") or {}).get("prompts")} for d, rec in chain]}
    return store.subset(idx), info, meta


# ---- predictions and labels ---------------------------------------------------------------------

def sample_blocks(sample: dict, seq_len: int, stride: int) -> tuple[dict, list[int]]:
    """The trainer's crop of one sample (`blocks.make_batch`'s, with the start at its lowest
    choice, half a crop before the answer) and every `stride`-th anchor of its answer part."""
    total, p = len(sample["ids"]), sample["prompt_len"]
    start = min(max(0, p - seq_len // 2), max(0, total - seq_len))
    crop = {k: sample[k][start:start + seq_len] for k in ("ids", "taps", "topk_ids", "topk_logp") if k in sample}
    lo, hi = max(1, p - 1 - start), min(total - start, seq_len) - 2
    return crop, list(range(lo, hi + 1, stride))


@torch.no_grad()
def predict(draft, store, data_taps: list[int], seq_len: int, stride: int = 1, chunk: int = 48):
    """(p, p_drafted, c, valid), each [blocks, N] float over the blocks of all held-out samples:
    the head's probability on the teacher-forced block (previous tokens the target's), the same
    as the proposer has it before verification (previous tokens its own drafts:
    `drafted_confidence`; equal to p on every slot a block reaches), the realised greedy
    acceptance, and 1 where slot k's target is inside the sequence."""
    from vllm_specx.methods.dspark import train as dspark_train
    from vllm_specx.training.blocks import assemble
    from vllm_specx.training.losses import IGNORE, confidence_labels
    from vllm_specx.training.taps import select_taps

    c = draft.cfg
    slices, ht = [list(data_taps).index(t) for t in c.target_layer_ids], c.target_hidden_size
    ps, ds, cs, vs = [], [], [], []
    for s in store:
        crop, anchors = sample_blocks(s, seq_len, stride)
        for i in range(0, len(anchors), chunk):
            b = assemble([crop], [anchors[i:i + chunk]], len(crop["ids"]), c.max_drafts, c.mask_token_id,
                         q=c.block_size)
            if slices != list(range(b["taps"].shape[-1] // ht)):
                b["taps"] = select_taps(b["taps"], slices, ht)
            b["chain_tokens"] = "target"
            out = dspark_train.forward(draft, b)
            n = out.targets.shape[-1]
            ps.append(torch.sigmoid(out.confidence.float()).reshape(-1, n))
            ds.append(torch.sigmoid(dspark_train.drafted_confidence(draft, b).float()).reshape(-1, n))
            cs.append(confidence_labels(out, "greedy").float())
            vs.append((out.targets.reshape(-1, n) != IGNORE).float())
    return torch.cat(ps), torch.cat(ds), torch.cat(cs), torch.cat(vs)


# ---- the numbers --------------------------------------------------------------------------------

def _bce(p: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    p = p.double().clamp(1e-7, 1 - 1e-7)
    return -(c * p.log() + (1 - c) * (1 - p).log())


def reliability(p: torch.Tensor, c: torch.Tensor, bins: int = BINS) -> list[dict]:
    """Equal-width bins of p (the last one closed): count, mean p, realised rate."""
    idx = (p * bins).long().clamp(max=bins - 1)
    rows = []
    for b in range(bins):
        m = idx == b
        n = int(m.sum())
        rows.append({"lo": b / bins, "hi": (b + 1) / bins, "count": n,
                     "mean_p": float(p[m].mean()) if n else None, "rate": float(c[m].mean()) if n else None})
    return rows


def calibration(p: torch.Tensor, c: torch.Tensor, mask: torch.Tensor, bins: int = BINS) -> dict:
    """Brier, ECE, BCE, the reliability bins and two constant yardsticks, over the slots in `mask`."""
    m = mask.bool()
    pv, cv = p[m], c[m]
    rel = reliability(pv, cv, bins)
    n = len(pv)
    base = float(cv.mean())
    rate = (c * m).sum(0) / m.sum(0).clamp(min=1)
    slot_const = rate.expand_as(p)[m]
    return {
        "slots": n, "brier": float(((pv - cv) ** 2).mean()),
        "ece": sum(r["count"] / n * abs(r["mean_p"] - r["rate"]) for r in rel if r["count"]),
        "bce": float(_bce(pv, cv).mean()), "mean_p": float(pv.mean()), "realised": base,
        "constant": {"p": base, "brier": float(((base - cv) ** 2).mean()),
                     "bce": float(_bce(torch.full_like(cv, base), cv).mean())},
        "per_slot_constant": {"p": rate.tolist(), "brier": float(((slot_const - cv) ** 2).mean()),
                              "bce": float(_bce(slot_const, cv).mean())},
        "per_slot": {"count": m.sum(0).long().tolist(),
                     "mean_p": ((p * m).sum(0) / m.sum(0).clamp(min=1)).tolist(),
                     "realised": rate.tolist(),
                     "brier": (((p - c) ** 2 * m).sum(0) / m.sum(0).clamp(min=1)).tolist()},
        "reliability": rel,
    }


def metrics(p: torch.Tensor, c: torch.Tensor, valid: torch.Tensor, p_drafted: torch.Tensor | None = None,
            bins: int = BINS) -> dict:
    """Every number of the report (see the module docstring). The calibration is over the slots
    a greedy-verified block reaches (slot k where drafts < k were accepted: p_k claims the
    acceptance given that), with the same over every valid slot under `all_slots`; the survival
    check uses `p_drafted` (what serving multiplies; default p) on blocks with all N slots."""
    from vllm_specx.training.losses import confidence_weights

    p, c, valid = p.double(), c.double(), valid.double()
    pd = p if p_drafted is None else p_drafted.double()
    reached = confidence_weights(c, valid) > 0
    full = valid.all(-1)
    pred_len = torch.cumprod(pd[full], -1).sum(-1)
    real_len = torch.cumprod(c[full], -1).sum(-1)
    corr = float(torch.corrcoef(torch.stack([pred_len, real_len]))[0, 1]) if len(pred_len) > 1 else None
    return {
        **calibration(p, c, reached, bins), "blocks": int(valid.shape[0]), "full_blocks": int(full.sum()),
        "all_slots": calibration(p, c, valid, bins),
        "drafted_equals_teacher_forced_on_reached": float((pd - p)[reached].abs().max()) if reached.any() else None,
        "survival": {"predicted": torch.cumprod(pd[full], -1).mean(0).tolist(),
                     "realised": torch.cumprod(c[full], -1).mean(0).tolist()},
        "accepted_length": {"predicted_mean": float(pred_len.mean()) if len(pred_len) else None,
                            "realised_mean": float(real_len.mean()) if len(real_len) else None,
                            "mean_abs_error": float((pred_len - real_len).abs().mean()) if len(pred_len) else None,
                            "correlation": corr,
                            "by_predicted": _length_bins(pred_len, real_len, p.shape[-1])},
    }


def _length_bins(pred: torch.Tensor, real: torch.Tensor, n: int) -> list[dict]:
    """Blocks grouped by predicted accepted length (unit-wide bins 0..N): mean predicted, mean realised."""
    rows = []
    for lo in range(n + 1):
        m = (pred >= lo) & (pred < lo + 1) if lo < n else pred >= n
        k = int(m.sum())
        if k:
            rows.append({"lo": lo, "count": k, "predicted": float(pred[m].mean()), "realised": float(real[m].mean())})
    return rows


# ---- the report ---------------------------------------------------------------------------------

def _f(x, nd=3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def table(res: dict) -> str:
    m, a_ = res["metrics"], res["metrics"]["all_slots"]
    s, sa = m["per_slot"], a_["per_slot"]
    row = lambda name, d, ece: (f"| {name} | {_f(d['brier'], 4)} | {ece} | {_f(d['bce'], 4)} |")  # noqa: E731
    lines = [
        f"Reached slots (slot k of blocks whose drafts < k were all accepted: what p_k claims; "
        f"{m['slots']} slots):", "",
        "| predictor | Brier | ECE | BCE |", "|---|---|---|---|",
        row("confidence head", m, _f(m["ece"], 4)),
        row(f"constant (held-out rate {m['constant']['p']:.3f})", m["constant"], "0"),
        row("per-slot constant (held-out rates)", m["per_slot_constant"], "-"),
        "", f"Every valid slot, teacher-forced ({a_['slots']} slots): head Brier {_f(a_['brier'], 4)}, "
        f"ECE {_f(a_['ece'], 4)}, BCE {_f(a_['bce'], 4)}; constant Brier {_f(a_['constant']['brier'], 4)}.",
        "", "| slot k | " + " | ".join(str(k) for k in range(len(s["mean_p"]))) + " |",
        "|---|" + "---|" * len(s["mean_p"]),
        "| reached blocks | " + " | ".join(str(x) for x in s["count"]) + " |",
        "| mean predicted p_k (reached) | " + " | ".join(_f(x) for x in s["mean_p"]) + " |",
        "| realised acceptance (reached) | " + " | ".join(_f(x) for x in s["realised"]) + " |",
        "| Brier (reached) | " + " | ".join(_f(x) for x in s["brier"]) + " |",
        "| mean p_k, every block | " + " | ".join(_f(x) for x in sa["mean_p"]) + " |",
        "| realised, every block (teacher-forced) | " + " | ".join(_f(x) for x in sa["realised"]) + " |",
        "| predicted survival prod p (as drafted) | " + " | ".join(_f(x) for x in m["survival"]["predicted"]) + " |",
        "| realised survival | " + " | ".join(_f(x) for x in m["survival"]["realised"]) + " |",
    ]
    a = m["accepted_length"]
    lines += ["", f"Accepted drafts per block ({m['full_blocks']} blocks with all slots in the sequence): "
              f"predicted sum_k prod_(i<=k) p_i = {_f(a['predicted_mean'])} (p as the proposer has it before "
              f"verification), realised {_f(a['realised_mean'])}; mean |error| per block "
              f"{_f(a['mean_abs_error'])}, correlation {_f(a['correlation'])}.",
              "", "| reliability bin (reached slots) | count | mean p | realised |", "|---|---|---|---|"]
    lines += [f"| {r['lo']:.1f}-{r['hi']:.1f} | {r['count']} | {_f(r['mean_p'])} | {_f(r['rate'])} |"
              for r in m["reliability"]]
    return "\n".join(lines)


def figures(res: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m, title = res["metrics"], res["title"]
    rel = [r for r in m["reliability"] if r["count"]]
    fig, (ax, hx) = plt.subplots(2, 1, figsize=(5.2, 6.4), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0, 1], [0, 1], color="tab:gray", ls="--", lw=1, label="perfect calibration")
    ax.plot([r["mean_p"] for r in rel], [r["rate"] for r in rel], "o-", color="tab:blue", label="confidence head")
    for r in m["reliability"]:
        if r["count"]:
            ax.bar((r["lo"] + r["hi"]) / 2, r["rate"], width=r["hi"] - r["lo"], color="tab:blue", alpha=0.15,
                   edgecolor="tab:blue", lw=0.5)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("realised acceptance")
    ax.set_title(f"{title}\nreached slots: Brier {m['brier']:.4f} (constant {m['constant']['brier']:.4f}), "
                 f"ECE {m['ece']:.4f}", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    hx.bar([(r["lo"] + r["hi"]) / 2 for r in m["reliability"]], [r["count"] for r in m["reliability"]],
           width=1 / len(m["reliability"]), color="tab:gray", edgecolor="white")
    hx.set_xlabel("predicted p (10 bins)")
    hx.set_ylabel("slots")
    fig.tight_layout()
    fig.savefig(out / "reliability.png", dpi=110)
    plt.close(fig)

    s, sv, a = m["per_slot"], m["survival"], m["accepted_length"]
    k = list(range(len(s["mean_p"])))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    sa = m["all_slots"]["per_slot"]
    axes[0].plot(k, s["realised"], "o-", color="tab:orange", label="realised, reached blocks")
    axes[0].plot(k, s["mean_p"], "s--", color="tab:blue", label="mean p, reached blocks")
    axes[0].plot(k, sa["realised"], "o:", color="tab:orange", alpha=0.5, label="realised, every block")
    axes[0].plot(k, sa["mean_p"], "s:", color="tab:blue", alpha=0.5, label="mean p, every block")
    axes[0].set_title("per slot: P(accept k | drafts < k accepted)", fontsize=9)
    axes[1].plot(k, sv["realised"], "o-", color="tab:orange", label="realised")
    axes[1].plot(k, sv["predicted"], "s--", color="tab:blue", label="predicted prod p (as drafted)")
    axes[1].set_title("survival: P(drafts 0..k all accepted)", fontsize=9)
    for x in axes[:2]:
        x.set_xlabel("draft slot k")
        x.set_ylim(0, 1)
        x.legend(fontsize=8)
    lb = a["by_predicted"]
    n = len(k)
    axes[2].plot([0, n], [0, n], color="tab:gray", ls="--", lw=1)
    axes[2].plot([r["predicted"] for r in lb], [r["realised"] for r in lb], "o-", color="tab:blue")
    for r in lb:
        axes[2].annotate(str(r["count"]), (r["predicted"], r["realised"]), fontsize=7,
                         textcoords="offset points", xytext=(3, -9))
    axes[2].set_xlabel("predicted accepted drafts sum_k prod p (binned)")
    axes[2].set_ylabel("realised accepted drafts")
    axes[2].set_title(f"per block: mean predicted {a['predicted_mean']:.2f}, realised {a['realised_mean']:.2f}",
                      fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "survival.png", dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draft", required=True, type=Path, help="a DSpark draft with a confidence head")
    ap.add_argument("--target", required=True, help="a target name (e.g. smollm2) or a model directory")
    ap.add_argument("--data", required=True, type=Path, help="on-policy data (`vllm-specx gen-data`)")
    ap.add_argument("--samples", type=int, default=32, help="held-out samples to use")
    ap.add_argument("--out", type=Path, default=None, help="folder for results.json/.md and the PNGs")
    ap.add_argument("--stride", type=int, default=1, help="a block at every STRIDE-th anchor of an answer")
    ap.add_argument("--seq-len", type=int, default=None, help="crop length (default: the training run's)")
    ap.add_argument("--keep-seen", action="store_true",
                    help="keep held-out samples whose prompts an earlier draft of the warm-start chain "
                         "was trained on (default: drop them; either way the report counts them)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    from vllm_specx.methods.dspark.checkpoint import load_draft
    from vllm_specx.targets import resolve
    from vllm_specx.training.taps import embed_and_head, load_target

    from _report import provenance, write_report

    torch.set_num_threads(args.threads)
    t0 = time.time()
    store, info, meta = held_out(args.draft, args.data, args.samples, not args.keep_seen)
    rec = _record(args.draft)
    seq_len = args.seq_len or int(rec["args"].get("seq_len", 256))
    target = load_target(resolve(args.target))
    draft = load_draft(args.draft, *embed_and_head(target)).eval()
    del target
    if draft.cfg.confidence_head is None:
        raise SystemExit(f"--draft {args.draft}: no confidence head (train one with --confidence-head)")
    p, p_drafted, c, valid = predict(draft, store, meta["taps"], seq_len, args.stride)
    res = {"title": args.title or f"{Path(args.draft).name} confidence head, held-out {Path(args.data).name}",
           "meta": provenance(torch.device("cpu"), args, wall_s=round(time.time() - t0, 1),
                              draft_config=draft.cfg.to_dict(), seq_len=seq_len),
           "held_out": info, "metrics": metrics(p, c, valid, p_drafted)}
    out = args.out
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        figures(res, out)
        md = (f"# {res['title']}\n\n{len(store)} held-out samples ({info['how']}) of `{info['data']}` "
              f"(prompts `{info['data_prompts']}`), {res['metrics']['blocks']} blocks (one at "
              + ("every anchor" if args.stride == 1 else f"every {args.stride}th anchor")
              + f" of the answers, crop {seq_len}); realised acceptance = the teacher-forced greedy "
              "draft equals the target's greedy token.\n\n"
              + table(res) + "\n\n![reliability](reliability.png)\n\n![survival](survival.png)\n")
        (out / "results.md").write_text(md)
    write_report(res, None if out is None else out / "results.json", table(res))
    return res


if __name__ == "__main__":
    main()
