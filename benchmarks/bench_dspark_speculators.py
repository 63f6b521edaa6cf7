"""DSpark: speculators 0.9.0's own trainer against ours, on the same data and budget (issue 36 item 6).

Steps (each skips itself when its output exists; state under ~/.cache/vllm-specx/runs/dspark-vs-speculators):

  prepare  our chat-mix data folder -> speculators' format: `speculators prepare-data` on our token
           ids (loss_mask = 1 on the answer tokens), then hidden_states/hs_{i}.safetensors from our
           stored taps. Our taps are layers 1,14,26,29 (0-based: the residual after that layer), i.e.
           aux ids 2,15,27 = speculators' default [2, n//2, n-3] for n = 30, and layer 29's output is
           the pre-final-norm last hidden state speculators wants in the last slot: no recompute.
           Stored bf16 (speculators' collator casts to --hidden-states-dtype).
  train    `python -m speculators.train` (through the CPU wrapper of shared/research/speculators-cpu.md)
           with speculators' DSpark defaults; only the CPU flags and the budget (one epoch over N
           sequences) are set.
  ours     (optional) our trainer with speculators' default architecture, same number of sequences.
  eval     each draft through our loader/proposer: `vllm-specx train --steps 0 --init-from CKPT ...
           --eval-data <three held-out sets>`, the served-tau walk (K = 7, T = 0).
  report   JSON + markdown under benchmarks/results/dspark-vs-speculators-smollm2/.

  .venv/bin/python benchmarks/bench_dspark_speculators.py all --train-seqs 600   # prepare, train, eval, report
  .venv/bin/python benchmarks/bench_dspark_speculators.py ours --train-seqs 600 --ours-arch specarch [--ours-batch 32]
  .venv/bin/python benchmarks/bench_dspark_speculators.py ours --train-seqs 600 --ours-arch baseline
  .venv/bin/python benchmarks/bench_dspark_speculators.py report --train-seqs 600

Needs the speculators venv: ~/.cache/vllm-specx/venv-speculators, an overlay on .venv (a .pth line to
.venv's site-packages) with `pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0` and
`pip install datasets==5.1.0` (see benchmarks/results/dspark-vs-speculators-smollm2/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("VLLM_SPECX_CACHE", Path.home() / ".cache/vllm-specx"))
VENV = CACHE / "venv-speculators"
DATA = CACHE / "data/smollm2-chat-mix"
TARGET = CACHE / "targets/smollm2-135m-instruct"
EVALS = [CACHE / f"data/eval-smollm2-{n}" for n in ("humaneval", "chat-code", "chat-prose")]
RUNS = CACHE / "runs/dspark-vs-speculators"
RESULTS = REPO / "benchmarks/results/dspark-vs-speculators-smollm2"
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_compute_curve import served_eval  # noqa: E402
# The comparison's reference: the record of the 2,400-draw DSpark baseline that was
# assets/drafts/smollm2-dspark until 2026-12-05 (its weights: that commit's tree); its arguments
# are the base of our runs here (`train --config`), so a re-run trains what the table reports.
BASELINE = RESULTS / "baseline"
BASELINE_EVAL = CACHE / "runs/compute-curve-cpu/committed-dspark-baseline-smollm2-dspark/training.json"
OUR_VAL = 32  # our trainer's first 32 samples (data order) validate: never trained on here
N_VAL = 48    # speculators' validation split (its trainer needs one)

CPU_WRAPPER = '''\
import torch
torch.set_num_threads(1)
import speculators.train.trainer as _tr
if not torch.accelerator.is_available():
    _tr.get_local_rank = lambda: "cpu"
    torch.accelerator.synchronize = lambda *a, **k: None
from speculators.train.cli import main
from speculators.train.config import TrainConfig
if __name__ == "__main__":   # DataLoader workers use 'spawn'
    main(TrainConfig.resolve())
'''

# speculators 0.9.0 DSpark defaults (train/config/schema.py), as our trainer's flags: 5 Qwen3 layers,
# block 8 drafting from the anchor, vanilla Markov head rank 256, confidence head on [h; W1[prev]],
# sliding_attention layers (window 2048, causal inside the block).
SPEC_ARCH = ["--layers", "5", "--block-size", "8", "--layout", "anchor", "--markov-rank", "256",
             "--markov-head-type", "vanilla", "--causal", "--sliding-window", "2048",
             "--confidence-head", "hidden+markov"]
OUR_RECIPE_OFF = ["--no-final-layer-tap", "--no-per-layer-fusion", "--no-slot-queries"]


def env1() -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
             HF_DATASETS_CACHE=str(CACHE / "hf-datasets-cache"), TOKENIZERS_PARALLELISM="false")
    return e


def run(cmd: list[str], log: Path, cwd: Path | None = None) -> float:
    log.parent.mkdir(parents=True, exist_ok=True)
    print("$ " + shlex.join(cmd), flush=True)
    t = time.time()
    with open(log, "w") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env1(), cwd=cwd).returncode
    wall = time.time() - t
    if rc:
        raise SystemExit(f"failed (rc {rc}) after {wall:.0f} s, see {log}")
    print(f"  done in {wall:.0f} s ({log})", flush=True)
    return wall


def data_dir(n: int) -> Path:
    return RUNS / f"spec-data-{n}"


def prepare(n: int) -> None:
    """Our data folder's first samples (data order, our validation samples skipped) in speculators'
    format: N_VAL + n rows, speculators' split sending the first n (after its shuffle) to training."""
    import torch
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    from vllm_specx.training.data import load_samples

    out = data_dir(n)
    done = out / "prepared.json"
    if done.is_file():
        print(f"prepare: {out} exists")
        return
    taps = json.loads((DATA / "meta.json").read_text())["taps"]
    if list(taps) != [1, 14, 26, 29]:  # aux ids 2, 15, 27 (speculators' default for 30 layers) + the last layer
        raise SystemExit(f"prepare: {DATA} has taps {taps}; this conversion needs layers 1,14,26,29")
    store = load_samples(DATA)
    order = sorted(range(len(store)), key=lambda i: store.index[i][1])  # by sample id
    chosen = [i for i in order if store.index[i][1] >= OUR_VAL][: n + N_VAL]
    if len(chosen) < n + N_VAL:
        raise SystemExit(f"prepare: only {len(chosen)} samples with taps in {DATA}, need {n + N_VAL}")
    out.mkdir(parents=True, exist_ok=True)
    rows = out / "samples.jsonl"
    by_ids = {}  # token ids -> sample, to match speculators' shuffled rows back
    with open(rows, "w") as f:
        for i in chosen:
            s = store[i]
            ids, p = s["ids"].tolist(), s["prompt_len"]
            by_ids.setdefault(tuple(ids), i)
            f.write(json.dumps({"input_ids": ids, "loss_mask": [0] * p + [1] * (len(ids) - p),
                                "specx_id": store.index[i][1]}) + "\n")
    ds = out / "dataset"
    wall = run([str(VENV / "bin/speculators"), "prepare-data", "--model", str(TARGET), "--data", str(rows),
                "--output", str(ds), "--num-preprocessing-workers", "1", "--seed", "0"], out / "prepare-data.log")
    # hidden states, in the prepared (shuffled) order, matched by token ids
    order_file = out / "prepared_ids.jsonl"  # the prepared (shuffled) rows' token ids, read in speculators' venv
    subprocess.run([str(VENV / "bin/python"), "-c",
                    "import sys, json; from datasets import load_from_disk; d = load_from_disk(sys.argv[1]).with_format(None); "
                    "f = open(sys.argv[2], 'w'); [f.write(json.dumps(list(r)) + chr(10)) for r in d['input_ids']]",
                    str(ds), str(order_file)], check=True, env=env1())
    prepared = [json.loads(line) for line in open(order_file)]
    hs = ds / "hidden_states"
    hs.mkdir(exist_ok=True)
    used = []
    for r in range(len(prepared)):
        ids = prepared[r]
        i = by_ids[tuple(ids)]
        s = store[i]
        taps = s["taps"]
        T = len(ids)
        assert taps.shape[0] >= T, (taps.shape, T)
        h = taps[:T].reshape(T, 4, -1).to(torch.bfloat16).contiguous()  # slots: layers 1,14,26 | 29
        save_file({"token_ids": torch.tensor(ids, dtype=torch.long), "hidden_states": h},
                  str(hs / f"hs_{r}.safetensors"))
        used.append(store.index[i][1])
    ratio = (n + 0.5) / len(prepared)
    meta = {"train_seqs": n, "val_seqs": len(prepared) - n, "rows": len(prepared), "train_data_ratio": ratio,
            "train_ids": sorted(used[:n]), "val_ids": sorted(used[n:]), "prepare_data_wall_s": round(wall, 1),
            "taps": "layers 1,14,26 (aux ids 2,15,27) + layer 29 pre-norm, bf16"}
    done.write_text(json.dumps(meta))
    print(f"prepare: {len(prepared)} rows, {n} train")


