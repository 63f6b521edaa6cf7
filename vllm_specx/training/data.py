"""On-policy training data: the target generates continuations in vLLM, then its taps are stored.

    python -m vllm_specx.training.data --target assets/ref-target \
        --prompts assets/prompts/train.jsonl --out runs/data --max-tokens 192 --taps 1,4,6

Writes, resumably (rerun the same command to continue after an interruption):
  <out>/tokens.jsonl             {"id", "prompt_ids", "output_ids"} per prompt, appended per batch
  <out>/taps/<first-id>.safetensors   per sample "ids_<id>" [T] int64 and "taps_<id>" [T, n*H] fp16,
                                 and with --topk K: "topk_ids_<id>" [T, K] int32 and
                                 "topk_logp_<id>" [T, K] float32
  <out>/meta.json                target, prompts, taps, temperature, max_tokens, ... (checked on resume)
  <out>/skipped.jsonl            prompts not answered: too long for the engine's max_model_len
  <out>/commands.txt             every gen-data command run on this folder, one per line (the
                                 trainer copies them into its training.json)

The token ids alone are small (about 2 bytes a token): `--export-tokens FILE` writes them to an
.npz that can be committed, and `--from-tokens FILE --taps ...` rebuilds the folder and its taps
on another machine without generating again.

Top-k (`--topk K`): row t holds the K most likely next tokens (the token at t + 1) of the target
at temperature 1 given ids[:t + 1], most likely first, with their log-probabilities under the
**full** softmax (not renormalised: exp(logp).sum() < 1, the rest is the stored miss). The losses
renormalise over the K (`vllm_specx.training.losses`, which says why TV stays exact).
`--dtype bfloat16` runs the taps/top-k forward in bfloat16 (fast on CPUs with AMX; vLLM serves
fp32 taps, which bf16-trained drafts read fine); the default float32 is the served arithmetic.

The token ids come from vLLM (the distribution drafts are judged against). The taps are computed
with transformers on the same weights: vLLM's CPU build cannot export hidden states (its
hidden-state connector needs pinned memory), and for the tapped layers the two are the same
residual stream.

The parts, one job each: `samples` (the folder's files and meta.json, the stored samples read
back: `load_samples`, `response_ids`), `prompts` (which prompts: `select_prompts`,
`trained_prompt_ids`), `generate` (the two passes: `generate_tokens` in vLLM, `write_taps`),
`token_file` (`--export-tokens` / `--from-tokens`); this module is the command, and its names
stay importable from here.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import time
from pathlib import Path

import torch

from vllm_specx.progress import Reporter, duration
from vllm_specx.training.generate import (
    TAPS_VIA,
    generate_tokens,
    taps_device,
    taps_path,
    taps_via,
    write_taps,
)
from vllm_specx.training.prompts import extension_refusal, read_prompts, select_prompts, trained_prompt_ids
from vllm_specx.training.samples import (
    COMMANDS_FILE,
    EVALUATION,
    PROMPT_FIELDS,
    SKIPPED_FILE,
    TAPS_FIELDS,
    SampleStore,
    check_meta,
    load_samples,
    read_jsonl,
    response_ids,
)
from vllm_specx.training.token_file import export_tokens, import_tokens, token_file_meta

__all__ = [  # re-exported: importers take these from here (tests, benchmarks, scripts)
    "COMMANDS_FILE", "EVALUATION", "PROMPT_FIELDS", "SKIPPED_FILE", "TAPS_FIELDS", "TAPS_VIA", "SampleStore",
    "default_out", "export_tokens", "generate_tokens", "import_tokens", "load_samples", "main", "read_prompts",
    "response_ids", "select_prompts", "taps_device", "taps_path", "taps_via", "trained_prompt_ids", "write_taps",
]


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object of engine arguments, not {type(value).__name__}")
    return value


def default_out(target: str, prompts: str, root: Path) -> Path:
    """`<root>/data/<target>-<prompts>`: a target or prompt file named by its folder or file stem."""
    stem = lambda x: Path(x).stem if Path(x).suffix == ".jsonl" else Path(x).name  # noqa: E731
    return root / "data" / f"{stem(target)}-{stem(prompts)}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="vllm-specx gen-data", description=__doc__.split("\n")[0])
    ap.add_argument("--target", help="a target name (vllm-specx target --help) or a model directory")
    ap.add_argument("--prompts",
                    help="a training prompt set by name (e.g. chat-train) or a jsonl with 'id' and 'prompt' or 'messages'")
    ap.add_argument("--export-tokens", metavar="FILE",
                    help="write the data folder's token ids (no taps) to FILE (.npz) and stop: small "
                         "enough to commit; --from-tokens rebuilds the folder from it")
    ap.add_argument("--from-tokens", metavar="FILE",
                    help="rebuild a data folder from an --export-tokens file (target, prompts and "
                         "generation settings come from it), then store --taps for it; with --prompts "
                         "A+B (the file answering A), also answer B's prompts: more data on top")
    ap.add_argument("--out", help="the data folder (default: $VLLM_SPECX_CACHE/data/<target>-<prompts>, "
                                  "else ~/.cache/vllm-specx/data/<target>-<prompts>)")
    ap.add_argument("--batch", type=int, default=256,
                    help="prompts in flight at once (fed continuously; at least the engine's max_num_seqs)")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--engine-args", type=_json_object, default={},
                    help="vLLM engine arguments as a JSON object, over vllm_specx.engine.CPU_ENGINE_ARGS "
                         "(e.g. '{\"gpu_memory_utilization\": 0.3}': a larger KV cache runs more prompts at once)")
    ap.add_argument("--taps", default="", help="comma-separated 0-based target layers; empty: tokens only")
    ap.add_argument("--topk", type=int, default=0,
                    help="also store the target's top-K next-token log-probs (TV-type losses need them)")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                    help="arithmetic of the taps/top-k forward (default: bfloat16 on cuda, float32 on cpu)")
    ap.add_argument("--device", default=None,
                    help="where the taps/top-k forward runs: cuda, cuda:1, cpu (default: cuda when "
                         "available, else cpu); generation runs in vLLM on its own platform")
    ap.add_argument("--taps-via", default="auto", choices=list(TAPS_VIA),
                    help="what computes the taps/top-k: vllm (vLLM's extract_hidden_states export, in "
                         "an engine with --engine-args), transformers (a second forward on --device), "
                         "auto (default: vllm when --device is cuda, else transformers)")
    ap.add_argument("--limit", type=int, default=None, help="the first N prompts")
    ap.add_argument("--spread", type=int, default=None,
                    help="N prompts spread evenly over the set (every len/N-th), after --limit")
    ap.add_argument("--taps-only", action="store_true",
                    help="generate nothing: store taps for the responses already in <out>/tokens.jsonl")
    ap.add_argument("--for-eval", action="store_true",
                    help="data to measure drafts on (`train --eval-data`), e.g. of an evaluation set "
                         "such as humaneval; recorded in meta.json, and `train --data` refuses it")
    ap.add_argument("--stop-at-eos", action="store_true",
                    help="end a response at the target's end of answer (chat targets); default: exactly --max-tokens")
    ap.add_argument("--quiet", action="store_true",
                    help="no progress bars (the closing summary stays); in a log (stderr not a terminal) "
                         "a bar is a line each tenth of its work")
    args = ap.parse_args(argv)
    t0, report = time.perf_counter(), Reporter(quiet=args.quiet)
    report.quiet_libraries()
    # A stopped run (SIGTERM, e.g. `kill`) unwinds like Ctrl-C: the engine's context manager shuts
    # vLLM's engine-core and worker processes down instead of leaving them running; what was
    # written stays, and the same command resumes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from vllm_specx.targets import cache_root, resolve

    if args.export_tokens and args.out and not (args.target or args.prompts):
        print(json.dumps(export_tokens(Path(args.out), Path(args.export_tokens))))
        return
    extend = False  # --from-tokens FILE --prompts A+B: FILE's answers (to A), then B's answered here
    if args.from_tokens:
        if args.target:
            ap.error("--from-tokens takes the target from its file: drop --target")
        saved = token_file_meta(Path(args.from_tokens))
        if args.prompts and args.prompts != saved["prompts"]:
            why = extension_refusal(saved, args.prompts)
            if why:
                ap.error(f"--prompts {args.prompts} with --from-tokens {args.from_tokens}: {why}")
            extend = True
        args.target, args.prompts = saved["target"], args.prompts or saved["prompts"]
    elif not (args.target and args.prompts):
        ap.error("--target and --prompts are required (or --from-tokens FILE)")
    out = Path(args.out) if args.out else default_out(args.target, args.prompts, cache_root())
    if args.export_tokens:
        print(json.dumps(export_tokens(out, Path(args.export_tokens))))
        return
    if args.from_tokens:
        import_tokens(Path(args.from_tokens), out, prompts=args.prompts)
        args.taps_only = not extend
        for k in ("max_tokens", "temperature") + (() if extend else ("limit", "spread")):
            if k in saved:
                setattr(args, k, saved[k])
        args.stop_at_eos = bool(saved.get("stop_at_eos"))
        args.for_eval = saved.get("purpose") == EVALUATION
    target = str(resolve(args.target))  # a registered name (recorded as such) or a directory
    args.device = taps_device(args.device)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: this torch build sees no CUDA device (use --device cpu)")
    via = taps_via(args.taps_via, args.device)
    if not args.taps_only or via == "vllm":
        from vllm_specx.engine import engine_args

        try:
            engine_args(args.engine_args)  # refused before any work, naming the field
        except ValueError as e:
            ap.error(f"--engine-args: {e}")
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    taps = tuple(sorted(int(x) for x in args.taps.split(",") if x))
    meta = {"target": args.target, "taps": list(taps), "max_tokens": args.max_tokens,
            "temperature": args.temperature, "prompts": args.prompts}
    meta.update({k: getattr(args, k) for k in ("limit", "spread") if getattr(args, k) is not None})
    # Recorded only when set, so data made before these flags still resumes.
    if args.stop_at_eos:
        meta["stop_at_eos"] = True
    if args.topk:
        meta["topk"] = args.topk
    if args.for_eval:
        meta["purpose"] = EVALUATION
    if args.dtype != "float32":
        meta["taps_dtype"] = args.dtype
    check_meta(out, meta)
    with open(out / COMMANDS_FILE, "a") as f:
        f.write(" ".join(["vllm-specx gen-data", *(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))]) + "\n")
    if not args.taps_only:
        prompts = select_prompts(args.prompts, args.limit, args.spread, evaluation=args.for_eval)
        generate_tokens(target, prompts, out, args.max_tokens, args.temperature, batch=args.batch,
                        ignore_eos=not args.stop_at_eos, engine_args=args.engine_args, report=report)
    print(f"data: {out}")
    if taps:
        where = "in vLLM's engine" if via == "vllm" else f"on {args.device}"
        print(f"taps: {len(taps)} layers {where} in {args.dtype}, by {taps_path(args.device, via)}")
        write_taps(target, out, taps, topk=args.topk, dtype=args.dtype, device=args.device, via=via,
                   engine_args=args.engine_args, report=report)
    elif args.topk:
        raise ValueError("--topk needs --taps (they are stored together)")
    print(summary(out, taps, time.perf_counter() - t0), flush=True)


def summary(out: Path, taps: tuple[int, ...], seconds: float) -> str:
    """gen-data's closing line: what the folder holds now and how long this run took."""
    rows = read_jsonl(out / "tokens.jsonl")
    shards = len(list((out / "taps").glob("*.safetensors"))) if taps else 0
    stored = f", taps of {len(taps)} layers in {shards} shards" if taps else ", no taps"
    return (f"gen-data: {out} holds {len(rows)} samples ({sum(len(r['output_ids']) for r in rows)} "
            f"response tokens){stored}; this run {duration(seconds)}")


if __name__ == "__main__":
    main()
