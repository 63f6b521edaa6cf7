"""The two taps paths of `gen-data` on one data set: `--taps-via transformers` (a second forward
of the target in transformers) and `--taps-via vllm` (vLLM's `extract_hidden_states` export),
each timed as the whole command (model load or engine start included), and their outputs
compared: per sample, the largest tap difference relative to the sample's largest tap, the share
of equal top-k ids, and the largest difference of the top-1 log-probability.

    python benchmarks/bench_taps_path.py --tokens assets/data/smollm2-chat-mix.tokens.npz \
        --rows 64 --taps 1,14,26,29 --topk 32 --out benchmarks/results/taps-path-smollm2/results.json

The first `--rows` samples of the committed token ids (a training set, not an evaluation set) are
copied into two fresh data folders under `--work`; everything runs on the CPU in fp32.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import provenance, write_report  # noqa: E402

from vllm_specx.training.data import import_tokens  # noqa: E402

VIAS = ("transformers", "vllm")


def _shards(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted((folder / "taps").glob("*.safetensors")):
        out.update(load_file(f))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=Path, required=True, help="a gen-data --export-tokens file")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--taps", default="1,14,26,29")
    ap.add_argument("--topk", type=int, default=32)
    ap.add_argument("--engine-args", default="{}", help="gen-data --engine-args for the vLLM path")
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "vllm-specx" / "bench-taps-path")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    shutil.rmtree(args.work, ignore_errors=True)
    meta = import_tokens(args.tokens, args.work / "all")
    rows = (args.work / "all" / "tokens.jsonl").read_text().splitlines()[: args.rows]
    tokens = sum(len(r["prompt_ids"]) + len(r["output_ids"]) for r in map(json.loads, rows))
    times = {}
    for via in VIAS:
        d = args.work / via
        d.mkdir(parents=True)
        (d / "tokens.jsonl").write_text("\n".join(rows) + "\n")
        shutil.copy(args.work / "all" / "meta.json", d / "meta.json")
        cmd = [sys.executable, "-m", "vllm_specx.training.data", "--out", str(d), "--target", meta["target"],
               "--prompts", meta["prompts"], "--max-tokens", str(meta["max_tokens"]),
               "--temperature", str(meta["temperature"]), "--taps", args.taps,
               "--topk", str(args.topk), "--taps-only", "--taps-via", via, "--device", "cpu",
               "--dtype", "float32", "--engine-args", args.engine_args]
        cmd += ["--stop-at-eos"] if meta.get("stop_at_eos") else []
        cmd += [f"--{k}={meta[k]}" for k in ("limit", "spread") if k in meta]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        times[via] = time.perf_counter() - t0
    ref, got = (_shards(args.work / v) for v in VIAS)
    ids = [k[len("ids_"):] for k in ref if k.startswith("ids_")]
    rel, agree, top1 = [], [], []
    for i in ids:
        a, b = ref[f"taps_{i}"].float(), got[f"taps_{i}"].float()
        rel.append(((a - b).abs().max() / a.abs().max()).item())
        agree.append((ref[f"topk_ids_{i}"] == got[f"topk_ids_{i}"]).float().mean().item())
        top1.append((ref[f"topk_logp_{i}"][:, 0] - got[f"topk_logp_{i}"][:, 0]).abs().max().item())
    summary = {"samples": len(ids), "tokens": tokens,
               "seconds": {v: round(t, 1) for v, t in times.items()},
               "taps_max_rel_diff": max(rel), "taps_median_rel_diff": sorted(rel)[len(rel) // 2],
               "topk_ids_equal_min": min(agree), "topk_ids_equal_mean": sum(agree) / len(agree),
               "top1_logp_max_abs_diff": max(top1)}
    table = "\n".join([
        "| path | seconds (whole command) | tokens/s |", "|---|---|---|",
        *(f"| {v} | {times[v]:.1f} | {tokens / times[v]:.0f} |" for v in VIAS), "",
        f"{len(ids)} samples, {tokens} tokens, taps {args.taps}, top-{args.topk}, fp32, CPU. "
        f"vLLM vs transformers: taps differ by at most {max(rel):.2e} of a sample's largest tap "
        f"(median {summary['taps_median_rel_diff']:.2e}); top-{args.topk} ids equal at "
        f"{100 * summary['topk_ids_equal_mean']:.2f} % of ranks (worst sample {100 * min(agree):.2f} %); "
        f"top-1 log-probabilities within {max(top1):.2e}."])
    report = {"meta": provenance(torch.device("cpu"), args, target=meta["target"], prompts=meta["prompts"]),
              "summary": summary}
    write_report(report, args.out, table)
    if args.out is not None:
        args.out.with_name("results.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