def spec_run(n: int, tag: str = "") -> Path:
    return RUNS / f"speculators-dspark-{n}{tag}"


def spec_train_cmd(n: int, save: Path, extra: list[str] = ()) -> list[str]:
    meta = json.loads((data_dir(n) / "prepared.json").read_text())
    return [str(VENV / "bin/python"), str(RUNS / "train_cpu.py"),
            "--speculator-type", "dspark", "--verifier-name-or-path", str(TARGET),
            "--data-path", str(data_dir(n) / "dataset"), "--save-path", str(save),
            "--epochs", "1", "--train-data-ratio", repr(meta["train_data_ratio"]),
            # what the CPU needs (shared/research/speculators-cpu.md)
            "--num-workers", "0", "--on-missing", "raise", "--draft-attn-impl", "sdpa",
            "--loss-implementation", "eager", "--hidden-states-dtype", "float32",
            "--log-freq", "5", "--seed", "0", *extra]


def spec_train(n: int, extra: list[str], tag: str) -> None:
    d = spec_run(n, tag)
    if (d / "done.json").is_file():
        print(f"train: {d} exists")
        return
    RUNS.mkdir(parents=True, exist_ok=True)
    (RUNS / "train_cpu.py").write_text(CPU_WRAPPER)
    cmd = spec_train_cmd(n, d / "ckpt", extra)
    d.mkdir(parents=True, exist_ok=True)
    wall = run(cmd, d / "train.log", cwd=d)
    (d / "done.json").write_text(json.dumps({"command": shlex.join(cmd), "wall_s": round(wall, 1)}))


