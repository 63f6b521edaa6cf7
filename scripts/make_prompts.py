#!/usr/bin/env python
"""Write the held-out prompt sets for the reference target model.

    .venv/bin/python scripts/make_prompts.py          # -> assets/prompts/{code,prose}.jsonl

Prompts come only from the *held-out* stdlib files of
``scripts/train_ref_target.py`` (``sha1(relpath) % 20 == 0``; never seen by the
tokenizer or the model), and are measured with the trained tokenizer
(``assets/ref-target/tokenizer.json``). Deterministic: the held-out files are
sorted and all choices come from ``random.Random(--seed)``.

Cut at line boundaries, *without* the final newline
    Every prompt is a run of whole source lines minus the last ``\\n``, so it
    ends at the end of a line and the model's first token is the newline itself.
    Why: the byte-level BPE pre-tokenizer (GPT-2 regex) merges a newline with
    the following indentation (``"\\n        "`` is one token), so in training a
    bare ``"\\n"`` token only ever precedes column-0 text. A prompt ending in
    ``"\\n"`` is therefore out of distribution and the model answers with a
    dedent (``def ...`` at module level) -- the classic prompt-boundary problem.

code.jsonl  (64 prompts)
    A run of whole source lines of 48-96 tokens that
    starts at the beginning of a statement (not a string/docstring), ends with a
    code line, is mostly code (>= 60% of its non-blank lines are code lines) and
    is followed by >= 64 more tokens of the file.
    Prompts from one file never overlap; files are visited round-robin.

prose.jsonl (64 prompts)
    Docstrings (module/class/function, via ``ast``) and full-line comment
    blocks (>= 3 lines). The prompt is the enclosing ``def``/``class`` line(s)
    when they fit, then the docstring (or comment block) cut at a line boundary
    *inside* it, 48-96 tokens in all, so that at least one more line of prose
    follows. At most 16 prompts are comment blocks.

Each line: ``{"id", "prompt", "source", "n_tokens", "kind"}`` where ``source`` is
``relpath:first_line-last_line`` (1-based, inclusive) within the stdlib.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import random
import sys
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_ref_target import corpus_files, split_corpus  # noqa: E402  (import-light)

MIN_TOK, MAX_TOK = 48, 96


def line_info(text: str) -> tuple[list[str], list[bool]]:
    """Per line (0-based): kind 'code' | 'comment' | 'string' | 'blank', and
    whether a logical line (statement) starts on it."""
    lines = text.splitlines(keepends=True)
    kinds = ["blank" if not ln.strip() else "code" for ln in lines]
    has_code = [False] * len(lines)
    comment = [False] * len(lines)
    stmt_start = [False] * len(lines)
    at_start = True
    try:
        for t in tokenize.generate_tokens(io.StringIO(text).readline):
            (sr, _), (er, _) = t.start, t.end
            if t.type == tokenize.NEWLINE:
                at_start = True
            elif t.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT,
                                tokenize.ENDMARKER, tokenize.ENCODING):
                if at_start and sr - 1 < len(lines):
                    stmt_start[sr - 1] = True
                at_start = False
            if t.type == tokenize.COMMENT:
                comment[sr - 1] = True
            elif t.type == tokenize.STRING and er > sr:
                for r in range(sr, er + 1):  # lines covered by a multi-line string
                    if r - 1 < len(kinds):
                        kinds[r - 1] = "string"
            elif t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                tokenize.ENDMARKER, tokenize.ENCODING):
                if sr - 1 < len(has_code):
                    has_code[sr - 1] = True
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    for i in range(len(lines)):
        if kinds[i] == "code" and comment[i] and not has_code[i]:
            kinds[i] = "comment"
    return kinds, stmt_start


def ntok(tok, s: str) -> int:
    return len(tok.encode(s, add_special_tokens=False).ids)


def prompt_text(lines: list[str], s: int, e: int) -> str:
    """Lines [s, e) joined, without the final newline (see module docstring)."""
    text = "".join(lines[s:e])
    return text[:-1] if text.endswith("\n") else text


# ---------------------------------------------------------------------------
def code_candidates(rel, text, tok, rng):
    lines = text.splitlines(keepends=True)
    kinds, stmt_start = line_info(text)
    per_line = [len(e.ids) for e in tok.encode_batch(lines, add_special_tokens=False)] if lines else []
    cands = []
    for i in range(len(lines)):
        # start at the beginning of a statement that is not a (doc)string
        if kinds[i] != "code" or not stmt_start[i] or lines[i].lstrip()[:1] in ("'", '"'):
            continue
        target = rng.randint(MIN_TOK, MAX_TOK)
        est, j = 0, i  # per-line counts approximate the count of the joined text
        while j < len(lines) and est < target:
            est += per_line[j]
            j += 1
        n = ntok(tok, prompt_text(lines, i, j))
        if not (MIN_TOK <= n <= MAX_TOK):
            continue
        nb = [k for k in kinds[i:j] if k != "blank"]
        if not nb or nb[-1] != "code":  # the continuation should be code, not prose
            continue
        if sum(k == "code" for k in nb) < 0.6 * len(nb):
            continue
        if ntok(tok, "".join(lines[j:j + 40])) < 64:
            continue
        cands.append((i, j, n))
    return cands


def doc_candidates(rel, text, tok, rng):
    """Docstrings and comment blocks -> [(kind, first, end, n)] (0-based, end exclusive)."""
    lines = text.splitlines(keepends=True)
    out = []
    try:
        tree = ast.parse(text)
    except SyntaxError:
        tree = None
    nodes = [tree] if tree is not None else []
    if tree is not None:
        nodes += [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    for node in nodes:
        body = getattr(node, "body", None)
        if not body or not isinstance(body[0], ast.Expr) or not isinstance(getattr(body[0], "value", None), ast.Constant) \
                or not isinstance(body[0].value.value, str):
            continue
        ds = body[0]
        d0, d1 = ds.lineno - 1, ds.end_lineno  # docstring lines [d0, d1)
        if d1 - d0 < 3:
            continue
        head = node.lineno - 1 if not isinstance(node, ast.Module) else d0
        starts = [head, d0] if head != d0 else [d0]
        cuts = list(range(d0 + 1, d1 - 1))  # prompt = lines[start:cut]; >= 1 docstring line remains
        rng.shuffle(cuts)
        for s in starts:
            found = None
            for c in cuts:
                body_txt = "".join(lines[d0 + 1:c]).strip()
                if not body_txt and c == d0 + 1 and lines[d0].strip() in ('"""', "'''", 'r"""'):
                    continue
                n = ntok(tok, prompt_text(lines, s, c))
                if MIN_TOK <= n <= MAX_TOK:
                    found = ("docstring", s, c, n)
                    break
            if found:
                out.append(found)
                break
    kinds, _ = line_info(text)
    i = 0
    while i < len(lines):
        if kinds[i] == "comment":
            j = i
            while j < len(lines) and kinds[j] == "comment":
                j += 1
            if j - i >= 3:
                cuts = list(range(i + 1, j))
                rng.shuffle(cuts)
                for c in cuts:
                    n = ntok(tok, prompt_text(lines, i, c))
                    if MIN_TOK <= n <= MAX_TOK:
                        out.append(("comment", i, c, n))
                        break
            i = j
        else:
            i += 1
    return out


