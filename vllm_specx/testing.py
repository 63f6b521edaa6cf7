"""Helpers for tests, demos and benchmarks that run vLLM on the CPU with the reference target.

Worker-side helpers (`record_drafts`, `read_drafts`, `spy_rejection_sampler`, ...) are passed to
`LLM.collective_rpc`, which runs them inside the vLLM worker with the worker as argument; they
live in this importable module so the worker process can unpickle them.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# VLLM_SPECX_ASSETS points the tests at another folder with ref-target/ and prompts/.
ASSETS = Path(os.environ.get("VLLM_SPECX_ASSETS", REPO / "assets"))
REF_TARGET = ASSETS / "ref-target"
PROMPTS = ASSETS / "prompts"

# CPU engine settings measured to work on the 2-core, 24 GB machines.
CPU_ENGINE_ARGS = dict(dtype="float32", max_model_len=1024, enforce_eager=True,
                       gpu_memory_utilization=0.2, disable_log_stats=False, seed=0)


def load_prompts(name: str = "code", limit: int | None = None) -> list[str]:
    rows = [json.loads(line) for line in (PROMPTS / f"{name}.jsonl").read_text().splitlines() if line]
    return [r["prompt"] for r in rows[:limit]]


@contextlib.contextmanager
def cpu_llm(model: str | Path = REF_TARGET, speculative_config: dict | None = None, **overrides):
    """An offline `vllm.LLM` on the CPU, shut down on exit."""
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(callable)
    from vllm import LLM

    llm = LLM(model=str(model), speculative_config=speculative_config, **{**CPU_ENGINE_ARGS, **overrides})
    try:
        yield llm
    finally:
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm
        gc.collect()


def spec_metrics(llm) -> dict:
    """vLLM's own spec-decode counters, with tau = 1 + accepted / drafts."""
    m = {x.name.removeprefix("vllm:spec_decode_"): getattr(x, "value", getattr(x, "values", None))
         for x in llm.get_metrics() if x.name.startswith("vllm:spec_decode")}
    m.update(acceptance_summary(m.get("num_drafts", 0), m.get("num_accepted_tokens", 0),
                                m.get("num_accepted_tokens_per_pos") or []))
    return m


def acceptance_summary(num_drafts: int, num_accepted: int, accepted_per_pos: list[int]) -> dict:
    """tau = 1 + accepted / drafts (as vLLM's spec-decode metrics define it) and the per-position
    acceptance rates; None / [] when nothing was drafted."""
    if not num_drafts:
        return {"tau": None, "acceptance_per_pos": []}
    return {"tau": 1 + num_accepted / num_drafts,
            "acceptance_per_pos": [round(a / num_drafts, 4) for a in accepted_per_pos]}


# ---- worker-side helpers (run through LLM.collective_rpc) -------------------------------------

def drafter_class(worker) -> str:
    d = getattr(worker.model_runner, "drafter", None)
    return f"{type(d).__module__}.{type(d).__qualname__}" if d is not None else "None"


def rejection_sampler_info(worker) -> dict:
    rs = worker.model_runner.rejection_sampler
    return {"class": type(rs).__name__, "method": getattr(rs, "method", None),
            "calls": getattr(rs, "calls", None)}


def drafter_stats(worker) -> dict:
    return dict(getattr(worker.model_runner.drafter, "stats", {}))


def record_drafts(worker) -> None:
    """Record (anchor ids, draft ids) of every DSparkProposer draft pass."""
    d = worker.model_runner.drafter
    if getattr(d, "_recorded", None) is not None:
        d._recorded.clear()
        return
    d._recorded = []
    orig = d._sample_draft_tokens

    def _sample_draft_tokens(hidden_states, sampling_metadata):
        ids, probs = orig(hidden_states, sampling_metadata)
        batch = hidden_states.shape[0] // d.num_speculative_tokens
        d._recorded.append((d._anchor_ids[:batch].tolist(), ids.view(batch, -1).tolist()))
        return ids, probs

    d._sample_draft_tokens = _sample_draft_tokens


def read_drafts(worker) -> list:
    return list(getattr(worker.model_runner.drafter, "_recorded", []))


def spy_rejection_sampler(worker) -> None:
    """Record what the runner's rejection sampler receives as draft probabilities."""
    rs = worker.model_runner.rejection_sampler
    rs._specx_seen = []
    orig = rs.forward

    def forward(metadata, draft_probs, *args, **kwargs):
        rs._specx_seen.append(None if draft_probs is None else tuple(draft_probs.shape))
        return orig(metadata, draft_probs, *args, **kwargs)

    rs.forward = forward


def read_rejection_spy(worker) -> list:
    return list(getattr(worker.model_runner.rejection_sampler, "_specx_seen", []))
