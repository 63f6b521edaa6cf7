"""Learning curve (issue 27, item 3): tau against training-data size for DSpark (baseline, the
full recipe, and the recipe's switches with the vanilla Markov head), our MTP (GLM-5.2 recipe: final-layer tap, KVShare, chain TV) and the EAGLE-3
baseline, every provider at the same budget (steps x batch x blocks) at every size.

Sizes are nested: size N trains on the N samples after the first `--val-samples` in the data's
order (`train --train-samples`; the validation samples are the same for every run; chat-mix's
prompt order is a seeded mix, so every prefix is representative). A run starts as soon as the
data has taps for its prefix, so training overlaps a taps pass still running. tau is measured
after training on `gen-data --for-eval` folders of prompts no draft is trained on (HumanEval,
the held-out chat-code / chat-prose sets): the teacher-forced greedy accepted length of the first
K drafts at `--anchors` random anchors per response (`train --eval-data --eval-drafts K`), which
for T = 0 is what verification accepts at those anchors (a greedy chain's inputs equal the
target's tokens wherever its drafts are accepted; the reference equals serving token for token,
`tests/e2e`). Served tau at batch 16 for the largest size is the SmolLM2 table
(`vllm-specx bench`, benchmarks/results/README.md).

`--export PROVIDER=DIR` (repeatable) copies the largest size's run of PROVIDER to DIR as a
committed draft: its tensors in bfloat16 (what `train --save-dtype bfloat16`, now in the budget
flags, writes; runs saved before that are cast here the same way), config.json, and training.json
with the command that re-trains it (`vllm-specx train --config DIR/training.json`).

Runs are resumable: a run whose training.json exists is read, not re-run, and an interrupted run
continues from its last trainer_state.pt (`train --resume`, every 100 steps). `--jobs 2` trains
two runs at once, one thread each.

    .venv/bin/python benchmarks/bench_learning_curve.py --target smollm2 \
        --data ~/.cache/vllm-specx/data/smollm2-chat-mix \
        --eval-data ~/.cache/vllm-specx/data/eval-smollm2-humaneval \
        --eval-data ~/.cache/vllm-specx/data/eval-smollm2-chat-code \
        --eval-data ~/.cache/vllm-specx/data/eval-smollm2-chat-prose \
        --sizes 704,2112,7040 --steps 300 --runs ~/.cache/vllm-specx/runs/learning-curve \
        --out benchmarks/results/learning-curve-smollm2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from vllm_specx import vocab

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import curve_provenance, plot_panels, ratio_table, write_report  # noqa: E402


# the references' loss (0.9·TV + 0.1·CE on the data's top-k), as the DSpark ablation's `loss-tv`
TV_LOSS = ["--loss", "tv", "--ce-weight", "0.1"]


def _dspark(rank: int, head: str = "vanilla", recipe: bool = False, stream: str = "none",
            tv: bool = False, layers: int = 2) -> list[str]:
    """A DSpark provider's flags, every switch spelled out (the trainer's defaults have changed
    since the earlier runs): `layers` layers (2 unless said), block 8, the anchor layout; CE, or
    with `tv` the ablation's 0.9·TV + 0.1·CE on the stored top-k."""
    switches = ["--final-layer-tap", "--per-layer-fusion", "--slot-queries"] if recipe else \
        ["--no-final-layer-tap", "--no-per-layer-fusion", "--no-slot-queries"]
    loss = TV_LOSS if tv else ["--loss", "ce"]
    return ["--method", "dspark", *loss, "--layers", str(layers), "--block-size", "8", "--markov-rank", str(rank),
            "--markov-head-type", head, "--layout", "anchor", *switches, "--next-token-stream", stream]


