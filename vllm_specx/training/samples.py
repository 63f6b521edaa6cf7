"""A gen-data folder (`vllm_specx.training.data`): its files, its meta.json, and the stored samples read back.

  <out>/tokens.jsonl             {"id", "prompt_ids", "output_ids"} per prompt
  <out>/taps/<first-id>.safetensors   per sample "ids_<id>", "taps_<id>" and, with top-k,
                                 "topk_ids_<id>", "topk_logp_<id>" (`generate.write_taps`)
  <out>/meta.json                how it was made (`check_meta`)
  <out>/skipped.jsonl            prompts not answered (`SKIPPED_FILE`)
  <out>/commands.txt             every gen-data command run on the folder (`COMMANDS_FILE`)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from safetensors import safe_open


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


TAPS_FIELDS = ("taps", "topk", "taps_dtype")  # the taps pass's part of meta.json
PROMPT_FIELDS = ("prompts", "limit", "spread")  # which prompts (tests check drafts never saw an eval set)
COMMANDS_FILE = "commands.txt"
EVALUATION = "evaluation"  # meta.json "purpose" of `gen-data --for-eval` data: measured on, never trained on
SKIPPED_FILE = "skipped.jsonl"  # prompts too long for the engine's max_model_len, with their lengths


def check_meta(out: Path, meta: dict, with_taps: bool = True) -> None:
    """Write meta.json, or check it against an existing one: the generation fields must match;
    the taps fields may change only while no taps are stored (taps can be added to token data).
    `with_taps=False` (token ids imported into a folder, `token_file.import_tokens`): `meta` says nothing
    about taps, so an existing folder's taps fields are neither compared nor rewritten."""
    file = out / "meta.json"
    if file.exists():
        old = json.loads(file.read_text())
        # Data made before the prompts were recorded gets them added; otherwise they must match.
        meta_cmp = {k: v for k, v in meta.items() if k in old or k not in PROMPT_FIELDS}
        gen = lambda m: {k: v for k, v in m.items() if k not in TAPS_FIELDS}  # noqa: E731
        taps = lambda m: {k: v for k, v in m.items() if k in TAPS_FIELDS and v}  # noqa: E731
        stored = any((out / "taps").glob("*.safetensors")) if (out / "taps").is_dir() else False
        if gen(old) != gen(meta_cmp) or (with_taps and stored and taps(old) != taps(meta)):
            raise ValueError(f"{file}: existing data was made with {old}, not {meta}; use a new --out")
        if old == meta or not with_taps:
            return
    out.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(meta, indent=2) + "\n")


def response_ids(out: str | Path) -> list[list[int]]:
    """The generated token ids of every response in a data folder (its tokens.jsonl)."""
    return [r["output_ids"] for r in read_jsonl(Path(out) / "tokens.jsonl")]


class SampleStore(Sequence):
    """The stored samples, read from disk when indexed (nothing but an index is kept in RAM).

    `store[i]` is {"ids": [T] int64, "taps": [T, n*H] fp16, "prompt_len": int, and when the data
    has top-k: "topk_ids" [T, K] int64, "topk_logp" [T, K] float32}. `store.subset(indices)` is a
    view (the trainer's train/validation split).
    """

    def __init__(self, out: Path):
        self.out = Path(out)
        self.prompt_len = {r["id"]: len(r["prompt_ids"]) for r in read_jsonl(self.out / "tokens.jsonl")}
        self.index = []  # (shard, sample id, whether the shard stores the sample's top-k)
        for file in sorted((self.out / "taps").glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                keys = set(f.keys())
            self.index += [(file, int(k[4:]), f"topk_ids_{k[4:]}" in keys) for k in sorted(keys) if k.startswith("ids_")]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        file, sid, has_topk = self.index[i]
        with safe_open(str(file), framework="pt") as f:
            s = {"ids": f.get_tensor(f"ids_{sid}"), "taps": f.get_tensor(f"taps_{sid}"),
                 "prompt_len": self.prompt_len[sid]}
            if has_topk:
                s["topk_ids"] = f.get_tensor(f"topk_ids_{sid}").long()
                s["topk_logp"] = f.get_tensor(f"topk_logp_{sid}")
        return s

    def subset(self, indices) -> SampleStore:
        view = SampleStore.__new__(SampleStore)
        view.out, view.prompt_len, view.index = self.out, self.prompt_len, [self.index[i] for i in indices]
        return view


def load_samples(out: Path) -> SampleStore:
    """Every stored sample of a data folder (see `SampleStore`; read lazily)."""
    return SampleStore(Path(out))
