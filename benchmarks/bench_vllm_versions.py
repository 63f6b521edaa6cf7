"""The same drafts, prompts and settings on vLLM 0.32 (V1 runner) and vLLM 0.34 (V2 runner), run in
each version's venv: tau from vLLM's own counters, drafts per pass, greedy identity with no-spec,
for our committed SmolLM2 DSpark and MTP drafts at fixed K 7 and with adaptive drafting, at batch 1
and 16. Adaptive drafting is ours on 0.32 (`"adaptive": true`: K per request from confidence and the
measured costs) and vLLM's dynamic speculative decoding on 0.34 (`num_speculative_tokens_per_batch_size`,
K by batch size: `--schedule`, by default the drafts per pass ours chose on 0.32 at each batch, read
from the 0.32 report).

    .venv/bin/python benchmarks/bench_vllm_versions.py --out benchmarks/results/vllm-versions-smollm2
    SPECX_TRITON_INTERPRETER=1 "$(bash scripts/venv034.sh)/bin/python" benchmarks/bench_vllm_versions.py \
        --out benchmarks/results/vllm-versions-smollm2

Each run writes `vllm-<version>.json`; `results.md` compares the versions found there. On 0.34 here
vLLM's Triton kernels run in Triton's interpreter (`vllm_specx.testing.triton_harness`): its
tokens/s are recorded but say nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRAFTS = {"dspark": "assets/drafts/smollm2-dspark", "mtp": "assets/drafts/smollm2-mtp"}


def prompts(n: int) -> list:
    from transformers import AutoTokenizer

    from vllm_specx import assets, targets
    from vllm_specx.bench.e2e import render

    tok = AutoTokenizer.from_pretrained(str(targets.ensure("smollm2")))
    half = n // 2
    return render(assets.load_prompts("humaneval", half) + assets.load_prompts("chat-prose", n - half), tok)


def run(target, spec, inputs, batch: int, max_tokens: int) -> dict:
    from vllm import SamplingParams

    from vllm_specx.bench.eval import generate_measured
    from vllm_specx.engine import cpu_llm

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    with cpu_llm(target, spec, max_num_seqs=batch) as llm:
        llm.generate(inputs[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
        t0 = time.time()
        row = generate_measured(llm, inputs, params)
        row["wall_s"] = round(time.time() - t0, 2)
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=16, help="held-out prompts (half HumanEval, half chat-prose)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch-1-prompts", type=int, default=8, help="of them, served one at a time")
    ap.add_argument("--schedule", default=None,
                    help='0.34: JSON {"dspark": [[lo, hi, K], ...], "mtp": [...]} (default: from the 0.32 report)')
    args = ap.parse_args(argv)
    if os.environ.get("SPECX_TRITON_INTERPRETER") == "1":
        from vllm_specx.testing import triton_harness

        triton_harness.install()
    import vllm

    from vllm_specx import targets
    from vllm_specx.vllm_versions import serving_path

    v2 = serving_path(vllm.__version__) == "v2"
    target = targets.ensure("smollm2")
    inputs = prompts(args.prompts)
    args.out.mkdir(parents=True, exist_ok=True)
    schedule = None
    if v2:
        schedule = json.loads(args.schedule) if args.schedule else schedule_from_032(args.out)
    rows = []
    plan = [("no-spec", None, 16), ("no-spec", None, 1)]
    for method in DRAFTS:
        base = {"method": method, "model": str(ROOT / DRAFTS[method]), "num_speculative_tokens": 7}
        adaptive = {**base, "num_speculative_tokens_per_batch_size": schedule[method]} if v2 else \
            {**base, "adaptive": True}
        plan += [(f"{method} K7", base, 16), (f"{method} adaptive", adaptive, 16), (f"{method} adaptive", adaptive, 1)]
    ref = {}
    for i, (name, spec, batch) in enumerate(plan, 1):
        inp = inputs if batch > 1 else inputs[:args.batch_1_prompts]
        print(f"[{i}/{len(plan)}] {name} at batch {batch}: {len(inp)} prompts x {args.max_tokens} tokens", flush=True)
        r = run(target, spec, inp, batch, args.max_tokens)
        if spec is None:
            ref[batch] = r["outputs"]
        want = ref[16][:len(inp)]
        row = {"config": name, "batch": batch, "prompts": len(inp), "tau": r.get("tau"),
               "drafts_per_pass": round(r["num_draft_tokens"] / r["num_drafts"], 3) if r.get("num_drafts") else None,
               "acceptance_per_pos": r.get("acceptance_per_pos"), "tokens_per_s": r["tokens_per_s"],
               "identical": sum(a == b for a, b in zip(r["outputs"], want)),
               "speculative_config": None if spec is None else {**spec, "model": DRAFTS[spec["method"]]}}
        print(f"    tau {row['tau']}, drafts/pass {row['drafts_per_pass']}, {row['tokens_per_s']} tok/s, "
              f"greedy identical {row['identical']}/{len(inp)}", flush=True)
        rows.append(row)
    rec = {"vllm": vllm.__version__, "runner": "V2" if v2 else "V1", "max_tokens": args.max_tokens,
           "triton_interpreter": os.environ.get("SPECX_TRITON_INTERPRETER") == "1", "schedule": schedule,
           "measured": time.strftime("%Y-%m-%d"), "command": "python benchmarks/bench_vllm_versions.py "
           + " ".join(sys.argv[1:]), "rows": rows}
    (args.out / f"vllm-{vllm.__version__}.json").write_text(json.dumps(rec, indent=1) + "\n")
    report(args.out)


def schedule_from_032(out: Path) -> dict:
    """Per method, vLLM's K-by-batch-size schedule from our adaptive drafting's drafts per pass on
    0.32 (rounded): batch 1 -> its K at batch 1, 2..256 -> its K at batch 16."""
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("vllm-0.32*.json"))]
    if not runs:
        raise SystemExit(f"--schedule not given and no vllm-0.32*.json in {out}: run the 0.32 venv first")
    out_ = {}
    for method in DRAFTS:
        k = {r["batch"]: r["drafts_per_pass"] for r in runs[-1]["rows"] if r["config"] == f"{method} adaptive"}
        out_[method] = [[1, 1, max(1, round(k[1]))], [2, 256, max(1, round(k[16]))]]
    return out_


def report(out: Path) -> None:
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("vllm-*.json"))]
    lines = ["| vLLM (runner) | config | batch | prompts | τ | drafts / pass | greedy identical | tokens/s |",
             "|---|---|---|---|---|---|---|---|"]
    for run_ in runs:
        for r in run_["rows"]:
            tps = f"{r['tokens_per_s']}" + (" (interpreter)" if run_["triton_interpreter"] else "")
            lines.append(f"| {run_['vllm']} ({run_['runner']}) | {r['config']} | {r['batch']} | {r['prompts']} | "
                         f"{r['tau'] if r['tau'] is not None else '-'} | {r['drafts_per_pass'] or '-'} | "
                         f"{r['identical']}/{r['prompts']} | {tps} |")
    cmds = "\n".join(f"- {r['vllm']}: `{r['command']}` ({r['measured']}; schedule {r['schedule']})" for r in runs)
    (out / "results.md").write_text("# The same drafts on vLLM 0.32 and 0.34 (SmolLM2-135M-Instruct, CPU)\n\n"
                                    + "\n".join(lines) + "\n\n" + cmds + "\n")


if __name__ == "__main__":
    main()