# Provider -> its trainer flags (`vllm-specx train`); the budget flags are common (`budget_flags`).
PROVIDERS = {
    # DSpark baseline: none of the full recipe and no next-token stream
    "dspark-baseline": _dspark(32),
    # the full recipe's three switches with the vanilla Markov head (the recipe less its recurrent head)
    "dspark-vanilla": _dspark(32, recipe=True),
    "dspark-recipe": _dspark(32, "rnn", recipe=True),
    # the DSpark ablation's winner (issue 45): the baseline + the next-token stream (added) + a wider
    # Markov head; rank 256 is `train --method dspark`'s default, rank 96 the widest whose SmolLM2
    # draft (49,152-token Markov input table) stays under the repository's 30 MB for a committed draft
    "dspark-stream-r256": _dspark(256, stream="added"),
    "dspark-stream-r96": _dspark(96, stream="added"),
    # + the TV loss, the ablation's best at 8,000 draws (win+tv), at the committable rank
    "dspark-stream-r96-tv": _dspark(96, stream="added", tv=True),
    # the same at equal serving cost to EAGLE-3 (issue 56): 4 layers, the most whose draft time per
    # pass stays within EAGLE-3's K = 7 at batch 1 and 16 in vLLM's CPU engine
    # (benchmarks/results/draft-cost-smollm2: 2 layers 16 / 60 ms, 4 layers 26 / 91, EAGLE-3 44 / 102)
    "dspark-stream-r96-l4": _dspark(96, stream="added", layers=4),
    "mtp-glm52": ["--method", "mtp", "--loss", "chain-tv", "--ce-weight", "0.1", "--kv-share", "on",
                  "--drafts", "7"],
    "eagle3": ["--method", "eagle3", "--loss", "ce", "--taps", "1,14,26", "--drafts", "7"],
}


def budget_flags(args) -> list[str]:
    return ["--steps", str(args.steps), "--batch", str(args.batch), "--seq-len", str(args.seq_len),
            "--anchors", str(args.anchors), "--lr", str(args.lr), "--threads", "1", "--dtype", "bfloat16",
            "--val-samples", str(args.val_samples), "--val-every", str(args.steps),
            "--save-every", str(min(100, args.steps)), "--seed", str(args.seed), "--eval-drafts", str(args.k),
            "--save-dtype", "bfloat16"]


def command(args, provider: str, size: int, out: Path) -> list[str]:
    evals = [x for d in args.eval_data for x in ("--eval-data", str(d))]
    return [str(Path(sys.executable).parent / "vllm-specx"), "train", *PROVIDERS[provider],
            "--target", args.target, "--data", str(args.data), "--out", str(out),
            "--train-samples", str(size), *budget_flags(args), *evals, "--resume",
            *(["--draft-vocab", str(args.draft_vocab)] if args.draft_vocab else [])]


def run_all(args) -> list[dict]:
    """Train every (provider, size) not yet trained, `--jobs` at a time (`--report-only`: none);
    the records of the finished ones."""
    from vllm_specx.training.data import load_samples

    if args.report_only:
        return rows_of(args, [(p, n) for n in sorted(args.sizes) for p in args.providers
                              if (args.runs / f"{p}-{n}" / "training.json").is_file()])

    def complete(d: Path) -> bool:  # every response of an eval folder has its taps
        return len(load_samples(d)) == sum(1 for _ in open(d / "tokens.jsonl"))

    while not all(complete(d) for d in args.eval_data):
        print("waiting for the eval folders' taps", flush=True)
        time.sleep(30)
    todo = [(p, n) for n in sorted(args.sizes) for p in args.providers]
    pending, running = list(todo), []
    args.runs.mkdir(parents=True, exist_ok=True)
    while pending or running:
        have = len(load_samples(args.data))  # samples with taps so far
        while pending and len(running) < args.jobs:
            p, n = pending[0]
            out = args.runs / f"{p}-{n}"
            if (out / "training.json").is_file():
                pending.pop(0)
                continue
            if have < args.val_samples + n:
                break  # its prefix has no taps yet: wait for the taps pass
            pending.pop(0)
            log = open(args.runs / f"{p}-{n}.log", "w")
            print(f"train {p} on {n} samples -> {out}", flush=True)
            running.append((p, n, subprocess.Popen(command(args, p, n, out), stdout=log, stderr=subprocess.STDOUT)))
        for item in list(running):
            if item[2].poll() is not None:
                running.remove(item)
                if item[2].returncode:
                    raise SystemExit(f"{item[0]} on {item[1]} samples failed: see {args.runs}/{item[0]}-{item[1]}.log")
        time.sleep(10)
    return rows_of(args, todo)