def pick_round_robin(per_file: dict[str, list], n: int, rng, quota=None):
    """Visit files round-robin (rng-shuffled order); take a random non-overlapping candidate each visit."""
    files = sorted(f for f, c in per_file.items() if c)
    rng.shuffle(files)
    taken: dict[str, list[tuple[int, int]]] = {f: [] for f in files}
    chosen = []
    counts: dict[str, int] = {}
    pools = {f: list(per_file[f]) for f in files}
    for f in files:
        rng.shuffle(pools[f])
    while len(chosen) < n and any(pools.values()):
        for f in files:
            if len(chosen) >= n:
                break
            while pools[f]:
                c = pools[f].pop()
                s, e = c[-3], c[-2]
                kind = c[0] if isinstance(c[0], str) else "code"
                if quota and counts.get(kind, 0) >= quota.get(kind, n):
                    continue
                if any(s < te and ts < e for ts, te in taken[f]):
                    continue
                taken[f].append((s, e))
                counts[kind] = counts.get(kind, 0) + 1
                chosen.append((f, c))
                break
    return chosen


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default=str(REPO / "assets" / "ref-target" / "tokenizer.json"))
    ap.add_argument("--out-dir", default=str(REPO / "assets" / "prompts"))
    ap.add_argument("--n-code", type=int, default=64)
    ap.add_argument("--n-prose", type=int, default=64)
    ap.add_argument("--max-comment", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(a.tokenizer)
    _, held = split_corpus(corpus_files())
    texts = dict(held)
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    rng = random.Random(a.seed)
    code_c = {rel: code_candidates(rel, t, tok, rng) for rel, t in held}
    rng = random.Random(a.seed + 1)
    prose_c = {rel: doc_candidates(rel, t, tok, rng) for rel, t in held}

    sets = {
        "code": pick_round_robin(code_c, a.n_code, random.Random(a.seed + 2)),
        "prose": pick_round_robin(prose_c, a.n_prose, random.Random(a.seed + 3),
                                  quota={"comment": a.max_comment}),
    }
    for name, chosen in sets.items():
        chosen.sort(key=lambda fc: (fc[0], fc[1][-3]))
        rows = []
        for k, (rel, c) in enumerate(chosen):
            s, e, n = c[-3], c[-2], c[-1]
            lines = texts[rel].splitlines(keepends=True)
            prompt = prompt_text(lines, s, e)
            assert ntok(tok, prompt) == n
            rows.append({"id": f"{name}-{k:03d}", "prompt": prompt, "source": f"{rel}:{s + 1}-{e}",
                         "n_tokens": n, "kind": c[0] if isinstance(c[0], str) else "code"})
        path = out_dir / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        nfiles = len({r["source"].split(":")[0] for r in rows})
        kinds = {}
        for r in rows:
            kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
        print(f"{path}: {len(rows)} prompts from {nfiles} held-out files, kinds {kinds}, "
              f"tokens {min(r['n_tokens'] for r in rows)}-{max(r['n_tokens'] for r in rows)}")
        if len(rows) < (a.n_code if name == "code" else a.n_prose):
            print(f"WARNING: only {len(rows)} {name} prompts", file=sys.stderr)


if __name__ == "__main__":
    main()
