"""On-policy training data for the speculators DSpark interop fixtures.

Two steps (run.sh calls both, with ``speculators prepare-data`` in between):

``gen``: takes the first ``--num-samples`` prompts of ``assets/prompts/train.jsonl``
(only the train split; code.jsonl / prose.jsonl are evaluation sets) that have at
least ``--prompt-tokens`` tokens, cuts each to its first ``--prompt-tokens`` tokens
and appends ``--gen-tokens`` greedy tokens from the target (plain transformers,
fp32, no EOS stop). Writes ``samples.jsonl`` rows ``{"input_ids", "loss_mask"}``
with loss_mask 0 on the prompt and 1 on the generated tokens.

``hs``: for every row ``i`` of the prepared (shuffled) Arrow dataset written by
``speculators prepare-data``, runs the target once and writes
``<data>/hidden_states/hs_{i}.safetensors`` with ``token_ids`` [S] int64 and
``hidden_states`` [S, n_aux+1, H] fp32: slots 0..n_aux-1 are HF
``output_hidden_states[k]`` for k in ``--aux-ids`` (= vLLM aux layer id k), the last
slot is the PRE-final-norm output of the last decoder layer (forward hook), as
speculators' trainer applies verifier_norm itself.

Commands (what run.sh runs):
    python make_data.py gen --target assets/ref-target \
        --prompts assets/prompts/train.jsonl --out $WORK/samples.jsonl
    python make_data.py hs --target assets/ref-target --data $WORK/data --aux-ids 2 5 7
"""

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def load_target(path):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


@torch.no_grad()
def cmd_gen(args):
    tok = AutoTokenizer.from_pretrained(args.target)
    model = load_target(args.target)
    prompts = []
    with open(args.prompts) as f:
        for line in f:
            ids = tok(json.loads(line)["prompt"])["input_ids"]
            if len(ids) >= args.prompt_tokens:
                prompts.append(ids[: args.prompt_tokens])
            if len(prompts) == args.num_samples:
                break
    rows = []
    for b in range(0, len(prompts), args.batch_size):
        x = torch.tensor(prompts[b : b + args.batch_size], dtype=torch.long)
        out = model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            do_sample=False,
            max_new_tokens=args.gen_tokens,
            min_new_tokens=args.gen_tokens,
            pad_token_id=tok.pad_token_id,
        )
        assert out.shape[1] == args.prompt_tokens + args.gen_tokens, out.shape
        for seq in out.tolist():
            rows.append(
                {
                    "input_ids": seq,
                    "loss_mask": [0] * args.prompt_tokens + [1] * args.gen_tokens,
                }
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {len(rows)} samples to {args.out}")


def target_hidden_states(model, input_ids, aux_ids):
    """[S, n_aux+1, H]: aux taps plus the pre-final-norm last-layer output."""
    captured = {}

    def hook(_mod, _inp, out):
        captured["pre_norm"] = out[0] if isinstance(out, tuple) else out

    h = model.model.layers[-1].register_forward_hook(hook)
    try:
        out = model(input_ids=input_ids[None], output_hidden_states=True)
    finally:
        h.remove()
    taps = [out.hidden_states[k][0] for k in aux_ids]
    pre = captured["pre_norm"]
    pre = pre[0] if pre.dim() == 3 else pre
    # Sanity: HF's last hidden state is post-norm in transformers 5.x.
    assert torch.allclose(model.model.norm(pre), out.hidden_states[-1][0], atol=1e-5)
    return torch.stack(taps + [pre], dim=1).float().contiguous()


@torch.no_grad()
def cmd_hs(args):
    from datasets import load_from_disk

    model = load_target(args.target)
    ds = load_from_disk(args.data)
    out_dir = Path(args.data) / "hidden_states"
    out_dir.mkdir(parents=True, exist_ok=True)
    for i in range(len(ds)):
        ids = torch.as_tensor(ds[i]["input_ids"]).long()
        hs = target_hidden_states(model, ids, args.aux_ids)
        save_file(
            {"token_ids": ids.contiguous(), "hidden_states": hs},
            str(out_dir / f"hs_{i}.safetensors"),
        )
    print(f"wrote {len(ds)} hidden-state files to {out_dir}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("--target", required=True)
    g.add_argument("--prompts", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--num-samples", type=int, default=300)
    g.add_argument("--prompt-tokens", type=int, default=64)
    g.add_argument("--gen-tokens", type=int, default=136)
    g.add_argument("--batch-size", type=int, default=50)
    h = sub.add_parser("hs")
    h.add_argument("--target", required=True)
    h.add_argument("--data", required=True)
    h.add_argument("--aux-ids", type=int, nargs="+", default=[2, 5, 7])
    args = p.parse_args()
    torch.manual_seed(0)
    {"gen": cmd_gen, "hs": cmd_hs}[args.cmd](args)


if __name__ == "__main__":
    main()