def rows_of(args, runs: list[tuple[str, int]]) -> list[dict]:
    from vllm_specx.training.trainer import command_flags

    rows = []
    for p, n in runs:
        rec = json.loads((args.runs / f"{p}-{n}" / "training.json").read_text())
        last = rec["log"][-1]
        rows.append({"provider": p, "size": n, "train_samples": rec["train_samples"],
                     "wall_s": rec["wall_s"], "val_tau_greedy": last.get("tau_greedy"),
                     "val_tau_sampled": last.get("tau_sampled"),
                     "eval": {k: {"tau": v["tau_greedy"], "tau_sampled": v.get("tau_sampled"),
                                  "acceptance_per_pos": v["val_acc_per_pos"], "blocks": v["blocks"]}
                              for k, v in rec.get("eval", {}).items()},
                     # re-rendered from the recorded arguments (older records wrote lists as one flag)
                     "command": "vllm-specx train " + command_flags(argparse.Namespace(**rec["args"]))})
    return rows


def table(rows: list[dict], sets: list[str]) -> str:
    head = "| provider | responses | " + " | ".join(f"τ {s}" for s in sets) + " | τ validation (chat-mix) | train s |"
    lines = [head, "|" + "---|" * (4 + len(sets))]
    for r in rows:
        taus = " | ".join(f"{r['eval'][s]['tau']:.3f}" if s in r["eval"] else "-" for s in sets)
        lines.append(f"| {r['provider']} | {r['size']} | {taus} | {r['val_tau_greedy']:.3f} | {r['wall_s']:.0f} |")
    lines += ratio_table(rows, sets, "size", "responses", lambda r, s: r["eval"].get(s, {}).get("tau"),
                         [p for p in PROVIDERS if p != "eagle3"],
                         "τ ratio against EAGLE-3 at equal budget (the project's goal: ≥ 1.3×):", x_format="{}")
    return "\n".join(lines)


def plot(rows: list[dict], sets: list[str], out: Path, title: str) -> None:
    plot_panels({s: {p: [(r["size"], r["eval"][s]["tau"]) for r in rows if r["provider"] == p and s in r["eval"]]
                     for p in PROVIDERS} for s in sets}, out, title, "training responses", "τ (T = 0, K = 7)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--data", type=Path, required=True, help="the training data folder (gen-data, with taps)")
    ap.add_argument("--eval-data", type=Path, action="append", required=True,
                    help="gen-data --for-eval folders (repeatable)")
    ap.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",")], default=[704, 2112, 7040])
    ap.add_argument("--providers", type=lambda t: t.split(","), default=list(PROVIDERS))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=24)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--val-samples", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-k", type=int, default=7, help="drafts per pass measured")
    ap.add_argument("--draft-vocab", type=int, default=None, help="a reduced draft vocabulary for every provider")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--runs", type=Path, required=True, help="where the runs are trained (outside the work tree)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--export", action="append", default=[], metavar="PROVIDER=DIR",
                    help="copy the largest size's run of PROVIDER to DIR as a committed draft (bf16); "
                         "with --report-only, after the report")
    ap.add_argument("--report-only", action="store_true",
                    help="train nothing: the report of the runs finished so far (a partial curve)")
    args = ap.parse_args()
    unknown = [p for p in args.providers if p not in PROVIDERS]
    if unknown:
        raise SystemExit(f"--providers: unknown {unknown} (known: {list(PROVIDERS)})")
    rows = run_all(args)
    sets = list(dict.fromkeys(s for r in rows for s in r["eval"]))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = curve_provenance(torch.device("cpu"), args, rows, budget=budget_flags(args),
                            providers={p: PROVIDERS[p] for p in args.providers})
    missing = [f"{p}-{n}" for n in args.sizes for p in args.providers
               if not any(r["provider"] == p and r["size"] == n for r in rows)]
    meta["not_run_yet"] = missing
    text = table(rows, sets) + (f"\n\nNot run yet (the curve is partial): {', '.join(missing)}" if missing else "")
    write_report({"meta": meta, "rows": rows}, args.out / "results.json", text)
    (args.out / "results.md").write_text(
        f"# Learning curve, {args.target}: τ (T = 0, K = {args.k}, teacher-forced greedy) against training data\n\n"
        f"Budget per run: {' '.join(budget_flags(args))}\n\n{text}\n")
    plot(rows, sets, args.out / "learning_curve.png",
         f"{args.target}: τ vs training responses ({args.steps} steps × batch {args.batch} each)")
    print(f"wrote {args.out}")
    for spec in args.export:
        provider, _, dest = spec.partition("=")
        if provider not in PROVIDERS or not dest:
            raise SystemExit(f"--export {spec}: give PROVIDER=DIR with PROVIDER one of {list(PROVIDERS)}")
        export(args.runs / f"{provider}-{max(args.sizes)}", Path(dest), args)


