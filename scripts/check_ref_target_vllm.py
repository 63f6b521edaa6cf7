#!/usr/bin/env python
"""Check that vLLM (CPU) loads and runs the reference target model.

    .venv/bin/python scripts/check_ref_target_vllm.py            # load + greedy samples
    .venv/bin/python scripts/check_ref_target_vllm.py --ngram    # n-gram drafter tau on held-out code prompts

Default mode greedily continues a few prompts and prints the text.

``--ngram`` runs vLLM's built-in n-gram (prompt-lookup) drafter,
``{"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_max": 4,
"prompt_lookup_min": 2}``, greedy, over ``assets/prompts/code.jsonl`` (64 prompts
x 128 tokens, ``ignore_eos=True``), and reports

    tau = 1 + vllm:spec_decode_num_accepted_tokens / vllm:spec_decode_num_drafts

from ``llm.get_metrics()``. (A "draft" is one drafting step of one request in
which the n-gram proposer found a match; steps without a match are plain decode
steps and are not counted.) It also checks that speculative greedy output equals
plain greedy output unless ``--no-compare`` is given.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from vllm_specx.metrics import spec_metrics

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "assets" / "ref-target"
DEFAULT_PROMPTS = REPO / "assets" / "prompts" / "code.jsonl"

# Prompts end at the end of a line *without* the newline: the byte-level BPE
# merges "\n" with the next line's indentation, so a prompt ending in a bare
# "\n" token is out of distribution (see scripts/make_prompts.py).
FALLBACK_PROMPTS = [
    "import os\nimport sys\n\n\ndef main(argv=None):",
    'class Stack:\n    """A simple LIFO stack."""\n\n    def __init__(self):',
    "def _read_config(path):\n    with open(path, encoding='utf-8') as f:",
    '"""Utilities for',
]


def load_prompts(path: Path, n: int) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[:n]


def make_llm(model: str, spec: dict | None = None):
    from vllm import LLM

    kw = {}
    if spec is not None:
        kw["speculative_config"] = spec
    return LLM(
        model=model,
        dtype="float32",
        max_model_len=1024,
        enforce_eager=True,
        gpu_memory_utilization=0.3,
        disable_log_stats=False,
        seed=0,
        **kw,
    )


def run_samples(args) -> None:
    from vllm import SamplingParams

    llm = make_llm(args.model)
    if DEFAULT_PROMPTS.exists():
        prompts = [r["prompt"] for r in load_prompts(DEFAULT_PROMPTS, 3)]
    else:
        prompts = []
    prompts = FALLBACK_PROMPTS + prompts
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    outs = llm.generate(prompts, sp)
    for p, o in zip(prompts, outs):
        print("=" * 80)
        print(p, end="")
        print("\u2588", end="")  # marks where the model's continuation starts
        print(o.outputs[0].text)
    print("=" * 80)
    print(f"OK: vLLM generated {sum(len(o.outputs[0].token_ids) for o in outs)} tokens for {len(prompts)} prompts")
    if args.hf_compare:
        # Cross-check against transformers' greedy decoding of the same weights.
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.model)
        hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
        agree = 0
        for p, o in zip(prompts, outs):
            ids = torch.tensor([tok(p).input_ids])
            assert ids[0].tolist() == list(o.prompt_token_ids), "prompt tokenization differs"
            with torch.no_grad():
                g = hf.generate(ids, max_new_tokens=args.max_tokens, do_sample=False,
                                eos_token_id=None, pad_token_id=tok.pad_token_id)
            ref = g[0, ids.shape[1]:].tolist()
            got = list(o.outputs[0].token_ids)
            n = next((i for i, (x, y) in enumerate(zip(ref, got)) if x != y), min(len(ref), len(got)))
            agree += n == len(got)
            print(f"HF vs vLLM: first {n}/{len(got)} greedy tokens identical")
        print(f"HF/vLLM greedy agreement: {agree}/{len(prompts)} prompts fully identical")


def run_ngram(args) -> None:
    from vllm import SamplingParams

    rows = load_prompts(Path(args.prompts), args.num_prompts)
    prompts = [r["prompt"] for r in rows]
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    spec = {"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_max": 4, "prompt_lookup_min": 2}

    llm = make_llm(args.model, spec)
    t0 = time.time()
    outs = llm.generate(prompts, sp)
    dt = time.time() - t0
    m = spec_metrics(llm)
    drafts, draft_toks = m.get("num_drafts", 0), m.get("num_draft_tokens", 0)
    acc = m.get("num_accepted_tokens", 0)
    gen = sum(len(o.outputs[0].token_ids) for o in outs)
    tau = m["tau"] if m["tau"] is not None else float("nan")
    res = {
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "generated_tokens": gen,
        "num_drafts": drafts,
        "num_draft_tokens": draft_toks,
        "num_accepted_tokens": acc,
        "acceptance_rate": acc / draft_toks if draft_toks else float("nan"),
        "tau": tau,
        "spec_seconds": round(dt, 1),
    }
    if not args.no_compare:
        spec_texts = [o.outputs[0].token_ids for o in outs]
        del llm
        import gc

        gc.collect()
        base = make_llm(args.model)
        t0 = time.time()
        bouts = base.generate(prompts, sp)
        res["baseline_seconds"] = round(time.time() - t0, 1)
        same = sum(list(a) == list(b.outputs[0].token_ids) for a, b in zip(spec_texts, bouts))
        res["identical_to_plain_greedy"] = f"{same}/{len(prompts)}"
    print(json.dumps(res, indent=2))
    print(f"n-gram tau = {tau:.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--ngram", action="store_true", help="measure the built-in n-gram drafter's tau")
    ap.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--hf-compare", action="store_true", help="default mode: also decode with transformers and compare")
    ap.add_argument("--no-compare", action="store_true", help="--ngram: skip the plain-greedy equality check")
    args = ap.parse_args()
    if args.max_tokens is None:
        args.max_tokens = 128 if args.ngram else 64
    if args.ngram:
        run_ngram(args)
    else:
        run_samples(args)
