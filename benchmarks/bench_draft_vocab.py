"""Reduced draft vocabularies on SmolLM2-135M-Instruct: coverage, draft-head time and training-step
time at the full vocabulary (49,152) and at reduced sizes (issue 27, item 1).

* coverage: the share of the target's greedy tokens on held-out prompts (`chat-code` and
  `chat-prose`, never trained on) that fall inside a vocabulary built from the training data's
  responses (`vllm_specx.vocab.by_frequency`, what `train --draft-vocab N` builds). A token
  outside can never be drafted: coverage bounds first-position acceptance at T = 0.
* draft head: the part of a DSpark draft pass that depends on the vocabulary: base logits
  (lm_head rows), the Markov bias (W2 rows) and the pick, left to right over N = 7 slots
  (`model.sequential_drafts`), at batch 1 and 16; the backbone (the query block's layers) does
  not depend on it and is not timed.
* training step: forward, loss (CE) and backward of the DSpark trainer (`methods.dspark.train`)
  on batches cut from the data's responses with random taps (their values do not change the
  time), batch 8, 256 tokens, 24 blocks of 8.

Times are medians over repeats taken round robin, with torch on this machine's threads; on two
shared CPU cores they are comparable within one run only.

    .venv/bin/python benchmarks/bench_draft_vocab.py --data ~/.cache/vllm-specx/data/smollm2-chat-mix \
        --out benchmarks/results/draft-vocab-smollm2
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from vllm_specx import vocab
from vllm_specx.methods.dspark import train as dspark_train
from vllm_specx.methods.dspark.config import DSparkDraftConfig
from vllm_specx.methods.dspark.model import DSparkDraft, greedy_pick, head_stepper, sequential_drafts
from vllm_specx.targets import resolve
from vllm_specx.training.data import response_ids
from vllm_specx.training.losses import cross_entropy, position_weights
from vllm_specx.training.taps import embed_and_head, load_target


def heldout_greedy_tokens(target: str, n: int, max_tokens: int) -> list[int]:
    """The target's greedy response tokens on the first n/2 prompts of chat-code and chat-prose."""
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from vllm_specx import assets
    from vllm_specx.assets import render
    from vllm_specx.engine import cpu_llm

    prompts = assets.load_prompts("chat-code", n // 2) + assets.load_prompts("chat-prose", n - n // 2)
    tok = AutoTokenizer.from_pretrained(target)
    with cpu_llm(target, gpu_memory_utilization=0.3) as llm:
        outs = llm.generate(render(prompts, tok), SamplingParams(temperature=0, max_tokens=max_tokens),
                            use_tqdm=False)
    return [t for o in outs for t in o.outputs[0].token_ids]


def make_draft(tc: dict, embed, lm_head, ids) -> DSparkDraft:
    cfg = DSparkDraftConfig.for_target(tc, target_layer_ids=(1, 14, 26), num_hidden_layers=2,
                                       block_size=8, mask_token_id=0, markov_rank=64)
    if ids is not None:
        import dataclasses
        cfg = dataclasses.replace(cfg, draft_vocab_size=len(ids))
    torch.manual_seed(0)
    draft = DSparkDraft(cfg, embed, lm_head, ids)
    for p in draft.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return draft


def time_head(draft: DSparkDraft, batch: int, n: int = 7) -> float:
    h = torch.randn(batch, n, draft.cfg.hidden_size)
    anchors = torch.randint(0, draft.cfg.vocab_size, (batch,))
    t0 = time.perf_counter()
    with torch.no_grad():
        sequential_drafts(h @ draft.lm_head.t(), anchors, head_stepper(draft.markov_head, h), greedy_pick,
                          None, draft.draft_target_ids, draft.cfg.vocab_size)
    return time.perf_counter() - t0


def time_train_step(draft: DSparkDraft, samples: list[dict], rng: random.Random, args) -> float:
    b = dspark_train.batch(draft, samples, rng, 8, args)
    t0 = time.perf_counter()
    out = dspark_train.forward(draft, b)
    loss = cross_entropy(out, position_weights(out.targets.shape[-1], 4.0))
    loss.backward()
    draft.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a gen-data folder of the target (its responses build the vocabularies)")
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--sizes", default="8192,16384,32768")
    ap.add_argument("--heldout-prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    target_dir = str(resolve(args.target))
    model = load_target(target_dir)
    tc = model.config.to_dict()
    v = int(tc["vocab_size"])
    embed, lm_head = embed_and_head(model)
    responses = response_ids(args.data)
    sizes = [int(x) for x in args.sizes.split(",")]
    vocabs = {s: vocab.by_frequency(responses, s, v)[0] for s in sizes}

    held = torch.tensor(heldout_greedy_tokens(target_dir, args.heldout_prompts, args.max_tokens))
    train_tokens = torch.tensor([t for r in responses for t in r])
    rows = {v: {"coverage_heldout": 1.0, "coverage_train": 1.0}}
    for s, ids in vocabs.items():
        t2d = vocab.maps(ids, v)[1]
        rows[s] = {"coverage_heldout": vocab.coverage(held, t2d), "coverage_train": vocab.coverage(train_tokens, t2d)}

    drafts = {v: make_draft(tc, embed, lm_head, None)}
    drafts.update({s: make_draft(tc, embed, lm_head, ids) for s, ids in vocabs.items()})
    g = torch.Generator().manual_seed(0)
    samples = [{"ids": torch.tensor(r["ids"]), "taps": torch.randn(len(r["ids"]), 3 * tc["hidden_size"], generator=g).half(),
                "prompt_len": r["p"]} for r in
               ({"ids": x, "p": 0} for x in responses[:64] if len(x) >= 64)]
    targs = argparse.Namespace(seq_len=256, anchors=24, chain_tokens="target")
    times = {k: {"head_b1": [], "head_b16": [], "train_step": []} for k in drafts}
    for rep in range(args.repeats + 1):  # round robin; the first round warms up
        for k, d in drafts.items():
            t = {"head_b1": time_head(d, 1), "head_b16": time_head(d, 16),
                 "train_step": time_train_step(d, samples, random.Random(rep), targs)}
            if rep:
                for name, x in t.items():
                    times[k][name].append(x)
    for k in drafts:
        rows[k].update({name: statistics.median(x) * 1000 for name, x in times[k].items()})
    data = str(Path(args.data).expanduser())
    result = {"target": args.target, "data": data.replace(str(Path.home()), "~", 1),  # no machine path "data_responses": len(responses),
              "heldout_tokens": int(held.numel()), "torch_threads": torch.get_num_threads(),
              "sizes": {str(k): rows[k] for k in sorted(rows, reverse=True)}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    full = rows[v]
    lines = [f"Draft vocabulary on {args.target} ({len(responses)} training responses build the vocabularies; "
             f"{held.numel()} held-out greedy tokens; medians of {args.repeats}, torch threads "
             f"{torch.get_num_threads()})", "",
             "| draft vocabulary | coverage, held-out | coverage, training data | draft head b1 (ms) | "
             "draft head b16 (ms) | training step (ms) |", "|---|---|---|---|---|---|"]
    for k in sorted(rows, reverse=True):
        r = rows[k]
        lines.append(f"| {k:,}{' (full)' if k == v else ''} | {r['coverage_heldout']:.4f} | {r['coverage_train']:.4f} | "
                     f"{r['head_b1']:.2f} ({full['head_b1'] / r['head_b1']:.1f}x) | "
                     f"{r['head_b16']:.2f} ({full['head_b16'] / r['head_b16']:.1f}x) | "
                     f"{r['train_step']:.0f} ({full['train_step'] / r['train_step']:.2f}x) |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
