"""Benchmark the DSA indexer ops (decode, paged K) against their roofline and PyTorch baselines.

Three ops, for every (context, batch, query tokens per request):
  logits         `indexer_logits_decode`          vs the PyTorch reference
  topk           radix top-k of the logits        vs `torch.topk` and the sort-based reference
  indexer_topk   indexer -> top-k, materialised (G0), fused group-max (G>0) and per-chunk
                 candidates (C: chunk keys per program) paths
                 vs reference logits + `torch.topk` and the full reference

For each it reports time, the bytes and FLOPs the op must touch (K read once per request, q, w,
and its output), the roofline time max(bytes / copy bandwidth, FLOPs / matmul rate) with both
rates measured here, the achieved fraction of that roofline and the speedups. Writes JSON (date,
git sha, torch / Triton versions, GPU) and prints a table, then the speed goals (`GOALS`) judged
on the sweep's rows. Needs only torch and Triton, no vLLM.

    python benchmarks/bench_dsa_indexer.py                 # GPU sweep -> benchmarks/results/
    python benchmarks/bench_dsa_indexer.py --smoke         # tiny CPU run, Triton interpreter
    python benchmarks/bench_dsa_indexer.py --compile-only  # build every kernel for sm_90, no GPU
"""

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing the package

import torch  # noqa: E402
from _report import provenance, write_report  # noqa: E402

FP8 = torch.float8_e4m3fn
# --dtype: (q dtype, K cache dtype). fp8: vLLM's fp8 indexer (q and K in e4m3, fp8 tensor cores);
# bf16-fp8k: bf16 queries against an fp8 K cache (read as fp8, widened on chip).
DTYPES = {"bf16": (torch.bfloat16,) * 2, "fp16": (torch.float16,) * 2, "fp32": (torch.float32,) * 2,
          "fp8": (FP8, FP8), "bf16-fp8k": (torch.bfloat16, FP8)}


LOGITS_TUNING = {"w8": dict(num_warps=8), "bt2w8": dict(block_t=2, num_warps=8),
                 "bs128w8": dict(block_s=128, num_warps=8),
                 # keys as the product's rows, heads as its columns (the head sum within a warp)
                 "rows-w8": dict(keys_as_rows=True, num_warps=8),
                 "rows-bt2w8": dict(keys_as_rows=True, block_t=2, num_warps=8),
                 "rows-bs128w8": dict(keys_as_rows=True, block_s=128, num_warps=8)}
# Keys per program of the per-chunk-candidates indexer -> top-k path. Each chunk emits k
# candidates and one program merges a row's chunks * k: small chunks write more candidates and
# load the merge (1M keys: 256 chunks of 4K -> 524K candidates; 16 of 64K -> 32K).
CHUNKS = (4096, 16384, 65536)
TOPK_TUNING = {"": {}, "8bit": dict(radix_bits=8), "1chunk": dict(num_splits=1),
               "4warps": dict(num_warps=4), "2048cols": dict(block=2048)}


