"""Prompts for DSpark training data: windows of the target's *training* files (never held out).

    python scripts/make_train_prompts.py --n 640 --out assets/prompts/train.jsonl

Deterministic (seeded); each prompt starts at a line boundary and is about 200-400 characters.
A window that shares a run of `--no-overlap` tokens (reference-target tokenizer) with a held-out
prompt (`assets/prompts/code.jsonl`, `prose.jsonl`) is skipped: the CPython sources repeat
template code across files (the `encodings/*` codecs), so a training file can hold a held-out
prompt's text. `tests/test_no_eval_in_training.py` checks the result.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_ref_target import corpus_files, split_corpus  # noqa: E402


TOKENIZER = None


def grams(ids: list[int], n: int) -> set[tuple[int, ...]]:
    return {tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)}


def held_out_grams(n: int) -> set[tuple[int, ...]]:
    """Every n-token run of the held-out prompts, in the reference target's tokenizer."""
    global TOKENIZER
    from transformers import AutoTokenizer

    repo = Path(__file__).resolve().parents[1]
    TOKENIZER = AutoTokenizer.from_pretrained(str(repo / "assets" / "ref-target"))
    out: set[tuple[int, ...]] = set()
    for name in ("code", "prose"):
        for line in (repo / "assets" / "prompts" / f"{name}.jsonl").read_text().splitlines():
            if line:
                out |= grams(TOKENIZER(json.loads(line)["prompt"])["input_ids"], n)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=640)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="assets/prompts/train.jsonl")
    ap.add_argument("--no-overlap", type=int, default=32,
                    help="skip windows sharing this many consecutive tokens with a held-out prompt")
    args = ap.parse_args()
    held_out = held_out_grams(args.no_overlap)
    rng = random.Random(args.seed)
    train, _ = split_corpus(corpus_files())
    train = [(r, t) for r, t in train if len(t) > 2000]
    rows = []
    while len(rows) < args.n:
        rel, text = rng.choice(train)
        lines = text.splitlines(keepends=True)
        i = rng.randrange(0, max(1, len(lines) - 40))
        prompt = ""
        while i < len(lines) and len(prompt) < rng.randint(200, 400):
            prompt += lines[i]
            i += 1
        if prompt.strip() and not grams(TOKENIZER(prompt)["input_ids"], args.no_overlap) & held_out:
            rows.append({"id": len(rows), "prompt": prompt, "source": rel})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {args.out}")


if __name__ == "__main__":
    main()