def spec_ckpt(n: int, tag: str = "") -> Path:
    ck = spec_run(n, tag) / "ckpt"
    epochs = sorted((p for p in ck.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    return epochs[-1]


def ours_run(n: int, arch: str, batch: int = 8) -> Path:
    return RUNS / (f"ours-{arch}-{n}" + (f"-b{batch}" if batch != 8 else ""))


def ours_train(n: int, arch: str, batch: int, extra: list[str], pool: int) -> None:
    d = ours_run(n, arch, batch)
    if (d / "training.json").is_file():
        print(f"ours: {d} exists")
        return
    steps = -(-n // batch)  # at least n sequences
    # specarch: speculators' DSpark architecture and loss (KL to the target's distribution: ours
    # over its stored top-32) and mask token (2: the tokenizer has none, speculators falls back to
    # pad = eos); our trainer's optimiser, schedule, anchors (24 a sequence) and crops stay.
    flags = (SPEC_ARCH + ["--mask-token-id", "2", "--loss", "kl", "--confidence-weight", "1.0",
                          "--confidence-label", "soft", "--confidence-slots", "all"]) if arch == "specarch" else []
    cmd = [sys.executable, "-m", "vllm_specx.cli", "train", "--config", str(BASELINE / "training.json"),
           "--target", "smollm2", "--data", str(DATA), "--out", str(d), "--steps", str(steps), "--batch", str(batch),
           "--val-every", str(steps), "--save-every", str(steps), "--threads", "1", "--device", "cpu",
           "--train-samples", str(pool),
           *OUR_RECIPE_OFF, *flags, *extra, *[x for e in EVALS for x in ("--eval-data", str(e))], "--eval-drafts", "7"]
    run(cmd, RUNS / f"{d.name}.log", cwd=REPO)


def evaluate(src: Path, dest: Path, arch_flags: list[str]) -> None:
    if (dest / "training.json").is_file():
        print(f"eval: {dest} exists")
        return
    cmd = [sys.executable, "-m", "vllm_specx.cli", "train", "--config", str(BASELINE / "training.json"),
           "--target", "smollm2", "--data", str(DATA), "--out", str(dest), "--steps", "0",
           "--init-from", str(src), "--train-samples", "1", "--eval-drafts", "7", "--threads", "1",
           "--device", "cpu", *OUR_RECIPE_OFF, *arch_flags, *[x for e in EVALS for x in ("--eval-data", str(e))]]
    run(cmd, dest.parent / f"{dest.name}.log", cwd=REPO)


def spec_arch_flags(ckpt: Path) -> list[str]:
    cfg = json.loads((ckpt / "config.json").read_text())
    # --confidence-weight: our trainer refuses a confidence head nothing trains; with --steps 0
    # nothing trains anyway (the head is loaded, and the served walk does not read it)
    return SPEC_ARCH + ["--mask-token-id", str(cfg["mask_token_id"]), "--confidence-weight", "1.0"]


EVAL_NAMES = {"eval-smollm2-humaneval": "HumanEval", "eval-smollm2-chat-code": "chat-code",
              "eval-smollm2-chat-prose": "chat-prose"}


def _served(record: dict) -> dict:
    """The compute curve's `served_eval`, by eval-set name, plus the teacher-forced accuracies."""
    return {EVAL_NAMES[k]: {**v, "teacher_forced_acc_per_pos": record["eval"][k]["val_acc_per_pos"]}
            for k, v in served_eval(record).items()}


def _ours_row(name: str, run_dir: Path, eval_record: dict | None = None) -> dict | None:
    f = run_dir / "training.json"
    if not f.is_file():
        return None
    rec = json.loads(f.read_text())
    a = rec["args"]
    return {"draft": name, "trainer": "vllm-specx", "train_seqs": a["steps"] * a["batch"], "optimizer_steps": a["steps"],
            "anchors_per_seq": a["anchors"], "anchor_blocks": a["steps"] * a["batch"] * a["anchors"],
            "layers": a["layers"], "markov_rank": a["markov_rank"], "causal": a["causal"], "loss": a["loss"],
            "mask_token_id": a["mask_token_id"],
            # training only (the last validation's elapsed_s); wall_s also holds the --eval-data pass
            "train_wall_s": rec["log"][-1]["elapsed_s"] if a["steps"] else None, "run_wall_s": rec["wall_s"],
            "command": rec["command"], "eval": _served(eval_record or rec)}


def report(n: int, tag: str = "") -> None:
    rows = []
    committed = json.loads((BASELINE / "training.json").read_text())
    if BASELINE_EVAL.is_file():
        r = _ours_row("ours, committed baseline (2 layers, rank 32, CE)", BASELINE, json.loads(BASELINE_EVAL.read_text()))
        r["train_wall_s"] = committed["log"][-1]["elapsed_s"]
        r["run_wall_s"], r["eval_command"] = committed["wall_s"], json.loads(BASELINE_EVAL.read_text())["command"]
        rows.append(r)
    for arch, batch, name in (("baseline", 8, "ours, baseline architecture"),
                              ("specarch", 8, "ours, speculators' architecture"),
                              ("specarch", 32, "ours, speculators' architecture, batch 32")):
        r = _ours_row(f"{name}, {n} seqs", ours_run(n, arch, batch))
        if r:
            rows.append(r)
    d = spec_run(n, tag)
    ev = RUNS / f"eval-speculators-dspark-{n}{tag}" / "training.json"
    if (d / "done.json").is_file() and ev.is_file():
        done = json.loads((d / "done.json").read_text())
        ck = spec_ckpt(n, tag)
        cfg = json.loads((ck / "config.json").read_text())
        steps = json.loads((ck / "training_state.json").read_text())["global_step"]
        val = json.loads((ck / "val_metrics.json").read_text())
        meta = json.loads((data_dir(n) / "prepared.json").read_text())
        erec = json.loads(ev.read_text())
        rows.append({"draft": f"speculators 0.9.0 DSpark (its defaults), {n} seqs", "trainer": "speculators 0.9.0",
                     "train_seqs": meta["train_seqs"], "optimizer_steps": steps,
                     "anchors_per_seq": round(steps * 512 / meta["train_seqs"], 1), "anchor_blocks": steps * 512,
                     "layers": cfg["transformer_layer_config"]["num_hidden_layers"], "markov_rank": cfg["markov_rank"],
                     "causal": not cfg["sliding_window_non_causal"], "loss": "kl_div (full vocabulary)",
                     "mask_token_id": cfg["mask_token_id"], "train_wall_s": done["wall_s"],
                     "command": done["command"], "eval_command": erec["command"], "speculators_val_metrics": val,
                     "eval": _served(erec)})
    RESULTS.mkdir(parents=True, exist_ok=True)
    # machine paths (the cache, the checkout) as `~/...` and repository-relative, as `export` writes them
    text = json.dumps({"train_seqs": n, "rows": rows}, indent=1).replace(f"{REPO}/", "")
    (RESULTS / "results.json").write_text(text.replace(str(Path.home()), "~") + "\n")
    lines = ["| draft | seqs | steps | anchor blocks | layers | rank | loss | train s | "
             + " | ".join(f"{e} tau" for e in EVAL_NAMES.values()) + " |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['draft']} | {r['train_seqs']} | {r['optimizer_steps']} | {r['anchor_blocks']} | {r['layers']} "
                     f"| {r['markov_rank']} | {r['loss']} | {r['train_wall_s']:.0f} | "
                     + " | ".join(f"{r['eval'][e]['tau_served']:.3f}" for e in EVAL_NAMES.values()) + " |")
    lines += ["", "Served per-position acceptance (P(draft k accepted), k = 1..7, K = 7, T = 0):", ""]
    for e in EVAL_NAMES.values():
        lines += [f"**{e}**", "", "| draft | " + " | ".join(f"k={k}" for k in range(1, 8)) + " |",
                  "|---|" + "---|" * 7]
        for r in rows:
            lines.append(f"| {r['draft']} | " + " | ".join(f"{x:.4f}" for x in r["eval"][e]["served_acc_per_pos"]) + " |")
        lines.append("")
    (RESULTS / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=["prepare", "train", "ours", "eval", "report", "all"])
    ap.add_argument("--train-seqs", type=int, default=2400)
    ap.add_argument("--spec-extra", default="", help="extra speculators train flags (shell words)")
    ap.add_argument("--tag", default="", help="suffix of the speculators run folder")
    ap.add_argument("--ours-arch", default="specarch", choices=["specarch", "baseline"])
    ap.add_argument("--ours-batch", type=int, default=8)
    ap.add_argument("--ours-extra", default="")
    ap.add_argument("--ours-pool", type=int, default=2400,
                    help="our trainer's --train-samples: draws come from ids 32..32+N (data order), "
                         "the pool speculators' sets are cut from")
    a = ap.parse_args(argv)
    n = a.train_seqs
    if a.step in ("prepare", "all"):
        prepare(n)
    if a.step in ("train", "all"):
        spec_train(n, shlex.split(a.spec_extra), a.tag)
    if a.step == "ours":
        ours_train(n, a.ours_arch, a.ours_batch, shlex.split(a.ours_extra), a.ours_pool)
    if a.step in ("eval", "all"):
        ck = spec_ckpt(n, a.tag)
        evaluate(ck, RUNS / f"eval-speculators-dspark-{n}{a.tag}", spec_arch_flags(ck))
    if a.step in ("report", "all"):
        report(n, a.tag)


if __name__ == "__main__":
    main()
