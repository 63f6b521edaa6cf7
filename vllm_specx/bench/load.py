"""The load benchmark: sustained traffic against `vllm serve`, one server per provider (no-spec,
n-gram, our drafts), reporting throughput, time to first token and inter-token latency (p50, p99)
(between stream chunks; a speculative chunk carries several tokens) and time per output token
(TPOT, after the first), and vLLM's own spec-decode counters. JSON + table + PNG; not a test.

    vllm-specx load --target smollm2 --prompts humaneval --rate 0.5 --duration 150 \\
        --method no-spec --method ngram --method dspark=assets/drafts/smollm2-dspark \\
        --out benchmarks/results/load-smollm2

Requests arrive as a Poisson process at `--rate` per second for `--duration` seconds (the same
arrival times, prompts and parameters for every provider: `loadgen.make_requests` with a fixed
seed), each up to `--max-tokens` tokens at temperature 0 (`--mix` for the reliability mix of
temperatures, seeds, n and aborts). A provider's run counts as failed if any request not
aborted is lost (error, wrong token count) or the server does not end idle (`loadgen.check_server`).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from vllm_specx import assets, targets
from vllm_specx.bench import e2e as bench
from vllm_specx.bench import loadgen


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vllm-specx load", description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="ref", help="'ref' or a registered target (e.g. smollm2) or a directory")
    ap.add_argument("--prompts", default="code", help=f"a prompt set: {', '.join(assets.PROMPT_SETS)}")
    ap.add_argument("--method", dest="methods", action="append", default=None,
                    help="a provider, as in `vllm-specx bench` (no-spec, ngram, LABEL=DIR, eagle3=DIR)")
    ap.add_argument("-k", "--k", type=int, default=7, help="num_speculative_tokens")
    ap.add_argument("--rate", type=float, default=0.5, help="requests per second (Poisson arrivals)")
    ap.add_argument("--duration", type=float, default=150.0, help="seconds of arrivals per provider")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--mix", action="store_true",
                    help="the reliability mix (temperatures, top-p/top-k, seeds, n, 1/4 aborted) instead of greedy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    return ap


def _server_args(provider: bench.Provider, k: int, max_len: int) -> list[str]:
    args = ["--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.3",
            "--max-model-len", str(max_len), "--served-model-name", "target"]
    spec = provider.spec(k)
    if spec:
        args += ["--speculative-config", json.dumps(spec)]
    return args


def main(argv: list[str]) -> Path:
    args = parser().parse_args(argv)
    if args.rate <= 0 or args.duration <= 0 or args.max_tokens < 1 or args.k < 1:
        raise ValueError("--rate, --duration, --max-tokens and -k must be positive")
    providers = [bench.parse_provider(m) for m in (args.methods or ["no-spec", "ngram"])]
    if not any(p.method is None for p in providers):
        providers.insert(0, bench.Provider("no-spec", None))
    target = assets.path("ref-target") if args.target == "ref" else targets.resolve(args.target)

    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    inputs = bench.render(assets.load_prompts(args.prompts), tok)
    prompts = [x["prompt_token_ids"] if isinstance(x, dict) else tok(x)["input_ids"] for x in inputs]
    bench.check_providers(providers, AutoConfig.from_pretrained(str(target)), [args.k])
    max_len = -(-(max(map(len, prompts)) + args.max_tokens + args.k + 8) // 256) * 256
    count = max(1, round(args.rate * args.duration))
    requests = loadgen.make_requests(prompts, count, abort_fraction=0.25 if args.mix else 0.0, seed=args.seed,
                                     max_tokens=(args.max_tokens, args.max_tokens), mix=args.mix,
                                     arrival_rate=args.rate, ignore_eos=args.mix)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = bench.provenance(argparse.Namespace(target=args.target, argv=[]), Path(target))
    meta["command"] = " ".join([*(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("VLLM_CPU_")),
                                "vllm-specx load", *argv])
    rows = []
    for p in providers:
        log = out / f"serve-{p.label}.log"
        with loadgen.vllm_serve(target, _server_args(p, args.k, max_len), log) as (base, _):
            before = loadgen.spec_counters(loadgen.http_get(base + "/metrics"))
            t0 = time.perf_counter()
            results = loadgen.run_load(base, "target", requests, concurrency=count, timeout=3600)
            wall = time.perf_counter() - t0
            try:
                summary = loadgen.check_server(base, "target", results)
                failures = []
            except AssertionError as e:
                summary, failures = loadgen.summarize(results), str(e).splitlines()
        summary.update(loadgen.summarize(results, wall))
        spec = summary.get("spec") or {}
        drafts = spec.get("drafts", 0) - before["drafts"]
        accepted = spec.get("accepted_tokens", 0) - before["accepted_tokens"]
        rows.append({"provider": p.label, "spec": p.spec(args.k), **summary,
                     "tau": (1 + accepted / drafts) if drafts else None, "failures": failures})
        log.unlink(missing_ok=not failures)  # keep a failed provider's server log
        print(f"{p.label}: {rows[-1]['output_tok_per_s']:.1f} tok/s, lost {summary['lost']}, "
              f"failures {len(failures)}", flush=True)
    report = {"meta": meta, "settings": {"prompts": args.prompts, "rate": args.rate, "duration": args.duration,
                                         "requests": count, "max_tokens": args.max_tokens, "k": args.k,
                                         "mix": args.mix, "seed": args.seed, "max_model_len": max_len},
              "rows": rows}
    (out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    write_report(out)
    return out


def _ms(x):
    return "-" if x is None else f"{1000 * x:.0f}"


def write_report(out: Path) -> None:
    rep = json.loads((out / "results.json").read_text())
    s = rep["settings"]
    lines = [f"Load: {s['requests']} requests, Poisson {s['rate']}/s over {s['duration']} s, "
             f"{s['prompts']}, {s['max_tokens']} tokens, K {s['k']}{', mixed sampling' if s['mix'] else ', T 0'}",
             "", "| provider | τ | completed | aborted | lost | output tok/s | TTFT p50 / p99 (ms) | "
             "TPOT p50 / p99 (ms) | ITL p50 / p99 (ms) | failures |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rep["rows"]:
        tau = "-" if r["tau"] is None else f"{r['tau']:.2f}"
        lines.append(f"| {r['provider']} | {tau} | {r['completed']} | "
                     f"{r['aborted']} | {r['lost']} | {r['output_tok_per_s']:.1f} | {_ms(r['ttft_p50_s'])} / "
                     f"{_ms(r['ttft_p99_s'])} | {_ms(r['tpot_p50_s'])} / {_ms(r['tpot_p99_s'])} | {_ms(r['itl_p50_s'])} / {_ms(r['itl_p99_s'])} | "
                     f"{len(r['failures'])} |")
    lines += ["", f"Command: `{rep['meta']['command']}`", ""]
    (out / "results.md").write_text("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = rep["rows"]
    names = [r["provider"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    axes[0].bar(names, [r["output_tok_per_s"] for r in rows], color="tab:blue")
    axes[0].set_title("output tokens/s")
    for ax, key, title in ((axes[1], "ttft", "time to first token (ms)"), (axes[2], "tpot", "time per output token (ms)")):
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [1000 * (r[f"{key}_p50_s"] or 0) for r in rows], 0.4, label="p50")
        ax.bar([i + 0.2 for i in x], [1000 * (r[f"{key}_p99_s"] or 0) for r in rows], 0.4, label="p99")
        ax.set_xticks(list(x), names)
        ax.set_title(title)
        ax.legend()
    fig.suptitle(lines[0], fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "load.png", dpi=110)
    plt.close(fig)
