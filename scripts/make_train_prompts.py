"""Prompts for DSpark training data: windows of the target's *training* files (never held out).

    python scripts/make_train_prompts.py --n 640 --out assets/prompts/train.jsonl

Deterministic (seeded); each prompt starts at a line boundary and is about 200-400 characters.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_ref_target import corpus_files, split_corpus  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=640)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="assets/prompts/train.jsonl")
    args = ap.parse_args()
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
        if prompt.strip():
            rows.append({"id": len(rows), "prompt": prompt, "source": rel})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {args.out}")


if __name__ == "__main__":
    main()
