"""Which vLLM versions vllm-specx serves, and by which path (plain Python: no vLLM import).

* vLLM 0.32 and 0.33 (`V1_RANGE`): vLLM's V1 model runner, reached through the patches in
  `vllm_specx._vllm_compat` (vLLM has no speculator plugin API there).
* vLLM 0.34 (`V2_RANGE`): vLLM's V2 model runner (0.34 has no V1 runner), reached through its
  own speculator plugin API (`register_speculative_method`, `vllm_specx.speculator_api`), with
  nothing patched.

Ranges are [min, max) on (major, minor).
"""

from __future__ import annotations

V1_RANGE = ((0, 32), (0, 34))
V2_RANGE = ((0, 34), (0, 35))
SUPPORTED = (V1_RANGE[0], V2_RANGE[1])


def minor(version: str) -> tuple[int, int]:
    """(major, minor) of a vLLM version string ("0.34.0", "0.33.1+cpu", "0.34.0rc1")."""
    parts = []
    for p in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit()) if not p.isdigit() else p
        parts.append(int(digits or 0))
    return tuple(parts)  # type: ignore[return-value]


def serving_path(version: str) -> str:
    """"v1" (patches on vLLM's V1 runner) or "v2" (vLLM's speculator API on its V2 runner) for
    vLLM `version`; RuntimeError naming the supported range for any other version."""
    v = minor(version)
    if V1_RANGE[0] <= v < V1_RANGE[1]:
        return "v1"
    if V2_RANGE[0] <= v < V2_RANGE[1]:
        return "v2"
    lo, hi = SUPPORTED
    raise RuntimeError(
        f"vllm-specx supports vLLM >= {lo[0]}.{lo[1]}, < {hi[0]}.{hi[1]} (0.32 and 0.33 on the V1 "
        f"model runner, 0.34 through vLLM's speculator API); found vLLM {version}. Install a "
        "supported vLLM or a vllm-specx release made for yours.")
