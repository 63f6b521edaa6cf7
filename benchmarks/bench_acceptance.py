"""Benchmark the acceptance sampler against vLLM V1's `RejectionSampler` on identical inputs.

Every config (batch B, drafts per request K, vocab V) builds one batch: target logits
`[B*K + B, V]` in vLLM V1's layout (each request's K draft rows, then its bonus row), draft
probabilities `[B*K, V]` and drafts drawn from them; every request samples at temperature 1.0.
Columns (median ms per call):

  ours_op      `acceptance_sample` on ready probabilities and noise (auto: the vectorised torch
               path on CPU, the Triton kernels on CUDA)
  ours_e2e     what vLLM's call covers, from the same logits: softmax of the target and bonus
               rows, the host draws (`draw_randomness`, whose noise is serving's sampler
               `draw_exp_noise`), then `acceptance_sample` with `validate=False`, as served
  reference    the looped spec (`impl="reference"`; small configs only)
  vllm         `RejectionSampler.forward(metadata, draft_probs, logits, sampling_metadata)`,
               which also samples its bonus tokens with vLLM's `Sampler`
  specx_in_vllm  the same forward on vllm-specx's `SpecxRejectionSampler` (what a served
               request pays with our sampler), when vllm-specx is installed beside vLLM

vLLM is optional: without it the column is empty; the op itself never imports vLLM. On CPU,
vLLM's Python override of its `expand` kernel mishandles the float temperature (garbage
temperatures), which changes the sampled tokens but not the work done, so the timing stands.

    python benchmarks/bench_acceptance.py                # CPU sweep (~3 min) -> benchmarks/results/
    python benchmarks/bench_acceptance.py --smoke        # 2 tiny configs (used by a test)
    python benchmarks/bench_acceptance.py --gpu          # CUDA: Triton kernels vs torch path, vLLM
    python benchmarks/bench_acceptance.py --compile-only # build the kernels for sm_90, no GPU
"""

import argparse
import datetime
import os
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing the package

import torch  # noqa: E402
from _report import provenance, write_report  # noqa: E402


def parse_args(argv=None):
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="2 tiny configs")
    p.add_argument("--gpu", action="store_true", help="time on CUDA (Triton kernels)")
    p.add_argument("--compile-only", action="store_true",
                   help="compile every kernel specialisation for --arch without a GPU")
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--batches", type=ints, default=None, help="CPU 1,16,64; GPU 1,16,64,256")
    p.add_argument("--ks", type=ints, default=None, help="drafts per request: CPU 1,4,8; GPU +16")
    p.add_argument("--vocabs", type=ints, default=[2048, 32000, 152064])
    p.add_argument("--method", choices=("token", "block"), default="token")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1: shared CPU cores make more threads noisy)")
    p.add_argument("--min-time", type=float, default=0.3, help="seconds of timing per column")
    p.add_argument("--ref-max-elems", type=float, default=2e6,
                   help="skip the looped reference above this many B*K*V elements")
    p.add_argument("--no-vllm", action="store_true", help="skip the vLLM column")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/)")
    args = p.parse_args(argv)
    if args.smoke:
        args.batches, args.ks, args.vocabs, args.min_time = [2, 3], [2], [64], 0.0
    args.batches = args.batches or ([1, 16, 64, 256] if args.gpu else [1, 16, 64])
    args.ks = args.ks or ([1, 4, 8, 16] if args.gpu else [1, 4, 8])
    return args


