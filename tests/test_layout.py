"""The layout's promises, checked on the source: no shared module names a method, every vLLM
internal used outside `_vllm_compat` is listed in its manifest (and exists in the installed vLLM),
and the package imports neither test helpers nor the source checkout's assets."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

import vllm_specx
from vllm_specx import _vllm_compat, registry
from vllm_specx._vllm_compat import acceptance

PKG = Path(vllm_specx.__file__).parent
SOURCES = sorted(PKG.rglob("*.py"))


def _names_of(method: registry.Method) -> list[str]:
    return [method.name, *method.archs]


def _code(text: str) -> str:
    """The source without docstrings and comments: prose may name a concept (an "MTP layer"),
    code must not route by a method's name."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            body[0] = ast.Pass()
    return ast.unparse(tree)


def _mentions(text: str, words: list[str]) -> list[str]:
    """The words that occur in the code as whole identifiers or words (case-sensitive: a method's
    name is spelled as users type it, e.g. "mtp" in `index_share_for_mtp_iteration` is vLLM's
    field, not our method)."""
    code = _code(text)
    return [w for w in words if re.search(rf"(?<![\w]){re.escape(w)}(?![\w])", code)]


def _method_folder(method: registry.Method) -> Path:
    return Path(inspect.getfile(method.config_cls)).parent


def test_no_module_outside_a_methods_folder_names_it():
    offenders = []
    for method in registry.methods().values():
        home = _method_folder(method)
        for src in SOURCES:
            if home in src.parents:
                continue
            hits = _mentions(src.read_text(), _names_of(method))
            if hits:
                offenders.append(f"{src.relative_to(PKG)} names {hits}")
    assert not offenders, offenders


def test_the_name_scan_can_fail():
    """Negative control: the same scan finds each method's name inside its own folder."""
    for method in registry.methods().values():
        home = _method_folder(method)
        inside = [s for s in SOURCES if home in s.parents and _mentions(s.read_text(), [method.name])]
        assert inside, f"scan found no mention of {method.name!r} even in {home}"