def _has_tensor(path: Path, name: str) -> bool:
    from vllm_specx.checkpoint import read_header

    return name in read_header(path)


def export(run: Path, dest: Path, args, curve: str = "benchmarks/bench_learning_curve.py") -> None:
    """`run` (a finished training run) as a committed draft in `dest`: tensors cast to bfloat16
    (floating ones; maps stay integer), config.json's torch_dtype said so, training.json with
    the portable command and paths (`~/.cache/...`, `--save-dtype bfloat16`) that re-train it."""
    from safetensors.torch import load_file, save_file

    if not (run / "training.json").is_file():
        raise SystemExit(f"--export: {run} has not finished (no training.json)")
    dest.mkdir(parents=True, exist_ok=True)
    for f in dest.iterdir():
        if f.is_file():
            f.unlink()
    for f in sorted(run.glob("*.safetensors")):
        tensors = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
                   for k, v in load_file(str(f)).items()}
        save_file(tensors, str(dest / f.name))
    config = json.loads((run / "config.json").read_text())
    if "torch_dtype" in config:
        config["torch_dtype"] = "bfloat16"
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # a reduced draft vocabulary's lm_head rows are the target's, frozen in training: left out
    # of the committed file when they are exactly those rows (`vocab.omit_target_head`)
    if _has_tensor(dest, vocab.D2T):
        from vllm_specx.targets import resolve
        from vllm_specx.training.taps import embed_and_head, load_target

        if vocab.omit_target_head(dest, embed_and_head(load_target(resolve(args.target)))[1]):
            print(f"{dest}: lm_head rows left out (the target's rows at d2t; lm_head_from_target)")
    home = str(Path.home())
    # every machine path in the record (arguments, the data's commands) as `~/...`
    rec = json.loads((run / "training.json").read_text().replace(home, "~"))
    rec["args"]["save_dtype"] = "bfloat16"
    rec["args"]["resume"] = False
    from vllm_specx.training.trainer import command_flags

    rec["command"] = "vllm-specx train " + command_flags(argparse.Namespace(**rec["args"]))
    rec["exported"] = {"from": str(run).replace(home, "~"), "tensors": "bfloat16",
                       "reproduce": f"vllm-specx train --config {dest}/training.json, or the "
                                    f"curve's command ({curve})"}
    (dest / "training.json").write_text(json.dumps(rec, indent=1) + "\n")
    size = sum(f.stat().st_size for f in dest.iterdir()) / 2**20
    print(f"exported {run.name} -> {dest} ({size:.1f} MB)")


if __name__ == "__main__":
    main()
