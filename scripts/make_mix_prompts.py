"""The large training prompt sets for a chat target (SmolLM2-135M-Instruct): `assets/prompts/chat-mix.jsonl`
and `chat-mix2.jsonl` (below).

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
record (made with the versions `pip install -e ".[cpu,dev,bench]"` installed on 2026-12-03;
a signature whose default is a bare `object()` shows its memory address, so the prompts with one,
40 of them, may differ from run to run; nothing else does):

    .venv/bin/python scripts/make_mix_prompts.py

**chat-mix2** (`assets/prompts/chat-mix2.jsonl`, issue 56: more on-policy data) is a second set of
the same three kinds that repeats nothing of `chat-mix`:

    .venv/bin/python scripts/make_mix_prompts.py --name chat-mix2 --more --seed 1 --per-topic 6 \
        --exclude assets/prompts/chat-mix.jsonl --exclude assets/prompts/chat-train.jsonl

`--exclude FILE` (repeatable) refuses a prompt whose messages equal one of FILE's, and a function
FILE already drew from (its `pkg:`/`stdlib:` sources), so no function is asked about twice; a
topic is used again only with templates it has not been asked with. `--more` adds EXTRA_PACKAGES
(more installed packages and standard-library modules), the public methods of the packages'
classes, EXTRA_CODE_TEMPLATES, EXTRA_PROSE_TEMPLATES and EXTRA_TOPICS, and refuses more: a
signature showing a memory address, a set default or the command line (so chat-mix2 is the same
from run to run and whatever --out), a module with a held-out module's name at any level (not
only the top one), and a prompt sharing an 8-word run with the reference target's evaluation
windows (`code`, `prose`) as well as with HumanEval.
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
RAW_EVAL = ("code", "prose")  # the reference target's evaluation windows (CPython code and docstrings)
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

# `--more` (chat-mix2): further installed packages (third-party ones of `pip install -e
# ".[cpu,dev,bench]"`, and standard-library modules neither PACKAGES nor chat.TRAIN_MODULES walk),
# all pure Python with docstrings and importable without side effects. Not walked: torch,
# transformers, vllm and their kin (slow to import, import-time side effects), sentry_sdk (its
# integrations raise on import), private top-level packages (_pytest).
EXTRA_PACKAGES = ["mpmath", "pygments", "pyparsing", "dateutil", "markdown_it", "jsonschema", "referencing",
                  "lark", "interegular", "docstring_parser", "cachetools", "dill", "cloudpickle", "astor",
                  "fire", "setuptools", "pycparser", "cycler", "anyio", "starlette", "email_validator",
                  "dns", "typer", "shellingham", "psutil", "charset_normalizer", "yarl", "prometheus_client",
                  "websockets", "dotenv", "ijson", "typing_extensions", "fontTools", "PIL", "cryptography",
                  "huggingface_hub", "pydantic", "google.protobuf", "aiohttp", "opentelemetry",
                  "mistral_common", "pythonjsonlogger", "supervisor", "contourpy", "matplotlib", "msgspec",
                  "jwt", "pydoc", "ntpath", "genericpath", "shelve", "webbrowser", "zipapp", "bdb", "profile",
                  "tracemalloc", "copyreg", "xmlrpc", "lib2to3", "cgi", "imghdr", "mailcap", "nturl2path",
                  "pty", "tty"]
EXTRA_CODE_TEMPLATES = [
    "Write a Python function `{name}{sig}` with type hints and a docstring. It should do this: {doc}",
    "Show how to use `{module}.{qual}` in a small, complete Python script, with comments.",
    "Explain the signature `{module}.{qual}{sig}`: what it takes, what it returns and when to call it.",
    "Describe step by step how you would implement `{name}{sig}` in Python, then write it: {doc}",
    "List the edge cases to consider for `{name}{sig}`, then write the function. Its job: {doc}",
    "Write a beginner-friendly version of `{name}{sig}`, with a comment on each step: {doc}",
    "When should I use `{module}.{qual}`, and when is something else a better choice?",
    "Here is a summary of `{module}.{qual}`: {doc} Rephrase it for a newcomer and give an example call.",
]
EXTRA_PROSE_TEMPLATES = [
    "Write a news headline and a short article about {t}.",
    "What questions would a curious child ask about {t}? Answer three of them.",
    "Give me a fun fact about {t} and explain why it is true.",
    "Write a short speech for a school assembly about {t}.",
    "Write a social media post that gets people interested in {t}.",
    "What are three common myths about {t}, and what is the truth?",
    "Write a letter to a friend telling them about {t}.",
    "Create a simple lesson plan for teaching {t}.",
    "Write a riddle about {t} and give the answer.",
    "Write a short interview with an expert on {t}.",
    "Give a one-sentence summary of {t}, then a longer explanation.",
    "Write a checklist for someone who wants to learn about {t}.",
]
EXTRA_TOPICS = [
    "tectonic plates", "the rock cycle", "fossils", "the carbon cycle", "the nitrogen cycle",
    "bacteria and viruses", "the human skeleton", "the digestive system", "the brain", "lungs and breathing",
    "the five senses", "eyesight and glasses", "allergies", "the common cold", "hand washing", "vitamins",
    "protein in food", "sugar and teeth", "frogs and tadpoles", "owls", "sharks", "dolphins", "bats",
    "spiders", "snails", "squirrels", "foxes", "bears", "kangaroos", "parrots", "crows and ravens",
    "seeds and sprouts", "autumn leaves", "wildflowers", "ferns and mosses", "rivers and deltas",
    "waterfalls", "caves", "the northern lights", "comets", "meteor showers", "the phases of the moon",
    "the sun", "eclipses", "rockets", "sound waves", "echoes", "light and shadows", "mirrors",
    "static electricity", "batteries", "simple machines", "levers and pulleys", "friction",
    "floating and sinking", "boiling water", "crystals", "salt", "rust", "soap bubbles",
    "the ancient Maya", "the Inca roads", "the Ottoman Empire", "the Ming dynasty", "samurai",
    "the history of writing", "the invention of paper", "the steam engine", "the history of electricity",
    "the first cars", "the Titanic", "the Gold Rush", "the Berlin Wall", "the space race",
    "Roman aqueducts", "knights and armor", "the history of the post office", "the history of clocks",
    "the history of playing cards", "grocery shopping on a budget", "meal prepping", "packing a suitcase",
    "choosing a mattress", "decluttering a garage", "doing laundry", "ironing shirts", "removing stains",
    "washing dishes by hand", "cleaning windows", "changing a light bulb", "hanging a picture frame",
    "assembling furniture", "basic car maintenance", "saving energy at home", "home safety",
    "smoke detectors", "earthquake preparedness", "packing an emergency kit", "first aid for cuts",
    "treating a sprained ankle", "staying cool in a heat wave", "dressing for cold weather",
    "sun protection", "dental care", "posture at a desk", "screen time", "spotting misinformation",
    "writing a speech", "leading a meeting", "taking minutes at a meeting", "writing a project proposal",
    "asking for a raise", "handling criticism", "a first job", "internships", "planning a picnic",
    "throwing a surprise party", "hosting a game night", "choosing a gift", "learning to skateboard",
    "rock climbing", "kayaking", "fishing", "surfing", "tennis", "basketball", "soccer", "table tennis",
    "bowling", "martial arts", "sailing", "crochet", "pottery", "woodcarving", "calligraphy",
    "embroidery", "making candles", "scrapbooking", "collecting stamps", "collecting coins",
    "building model airplanes", "jigsaw puzzles", "crossword puzzles", "magic tricks", "learning the drums",
    "the violin", "the flute", "writing song lyrics", "stand-up comedy", "opera", "folk music",
    "street art", "art galleries", "sculpture", "mosaics", "Gothic cathedrals", "making pasta from scratch",
    "homemade pickles", "jam making", "spices", "rice dishes around the world", "dumplings", "tacos",
    "curry", "salads", "smoothies", "pancakes", "ice cream", "olive oil", "herbs in the kitchen",
    "grilling vegetables", "food safety", "reading nutrition labels", "cooking for one", "school lunches",
    "a robot gardener", "a shy giant", "a clockmaker's apprentice", "a lost balloon",
    "a penguin who wants to fly", "a city of cats", "a map that changes by itself",
    "a whale who sings off-key", "a mouse in a bakery", "a painter who lost her colors",
    "a door in the forest", "a mysterious postcard", "an inventor's failed machine", "a snow day",
    "a town without clocks", "a treasure hunt", "a brave little boat", "a friendly scarecrow",
    "a sandcastle contest", "the last leaf on a tree", "cloud storage", "Wi-Fi at home",
    "smart home devices", "electric scooters", "self-driving cars", "drones", "virtual reality", "e-books",
    "online shopping", "online courses", "QR codes", "barcodes", "GPS navigation",
    "how search engines work", "two-factor authentication", "open source software", "keyboard shortcuts",
    "choosing a laptop", "recycling electronics", "fair trade", "public transport", "car sharing",
    "urban gardening", "community centers", "local elections", "jury duty", "paying taxes", "insurance",
    "renting versus buying a home", "retirement savings", "credit scores", "charity donations",
    "tipping customs", "travel etiquette", "jet lag", "travelling with a pet", "packing light", "hostels",
    "the Nile", "the Himalayas", "Venice and its canals", "tropical fruits",
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
    # onerror: a subpackage whose import raises something other than ImportError (matplotlib.tests
    # without its test data) is skipped, not fatal
    for info in pkgutil.walk_packages(getattr(pkg, "__path__", []), prefix=package + ".",
                                      onerror=lambda name: None):
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


def package_functions(packages, heldout_modules, methods: bool = False,
                      stable: bool = False) -> list[tuple[str, str, str, str]]:
    """(module, name, signature, docstring) of public pure-Python functions defined in the
    packages' modules, each function once, in a stable order; with `methods` also the public
    methods of their public classes (name "Class.method"); with `stable` none whose signature
    has a set default (its order changes from run to run with string hashing) or `sys.argv` as a
    default (pygments.cmdline.main: the command line that ran this script)."""
    out, seen = [], set()
    heldout = set(heldout_modules)
    for package in packages:
        for mod in _modules(package):
            if mod.__name__.split(".")[0] in heldout or mod.__name__ in heldout:
                continue
            members = [(name, obj) for name, obj in sorted(vars(mod).items()) if inspect.isfunction(obj)]
            if methods:
                members += [(f"{name}.{m}", f) for name, cls in sorted(vars(mod).items())
                            if inspect.isclass(cls) and not name.startswith("_") and cls.__module__ == mod.__name__
                            for m, f in sorted(vars(cls).items()) if not m.startswith("_") and inspect.isfunction(f)]
            for name, fn in members:
                if name.startswith("_") or fn.__module__ != mod.__name__:
                    continue
                key = (fn.__module__, fn.__qualname__)
                doc = _short_doc(inspect.getdoc(fn) or "")
                if key in seen or doc is None:
                    continue
                try:
                    signature = inspect.signature(fn)
                    sig = str(signature)
                except (TypeError, ValueError):
                    continue
                if stable and any(isinstance(q.default, (set, frozenset)) or q.default is sys.argv
                                  for q in signature.parameters.values()):
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


def _key(prompt) -> str:
    """A prompt compared exactly: a raw prompt's text, a chat's messages."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def _chat_key(text: str) -> str:
    return _key([{"role": "user", "content": text}])


