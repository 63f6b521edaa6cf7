"""Served τ in vLLM against the trainer's serving count, for finished training runs on a real target.

`tests/e2e/test_serving_count.py` checks the count (`train --eval-data`: `tau_served`) against vLLM's
counters on the reference target with the committed full-vocabulary drafts. This runs the same
comparison for any finished run (a compute-curve run, a reduced draft vocabulary included) on one
evaluation folder: every answer's prompt served with the run's draft (K = 7, T = 0, `max_tokens` =
the answer's length), vLLM's spec-decode counters read, the outputs compared with the answers.

    python benchmarks/served_vs_counted.py --target smollm2 \\
        --eval-data ~/.cache/vllm-specx/data/eval-smollm2-chat-code \\
        --run ~/.cache/vllm-specx/runs/compute-curve-cpu/mtp-glm52-250x32 [--run ...] \\
        --out benchmarks/results/compute-curve-smollm2/served-vs-counted.json
"""

import argparse
import json
from pathlib import Path

K = 7


def check(target, run: Path, ev: Path, rows: list[dict]) -> dict:
    """One run's row: vLLM's counters serving `rows` (the answers of `ev`) against its count."""
    from vllm_specx.bench.eval import serve_answers

    rec = json.loads((run / "training.json").read_text())
    if ev.name not in rec.get("eval", {}):
        raise SystemExit(f"--run {run}: its training.json has no evaluation on {ev.name} (train --eval-data)")
    if rec["args"].get("eval_drafts", K) != K or rec["args"].get("eval_max_tokens") is not None:
        raise SystemExit(f"--run {run}: evaluated with --eval-drafts {rec['args'].get('eval_drafts')} "
                         f"--eval-max-tokens {rec['args'].get('eval_max_tokens')}; this compares K = {K}, whole answers")
    got = serve_answers(target, rec["args"]["method"], run, rows, K)
    ours = rec["eval"][ev.name]
    home = str(Path.home())
    return {
        "run": str(run).replace(home, "~"), "method": rec["args"]["method"],
        "draft_vocab": rec["args"].get("draft_vocab"), "eval": ev.name, "answers": len(rows),
        "identical": got["identical"],
        "tau_vllm": got["tau"], "tau_counted": ours["tau_served"],
        "rel_diff": round(abs(ours["tau_served"] - got["tau"]) / got["tau"], 4),
        "passes_vllm": got["num_drafts"], "passes_counted": ours["served_passes"],
        "acceptance_per_pos_vllm": got["acceptance_per_pos"], "acceptance_per_pos_counted": ours["served_acc_per_pos"],
        "wall_s": got["wall_s"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="a registered target name or a model directory")
    ap.add_argument("--eval-data", type=Path, required=True, help="an evaluation folder (gen-data --for-eval)")
    ap.add_argument("--run", type=Path, action="append", required=True, help="a finished training run (repeatable)")
    ap.add_argument("--out", type=Path, required=True, help="JSON file; existing rows of other runs are kept")
    args = ap.parse_args()
    from vllm_specx.targets import resolve

    target = resolve(args.target)
    ev = args.eval_data.expanduser()
    if not (ev / "tokens.jsonl").is_file():
        raise SystemExit(f"--eval-data {ev}: no tokens.jsonl (make it with gen-data --for-eval)")
    answers = [json.loads(line) for line in (ev / "tokens.jsonl").read_text().splitlines()]  # read once
    rows = json.loads(args.out.read_text())["rows"] if args.out.is_file() else []
    for run in args.run:
        run = run.expanduser()
        if not (run / "training.json").is_file():
            raise SystemExit(f"--run {run}: not a finished run (no training.json)")
        row = check(target, run, ev, answers)
        print(json.dumps({k: row[k] for k in ("run", "eval", "identical", "tau_vllm", "tau_counted", "rel_diff")}))
        rows = [r for r in rows if (r["run"], r["eval"]) != (row["run"], row["eval"])] + [row]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"target": args.target, "K": K, "temperature": 0, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
