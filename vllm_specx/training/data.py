"""On-policy training data: the target generates continuations in vLLM, then its taps are stored.

    python -m vllm_specx.training.data --target assets/ref-target \
        --prompts assets/prompts/train.jsonl --out runs/data --max-tokens 192 --taps 1,4,6

Writes, resumably (rerun the same command to continue after an interruption):
  <out>/tokens.jsonl             {"id", "prompt_ids", "output_ids"} per prompt, appended per batch
  <out>/taps/<first-id>.safetensors   per sample "ids_<id>" [T] int64 and "taps_<id>" [T, n*H] fp16
  <out>/meta.json                target, taps, temperature, max_tokens (checked on resume)

The token ids come from vLLM (the distribution drafts are judged against). The taps are computed
with transformers on the same weights: vLLM's CPU build cannot export hidden states (its
hidden-state connector needs pinned memory), and for the tapped layers the two are the same
residual stream.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _check_meta(out: Path, meta: dict) -> None:
    file = out / "meta.json"
    if file.exists():
        old = json.loads(file.read_text())
        if old != meta:
            raise ValueError(f"{file}: existing data was made with {old}, not {meta}; use a new --out")
    else:
        out.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(meta, indent=2) + "\n")


def generate_tokens(target: str, prompts: list[dict], out: Path, max_tokens: int,
                    temperature: float = 0.0, batch: int = 64) -> None:
    """Append vLLM generations for the prompts not yet in <out>/tokens.jsonl."""
    done = {r["id"] for r in _read_jsonl(out / "tokens.jsonl")}
    todo = [p for p in prompts if p["id"] not in done]
    if not todo:
        return
    from vllm import SamplingParams

    from vllm_specx.engine import cpu_llm

    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True, seed=0)
    with cpu_llm(target) as llm, open(out / "tokens.jsonl", "a") as f:
        for i in tqdm(range(0, len(todo), batch), desc="generate", unit="batch"):
            chunk = todo[i:i + batch]
            for p, o in zip(chunk, llm.generate([p["prompt"] for p in chunk], params, use_tqdm=False)):
                f.write(json.dumps({"id": p["id"], "prompt_ids": list(o.prompt_token_ids),
                                    "output_ids": list(o.outputs[0].token_ids)}) + "\n")
            f.flush()


def write_taps(target: str, out: Path, layer_ids: tuple[int, ...], shard: int = 32) -> None:
    """Store the target's taps for every generated sequence, one safetensors file per shard."""
    from vllm_specx.training.taps import load_target, target_taps

    rows = _read_jsonl(out / "tokens.jsonl")
    (out / "taps").mkdir(exist_ok=True)
    model = None
    for i in tqdm(range(0, len(rows), shard), desc="taps", unit="shard"):
        file = out / "taps" / f"{rows[i]['id']:06d}.safetensors"
        if file.exists():
            continue
        model = model or load_target(target)
        seqs = [torch.tensor(r["prompt_ids"] + r["output_ids"]) for r in rows[i:i + shard]]
        # One padded forward per shard: right padding cannot change a causal model's earlier rows.
        taps = target_taps(model, torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True), layer_ids)
        tensors = {}
        for r, ids, t in zip(rows[i:i + shard], seqs, taps):
            tensors[f"ids_{r['id']}"] = ids
            tensors[f"taps_{r['id']}"] = t[: len(ids)].half()
        save_file(tensors, str(file.with_suffix(".tmp")))
        file.with_suffix(".tmp").rename(file)  # a shard is either complete or absent


def load_samples(out: Path) -> list[dict]:
    """[{"ids": [T] int64, "taps": [T, n*H] fp16, "prompt_len": int}] for every stored sample."""
    prompt_len = {r["id"]: len(r["prompt_ids"]) for r in _read_jsonl(out / "tokens.jsonl")}
    samples = []
    for file in sorted((out / "taps").glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                if key.startswith("ids_"):
                    i = int(key[4:])
                    samples.append({"ids": f.get_tensor(key), "taps": f.get_tensor(f"taps_{i}"),
                                    "prompt_len": prompt_len[i]})
    return samples


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="vllm-specx gen-data", description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--prompts", required=True, help="jsonl with 'id' and 'prompt'")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--taps", default="", help="comma-separated 0-based target layers; empty: tokens only")
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args(argv)
    out = Path(args.out)
    taps = tuple(sorted(int(x) for x in args.taps.split(",") if x))
    _check_meta(out, {"target": args.target, "taps": list(taps),
                      "max_tokens": args.max_tokens, "temperature": args.temperature})
    prompts = _read_jsonl(Path(args.prompts))[: args.limit]
    generate_tokens(args.target, prompts, out, args.max_tokens, args.temperature)
    if taps:
        write_taps(args.target, out, taps)


if __name__ == "__main__":
    main()
