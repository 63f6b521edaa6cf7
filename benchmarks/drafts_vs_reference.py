"""Every pass's DSpark drafts in a real vLLM engine against the PyTorch reference's for the same
context: how often the engine drafts exactly what the trained model would (greedy, batch 1).

Greedy output is identical with or without a draft (the verification guarantees it), so tau is
what tells two engines apart; this tells *why*: on the same prompts and the same output, did the
engine propose the drafts of the reference (`DSparkDraft.greedy_drafts`, given the target's taps
of the context and the anchor), pass by pass?

    # in each vLLM venv: record the passes (0.34's needs the interpreter harness)
    .venv/bin/python benchmarks/drafts_vs_reference.py record --out /tmp/drafts-032.json
    SPECX_TRITON_INTERPRETER=1 "$(bash scripts/venv034.sh)/bin/python" benchmarks/drafts_vs_reference.py \\
        record --out /tmp/drafts-034.json
    # then compare each with the reference (any venv with transformers)
    .venv/bin/python benchmarks/drafts_vs_reference.py compare /tmp/drafts-032.json /tmp/drafts-034.json

On the reference target with the committed `ref-dspark` (8 held-out code prompts x 48 tokens), see
docs/vllm-versions.md for what it found (vLLM 0.34's CPU K-norm, worked around; now 164 of 164
passes equal on 0.32 and on 0.34). Each request's last pass is left out of the comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from vllm_specx.testing.propose_probe import greedy_walk, propose_probe  # noqa: E402


def record(args) -> None:
    if os.environ.get("SPECX_TRITON_INTERPRETER") == "1":
        from vllm_specx.testing import triton_harness

        triton_harness.install()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import vllm
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from vllm_specx import assets
    from vllm_specx.engine import cpu_llm

    target = assets.root() / "ref-target"
    tok = AutoTokenizer.from_pretrained(str(target))
    prompts = assets.load_prompts("code", args.prompts)
    spec = {"method": "dspark", "model": str(args.draft), "num_speculative_tokens": args.k}
    rows = []
    with cpu_llm(target, spec, max_num_seqs=1) as llm:
        llm.collective_rpc(propose_probe)
        for p in prompts:
            o = llm.generate([p], SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True),
                             use_tqdm=False)[0]
            rows.append({"prompt_ids": tok(p)["input_ids"], "engine_prompt_ids": list(o.prompt_token_ids),
                         "out": list(o.outputs[0].token_ids), "passes": [c["drafts"] for c in llm.collective_rpc(propose_probe)[0]]})
    args.out.write_text(json.dumps({"vllm": vllm.__version__, "draft": str(args.draft), "k": args.k, "rows": rows}))
    print(f"wrote {args.out}: {sum(len(r['passes']) for r in rows)} passes, vLLM {vllm.__version__}")


def compare(args) -> None:
    import torch

    from vllm_specx.methods.dspark.checkpoint import load_draft
    from vllm_specx.training.taps import embed_and_head, load_target, target_taps

    target = load_target(ROOT / "assets" / "ref-target")  # every file is a run on the reference target
    embed, head = embed_and_head(target)
    for f in args.files:
        rec = json.loads(Path(f).read_text())
        draft = load_draft(rec["draft"], embed, head).float().eval()
        k, n, equal, first = rec["k"], 0, 0, 0
        accepted = 0
        for r in rec["rows"]:
            pid, out = r["engine_prompt_ids"], r["out"]
            ids = torch.tensor([pid + out])
            with torch.no_grad():
                taps = target_taps(target, ids, draft.cfg.target_layer_ids)[0].float()
            # the request's last pass is left out: when its verification accepted past max_tokens,
            # the engine drafted from tokens the output was cut before (an anchor not in `out`)
            walk = greedy_walk([d[0] if d and isinstance(d[0], list) else d for d in r["passes"]], out, k)
            for pos, d, m in walk[:-1]:
                t = len(pid) + pos
                ref = draft.greedy_drafts(taps[:t], out[pos], k, tokens=ids[0, :t])
                n, equal, first, accepted = n + 1, equal + (ref == d), first + (ref[0] == d[0]), accepted + m
        print(f"vLLM {rec['vllm']}: {n} passes; drafts equal to the reference's {equal} ({equal / n:.0%}), "
              f"first draft equal {first} ({first / n:.0%}); tau over these passes {1 + accepted / n:.4f}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("record", help="run the engine of this venv and keep every pass's drafts")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--draft", type=Path, default=ROOT / "assets" / "drafts" / "ref-dspark")
    r.add_argument("--prompts", type=int, default=8)
    r.add_argument("--max-tokens", type=int, default=48)
    r.add_argument("--k", type=int, default=7)
    c = sub.add_parser("compare", help="each recorded file's passes against the reference's drafts")
    c.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    record(args) if args.what == "record" else compare(args)


if __name__ == "__main__":
    main()