def read_excluded(paths) -> tuple[set[str], set[str]]:
    """The prompts (`_key`) of the prompt files `paths`, and the functions ("module.name") their
    code prompts came from (sources "pkg:..." or "stdlib:...")."""
    prompts, functions = set(), set()
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            prompts.add(_key(r["messages"] if "messages" in r else r["prompt"]))
            kind, _, src = r.get("source", "").partition(":")
            if kind in ("pkg", "stdlib"):
                functions.add(src)
    return prompts, functions


def raw_eval_grams(n: int) -> set[tuple[str, ...]]:
    """Every n-word run of the reference target's evaluation windows (`code`, `prose`)."""
    grams = set()
    for name in RAW_EVAL:
        for x in (ROOT / "assets" / "prompts" / f"{name}.jsonl").read_text().splitlines():
            w = chat._words(json.loads(x)["prompt"])
            grams |= {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}
    return grams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", default="chat-mix", help="the set's name: its ids are NAME-00000, ...")
    ap.add_argument("--out", help="default: assets/prompts/NAME.jsonl")
    ap.add_argument("--no-overlap", type=int, default=8, help="refuse prompts sharing an N-word run with HumanEval")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--exclude", action="append", default=[], metavar="FILE",
                    help="a prompt file whose prompts are not repeated and whose functions are not drawn "
                         "from again (repeatable)")
    ap.add_argument("--more", action="store_true",
                    help="EXTRA_PACKAGES, class methods, the EXTRA templates and topics, and the stricter "
                         "refusals (the module docstring)")
    ap.add_argument("--per-package", type=int, default=PER_PACKAGE,
                    help="functions drawn at most from one top-level package")
    ap.add_argument("--per-topic", type=int, default=8, help="prose templates drawn per topic")
    args = ap.parse_args()
    out = args.out or str(ROOT / "assets" / "prompts" / f"{args.name}.jsonl")
    names, grams = chat.humaneval_index(args.no_overlap)
    n = args.no_overlap
    heldout_modules = chat.HELDOUT_MODULES
    rng = random.Random(args.seed)
    excluded, used = read_excluded(args.exclude)
    packages, code_templates, topics, templates = PACKAGES, chat.CODE_TEMPLATES, chat.TRAIN_TOPICS + MORE_TOPICS, \
        chat.PROSE_TEMPLATES + MORE_PROSE_TEMPLATES
    if args.more:
        packages = PACKAGES + [p for p in EXTRA_PACKAGES if p not in PACKAGES]
        code_templates = chat.CODE_TEMPLATES + EXTRA_CODE_TEMPLATES
        topics = list(dict.fromkeys(topics + EXTRA_TOPICS))
        templates = templates + EXTRA_PROSE_TEMPLATES
        grams = grams | raw_eval_grams(n)

    def new(f) -> bool:
        """Not a function an excluded set drew from; with --more, no memory address in its
        signature (nor a set default: `package_functions(stable=True)`) and no held-out module's
        name at any level of its module."""
        if f"{f[0]}.{f[1]}" in used:
            return False
        return not args.more or (" at 0x" not in f[2] and not set(f[0].split(".")) & set(heldout_modules))

    rows = []
    fns = [f for f in package_functions(packages, heldout_modules, methods=args.more, stable=args.more) if new(f)]
    by_pkg: dict[str, list] = {}
    for f in fns:
        by_pkg.setdefault(f[0].split(".")[0], []).append(f)
    fns = sorted(f for group in by_pkg.values()  # no package more than --per-package of the code
                 for f in (rng.sample(group, args.per_package) if len(group) > args.per_package else group))
    fns += [f for f in chat.stdlib_functions(chat.TRAIN_MODULES)
            if f[0] not in heldout_modules and f not in fns and new(f)]
    for module, name, sig, doc in fns:
        short = name.split(".")[-1]
        if rng.random() < 0.65:
            text = completion_prompt(short, sig, doc)
        else:
            tmpl = rng.choice(code_templates)
            text = tmpl.format(name=short, qual=name, sig=sig, module=module,
                               doc=chat._first_sentence(doc) or doc[:400])
        rows.append({"text": text, "source": f"pkg:{module}.{name}", "entry": short})
    topics = [t for t in topics if t not in chat.HELDOUT_TOPICS]
    for t in topics:  # with --exclude: only the templates this topic was not asked with
        fresh = [tmpl for tmpl in templates if _chat_key(tmpl.format(t=t)) not in excluded]
        for tmpl in rng.sample(fresh, min(args.per_topic, len(fresh))):
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
        if (r["entry"] in names or r["text"] in held or r["text"] in texts or _chat_key(r["text"]) in excluded
                or any(tuple(w[i:i + n]) in grams for i in range(len(w) - n + 1))):
            continue
        texts.add(r["text"])
        kept.append(r)
    rng.shuffle(kept)
    with open(out, "w") as f:
        for i, r in enumerate(kept):
            f.write(json.dumps({"id": f"{args.name}-{i:05d}", "messages": [{"role": "user", "content": r["text"]}],
                                "source": r["source"]}) + "\n")
    kinds = {}
    for r in kept:
        k = "completion" if r["text"].startswith("Complete this Python function") else r["source"].split(":")[0]
        kinds[k] = kinds.get(k, 0) + 1
    print(f"wrote {out}: {len(kept)} prompts {kinds} from {len(fns)} functions, {len(topics)} topics")


if __name__ == "__main__":
    main()
