"""A probe on an engine's drafter, for benchmarks and tests that read what each target pass proposed.

`LLM.collective_rpc(propose_probe)` wraps the worker's drafter (vLLM 0.32's V1 `drafter`, vLLM
0.34's V2 `speculator`) once, so that every `propose` call records its wall time and its draft
ids; each call of the probe returns the records since the last and clears them."""

from __future__ import annotations

import time


def propose_probe(worker) -> list[dict] | None:
    """In the worker: [{"seconds", "drafts"}] per `propose` call since the last probe (None: no
    drafter). The draft ids are copied to the host after the timer stops."""
    runner = worker.model_runner
    d = getattr(runner, "speculator", None) or getattr(runner, "drafter", None)
    if d is None:
        return None
    if not hasattr(d, "_specx_probe"):
        propose, d._specx_probe = d.propose, []

        def probed(*args, **kwargs):
            t0 = time.perf_counter()
            out = propose(*args, **kwargs)
            seconds = time.perf_counter() - t0
            ids = out[0] if isinstance(out, tuple) else out
            d._specx_probe.append({"seconds": seconds, "drafts": ids.tolist() if hasattr(ids, "tolist")
                                   else [list(x) for x in ids]})
            return out
        d.propose = probed
    got = list(d._specx_probe)
    d._specx_probe.clear()
    return got


def greedy_walk(passes: list[list[int]], out: list[int], k: int) -> list[tuple[int, list[int], int]]:
    """One request served alone at T = 0: (position in `out` of the pass's anchor, its drafts, how
    many of them the output accepted) for each recorded pass (`passes`: each pass's k drafts), up
    to the pass that reached the output's end. That last pass's anchor may lie beyond `out` (its
    verification may have accepted past max_tokens): compare drafts with a reference on the others."""
    walk, pos = [], 0
    for d in passes:
        m = 0
        while m < k and pos + 1 + m < len(out) and d[m] == out[pos + 1 + m]:
            m += 1
        walk.append((pos, d, m))
        pos += m + 1
        if pos >= len(out):
            break
    return walk
