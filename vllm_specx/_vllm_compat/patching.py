"""The patch machinery every patch module of `vllm_specx._vllm_compat` builds on: `@patch` /
`@probe` declare a patch and its effect check into `MANIFEST` (in import order), `resolve` and
`_replace` find and swap a vLLM symbol (`original` keeps what it replaced), `Blank` and
`ProbeReached` are the probes' fake inputs, and `register_archs` / `route_of` connect the
registry's methods to vLLM's model registry and a routed engine. The package's `__init__`
imports the patch modules and applies them (`install`, `check`); the patch modules import this
module, never the package, so no import runs in a circle."""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable

from vllm_specx import registry

logger = logging.getLogger("vllm.specx")  # a child of "vllm": gets vLLM's handlers once configured

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