def parse_args(argv=None):
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny CPU config (Triton interpreter)")
    p.add_argument("--compile-only", action="store_true",
                   help="compile every kernel specialisation for --arch without a GPU")
    p.add_argument("--arch", type=int, default=90, help="--compile-only target (90: H100/H200)")
    p.add_argument("--compile-dtypes", default="bf16,fp8,bf16-fp8k", help="--compile-only q/k dtypes (--dtype names): bf16,fp32,fp8,bf16-fp8k")
    p.add_argument("--contexts", type=ints, default=[4096, 32768, 131072, 1048576])
    p.add_argument("--batches", type=ints, default=[1, 8, 64])
    p.add_argument("--next-n", type=ints, default=[1, 4, 8], help="query tokens per request")
    p.add_argument("--mixed-short", type=int, default=0,
                   help="mixed batches: request 0 has the context's keys, every other one this many "
                        "(0: uniform batches); the goal check leaves such rows out")
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--max-gb", type=float, default=60.0, help="skip configs needing more memory")
    p.add_argument("--ref-max-elems", type=float, default=2**31,
                   help="skip the PyTorch baselines above this many logits (B*N*ctx)")
    p.add_argument("--out", type=Path, default=None, help="JSON path (GPU: benchmarks/results/)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="also time every op replayed from a CUDA graph (no launch overhead, as "
                        "vLLM's decode runs): graph_ms and graph_speedup_vs_* columns")
    args = p.parse_args(argv)
    if args.mixed_short < 0:
        p.error(f"--mixed-short must be >= 0, got {args.mixed_short}")
    if args.smoke:
        args.contexts, args.batches, args.next_n = [256], [2], [1, 2]
        args.heads, args.head_dim, args.topk, args.page_size = 4, 32, 16, 16
    return args


# --------------------------------------------------------------------------- measurement


def bench(fn, device, graph: bool = False) -> float | None:
    """Median ms of `fn()`: CUDA events (Triton's do_bench) on GPU, wall clock on CPU. `graph`:
    replayed from a CUDA graph (`do_bench_cudagraph`), i.e. without the host's launch overhead,
    as vLLM runs a decode step; None where `fn` cannot be captured."""
    if device.type == "cuda":
        import triton.testing

        if graph:
            try:
                return float(triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median"))
            except RuntimeError as e:  # e.g. a host synchronisation inside fn
                print(f"not capturable in a CUDA graph: {e}", file=sys.stderr)
                return None
        return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))
    fn()  # warm up (and JIT)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[1]


