"""End-to-end speculative decoding in vLLM on the reference target: tau, per-position acceptance and
tokens/s for no-spec, vLLM's n-gram drafter and a vllm-specx draft (any registered method) at
several k. JSON + table.

    python benchmarks/bench_e2e.py --prompts code --limit 32 --max-tokens 128 --out runs/bench_e2e.json

(vLLM's built-in EAGLE-3 joins this table once the training issue trains an EAGLE-3 head.)
"""

import argparse
import os
from pathlib import Path

import torch
from _report import provenance, write_report

from vllm_specx import assets, registry
from vllm_specx.eval import format_table, run_configs

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default="code", choices=["code", "prose"])
    ap.add_argument("--limit", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--draft", default=str(assets.path("drafts", "ref-dspark")),
                    help="a draft checkpoint of any registered vllm-specx method")
    ap.add_argument("--ks", default="3,5,7,8")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    configs = {"no-spec": None,
               "ngram k=7": {"method": "ngram", "num_speculative_tokens": 7,
                             "prompt_lookup_max": 4, "prompt_lookup_min": 2}}
    draft = args.draft = os.path.relpath(args.draft)  # relative: keeps the JSON machine-neutral
    method = registry.read_checkpoint(draft)[0].name  # the draft's own method, from the registry
    for k in map(int, args.ks.split(",")):
        configs[f"specx {method} k={k}"] = {"method": method, "model": draft, "num_speculative_tokens": k}
    rows = run_configs(os.path.relpath(assets.path("ref-target")), configs,
                       assets.load_prompts(args.prompts, args.limit), args.max_tokens)
    report = {"meta": provenance(torch.device("cpu"), args), "prompts": args.prompts,
              "n_prompts": args.limit, "max_tokens": args.max_tokens,
              "rows": [{k: v for k, v in r.items() if k != "outputs"} for r in rows]}
    write_report(report, Path(args.out) if args.out else None, format_table(rows))