def _vllm_imports(src: Path) -> list[str]:
    """'module:name' for every `from vllm.x import name`, 'module:' for `import vllm.x`."""
    out = []
    for node in ast.walk(ast.parse(src.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllm."):
            out += [f"{node.module}:{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            out += [f"{a.name}:" for a in node.names if a.name.startswith("vllm.")]
    return out


def v2_internals() -> set[str]:
    """Every module's `VLLM_INTERNALS_V2` (the vLLM >= 0.34 path's internals, read from the source:
    those modules import vLLM 0.34 and cannot be imported on 0.32; tests/test_vllm034.py checks
    each resolves in vLLM 0.34)."""
    out: set[str] = set()
    for src in SOURCES:
        for node in ast.parse(src.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "VLLM_INTERNALS_V2"
                                                    for t in node.targets):
                out.update(ast.literal_eval(node.value))
    return out


def test_every_vllm_internal_used_outside_compat_is_in_the_manifest():
    listed = set(_vllm_compat.vllm_internals()) | v2_internals()
    compat = PKG / "_vllm_compat"
    unlisted = [f"{src.relative_to(PKG)}: {imp}" for src in SOURCES if compat not in src.parents
                for imp in _vllm_imports(src) if imp not in listed]
    assert not unlisted, f"vLLM internals imported outside _vllm_compat and not listed: {unlisted}"


def test_the_internals_scan_sees_real_imports():
    """Negative control: the proposers' imports are found by the scanner (and are listed)."""
    found = {imp for src in SOURCES for imp in _vllm_imports(src)}
    assert "vllm.v1.spec_decode.dflash:DFlashProposer" in found
    assert "vllm.v1.sample.rejection_sampler:RejectionSampler" in found


def test_every_listed_internal_exists_in_the_installed_vllm():
    missing = []
    for name in _vllm_compat.vllm_internals():
        try:
            _vllm_compat.resolve(name)
        except (ImportError, AttributeError) as e:
            missing.append(f"{name}: {e}")
    assert not missing, missing


def test_rejection_sample_positional_contract():
    from vllm.v1.sample import rejection_sampler

    orig = getattr(rejection_sampler.rejection_sample, "__wrapped__", rejection_sampler.rejection_sample)
    acceptance.check_contract(orig)

    def changed(draft_token_ids, cu_num_draft_tokens, num_draft_tokens, max_spec_len, draft_probs,
                target_logits, bonus_token_ids, sampling_metadata):
        pass

    with pytest.raises(RuntimeError, match="changed"):
        acceptance.check_contract(changed)


def _imports_of(src: Path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(src.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            mods.add(node.module)
            mods.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
    return mods


# The tools that run on the source checkout's reference target and prompt files (the data command
# takes prompt sets by name and renders chats with them); nothing in the serving path, the trainer
# or the CLI's own module imports assets.
ASSET_TOOLS = ("assets.py", "bench/e2e.py", "bench/load.py", "training/prompts.py", "training/generate.py")


def test_the_package_imports_no_test_helpers_and_no_assets():
    bad = []
    for src in SOURCES:
        if src.relative_to(PKG).as_posix() in ASSET_TOOLS:
            continue
        mods = _imports_of(src)
        bad += [f"{src.relative_to(PKG)}: {m}" for m in mods
                if m.split(".")[0] == "tests" or m in ("vllm_specx.assets", "vllm_specx.testing")]
    assert not bad, bad


def test_every_patch_lives_in_its_own_module():
    modules = [p.make.__module__ for p in _vllm_compat.MANIFEST]
    assert len(set(modules)) == len(modules), modules
    assert all(m.startswith("vllm_specx._vllm_compat.") for m in modules)


def test_training_does_not_import_the_benchmark_tooling():
    """Training is a library path: it must not import the benchmark, load or evaluation tools."""
    tools = ("vllm_specx.bench",)
    offenders = [f"{src.relative_to(PKG)}: {m}" for src in (PKG / "training").rglob("*.py")
                 for m in tools if re.search(rf"^\s*(from {re.escape(m)}\b|import {re.escape(m)}\b)", src.read_text(), re.M)]
    assert not offenders, offenders


# The package root holds the plugin and the modules its tools share; benchmark, load and
# evaluation tooling lives in `vllm_specx/bench/`, methods in `methods/`, vLLM patches in
# `_vllm_compat/`.
ROOT_MODULES = {"__init__.py", "registry.py", "checkpoint.py", "layers.py", "vocab.py", "envs.py", "engine.py",
                "metrics.py", "assets.py", "targets.py", "cli.py", "vllm_versions.py", "speculator_api.py",
                "progress.py"}


def test_the_package_root_holds_only_plugin_modules():
    found = {p.name for p in PKG.glob("*.py")}
    assert found == ROOT_MODULES, (f"not a plugin module (tooling goes to vllm_specx/bench/): "
                                   f"{sorted(found - ROOT_MODULES)}; gone: {sorted(ROOT_MODULES - found)}")


def test_no_import_cycle_inside_a_method_folder():
    """Inside each method folder the modules' imports of each other form no cycle."""
    for folder in sorted(p for p in (PKG / "methods").iterdir() if (p / "__init__.py").is_file()):
        pkg = f"vllm_specx.methods.{folder.name}"
        mods = {p.stem: p for p in folder.glob("*.py") if p.stem != "__init__"}
        graph = {m: {n for n in mods if any(i == f"{pkg}.{n}" or i.startswith(f"{pkg}.{n}.")
                                           for i in _imports_of(src))} - {m}
                 for m, src in mods.items()}
        state: dict[str, int] = {}

        def visit(m, path):
            if state.get(m) == 1:
                raise AssertionError(f"import cycle in {pkg}: {' -> '.join(path + [m])}")
            if state.get(m) == 2:
                return
            state[m] = 1
            for n in sorted(graph[m]):
                visit(n, path + [m])
            state[m] = 2

        for m in sorted(graph):
            visit(m, [])


def _import_graph(root: Path) -> dict[str, dict[str, int]]:
    """module -> {module of the same package it imports: line}, for every module under `root`
    (a package folder), from the source: `import a.b`, `from a import b` (module b, or a's
    `__init__` when b is a name in it) and relative imports, wherever they stand (module level,
    inside a function, under `if`). Parent packages a submodule import runs first are not edges,
    and neither are `importlib.import_module` calls (the registry's plugin loading)."""
    files = {}
    for src in root.rglob("*.py"):
        parts = src.relative_to(root.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = src

    def owner(name: str) -> str | None:  # the longest prefix of `name` that is one of the modules
        parts = name.split(".")
        return next((m for i in range(len(parts), 0, -1) if (m := ".".join(parts[:i])) in files), None)

    graph: dict[str, dict[str, int]] = {}
    for mod, src in files.items():
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(src.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = mod.split(".") if src.name == "__init__.py" else mod.split(".")[:-1]
                    base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for target in filter(None, map(owner, names)):
                if target != mod:
                    edges.setdefault(target, node.lineno)
        graph[mod] = edges
    return graph


def _import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The modules of each import cycle (the graph's strongly connected components of 2 or more;
    Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while not part or part[-1] != v:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _describe(graph: dict[str, dict[str, int]], cycles: list[list[str]]) -> list[str]:
    return [" | ".join(f"{a} -> {b} (line {line})" for a in cycle for b, line in sorted(graph[a].items())
                       if b in cycle) for cycle in cycles]


def test_no_import_cycle_in_the_package():
    """No two modules of `vllm_specx` import each other, directly or through others, counting the
    imports inside functions too (a lazy import hides a circle from Python, not from readers: the
    two modules still depend on each other). Shared code goes to a module both sides import."""
    graph = _import_graph(PKG)
    assert len(graph) == len(SOURCES)
    cycles = _import_cycles(graph)
    assert not cycles, _describe(graph, cycles)


def test_the_cycle_scan_finds_a_cycle(tmp_path):
    """Negative control: in a synthetic package, a module-level `from pkg import b` in a.py and a
    function-level `from . import a` in b.py form a cycle the scan reports (with a third module
    joined through a name of the package's `__init__`); without the function-level import, none."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg.c import helper\n")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    (pkg / "c.py").write_text("import os\n\ndef helper():\n    from pkg import helper as again\n    return again\n")
    graph = _import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.b": 1} and graph["pkg.b"] == {"pkg.a": 2}
    assert sorted(_import_cycles(graph)) == [["pkg", "pkg.c"], ["pkg.a", "pkg.b"]]
    (pkg / "b.py").write_text("def f():\n    return None\n")
    (pkg / "c.py").write_text("def helper():\n    return None\n")
    assert _import_cycles(_import_graph(pkg)) == []


# A module of `training/` longer than this does more than one job (issue 46): split it by job.
TRAINING_MAX_LINES = 450


def test_no_training_module_over_the_line_limit():
    lengths = {src.relative_to(PKG / "training").as_posix(): len(src.read_text().splitlines())
               for src in (PKG / "training").rglob("*.py")}
    over = {name: n for name, n in lengths.items() if n > TRAINING_MAX_LINES}
    assert not over, over


# The README is what a vLLM user reads first (issue 55): short, and every link in it, in the docs
# and in the results index resolves to a file or folder of the repository (and, for a link into a
# Markdown file, to one of its headings).
REPO = PKG.parent
README = REPO / "README.md"
README_MAX_LINES = 250
LINKED_DOCS = (README, *sorted((REPO / "docs").rglob("*.md")), REPO / "benchmarks" / "results" / "README.md")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[([^\]\n]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _links(text: str) -> list[tuple[str, str]]:
    """(text, target) of every Markdown link and image outside code blocks and code spans."""
    return [(m.group(1), m.group(2)) for m in _LINK.finditer(_CODE.sub("", _FENCE.sub("", text)))]


def _anchors(text: str) -> set[str]:
    """The heading anchors GitHub gives a Markdown text: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", _FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        out.add(slug if seen[slug] == 0 else f"{slug}-{seen[slug]}")
    return out


def broken_links(text: str, where: Path, root: Path = REPO) -> list[str]:
    """The relative links of `text` (a Markdown file at `where`) that point to nothing inside
    `root`: a missing file or folder, or a missing heading of a Markdown file. URLs are not
    followed."""
    bad = []
    for _, target in _links(text):
        if re.match(r"^[a-zA-Z][\w+.-]*:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (where.parent / unquote(path)).resolve() if path else where.resolve()
        if root.resolve() not in (dest, *dest.parents) or not dest.exists():
            bad.append(f"{target}: no such file or folder")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text()):
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    return bad


def test_the_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}): move detail to docs/"


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(doc):
    assert doc.is_file(), doc
    assert not broken_links(doc.read_text(), doc), broken_links(doc.read_text(), doc)


def _figures(text: str) -> list[tuple[str, str]]:
    """(figure, target) of every link whose text is a number (`[2.40](...)`, `[**1.41×**](...)`)."""
    return [(t.strip("*"), target) for t, target in _links(text) if re.fullmatch(r"\**[\d.,]+×?\**", t)]


def unbacked_figures(text: str, root: Path = REPO) -> list[str]:
    """The linked figures of `text` (a Markdown file at `root`) whose link is not a file under
    `root`/benchmarks/results that shows the same figure."""
    results = (root / "benchmarks" / "results").resolve()
    bad = []
    for figure, target in _figures(text):
        run = (root / target.partition("#")[0]).resolve()
        if results not in run.parents or not run.is_file() or figure not in run.read_text():
            bad.append(f"{figure} -> {target}")
    return bad


def test_every_figure_in_the_readme_links_to_a_run_that_holds_it():
    """Each figure of the README's results table links to the file of its committed run, and that
    file shows the same figure."""
    assert len(_figures(README.read_text())) >= 24  # τ and speed-up at batch 1 and 16, six rows
    assert not unbacked_figures(README.read_text()), unbacked_figures(README.read_text())


def test_the_link_checks_can_fail(tmp_path):
    """Negative control: a missing file, a missing folder, a missing heading and a link that leaves
    the repository are reported, and existing ones, URLs and links inside code are not; a figure
    that its linked run does not show, or that links outside the results, is reported."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## The ×2 table: τ\n\n## Title\n")
    doc = tmp_path / "README.md"
    text = ("[ok](docs/a.md) [ok](docs/) [ok](docs/a.md#the-2-table-τ) [ok](docs/a.md#title-1) ![ok](docs/a.md)\n"
            "[web](https://example.org/missing.md) `[code](missing-in-code.md)`\n"
            "```\n[block](missing-in-block.md)\n```\n"
            "[gone](docs/b.md) [gone](results/) [gone](docs/a.md#no-such-heading) [out](../outside.md)\n")
    assert [b.split(":")[0] for b in broken_links(text, doc, tmp_path)] == [
        "docs/b.md", "results/", "docs/a.md#no-such-heading", "../outside.md"]
    assert broken_links("[ok](docs/a.md#title)", doc, tmp_path) == []
    run = tmp_path / "benchmarks" / "results" / "run"
    run.mkdir(parents=True)
    (run / "results.md").write_text("| mtp | 2.40 | 1.41× |\n")
    (tmp_path / "docs" / "other.md").write_text("2.41\n")
    text = ("| [2.40](benchmarks/results/run/results.md) | [**1.41×**](benchmarks/results/run/results.md) |"
            " [2.41](benchmarks/results/run/results.md) | [2.41](docs/other.md) | [1.5×](benchmarks/results/gone.md) |")
    assert unbacked_figures(text, tmp_path) == [
        "2.41 -> benchmarks/results/run/results.md", "2.41 -> docs/other.md", "1.5× -> benchmarks/results/gone.md"]
