"""The method registry: every speculative method vllm-specx serves or trains is one `Method` record.

A method lives in its own folder (`vllm_specx/methods/<name>/`) and registers itself there::

    METHOD = registry.register(registry.Method(name="<name>", config_cls=..., ...))

Routing (the `SpeculativeConfig` patch), the `vllm-specx` CLI, `check`, the trainer and the
benchmarks loop over `methods()` and never spell a method name. Built-in methods are found by
importing every sub-package of `vllm_specx.methods`; other packages can add methods through the
`vllm_specx.methods` entry-point group (each entry point is a module that registers on import).

Nothing here imports vLLM: the front end, the trainer and the CLI share it.

A method's draft config (`Method.config_cls`) is a frozen dataclass that validates itself in
`__post_init__` (so a config rebuilt from a dict inside a vLLM worker is checked as strictly as one
read from disk) and provides:

* `source_format: str` - the checkpoint format it was read from;
* `max_drafts: int` - drafts per pass when the user gives no `num_speculative_tokens`;
* `check_target(target: dict, num_speculative_tokens: int | None)` - raise ValueError naming the
  field when the draft cannot serve the target (`target` as `target_dims` returns it);
* `expected_tensors() -> dict[str, tuple[int, ...]]` - checkpoint tensor names and shapes;
* `to_dict() -> dict` - JSON-able fields, `config_cls(**to_dict())` rebuilds it;
* `summary() -> str` - one line for `vllm-specx check`;
* optionally `max_drafts_source: str` - where `max_drafts` comes from, for messages (the field).

Every check that can run before an engine starts is in `check_draft` (config against target,
drafts per pass, tensor names, shapes, dtypes and values); the route runs it while vLLM builds the
speculative config, and for the baselines vLLM serves itself it runs `Baseline.check_draft`.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from vllm_specx.checkpoint import check_tensors, check_vocab_maps, read_config_json

ENTRY_POINT_GROUP = "vllm_specx.methods"
# The target fields every draft is checked against (its HF text config).
TARGET_FIELDS = ("hidden_size", "num_hidden_layers", "vocab_size")
# The most drafts per pass vLLM verifies: its rejection sampler's MAX_SPEC_LEN (it asserts this in
# the worker, on the first speculative step; a test checks the value against the installed vLLM).
MAX_DRAFTS_PER_PASS = 128


@dataclasses.dataclass(frozen=True)
class Method:
    """One speculative method.

    Attributes:
        name: the user-facing `method` of the speculative config (and the trainer's `--method`).
        config_cls: the method's draft config class (protocol in the module docstring).
        detect: `detect(raw config.json dict)` -> the checkpoint format this config.json claims
            to be (for example "specx"), or None when it is not this method's checkpoint.
        read_config: `read_config(raw, where)` -> config; raises ValueError naming the field and
            `where` (the file) for a checkpoint that claims to be this method's but is bad.
        internal_method: the vLLM method whose runner plumbing the proposer reuses.
        internal_method_for: `internal_method_for(config)` -> the internal method for one draft,
            when it depends on the checkpoint (None: always `internal_method`).
        arch: the draft architecture registered with vLLM's ModelRegistry.
        model_cls: "module:Class" of the vLLM draft model.
        proposer_cls: "module:Class" of the proposer swapped into vLLM's V1 runner.
        vllm_archs: further architecture names vLLM's plumbing may look the model up by.
        finish_hf: `finish_hf(draft hf_config, config)`: mirror the config into the HF-config keys
            vLLM's plumbing reads (for its `internal_method`).
        defer_to_vllm: `defer_to_vllm(fmt, requested_method, v2_would_run)`: True leaves a
            detected checkpoint to vLLM's own implementation.
        trainer: module with the trainer hooks (`add_args`, `build`, `make_batch`, `forward`,
            `save`; see `vllm_specx.training.trainer`), or None when the method is not trainable.
        vllm_internals: every vLLM internal the method's vLLM-side modules import or override
            ("module:attr" or "module:Class.attr"); listed in `_vllm_compat`'s manifest and
            checked against the installed vLLM.
        spec_options: `(field, verdict, note)` for the vLLM speculative-config fields whose
            verdict for this method differs from (or is missing in) the shared table in
            `vllm_specx._vllm_compat.route` (verdicts: honoured, vllm, irrelevant, internal,
            refused; a set option whose verdict is refused fails at config time, naming it).
        description: one line for `vllm-specx methods`.
        adaptive_drafting: its proposer implements confidence-scheduled drafting
            (`vllm_specx.adaptive`; the speculative config's `adaptive` options).
    """

    name: str
    config_cls: type
    detect: Callable[[dict], str | None]
    read_config: Callable[[dict, str], Any]
    internal_method: str
    arch: str
    model_cls: str
    proposer_cls: str
    vllm_archs: tuple[str, ...] = ()
    finish_hf: Callable[[Any, Any], None] = lambda hf, cfg: None
    defer_to_vllm: Callable[[str, str | None, bool], bool] = lambda fmt, requested, v2: False
    trainer: str | None = None
    vllm_internals: tuple[str, ...] = ()
    description: str = ""
    spec_options: tuple[tuple[str, str, str], ...] = ()
    internal_method_for: Callable[[Any], str] | None = None
    adaptive_drafting: bool = False

    @property
    def archs(self) -> tuple[str, ...]:
        return (self.arch, *self.vllm_archs)

    def internal(self, cfg) -> str:
        """The vLLM method whose plumbing serves the draft with config `cfg`."""
        return self.internal_method_for(cfg) if self.internal_method_for else self.internal_method


@dataclasses.dataclass(frozen=True)
class Baseline:
    """A method vLLM serves with its own implementation, trained here on the same data and budget
    as our methods so that they are compared fairly (routing never touches it).

    Attributes:
        name: the trainer's `--method`.
        vllm_method: the speculative-config `method` vLLM serves the trained draft with.
        trainer: module with the trainer hooks (as `Method.trainer`).
        description: one line for `vllm-specx methods`.
        check_draft: `check_draft(path, target, num_speculative_tokens)`: every check of a local
            draft directory that can run before vLLM's engine starts (`target` as `target_dims`
            returns it); ValueError naming the field or file. None: no checks beyond the files'.
    """

    name: str
    vllm_method: str
    trainer: str
    description: str = ""
    check_draft: Callable[[str, dict, int | None], None] | None = None


_METHODS: dict[str, Method] = {}
_BASELINES: dict[str, Baseline] = {}
_loaded = False


def register_baseline(baseline: Baseline) -> Baseline:
    """Add a trained baseline (idempotent for the same record; names are shared with methods)."""
    old = _BASELINES.get(baseline.name)
    if (old is not None and old != baseline) or baseline.name in _METHODS:
        raise ValueError(f"vllm-specx: {baseline.name!r} is already registered")
    _BASELINES[baseline.name] = baseline
    return baseline


def baselines() -> dict[str, Baseline]:
    """Every registered baseline, by name."""
    _load_methods()
    return dict(_BASELINES)


def trainers() -> dict[str, str]:
    """Trainer-hook module of every trainable method and baseline, by `--method` name."""
    out = {name: m.trainer for name, m in methods().items() if m.trainer}
    out.update({name: b.trainer for name, b in baselines().items()})
    return out


def register(method: Method) -> Method:
    """Add `method` (idempotent for the same record; a different record under a taken name or
    architecture is an error)."""
    old = _METHODS.get(method.name)
    if (old is not None and old != method) or method.name in _BASELINES:
        raise ValueError(f"vllm-specx: method {method.name!r} is already registered")
    for other in _METHODS.values():
        if other.name != method.name and set(other.archs) & set(method.archs):
            raise ValueError(f"vllm-specx: method {method.name!r} reuses architecture(s) of "
                             f"{other.name!r}: {sorted(set(other.archs) & set(method.archs))}")
    _METHODS[method.name] = method
    return method


def unregister(name: str) -> None:
    _METHODS.pop(name, None)


def _load_methods() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    import vllm_specx.methods as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.ispkg:
            importlib.import_module(f"{pkg.__name__}.{info.name}")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        ep.load()


def methods() -> dict[str, Method]:
    """Every registered method, by name (built-ins first, in folder order)."""
    _load_methods()
    return dict(_METHODS)


def get(name: str) -> Method:
    known = methods()
    if name not in known:
        raise ValueError(f"unknown vllm-specx method {name!r}; registered: {sorted(known)}")
    return known[name]


def detect(raw: dict[str, Any]) -> tuple[Method, str] | None:
    """(method, format) of the registered method whose checkpoint `raw` (config.json) claims to be."""
    found = [(m, fmt) for m in methods().values() if (fmt := m.detect(raw)) is not None]
    if len(found) > 1:
        raise ValueError(f"config.json is claimed by several methods: {[m.name for m, _ in found]}")
    return found[0] if found else None


def read_checkpoint(path: str | Path) -> tuple[Method, Any]:
    """(method, config) of the draft checkpoint directory `path`; ValueError naming the file or
    field when no registered method claims it or its config is bad."""
    raw = read_config_json(path)
    hit = detect(raw)
    if hit is None:
        raise ValueError(f"{Path(path) / 'config.json'}: not a checkpoint of any vllm-specx method "
                         f"(registered: {sorted(methods())})")
    return hit[0], hit[0].read_config(raw, str(Path(path) / "config.json"))


def choose(requested: str | None, model: str | None, v2_would_run: bool) -> tuple[Method, Any] | None:
    """The method (and its validated draft config) that serves a speculative config, or None to
    leave the config to vLLM.

    Args:
        requested: the user's `method` (None when omitted).
        model: the user's draft `model` (a local directory for our methods).
        v2_would_run: whether vLLM would pick its V2 model runner for this engine.
    """
    if not model or not (Path(model) / "config.json").is_file():
        return None
    known = methods()
    if requested is not None and requested not in known:
        return None
    raw = read_config_json(model)
    hit = detect(raw)
    if hit is None:
        return None
    method, fmt = hit
    if requested not in (None, method.name):
        return None
    if method.defer_to_vllm(fmt, requested, v2_would_run):
        return None
    return method, method.read_config(raw, f"{model}/config.json")


def target_dims(text_config) -> dict[str, Any]:
    """The target fields drafts are checked against, from an HF (text) config object."""
    return {k: getattr(text_config, k) for k in TARGET_FIELDS}


def adaptive_methods() -> list[str]:
    """Names of the methods whose proposers implement adaptive drafting."""
    return sorted(name for name, m in methods().items() if m.adaptive_drafting)


def draft_methods() -> set[str]:
    """The speculative-config `method`s whose drafts vllm-specx checks before an engine starts:
    every registered method and the vLLM method of every baseline."""
    return set(methods()) | {b.vllm_method for b in baselines().values()}


def baseline_for(vllm_method: str | None) -> Baseline | None:
    """The baseline vLLM serves with `vllm_method` that has draft checks, or None."""
    found = [b for b in baselines().values() if b.vllm_method == vllm_method and b.check_draft]
    return found[0] if found else None


def check_num_drafts(cfg, path: str | Path, num_speculative_tokens: int | None) -> None:
    """ValueError naming the field when a pass would draft more tokens than vLLM verifies: the
    requested `num_speculative_tokens`, or (none requested) the draft's default, `max_drafts`."""
    k = cfg.max_drafts if num_speculative_tokens is None else num_speculative_tokens
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"num_speculative_tokens must be a positive integer, got {k!r}")
    if k <= MAX_DRAFTS_PER_PASS:
        return
    if num_speculative_tokens is not None:
        raise ValueError(f"num_speculative_tokens {k} is beyond vLLM's limit of "
                         f"{MAX_DRAFTS_PER_PASS} drafts per pass (its rejection sampler's MAX_SPEC_LEN)")
    source = getattr(cfg, "max_drafts_source", "the draft's default")
    raise ValueError(f"draft {path}: {source} gives {k} drafts per pass by default, beyond vLLM's "
                     f"limit of {MAX_DRAFTS_PER_PASS} (its rejection sampler's MAX_SPEC_LEN); set "
                     f"num_speculative_tokens <= {MAX_DRAFTS_PER_PASS}")


def check_draft(method: Method, cfg, path: str | Path, target: dict[str, Any],
                num_speculative_tokens: int | None) -> None:
    """Every check that can run before an engine starts: config vs target, drafts per pass, then
    the tensors (names, shapes, dtypes, and NaN / inf values), and a reduced draft vocabulary's maps."""
    try:
        cfg.check_target(target, num_speculative_tokens)
    except ValueError as e:
        raise ValueError(f"draft {path}: {e}") from e
    check_num_drafts(cfg, path, num_speculative_tokens)
    check_tensors(path, cfg.expected_tensors())
    if getattr(cfg, "reduced_vocab", False):  # a method's config says whether it has one
        check_vocab_maps(path, cfg.vocab_size, cfg.draft_vocab_size)


def config_of(hf_config):
    """(method, validated config) that the route stored on a draft's HF config, or None.

    Workers call this to rebuild the config from the dict the front end stored (`specx_config`);
    the config class re-runs every check in `__post_init__`.
    """
    name = getattr(hf_config, "specx_route", None)
    if not name:
        return None
    method = get(name)
    return method, method.config_cls(**hf_config.specx_config)
