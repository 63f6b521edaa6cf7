"""vLLM's own spec-decode counters, read back as tau (accepted tokens per target pass) and
per-position acceptance: the one reader every test, benchmark and script uses."""

from __future__ import annotations


def acceptance_summary(num_drafts: int, num_accepted: int, accepted_per_pos: list[int]) -> dict:
    """tau = 1 + accepted / drafts (as vLLM's spec-decode metrics define it) and the per-position
    acceptance rates; None / [] when nothing was drafted."""
    if not num_drafts:
        return {"tau": None, "acceptance_per_pos": []}
    return {"tau": 1 + num_accepted / num_drafts,
            "acceptance_per_pos": [round(a / num_drafts, 4) for a in accepted_per_pos]}


def spec_metrics(llm) -> dict:
    """vLLM's spec-decode counters of an offline `LLM` (names without the `vllm:spec_decode_`
    prefix), with tau and acceptance_per_pos."""
    m = {x.name.removeprefix("vllm:spec_decode_"): getattr(x, "value", getattr(x, "values", None))
         for x in llm.get_metrics() if x.name.startswith("vllm:spec_decode")}
    m.update(acceptance_summary(m.get("num_drafts", 0), m.get("num_accepted_tokens", 0),
                                m.get("num_accepted_tokens_per_pos") or []))
    return m
