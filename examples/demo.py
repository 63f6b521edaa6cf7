"""Demo: the reference target in vLLM on CPU, without speculation and with the committed DSpark head
through vllm-specx (`method: "dspark"`). Prints tau, per-position acceptance and tokens/s.

    python examples/demo.py [--prompts 16] [--max-tokens 96]
"""

import argparse
import json

from vllm_specx import assets
from vllm_specx.eval import format_table, run_configs

REF_TARGET = assets.path("ref-target")
DRAFT = assets.path("drafts", "ref-dspark")

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    prompts = assets.load_prompts("code", args.prompts)
    rows = run_configs(REF_TARGET, {
        "no-spec": None,
        "specx dspark k=7": {"method": "dspark", "model": str(DRAFT), "num_speculative_tokens": 7},
    }, prompts, args.max_tokens)
    print(f"\ntarget {REF_TARGET.name}, {len(prompts)} held-out code prompts x {args.max_tokens} tokens, "
          "greedy, vLLM on CPU\n")
    print(format_table(rows))
    print("\n" + json.dumps([{k: v for k, v in r.items() if k != "outputs"} for r in rows], indent=1))