def measure_peaks(device, dtype) -> dict:
    """Copy bandwidth (read + write bytes / s) and dense matmul rate (FLOP / s), measured here."""
    big = device.type == "cuda"
    n = (1 << 30) if big else (1 << 22)  # bytes per copy buffer: 1 GiB on GPU
    src = torch.empty(n // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy_ms = bench(lambda: dst.copy_(src), device)
    m = 8192 if big else 256
    a = torch.randn(m, m, device=device).to(dtype)
    b = torch.randn(m, m, device=device).to(dtype)
    mm_ms = bench(lambda: a @ b, device)
    return {"copy_bytes_per_s": 2 * n / (copy_ms * 1e-3),
            "matmul_flops_per_s": 2 * m**3 / (mm_ms * 1e-3)}


def roofline_ms(bytes_, flops, peaks) -> float:
    return 1e3 * max(bytes_ / peaks["copy_bytes_per_s"], flops / peaks["matmul_flops_per_s"])


# --------------------------------------------------------------------------- one config


def seq_lens_of(ctx, batch, args) -> list[int]:
    """Keys per request: `ctx` each, or (`--mixed-short`) `ctx` for request 0 and fewer for the
    rest: one long request among short ones, the mix a DSA decode batch sees."""
    short = min(args.mixed_short, ctx) if args.mixed_short else ctx
    return [ctx] + [short] * (batch - 1)


def make_decode_inputs(ctx, batch, n, args, device):
    """Paged decode batch: `batch` requests of `ctx` keys each (`seq_lens_of`; the last `n` are
    the new tokens)."""
    (q_dtype, k_dtype), page = DTYPES[args.dtype], args.page_size
    pages_per_req = -(-ctx // page)
    num_pages = batch * pages_per_req
    k_cache = torch.randn(num_pages, page, args.head_dim, device=device).to(k_dtype)
    # Shuffled pages: the kernel must follow the block table, as in a real paged cache.
    block_table = torch.randperm(num_pages, device=device).view(batch, pages_per_req).int()
    q = torch.randn(batch, n, args.heads, args.head_dim, device=device).to(q_dtype)
    w = torch.randn(batch, n, args.heads, device=device) * (args.head_dim * args.heads) ** -0.5
    seq_lens = torch.tensor(seq_lens_of(ctx, batch, args), dtype=torch.int32, device=device)
    return q, k_cache, w, block_table, seq_lens


def row_lengths(seq_lens, n):
    """Causal key count of each of the `B * n` query rows: row i of a request of s keys sees
    `s - n + i + 1`."""
    i = torch.arange(n, device=seq_lens.device).repeat(seq_lens.shape[0])
    return (seq_lens.repeat_interleave(n) - n + 1 + i).int()


def op_costs(ctx, batch, n, args) -> dict:
    """Bytes and FLOPs each op must touch, counting every input once and its output once: the
    logits op writes the whole `[B, N, ctx]` output (-inf past a request's keys), the top-k reads
    each row's causal prefix."""
    q_elt, k_elt = (t.itemsize for t in DTYPES[args.dtype])
    lens = seq_lens_of(ctx, batch, args)
    rows = batch * n
    pairs = sum(s - n + i + 1 for s in lens for i in range(n))  # causal (query, key) pairs
    flops = 2 * args.heads * args.head_dim * pairs  # q.k per head; ReLU / weights are O(H) less
    inputs = sum(lens) * args.head_dim * k_elt + rows * args.heads * (args.head_dim * q_elt + 4)
    indices = rows * args.topk * 4
    return {
        "logits": (inputs + rows * ctx * 4, flops),
        "topk": (pairs * 4 + indices, 0),
        "indexer_topk": (inputs + indices, flops),
    }


def run_config(ctx, batch, n, args, peaks, device) -> list[dict]:
    from vllm_specx.ops.dsa_indexer import kernel as K
    from vllm_specx.ops.dsa_indexer import reference as R
    from vllm_specx.ops.topk.kernel import topk_triton
    from vllm_specx.ops.topk.reference import topk_reference

    q, kc, w, bt, seq = make_decode_inputs(ctx, batch, n, args, device)
    k = args.topk
    costs = op_costs(ctx, batch, n, args)
    with_ref = batch * n * ctx <= args.ref_max_elems
    logits = K.indexer_logits_decode_triton(q, kc, w, bt, seq, max_seq_len=ctx).flatten(0, 1)
    lengths = row_lengths(seq, n)
    group = max(K.choose_group(ctx, k), 4)

    def ref_logits():
        return R.indexer_logits_decode_reference(q, kc, w, bt, seq).flatten(0, 1)

    # (op, variant, triton fn, {baseline name: fn}); the variants after each op's default are
    # its tuning knobs, timed against the same baselines (each compiles without spills for sm_90)
    cases = [("logits", "triton",
              lambda: K.indexer_logits_decode_triton(q, kc, w, bt, seq, max_seq_len=ctx),
              {"reference": ref_logits})]
    cases += [("logits", f"triton-{name}",
               lambda t=t: K.indexer_logits_decode_triton(q, kc, w, bt, seq, max_seq_len=ctx, **t),
               {"reference": ref_logits}) for name, t in LOGITS_TUNING.items()]
    topk_base = {"torch.topk": lambda: torch.topk(logits, min(k, ctx), dim=1),
                 "reference": lambda: topk_reference(logits, k, lengths)}
    cases += [("topk", f"radix{'-' + name if name else ''}",
               lambda t=t: topk_triton(logits, k, lengths, **t), topk_base)
              for name, t in TOPK_TUNING.items()]
    ref_topk = {"reference": lambda: topk_reference(ref_logits(), k),
                "torch.topk": lambda: torch.topk(ref_logits(), min(k, ctx), dim=1)}
    for g in (0, group):
        cases.append(("indexer_topk", "materialised" if g == 0 else f"fused-G{g}",
                      lambda g=g: K.indexer_topk_decode_triton(q, kc, w, bt, seq, k, group=g,
                                                               max_seq_len=ctx),
                      ref_topk))
    for c in CHUNKS:  # per-chunk candidates on chip, then one merge
        cases.append(("indexer_topk", f"chunks-C{c}",
                      lambda c=c: K.indexer_topk_decode_triton(q, kc, w, bt, seq, k, chunk=c,
                                                               max_seq_len=ctx),
                      ref_topk))
    results, baseline_ms = [], {}
    for op, variant, fn, baselines in cases:
        bytes_, flops = costs[op]
        t = bench(fn, device)
        row = {"op": op, "variant": variant, "context": ctx, "batch": batch, "next_n": n,
               "mixed_short": args.mixed_short or None, "time_ms": t, "bytes": bytes_, "flops": flops,
               "roofline_ms": roofline_ms(bytes_, flops, peaks)}
        row["roofline_fraction"] = row["roofline_ms"] / t
        for name, base in baselines.items():
            key = (op, name)
            if with_ref and key not in baseline_ms:
                baseline_ms[key] = bench(base, device)
            row[f"{name}_ms"] = baseline_ms.get(key)
            row[f"speedup_vs_{name}"] = baseline_ms[key] / t if key in baseline_ms else None
        if getattr(args, "cuda_graph", False) and device.type == "cuda":
            g = row["graph_ms"] = bench(fn, device, graph=True)
            for name, base in baselines.items():
                key = (op, name, "graph")
                if with_ref and key not in baseline_ms:
                    baseline_ms[key] = bench(base, device, graph=True)
                b = baseline_ms.get(key)
                row[f"graph_{name}_ms"] = b
                row[f"graph_speedup_vs_{name}"] = b / g if b and g else None
        results.append(row)
    del q, kc, w, bt, seq, logits
    return results


# --------------------------------------------------------------------------- report


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(results) -> str:
    graph = any("graph_ms" in r for r in results)
    head = (f"{'op':<13}{'variant':<20}{'ctx':>9}{'B':>4}{'N':>3}{'ms':>10}{'roof ms':>10}"
            f"{'%roof':>7}{'x ref':>8}{'x torch':>8}"
            + (f"{'graph ms':>10}{'%roof':>7}{'x torch':>8}" if graph else ""))
    lines = [head, "-" * len(head)]
    for r in results:
        ref, tor = r.get("speedup_vs_reference"), r.get("speedup_vs_torch.topk")
        ctx = f"{r['context']}*" if r.get("mixed_short") else str(r["context"])
        line = (
            f"{r['op']:<13}{r['variant']:<20}{ctx:>9}{r['batch']:>4}{r['next_n']:>3}"
            f"{r['time_ms']:>10.3f}{r['roofline_ms']:>10.4f}{100 * r['roofline_fraction']:>6.1f}%"
            f"{_fmt(ref):>8}{_fmt(tor):>8}"
        )
        if graph:
            g = r.get("graph_ms")
            roof = f"{100 * r['roofline_ms'] / g:>6.1f}%" if g else f"{'-':>7}"
            line += f"{_fmt(g) if g is None else f'{g:.4f}':>10}{roof}{_fmt(r.get('graph_speedup_vs_torch.topk')):>8}"
        lines.append(line)
    short = {r["mixed_short"] for r in results if r.get("mixed_short")}
    if short:
        lines.append(f"* mixed batch: request 0 has ctx keys, the others {min(short)}")
    return "\n".join(lines)


# Issue 37's "Done when" (and item 3's 4-token figure), each checked on the rows it names:
# (goal, op, which rows, figure, "min"/"max" it must reach, target). Per config the op's best variant
# counts (the CUDA-graph time where measured: a vLLM decode step replays a graph), then the worst
# config decides.
GOALS = [
    ("top-k >= 3x torch.topk at 128K-1M", "topk",
     lambda r: 131072 <= r["context"] <= 1 << 20, "x torch", "min", 3.0),
    ("top-k <= 60 us for 64 x 128K", "topk",
     lambda r: r["context"] == 131072 and r["batch"] == 64 and r["next_n"] == 1, "us", "max", 60.0),
    ("top-k <= 30 us at 4K, batch <= 64", "topk",
     lambda r: r["context"] == 4096 and r["batch"] <= 64 and r["next_n"] == 1, "us", "max", 30.0),
    ("indexer -> top-k <= 1.2x logits, >= 128K, batch >= 8", "indexer_topk",
     lambda r: r["context"] >= 131072 and r["batch"] >= 8, "x logits", "max", 1.2),
    ("logits >= 70% roofline, 1 token, batch >= 8, >= 128K", "logits",
     lambda r: r["context"] >= 131072 and r["batch"] >= 8 and r["next_n"] == 1, "roofline", "min", 0.70),
    ("logits >= 50% roofline, 4 tokens, >= 128K (item 3)", "logits",
     lambda r: r["context"] >= 131072 and r["next_n"] == 4, "roofline", "min", 0.50),
    ("short-context floor <= 15 us (logits, 4K, batch 1)", "logits",
     lambda r: r["context"] == 4096 and r["batch"] == 1 and r["next_n"] == 1, "us", "max", 15.0),
]


def _best(results) -> dict:
    """{(op, context, batch, next_n): (time ms, variant, torch.topk ms, roofline ms)} of each
    config's fastest variant; graph times where every row has one."""
    results = [r for r in results if not r.get("mixed_short")]  # the goals are uniform batches
    graph = all(r.get("graph_ms") for r in results)
    best = {}
    for r in results:
        key = (r["op"], r["context"], r["batch"], r["next_n"])
        t = r["graph_ms"] if graph else r["time_ms"]
        torch_ms = r.get("graph_torch.topk_ms" if graph else "torch.topk_ms")
        if key not in best or t < best[key][0]:
            best[key] = (t, r["variant"], torch_ms, r["roofline_ms"])
    return best


def goals(results) -> list[dict]:
    """Each of `GOALS` on these results: its worst config, the variant that gave it, whether it
    holds (None: no row measured it, e.g. a smoke run or a narrower sweep)."""
    best, out = _best(results), []
    for name, op, where, figure, need, target in GOALS:
        vals = []
        for (o, ctx, batch, n), (t, variant, torch_ms, roof_ms) in best.items():
            if o != op or not where({"context": ctx, "batch": batch, "next_n": n}):
                continue
            if figure == "us":
                v = 1000 * t
            elif figure == "roofline":
                v = roof_ms / t
            elif figure == "x torch":
                v = torch_ms / t if torch_ms else None
            else:  # "x logits": against the same config's fastest logits
                lg = best.get(("logits", ctx, batch, n))
                v = t / lg[0] if lg else None
            if v is not None:
                vals.append((v, f"ctx {ctx} B {batch} N {n}", variant))
        row = {"goal": name, "figure": figure, "target": target, "configs": len(vals)}
        if vals:
            v, cfg, variant = (min if need == "min" else max)(vals)
            row.update(worst=v, at=cfg, variant=variant, holds=v >= target if need == "min" else v <= target)
        else:
            row.update(worst=None, at=None, variant=None, holds=None)
        out.append(row)
    return out


def goals_table(rows) -> str:
    lines = [f"{'goal':<56}{'worst':>9}  {'at':<22}{'variant':<21}holds"]
    for g in rows:
        if g["holds"] is None:
            lines.append(f"{g['goal']:<56}{'-':>9}  {'not measured':<22}{'':<21}-")
            continue
        w = f"{100 * g['worst']:.0f}%" if g["figure"] == "roofline" else f"{g['worst']:.2f}"
        lines.append(f"{g['goal']:<56}{w:>9}  {g['at']:<22}{g['variant']:<21}{'yes' if g['holds'] else 'NO'}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.compile_only:
        return compile_only(args)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        if not args.smoke:
            sys.exit("no GPU: run with --smoke (CPU, interpreter) or --compile-only")
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels (and triton.jit) are imported
    torch.manual_seed(0)
    q_dtype = DTYPES[args.dtype][0]  # fp8: the bf16 matmul rate (a conservative compute roof)
    peaks = measure_peaks(device, torch.bfloat16 if q_dtype == FP8 else q_dtype)
    results = []
    for ctx in args.contexts:
        for batch in args.batches:
            need_gb = batch * ctx * args.head_dim * DTYPES[args.dtype][1].itemsize * 1.1 / 1e9
            need_gb += 3 * batch * max(args.next_n) * ctx * 4 / 1e9  # logits (+ baselines)
            if need_gb > args.max_gb:
                print(f"skip ctx={ctx} batch={batch}: ~{need_gb:.0f} GB > --max-gb",
                      file=sys.stderr)
                continue
            for n in args.next_n:
                results += run_config(ctx, batch, n, args, peaks, device)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    report = {"meta": provenance(device, args, peaks=peaks), "results": results,
              "goals": goals(results)}
    out = args.out
    if out is None and not args.smoke:
        stamp = datetime.date.today().isoformat()
        gpu = report["meta"]["device"].replace(" ", "_")
        out = REPO / "benchmarks" / "results" / f"dsa_indexer-{gpu}-{stamp}.json"
    write_report(report, out, table(results) + "\n\n" + goals_table(report["goals"]))
    return report


# --------------------------------------------------------------------------- compile check


def compile_only(args) -> dict:
    """Compile every kernel specialisation the ops launch, for a real GPU target, on any machine.

    The interpreter cannot catch what only the compiler sees (loop-carried types, layouts,
    register pressure). Launches are recorded from CPU tensors instead of run, then each is
    compiled with `triton.compile` for `cuda:<arch>` and its ptxas register / spill report kept.
    """
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("--compile-only needs TRITON_INTERPRET unset")
    from _sm90_compile import compile_launches, record_launches

    launches = record_launches()
    from vllm_specx.ops.dsa_indexer import kernel as K
    from vllm_specx.ops.topk import kernel as TK

    def topk_recorded(scores, k, lengths=None, **kw):  # launches recorded, not run: a valid result
        TK.topk_triton(scores, k, lengths, **kw)
        return torch.full((scores.shape[0], k), -1, dtype=torch.int32)

    K.topk_triton = topk_recorded
    for dtype in (torch.float32, torch.bfloat16):  # top-k as the DSA shapes launch it (k = 2048)
        for bits in (11, 8):
            TK.topk_triton(torch.randn(2, 1 << 17).to(dtype), 2048, num_splits=8, radix_bits=bits)
            TK.topk_triton(torch.randn(8, 8192).to(dtype), 2048, torch.full((8,), 8000, dtype=torch.int32),
                           radix_bits=bits)

    for dtype in args.compile_dtypes.split(","):
        for ks in (False, True):
            args.dtype = dtype
            q, kc, w, bt, seq = make_decode_inputs(512, 2, 4, args, torch.device("cpu"))
            k_scale = torch.rand(kc.shape[:2]) if ks else None
            for t in LOGITS_TUNING.values():
                K.indexer_logits_decode_triton(q, kc, w, bt, seq, k_scale, **t)
            K.indexer_topk_decode_triton(q, kc, w, bt, seq, 64, k_scale, group=0)
            K.indexer_topk_decode_triton(q, kc, w, bt, seq, 64, k_scale, group=8)
            K.indexer_topk_decode_triton(q, kc, w, bt, seq, 64, k_scale, chunk=256)  # + the merge
            K.indexer_topk_decode_triton(q, kc, w, bt, seq, 64, k_scale, chunk=4096)  # one chunk
            cu = torch.tensor([0, 3, 8], dtype=torch.int32)
            K.indexer_topk_prefill_triton(q.flatten(0, 1), kc.flatten(0, 1)[:600], w.flatten(0, 1),
                                          cu, torch.tensor([0, 300, 600], dtype=torch.int32), 64,
                                          group=8 if ks else 0)
    report = []
    for c in compile_launches(launches, args.arch, ("num_warps", "num_stages")):
        ptx, consts = c.pop("ptx"), c.pop("consts")
        mma = "wgmma" if "wgmma" in ptx else "mma" if "mma.sync" in ptx else "-"
        report.append({"tensor_core": mma, **c})
        print(f"{c['kernel']:<24} {mma:<6} regs={c['registers']} spill={c['spill_store_bytes']} "
              f"smem={c['shared_bytes']} {c['compile_s']:.1f}s {c['options']} {dict(consts)}")
    print(f"compiled {len(report)} specialisations for sm_{args.arch}")
    return {"compiled": report}


if __name__ == "__main__":
    main()
