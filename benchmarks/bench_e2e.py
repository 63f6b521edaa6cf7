"""End-to-end speculative decoding in vLLM on the reference target: tau, per-position acceptance and
tokens/s for no-spec, vLLM's n-gram drafter and vllm-specx DSpark at several k. JSON + table.

    python benchmarks/bench_e2e.py --prompts code --limit 32 --max-tokens 128 --out runs/bench_e2e.json

(vLLM's built-in EAGLE-3 joins this table once the training issue trains an EAGLE-3 head.)
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

from vllm_specx.eval import format_table, run_configs
from vllm_specx.testing import ASSETS, load_prompts

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default="code", choices=["code", "prose"])
    ap.add_argument("--limit", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--draft", default=str(ASSETS / "drafts" / "ref-dspark"))
    ap.add_argument("--ks", default="3,5,7")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    configs = {"no-spec": None,
               "ngram k=7": {"method": "ngram", "num_speculative_tokens": 7,
                             "prompt_lookup_max": 4, "prompt_lookup_min": 2}}
    draft = os.path.relpath(args.draft)  # relative paths keep the committed JSON machine-neutral
    for k in map(int, args.ks.split(",")):
        configs[f"specx dspark k={k}"] = {"method": "dspark", "model": draft, "num_speculative_tokens": k}
    rows = run_configs(configs, load_prompts(args.prompts, args.limit), args.max_tokens)
    import torch
    import vllm
    report = {"date": datetime.date.today().isoformat(),
              "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
              "vllm": vllm.__version__, "torch": torch.__version__, "machine": platform.machine(),
              "prompts": args.prompts, "n_prompts": args.limit, "max_tokens": args.max_tokens,
              "rows": [{k: v for k, v in r.items() if k != "outputs"} for r in rows]}
    print(format_table(rows))
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
