"""The large training prompt set for a chat target (SmolLM2-135M-Instruct): `assets/prompts/chat-mix.jsonl`.

Ten times `chat-train`'s data needs a broader prompt set than the standard library's signatures.
Three kinds of prompt, interleaved (seeded shuffle), so that any prefix of the file is a mix:

* **code completion in HumanEval's form** ("Complete this Python function." + a fenced
  `def name(signature):` with its docstring), from the public pure-Python functions of many
  installed packages (PACKAGES: networkx, sympy, numpy, jinja2, ...) and of the standard-library
  modules `chat-train` uses;
* **code instructions** (`make_chat_prompts.CODE_TEMPLATES`) on other functions of the same packages;
* **chat and prose** requests: `make_chat_prompts.PROSE_TEMPLATES` and MORE_PROSE_TEMPLATES x
  `TRAIN_TOPICS` + MORE_TOPICS; plus every `chat-train` prompt (so the old data is a subset in kind).

Refused, as for `chat-train` (`tests/test_no_eval_in_training.py` checks the written file
independently): a prompt naming a HumanEval entry point or sharing a run of 8 words with any
HumanEval prompt or canonical solution; anything from a module or topic of the held-out chat sets
(`chat-code`, `chat-prose`); a prompt equal to a held-out prompt. The functions come from the
installed packages, so the file depends on their versions: the committed file is the data's
record (made with the versions `pip install -e ".[cpu,dev,bench]"` installed on 2026-12-03):

    .venv/bin/python scripts/make_mix_prompts.py
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import io
import json
import pkgutil
import random
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_chat_prompts as chat  # noqa: E402

ROOT = chat.ROOT
# Top-level packages whose submodules are walked (pure-Python functions with docstrings). Never a
# held-out chat module (`chat.HELDOUT_MODULES`), never HumanEval's package.
PACKAGES = ["networkx", "sympy", "numpy", "jinja2", "markupsafe", "packaging", "requests", "urllib3",
            "click", "rich", "fsspec", "yaml", "attr", "filelock", "regex", "tqdm", "idna",
            "email", "http", "xml", "json", "urllib", "importlib", "logging", "concurrent",
            "asyncio", "unittest", "collections", "encodings", "multiprocessing", "sqlite3",
            "wsgiref", "html", "ctypes", "curses", "dbm"]
PER_PACKAGE = 800  # functions drawn at most from one top-level package (sympy alone has ~2,400)
SKIP_PARTS = ("test", "tests", "testing", "conftest", "_vendor", "benchmarks", "__main__", "setup")
MORE_PROSE_TEMPLATES = [
    "Write a blog post introduction about {t}.",
    "Write a product description for something related to {t}.",
    "Answer as a helpful assistant: what should I know about {t}?",
    "Write a short poem about {t}.",
    "Create a quiz with three questions about {t}, with answers.",
    "Explain the main idea of {t} in simple words.",
    "Write a persuasive paragraph about why {t} matters.",
    "Make a step-by-step plan for a weekend project about {t}.",
    "Write a diary entry of someone who spent the day on {t}.",
    "List the key terms someone should learn about {t} and define each one.",
]
MORE_TOPICS = [
    "the human heart", "vaccines", "the stock market", "compound interest", "gardening in pots",
    "the French Revolution", "ancient Egypt", "the Great Wall of China", "penguins", "dinosaurs",
    "earthquakes", "hurricanes", "solar panels", "wind turbines", "nuclear power", "the periodic table",
    "black holes", "the speed of light", "gravity", "magnets", "electric circuits", "rainforests",
    "deserts", "the Arctic", "wolves", "elephants", "octopuses", "whales", "ants", "mushrooms",
    "cheese making", "pizza dough", "vegetarian cooking", "baking cookies", "making soup", "tea",
    "chocolate", "healthy breakfasts", "drinking enough water", "stretching", "yoga", "running",
    "cycling to work", "hiking safety", "learning to drive", "buying a used car", "fixing a flat tire",
    "painting a room", "cleaning the kitchen", "organizing a closet", "minimalism", "budgeting",
    "paying off debt", "starting a small business", "writing a cover letter", "teamwork",
    "giving feedback", "remote work", "video calls", "email etiquette", "networking events",
    "job negotiations", "learning to code", "spreadsheets", "password security", "phishing emails",
    "backing up photos", "smartphones", "social media", "online privacy", "video games",
    "the history of computers", "artificial intelligence", "robots in factories", "3D printing",
    "space stations", "Mars rovers", "the Hubble telescope", "satellites", "weather forecasts",
    "clouds", "snowflakes", "thunderstorms", "the seasons", "tides and the moon", "maps",
    "the Amazon river", "mountains", "islands", "lakes", "national parks", "city parks",
    "public libraries", "reading more books", "writing poetry", "keeping a sketchbook",
    "photography", "playing the piano", "singing in a choir", "jazz", "classical music",
    "learning to dance", "theatre", "film making", "podcasts", "newspapers", "the alphabet",
    "learning math", "fractions", "geometry", "probability", "statistics in daily life",
    "the scientific method", "chemistry experiments at home", "microscopes", "cells", "DNA",
    "evolution", "the immune system", "sleep and dreams", "memory", "habits", "motivation",
    "friendship", "kindness", "volunteering", "recycling at school", "a school garden",
    "a science fair", "a birthday party", "a family reunion", "a wedding toast", "a graduation speech",
    "a dragon who is afraid of the dark", "a detective cat", "a time traveler's breakfast",
    "a village on the moon", "a lost key", "a magic bicycle", "a friendly ghost", "a pirate map",
    "a snowman in summer", "an old clock", "a secret garden", "a message in a bottle",
    "a train journey", "a busy airport", "a farmers market", "a city at night", "a quiet morning",
    "a first day at school", "a new neighbor", "a stray dog", "an unusual pet", "a tiny house",
    "ancient Greece", "the Vikings", "medieval castles", "the Renaissance", "the Industrial Revolution",
    "the invention of the telephone", "the Wright brothers", "the history of money", "maps and explorers",
    "the Olympics of ancient times", "world languages", "sign language", "idioms", "grammar rules",
    "punctuation", "writing clear instructions", "note taking", "studying for exams", "homework",
    "teaching children to read", "parenting tips", "caring for houseplants", "feeding birds in winter",
    "keeping chickens", "horses", "dogs and their training", "aquariums", "butterfly gardens",
    "water conservation", "air pollution", "plastic in the ocean", "renewable energy", "trees",
    "bamboo", "wool and cotton", "sewing", "fashion trends", "shoes", "hats", "umbrellas",
    "bridges", "skyscrapers", "tunnels", "roads", "trains", "ships", "airplanes", "hot air balloons",
]


def _short_doc(doc: str) -> str | None:
    """A function's docstring as HumanEval shows one: the first paragraph or two, at most ~600
    characters, indented lines kept."""
    paras = [p.strip("\n") for p in doc.strip().split("\n\n") if p.strip()]
    if not paras or len(paras[0]) < 20:
        return None
    text = paras[0]
    if len(paras) > 1 and len(text) + len(paras[1]) < 600:
        text += "\n\n" + paras[1]
    return text[:600]


def _modules(package: str):
    """The package and its importable submodules (tests, vendored code and private modules skipped)."""
    try:
        pkg = importlib.import_module(package)
    except Exception:  # noqa: BLE001 - an optional package that does not import here
        return
    yield pkg
    for info in pkgutil.walk_packages(getattr(pkg, "__path__", []), prefix=package + "."):
        parts = info.name.split(".")
        if any(p.startswith("_") or p in SKIP_PARTS for p in parts[1:]):
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                    warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield importlib.import_module(info.name)
        except BaseException:  # noqa: BLE001 - platform-specific or broken submodules
            continue


def package_functions(packages, heldout_modules) -> list[tuple[str, str, str, str]]:
    """(module, name, signature, docstring) of public pure-Python functions defined in the
    packages' modules, each function once, in a stable order."""
    out, seen = [], set()
    heldout = set(heldout_modules)
    for package in packages:
        for mod in _modules(package):
            if mod.__name__.split(".")[0] in heldout or mod.__name__ in heldout:
                continue
            for name, fn in sorted(vars(mod).items()):
                if name.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != mod.__name__:
                    continue
                key = (fn.__module__, fn.__qualname__)
                doc = _short_doc(inspect.getdoc(fn) or "")
                if key in seen or doc is None:
                    continue
                try:
                    sig = str(inspect.signature(fn))
                except (TypeError, ValueError):
                    continue
                if len(sig) > 200 or any(p in sig or p in doc for p in chat.MACHINE_PATHS):
                    continue
                seen.add(key)
                out.append((mod.__name__, name, sig, doc))
    return sorted(out)


