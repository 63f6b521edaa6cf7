"""Measure speculative decoding in vLLM: tau, per-position acceptance and tokens/s, from vLLM's own
spec-decode counters, for one speculative config on one prompt set. Used by the demo, the
end-to-end benchmark and the trained-head test.
"""

from __future__ import annotations

import contextlib
import time

from vllm_specx.engine import cpu_llm
from vllm_specx.metrics import acceptance_summary, spec_metrics
from vllm_specx.progress import Reporter, duration

# The warm-up's prompt: a text outside every measured set (a measured prompt would sit in the
# prefix cache, of which vLLM reuses one block less with EAGLE-style drafters, as it recomputes the
# last block for their hidden states: an edge for no-spec and n-gram).
WARM_UP = "The quick brown fox jumps over the lazy dog."
_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def generate_measured(llm, inputs: list, params, use_tqdm=False) -> dict:
    """`llm.generate(inputs, params)` timed, with vLLM's spec-decode counters of this call alone
    (`use_tqdm`: vLLM's progress bar, e.g. `Reporter.vllm_bar`; it updates as prompts finish).

    Returns:
        {"output_tokens", "wall_s", "tokens_per_s", "outputs" (token ids per prompt),
         "num_drafts", "num_draft_tokens", "num_accepted_tokens", "tau", "acceptance_per_pos"}
        (tau None and acceptance [] when nothing was drafted).
    """
    before = spec_metrics(llm)
    t0 = time.perf_counter()
    outs = llm.generate(inputs, params, use_tqdm=use_tqdm)
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


@contextlib.contextmanager
def started_llm(target, speculative_config: dict | None, report: Reporter, label: str, **engine):
    """`engine.cpu_llm(target, speculative_config, **engine)`, with `report`'s heartbeat
    "<label>: starting the engine" while it starts; yields (the LLM, seconds its start took)."""
    with contextlib.ExitStack() as stack:
        t0 = time.perf_counter()
        with report.heartbeat(f"{label}: starting the engine"):
            llm = stack.enter_context(cpu_llm(target, speculative_config, **engine))
        yield llm, round(time.perf_counter() - t0, 1)


def measure(target, prompts: list[str], speculative_config: dict | None, max_tokens: int = 128,
            temperature: float = 0.0, report: Reporter = Reporter(quiet=True), label: str = "",
            **engine) -> dict:
    """Generate `max_tokens` per prompt (ignore_eos) after a warm-up (`WARM_UP`): `generate_measured`'s
    dict (counters exclude the warm-up; without speculation, only the token and time fields) and
    `engine_start_s`. `report` (quiet by default) says "<label>: starting the engine" while it
    starts and shows vLLM's bar, named `label`, while it generates."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True, seed=0)
    with started_llm(target, speculative_config, report, label, **engine) as (llm, start_s):
        llm.generate([WARM_UP], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        result = generate_measured(llm, prompts, params, report.vllm_bar(label))
    if speculative_config is None:
        for k in (*_COUNTERS, "tau", "acceptance_per_pos"):
            result.pop(k)
    return {**result, "engine_start_s": start_s}


def versus(row: dict, base: dict) -> dict:
    """`row` with its speed-up against `base` (the no-spec run of the same prompts and batch) and
    whether its greedy outputs equal base's (lossless)."""
    row["speedup_vs_nospec"] = round(row["tokens_per_s"] / base["tokens_per_s"], 3)
    row["greedy_output_identical"] = row["outputs"] == base["outputs"]
    return row


def run_configs(target, configs: dict[str, dict | None], prompts: list[str], max_tokens: int) -> list[dict]:
    """`measure` each named config on `target` in turn; adds speed-up vs the "no-spec" row and a
    lossless flag (greedy outputs equal to no-spec's)."""
    rows = [{"config": name, "speculative_config": spec, **measure(target, prompts, spec, max_tokens)}
            for name, spec in configs.items()]
    base = next((r for r in rows if r["speculative_config"] is None), None)
    return [versus(r, base) for r in rows] if base is not None else rows


def result_line(row: dict) -> str:
    """A finished run in one line: tau, tokens/s, the speed-up and greedy identity against no-spec
    (where the row has them), the generation's time and the engine start's."""
    same = row.get("greedy_output_identical", row.get("greedy_identical_to_nospec"))
    parts = [f"τ {row['tau']:.2f}"] if row.get("tau") else []
    parts.append(f"{row['tokens_per_s']:.1f} tok/s")
    if row.get("speedup_vs_nospec") is not None:
        parts.append(f"{row['speedup_vs_nospec']:.2f}× no-spec")
    if same is not None:
        parts.append("greedy = no-spec" if same else "greedy output DIFFERS from no-spec")
    start = f", engine start {duration(row['engine_start_s'])}" if "engine_start_s" in row else ""
    return ", ".join(parts) + f" ({row['output_tokens']} tokens in {duration(row['wall_s'])}{start})"


def format_table(rows: list[dict]) -> str:
    head = f"{'config':<22}{'tau':>7}{'tok/s':>9}{'speedup':>9}{'identical':>11}  acceptance per position"
    lines = [head, "-" * len(head)]
    for r in rows:
        tau = f"{r['tau']:.3f}" if r.get("tau") else "-"
        acc = " ".join(f"{a:.2f}" for a in r.get("acceptance_per_pos", []))
        lines.append(f"{r['config']:<22}{tau:>7}{r['tokens_per_s']:>9.1f}"
                     f"{r.get('speedup_vs_nospec', 1.0):>9.2f}{str(r.get('greedy_output_identical', '-')):>11}  {acc}")
    return "\n".join(lines)
