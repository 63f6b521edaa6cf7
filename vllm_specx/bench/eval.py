"""Measure speculative decoding in vLLM: tau, per-position acceptance and tokens/s, from vLLM's own
spec-decode counters, for one speculative config on one prompt set. Used by the demo, the
end-to-end benchmark and the trained-head test.
"""

from __future__ import annotations

import time

from vllm_specx.engine import cpu_llm
from vllm_specx.metrics import acceptance_summary, spec_metrics

_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def generate_measured(llm, inputs: list, params) -> dict:
    """`llm.generate(inputs, params)` timed, with vLLM's spec-decode counters of this call alone.

    Returns:
        {"output_tokens", "wall_s", "tokens_per_s", "outputs" (token ids per prompt),
         "num_drafts", "num_draft_tokens", "num_accepted_tokens", "tau", "acceptance_per_pos"}
        (tau None and acceptance [] when nothing was drafted).
    """
    before = spec_metrics(llm)
    t0 = time.perf_counter()
    outs = llm.generate(inputs, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    after = spec_metrics(llm)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    n_out = sum(map(len, tokens))
    row = {"output_tokens": n_out, "wall_s": round(wall, 3), "tokens_per_s": round(n_out / wall, 2),
           "outputs": tokens}
    d = {k: after.get(k, 0) - before.get(k, 0) for k in _COUNTERS}
    pos_after = after.get("num_accepted_tokens_per_pos") or []
    pos_before = before.get("num_accepted_tokens_per_pos") or [0] * len(pos_after)
    s = acceptance_summary(d["num_drafts"], d["num_accepted_tokens"],
                           [a - b for a, b in zip(pos_after, pos_before)])
    row.update(d, tau=None if s["tau"] is None else round(s["tau"], 4), acceptance_per_pos=s["acceptance_per_pos"])
    return row


def serve_answers(target, method: str, draft, rows: list[dict], k: int, max_tokens: int | None = None) -> dict:
    """vLLM serving evaluation answers (`gen-data --for-eval` rows: `prompt_ids`, `output_ids`)
    with a draft, K drafts a pass, greedy: each prompt's token ids, `max_tokens` the answer's
    length (or the cap given). `generate_measured`'s row plus `answers` (the answers cut to what
    was served) and `identical` (outputs equal to them: greedy with a draft = without)."""
    from vllm import SamplingParams

    cut = [r["output_ids"][:max_tokens] if max_tokens else r["output_ids"] for r in rows]
    params = [SamplingParams(temperature=0, max_tokens=len(a), ignore_eos=True) for a in cut]
    spec = {"method": method, "model": str(draft), "num_speculative_tokens": k}
    with cpu_llm(target, spec) as llm:
        got = generate_measured(llm, [{"prompt_token_ids": r["prompt_ids"]} for r in rows], params)
    got["answers"] = cut
    got["identical"] = sum(o == a for o, a in zip(got["outputs"], cut))
    return got


def measure(target, prompts: list[str], speculative_config: dict | None, max_tokens: int = 128,
            temperature: float = 0.0, **engine) -> dict:
    """Generate `max_tokens` per prompt (ignore_eos) after a one-prompt warm-up: `generate_measured`'s
    dict (counters exclude the warm-up; without speculation, only the token and time fields)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True, seed=0)
    with cpu_llm(target, speculative_config, **engine) as llm:
        llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        result = generate_measured(llm, prompts, params)
    if speculative_config is None:
        for k in (*_COUNTERS, "tau", "acceptance_per_pos"):
            result.pop(k)
    return result


def run_configs(target, configs: dict[str, dict | None], prompts: list[str], max_tokens: int) -> list[dict]:
    """`measure` each named config on `target` in turn; adds speed-up vs the "no-spec" row and a
    lossless flag (greedy outputs equal to no-spec's)."""
    rows = [{"config": name, "speculative_config": spec, **measure(target, prompts, spec, max_tokens)}
            for name, spec in configs.items()]
    base = next((r for r in rows if r["speculative_config"] is None), None)
    for r in rows:
        if base is not None:
            r["speedup_vs_nospec"] = round(r["tokens_per_s"] / base["tokens_per_s"], 3)
            r["greedy_output_identical"] = r["outputs"] == base["outputs"]
    return rows


def format_table(rows: list[dict]) -> str:
    head = f"{'config':<22}{'tau':>7}{'tok/s':>9}{'speedup':>9}{'identical':>11}  acceptance per position"
    lines = [head, "-" * len(head)]
    for r in rows:
        tau = f"{r['tau']:.3f}" if r.get("tau") else "-"
        acc = " ".join(f"{a:.2f}" for a in r.get("acceptance_per_pos", []))
        lines.append(f"{r['config']:<22}{tau:>7}{r['tokens_per_s']:>9.1f}"
                     f"{r.get('speedup_vs_nospec', 1.0):>9.2f}{str(r.get('greedy_output_identical', '-')):>11}  {acc}")
    return "\n".join(lines)