def completion_prompt(name: str, sig: str, doc: str) -> str:
    """HumanEval's form: a signature and its docstring to complete (`assets.HUMANEVAL_CHAT`)."""
    from vllm_specx.assets import HUMANEVAL_CHAT

    body = "\n".join(("    " + x) if x.strip() else "" for x in doc.split("\n"))
    return HUMANEVAL_CHAT.format(prompt=f'def {name}{sig}:\n    """{body.lstrip()}\n    """')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "assets" / "prompts" / "chat-mix.jsonl"))
    ap.add_argument("--no-overlap", type=int, default=8, help="refuse prompts sharing an N-word run with HumanEval")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    names, grams = chat.humaneval_index(args.no_overlap)
    n = args.no_overlap
    heldout_modules = chat.HELDOUT_MODULES
    rng = random.Random(args.seed)

    rows = []
    fns = package_functions(PACKAGES, heldout_modules)
    by_pkg: dict[str, list] = {}
    for f in fns:
        by_pkg.setdefault(f[0].split(".")[0], []).append(f)
    fns = sorted(f for group in by_pkg.values()  # no package more than PER_PACKAGE of the code
                 for f in (rng.sample(group, PER_PACKAGE) if len(group) > PER_PACKAGE else group))
    fns += [f for f in chat.stdlib_functions(chat.TRAIN_MODULES)
            if f[0] not in heldout_modules and f not in fns]
    for module, name, sig, doc in fns:
        short = name.split(".")[-1]
        if rng.random() < 0.65:
            text = completion_prompt(short, sig, doc)
        else:
            tmpl = rng.choice(chat.CODE_TEMPLATES)
            text = tmpl.format(name=short, qual=name, sig=sig, module=module,
                               doc=chat._first_sentence(doc) or doc[:400])
        rows.append({"text": text, "source": f"pkg:{module}.{name}", "entry": short})
    topics = [t for t in chat.TRAIN_TOPICS + MORE_TOPICS if t not in chat.HELDOUT_TOPICS]
    templates = chat.PROSE_TEMPLATES + MORE_PROSE_TEMPLATES
    for t in topics:
        for tmpl in rng.sample(templates, 8):
            rows.append({"text": tmpl.format(t=t), "source": f"topic:{t}", "entry": None})
    old = [json.loads(x) for x in (ROOT / "assets" / "prompts" / "chat-train.jsonl").read_text().splitlines()]
    rows += [{"text": r["messages"][0]["content"], "source": r["source"], "entry": None} for r in old]

    held = set()
    for name in ("chat-code", "chat-prose"):
        for x in (ROOT / "assets" / "prompts" / f"{name}.jsonl").read_text().splitlines():
            held.add(json.loads(x)["messages"][0]["content"])
    kept, texts = [], set()
    for r in rows:
        w = chat._words(r["text"])
        if (r["entry"] in names or r["text"] in held or r["text"] in texts
                or any(tuple(w[i:i + n]) in grams for i in range(len(w) - n + 1))):
            continue
        texts.add(r["text"])
        kept.append(r)
    rng.shuffle(kept)
    with open(args.out, "w") as f:
        for i, r in enumerate(kept):
            f.write(json.dumps({"id": f"chat-mix-{i:05d}", "messages": [{"role": "user", "content": r["text"]}],
                                "source": r["source"]}) + "\n")
    kinds = {}
    for r in kept:
        k = "completion" if r["text"].startswith("Complete this Python function") else r["source"].split(":")[0]
        kinds[k] = kinds.get(k, 0) + 1
    print(f"wrote {args.out}: {len(kept)} prompts {kinds} from {len(fns)} functions, {len(topics)} topics")


if __name__ == "__main__":
    main()