def make_inputs(B, K, V, device, seed=0):
    """Logits in vLLM V1's layout, draft probs and drafts drawn from them."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    T = B * K
    logits = (3.0 * torch.randn(T + B, V, generator=g)).to(device)
    draft_logits = logits.view(B, K + 1, V)[:, :K].reshape(T, V).cpu()
    draft_probs = (draft_logits + torch.randn(T, V, generator=g)).softmax(-1)
    drafts = torch.multinomial(draft_probs, 1, generator=g).squeeze(1) if T else torch.zeros(0)
    rows = torch.arange(T + B).view(B, K + 1)
    return {
        "logits": logits, "draft_probs": draft_probs.to(device), "drafts": drafts.long().to(device),
        "target_idx": rows[:, :K].reshape(-1).to(device), "bonus_idx": rows[:, K].to(device),
        "cu": (torch.arange(1, B + 1) * K).to(device), "greedy": torch.zeros(B, dtype=torch.bool,
                                                                              device=device),
    }


def op_inputs(inp, V, has_draft=True):
    """`AcceptanceInputs` from `make_inputs`: target and bonus rows softmaxed, host draws.

    The op columns time ready inputs with the value checks on (`validate=True`), so the rare
    +inf noise entry (U = 0 in `draw_exp_noise`, probability 2^-53 each) becomes the largest
    float: finite, as the checks require, and a near-zero race key as +inf is a zero one.
    """
    from vllm_specx.ops.acceptance import AcceptanceInputs, draw_randomness

    logits = inp["logits"]
    u, e = draw_randomness(inp["cu"], V)
    return AcceptanceInputs(
        inp["drafts"], inp["cu"], logits[inp["target_idx"]].softmax(-1),
        logits[inp["bonus_idx"]].softmax(-1), inp["draft_probs"] if has_draft else None,
        inp["greedy"], u, e.nan_to_num_(posinf=torch.finfo(torch.float32).max))


def time_call(fn, device, min_time, setup=None):
    """Median ms of `fn()` over >= 3 calls and >= `min_time` s (after one warm-up call)."""
    def once():
        arg = setup() if setup else None
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(arg) if setup else fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    once()
    times, start = [], time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < min_time:
        times.append(once())
    return 1e3 * statistics.median(times)


_OVERRIDES_DONE = False


def vllm_sampler(B, K, inp):
    """(callable(logits), None) running vLLM V1's rejection sampler on these inputs, or
    (None, why not)."""
    try:
        from vllm.platforms import current_platform
        from vllm.v1.sample.logits_processor import LogitsProcessors
        from vllm.v1.sample.metadata import SamplingMetadata
        from vllm.v1.sample.rejection_sampler import RejectionSampler
        from vllm.v1.sample.sampler import Sampler
        from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    except Exception as e:  # noqa: BLE001 - any import failure means: no vLLM column
        return None, f"vLLM unavailable: {type(e).__name__}: {e}"
    dev = inp["logits"].device
    global _OVERRIDES_DONE
    if not _OVERRIDES_DONE:  # CPU: vLLM's Python fallbacks for its Triton kernels
        current_platform.register_triton_kernel_overrides()
        _OVERRIDES_DONE = True
    md = SpecDecodeMetadata.make_dummy(inp["drafts"].view(B, K).tolist(), dev)
    md.target_logits_indices = inp["target_idx"].int()
    md.bonus_logits_indices = inp["bonus_idx"].int()
    md.logits_indices = torch.arange(B * (K + 1), dtype=torch.int32, device=dev)
    sm = SamplingMetadata(
        temperature=torch.ones(B, device=dev), all_greedy=False, all_random=True, top_p=None,
        top_k=None, generators={}, max_num_logprobs=None, no_penalties=True,
        prompt_token_ids=None, frequency_penalties=torch.zeros(B, device=dev),
        presence_penalties=torch.zeros(B, device=dev),
        repetition_penalties=torch.ones(B, device=dev), output_token_ids=[[] for _ in range(B)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    sampler = RejectionSampler(Sampler())
    draft_probs = inp["draft_probs"]
    calls = {"vllm": lambda logits: sampler(md, draft_probs, logits, sm)}
    try:  # vllm-specx's integrated path: the same vLLM forward, our acceptance op as its core
        import vllm_specx
        from vllm_specx.sample.rejection_sampler import SpecxRejectionSampler

        vllm_specx.register()
        ours = SpecxRejectionSampler(Sampler(), None, dev)
        calls["specx_in_vllm"] = lambda logits: ours(md, draft_probs, logits, sm)
    except Exception:  # noqa: BLE001 - plugin not installed beside this vLLM: no column
        pass
    return calls, None


def run_config(B, K, V, args, device):
    from vllm_specx.ops.acceptance import acceptance_sample, draw_randomness

    inp = make_inputs(B, K, V, device)
    logits, dp = inp["logits"], inp["draft_probs"]
    ready = op_inputs(inp, V).tensors()

    def e2e():  # specx_rejection_sample's work on these logits (vLLM's bonus draw aside)
        t = logits[inp["target_idx"]].softmax(-1)
        b = logits[inp["bonus_idx"]].softmax(-1)
        uu, ee = draw_randomness(inp["cu"], V)
        return acceptance_sample(inp["drafts"], inp["cu"], t, b, dp, inp["greedy"], uu, ee,
                                 method=args.method, max_num_draft_tokens=K, validate=False)

    row = {"batch": B, "k": K, "vocab": V, "method": args.method}
    impl = "triton" if device.type == "cuda" else "torch"
    row["ours_impl"] = impl
    row["ours_op_ms"] = time_call(lambda: acceptance_sample(**ready, method=args.method),
                                  device, args.min_time)
    row["ours_e2e_ms"] = time_call(e2e, device, args.min_time)
    if device.type == "cuda":
        row["torch_path_ms"] = time_call(
            lambda: acceptance_sample(**ready, method=args.method, impl="torch"), device,
            args.min_time)
    row["reference_ms"] = None
    if B * K * V <= args.ref_max_elems:
        row["reference_ms"] = time_call(
            lambda: acceptance_sample(**ready, method=args.method, impl="reference"), device,
            args.min_time)
    row["vllm_ms"], row["vllm_note"] = None, None
    if not args.no_vllm and args.method == "token":
        fns, why = vllm_sampler(B, K, inp)
        if fns is None:
            row["vllm_note"] = why
        else:
            row["vllm_ms"] = time_call(fns["vllm"], device, args.min_time, setup=lambda: logits.clone())
            if "specx_in_vllm" in fns:
                row["specx_in_vllm_ms"] = time_call(fns["specx_in_vllm"], device, args.min_time,
                                                    setup=lambda: logits.clone())
    elif args.method == "block":
        row["vllm_note"] = "vLLM V1 has no block verification"
    row["e2e_speedup_vs_vllm"] = (row["vllm_ms"] / row["ours_e2e_ms"]) if row["vllm_ms"] else None
    return row


def table(results) -> str:
    fmt = lambda v: "-" if v is None else f"{v:.3f}" if v < 10 else f"{v:.1f}"  # noqa: E731
    head = f"{'B':>4} {'K':>3} {'V':>7} | {'ours_op':>8} {'ours_e2e':>8} {'ref':>8} " \
           f"{'vllm':>8} {'specx_in_vllm':>13} | {'e2e x':>6}"
    lines = [head, "-" * len(head)]
    for r in results:
        sp = r["e2e_speedup_vs_vllm"]
        lines.append(f"{r['batch']:>4} {r['k']:>3} {r['vocab']:>7} | {fmt(r['ours_op_ms']):>8} "
                     f"{fmt(r['ours_e2e_ms']):>8} {fmt(r['reference_ms']):>8} "
                     f"{fmt(r['vllm_ms']):>8} {fmt(r.get('specx_in_vllm_ms')):>13} | "
                     f"{('-' if sp is None else f'{sp:.1f}'):>6}")
    return "\n".join(lines) + "\n(ms per call, median; e2e x = vllm / ours_e2e)"


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.compile_only:
        return compile_only(args)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.gpu else "cpu")
    if args.gpu and not torch.cuda.is_available():
        sys.exit("--gpu: no CUDA device")
    results = []
    for V in args.vocabs:
        for B in args.batches:
            for K in args.ks:
                results.append(run_config(B, K, V, args, device))
                print(table(results[-1:]).splitlines()[-2], file=sys.stderr, flush=True)
    report = {"meta": provenance(device, args, method=args.method, note=(
        "CPU: vLLM's expand override garbles the float temperature; timing unaffected")),
        "results": results}
    out = args.out
    if out is None and not args.smoke:
        stamp = datetime.date.today().isoformat()
        out = REPO / "benchmarks" / "results" / f"acceptance-{device.type}-{stamp}.json"
    write_report(report, out, table(results))
    return report


def compile_only(args) -> dict:
    """Compile the four kernels' specialisations for `cuda:<arch>` from CPU-recorded launches:
    catches what the interpreter cannot (loop-carried types, fp64 lowering), reports registers,
    spills, and that the fp32 divisions are IEEE (`div.rn`) and no FMA was contracted."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("--compile-only needs TRITON_INTERPRET unset")
    from _sm90_compile import compile_launches, record_launches

    launches = record_launches()
    from vllm_specx.ops.acceptance.kernel import acceptance_sample_triton

    for method in ("token", "block"):
        for has_draft in (True, False):
            inp = make_inputs(3, 2, 5000, torch.device("cpu"))
            acceptance_sample_triton(op_inputs(inp, 5000, has_draft), method)
    report = []
    for c in compile_launches(launches, args.arch, ("num_warps", "enable_fp_fusion")):
        ptx, consts = c.pop("ptx"), c.pop("consts")
        r = {k: c[k] for k in ("kernel", "constexprs", "registers", "spill_store_bytes")}
        r["approx_div"] = len(re.findall(r"div\.(?:full|approx)\.f32", ptx))
        r["fma"] = len(re.findall(r"\bfma\.rn\.f(?:32|64)", ptx))
        report.append(r)
        print(f"{r['kernel']:<24} regs={r['registers']} spill={r['spill_store_bytes']} "
              f"approx_div={r['approx_div']} fma={r['fma']} {dict(consts)}")
    print(f"compiled {len(report)} specialisations for sm_{args.arch}")
    return {"compiled": report}


if __name__ == "__main__":
    main()
