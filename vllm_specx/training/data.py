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
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


TAPS_FIELDS = ("taps", "topk", "taps_dtype")  # the taps pass's part of meta.json
PROMPT_FIELDS = ("prompts", "limit", "spread")
COMMANDS_FILE = "commands.txt"
EVALUATION = "evaluation"  # meta.json "purpose" of `gen-data --for-eval` data: measured on, never trained on
SKIPPED_FILE = "skipped.jsonl"  # prompts too long for the engine's max_model_len, with their lengths  # which prompts (tests check drafts never saw an eval set)


def _check_meta(out: Path, meta: dict, with_taps: bool = True) -> None:
    """Write meta.json, or check it against an existing one: the generation fields must match;
    the taps fields may change only while no taps are stored (taps can be added to token data).
    `with_taps=False` (token ids imported into a folder, `import_tokens`): `meta` says nothing
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


def read_prompts(spec: str, limit: int | None = None, evaluation: bool = False) -> list[dict]:
    """[{"id", "prompt"}] from a prompt-set name (`vllm_specx.assets.PROMPT_SETS`; a chat set's
    prompt is its message list) or a jsonl file with "id" and "prompt" or "messages".

    Refuses evaluation sets unless `evaluation` (gen-data --for-eval: data the trainer only
    measures on, never trains on): drafts are never trained on what they are measured on."""
    from vllm_specx import assets

    if spec in assets.PROMPT_SETS:
        if assets.PROMPT_SETS[spec][1] != "train" and not evaluation:
            raise ValueError(f"--prompts {spec}: an evaluation set ({assets.PROMPT_SETS[spec][2]}); "
                             "train on a training set: "
                             + ", ".join(n for n, v in assets.PROMPT_SETS.items() if v[1] == "train"))
        return [{"id": i, "prompt": p} for i, p in enumerate(assets.load_prompts(spec, limit))]
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"--prompts {spec}: neither a prompt set ({', '.join(assets.PROMPT_SETS)}) nor a file")
    rows = _read_jsonl(path)[:limit]
    for n, r in enumerate(rows):
        if "id" not in r or not ("prompt" in r or "messages" in r):
            raise ValueError(f"{path}: line {n + 1} needs 'id' and 'prompt' or 'messages'")
    return [{"id": r["id"], "prompt": r.get("messages", r.get("prompt"))} for r in rows]


def select_prompts(spec: str, limit: int | None = None, spread: int | None = None,
                   evaluation: bool = False) -> list[dict]:
    """The prompts gen-data runs on: `read_prompts(spec, limit, evaluation)`, then with `spread` N
    that many spread evenly over them (every len/N-th), in order."""
    prompts = read_prompts(spec, limit, evaluation)
    if spread is not None and spread < len(prompts):
        prompts = [prompts[i * len(prompts) // spread] for i in range(spread)]
    return prompts


def trained_prompt_ids(record: dict) -> tuple[str, set[int]] | None:
    """(prompt set, the ids of its prompts whose answers a training run's data held), from the
    run's training record (`training.json`), or None when the record cannot say.

    From the data folder's tokens.jsonl when it is still there; else re-derived from the data's
    meta: gen-data answers the selected prompts (`select_prompts`) in order, so data of n samples
    (the record's `data_samples`; in records older than it, its train + validation samples) holds
    the first n of them (a run stopped early holds a prefix)."""
    meta = record.get("data") or {}
    spec = meta.get("prompts")
    if spec is None:
        return None
    folder = (record.get("args") or {}).get("data")
    if folder and (Path(folder) / "tokens.jsonl").is_file():
        return spec, {r["id"] for r in _read_jsonl(Path(folder) / "tokens.jsonl")}
    n = int(record.get("data_samples") or 0) or int(record.get("train_samples") or 0) + int(record.get("val_samples") or 0)
    if not n:
        return None
    return spec, {p["id"] for p in select_prompts(spec, meta.get("limit"), meta.get("spread"))[:n]}


def generate_tokens(target: str, prompts: list[dict], out: Path, max_tokens: int,
                    temperature: float = 0.0, batch: int = 256, ignore_eos: bool = True,
                    engine_args: dict | None = None) -> None:
    """Append vLLM generations for the prompts not yet in <out>/tokens.jsonl (chats rendered
    with the target's chat template).

    The engine is fed continuously: up to `batch` prompts are in flight at once, so the batch never
    drains between chunks; responses are written as soon as every earlier prompt's is (prompt
    order, so a stopped run holds a prefix of the set and loses only what was in flight). The
    progress bar counts prompts over the whole set (its ETA is for the rest) and the tokens
    generated."""
    rows = _read_jsonl(out / "tokens.jsonl")
    done = {r["id"] for r in rows} | {r["id"] for r in _read_jsonl(out / SKIPPED_FILE)}
    todo = [p for p in prompts if p["id"] not in done]
    if not todo:
        return
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from vllm_specx.assets import render
    from vllm_specx.engine import cpu_llm

    tok = AutoTokenizer.from_pretrained(target)
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=ignore_eos, seed=0)
    tokens = sum(len(r["output_ids"]) for r in rows)
    bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), desc="generate", unit="prompt",
               smoothing=0.05)
    with cpu_llm(target, **(engine_args or {})) as llm, open(out / "tokens.jsonl", "a") as f, bar:
        engine, queue, in_flight = llm.llm_engine, iter(todo), {}
        finished, written = {}, 0  # rows are written in prompt order (a stopped run holds a prefix)
        limit = llm.llm_engine.model_config.max_model_len

        def flush():  # every answer whose earlier prompts are all answered (or skipped)
            nonlocal written, tokens
            while written < len(todo) and todo[written]["id"] in finished:
                got = finished.pop(todo[written]["id"])
                if got is not None:  # None: skipped
                    f.write(json.dumps({"id": todo[written]["id"], "prompt_ids": got[0], "output_ids": got[1]}) + "\n")
                    tokens += len(got[1])
                    bar.set_postfix(tokens=tokens, refresh=False)
                written += 1
                bar.update(1)
            f.flush()

        while True:
            while len(in_flight) < batch:
                p = next(queue, None)
                if p is None:
                    break
                prompt = render([p["prompt"]], tok)[0]
                n = len(prompt["prompt_token_ids"] if isinstance(prompt, dict) else tok(prompt)["input_ids"])
                if n >= limit:  # vLLM would refuse it and stop the whole run: skip it, on record
                    finished[p["id"]] = None
                    with open(out / SKIPPED_FILE, "a") as sk:
                        sk.write(json.dumps({"id": p["id"], "prompt_tokens": n, "max_model_len": limit}) + "\n")
                    print(f"gen-data: prompt {p['id']!r} has {n} tokens, not below max_model_len {limit}: "
                          f"skipped (listed in {out / SKIPPED_FILE})", file=sys.stderr)
                    continue
                rid = f"gen-{p['id']}"
                engine.add_request(rid, prompt, params)
                in_flight[rid] = p
            flush()
            if not in_flight:
                break
            for o in engine.step():
                if o.finished:
                    p = in_flight.pop(o.request_id)
                    finished[p["id"]] = (list(o.prompt_token_ids), list(o.outputs[0].token_ids))
            flush()

def taps_device(device: str | None) -> str:
    """`--device`: as given, else cuda when torch sees one, else cpu."""
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


TAPS_VIA = ("auto", "vllm", "transformers")


def taps_via(via: str, device: str) -> str:
    """`--taps-via`: as given, else (auto) vLLM's own hidden-state export when the taps are for a
    CUDA device (it saves loading the target a second time in transformers), else transformers
    (on CPU a small target's forward costs less than a second engine start)."""
    if via not in TAPS_VIA:
        raise ValueError(f"--taps-via {via!r}: one of {', '.join(TAPS_VIA)}")
    if via != "auto":
        return via
    return "vllm" if device.startswith("cuda") else "transformers"


def taps_path(device: str, via: str = "transformers") -> str:
    """Which path computes the taps, for the log."""
    if via == "vllm":
        return ("vLLM's extract_hidden_states export (a prefill of each sequence in vLLM's engine, "
                "hidden states saved by vllm_specx.training.vllm_taps.HiddenStatesConnector)")
    return f"a second forward in transformers on {device}"


def _shard_file(out: Path, first_id, index: int) -> Path:
    """A taps shard's file, named by its first sample's id (a number), or by its first row's
    index when ids are text (a user's prompt file)."""
    name = f"{first_id:06d}" if isinstance(first_id, int) else f"row{index:07d}"
    return out / "taps" / f"{name}.safetensors"


def write_taps(target: str, out: Path, layer_ids: tuple[int, ...], shard: int = 32, topk: int = 0,
               dtype: str = "float32", device: str | None = None, via: str = "transformers",
               engine_args: dict | None = None) -> None:
    """Store the target's taps (and, with topk > 0, its top-k next-token log-probabilities) for
    every generated sequence, one safetensors file per shard: by a forward in transformers on
    `device` (`taps_device`), or (via="vllm") exported by vLLM's engine (`vllm_taps`, with
    `engine_args` over `engine.CPU_ENGINE_ARGS`). Both give the same tensors (`taps.target_taps`
    is the contract; a test compares them)."""
    from vllm_specx.training.taps import load_target, target_taps

    rows = _read_jsonl(out / "tokens.jsonl")
    (out / "taps").mkdir(exist_ok=True)
    model, device, engine = None, taps_device(device), None
    try:
        for i in tqdm(range(0, len(rows), shard), desc="taps", unit="shard"):
            file = _shard_file(out, rows[i]["id"], i)
            if file.exists():
                continue
            seqs = [torch.tensor(r["prompt_ids"] + r["output_ids"]) for r in rows[i:i + shard]]
            if via == "vllm":
                if engine is None:
                    from vllm_specx.training.vllm_taps import VllmTaps

                    engine = VllmTaps(target, layer_ids, topk, dtype, engine_args,
                                      max_len=max(len(r["prompt_ids"]) + len(r["output_ids"]) for r in rows))
                taps, top_logp, top_ids = engine([s.tolist() for s in seqs])
            else:
                model = model or load_target(target, getattr(torch, dtype)).to(device)
                # One padded forward per shard: right padding cannot change a causal model's earlier rows.
                got = target_taps(model, torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True).to(device),
                                  layer_ids, topk=topk)
                taps, (top_logp, top_ids) = (got.cpu(), (None, None)) if not topk else (
                    got[0].cpu(), (got[1][0].cpu(), got[1][1].cpu()))
            _save_shard(file, rows[i:i + shard], seqs, taps, top_logp, top_ids)
    finally:
        if engine is not None:
            engine.close()


def _save_shard(file: Path, rows, seqs, taps, top_logp, top_ids) -> None:
    """One shard: per sample its ids, taps (fp16) and, when given, top-k ids/log-probs (rows of
    `taps` etc. may be padded beyond the sample's length)."""
    tensors = {}
    for n, (r, ids, t) in enumerate(zip(rows, seqs, taps)):
        tensors[f"ids_{r['id']}"] = ids
        tensors[f"taps_{r['id']}"] = t[: len(ids)].half().contiguous()
        if top_ids is not None:
            tensors[f"topk_ids_{r['id']}"] = top_ids[n][: len(ids)].int().contiguous()
            tensors[f"topk_logp_{r['id']}"] = top_logp[n][: len(ids)].float().contiguous()
    save_file(tensors, str(file.with_suffix(".tmp")))
    file.with_suffix(".tmp").rename(file)  # a shard is either complete or absent


def export_tokens(out: Path, file: Path) -> dict:
    """Write a data folder's token ids compactly (no taps) to `file` (.npz): every sample's
    prompt and response ids concatenated (uint16 when every id fits, else int32), their lengths,
    the sample ids, and the folder's meta.json and commands; `import_tokens` rebuilds the folder
    from it, and `gen-data --from-tokens FILE --taps ...` its taps. Returns a summary."""
    import numpy as np

    rows = _read_jsonl(out / "tokens.jsonl")
    if not rows:
        raise ValueError(f"{out}: no tokens.jsonl rows to export")
    flat = [t for r in rows for t in r["prompt_ids"] + r["output_ids"]]
    dtype = np.uint16 if max(flat) < 2 ** 16 else np.int32
    meta = json.loads((out / "meta.json").read_text())
    commands = (out / COMMANDS_FILE).read_text() if (out / COMMANDS_FILE).exists() else ""
    file.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(file, ids=np.asarray(flat, dtype=dtype),
                        prompt_len=np.asarray([len(r["prompt_ids"]) for r in rows], dtype=np.int32),
                        output_len=np.asarray([len(r["output_ids"]) for r in rows], dtype=np.int32),
                        sample_id=np.asarray([r["id"] for r in rows]),
                        meta=np.asarray(json.dumps({k: v for k, v in meta.items() if k not in TAPS_FIELDS})),
                        commands=np.asarray(commands))
    return {"samples": len(rows), "response_tokens": sum(len(r["output_ids"]) for r in rows),
            "bytes": file.stat().st_size}


def import_tokens(file: Path, out: Path) -> dict:
    """The data folder's tokens.jsonl and meta.json from an `export_tokens` file (the taps are
    then made by `write_taps`); refused when `out` already holds other data. Returns the meta."""
    import numpy as np

    with np.load(file) as z:
        ids, plen, olen, sid = z["ids"].astype(np.int64), z["prompt_len"], z["output_len"], z["sample_id"]
        meta, commands = json.loads(str(z["meta"])), str(z["commands"])
    _check_meta(out, meta, with_taps=False)  # a resumed taps pass: its taps are checked by gen-data
    have = {r["id"] for r in _read_jsonl(out / "tokens.jsonl")}
    ends = np.cumsum(plen + olen)
    with open(out / "tokens.jsonl", "a") as f:
        for i, (n_p, end) in enumerate(zip(plen, ends)):
            key = sid[i].item()
            if key in have:
                continue
            seq = ids[end - (n_p + olen[i]): end].tolist()
            f.write(json.dumps({"id": key, "prompt_ids": seq[:n_p], "output_ids": seq[n_p:]}) + "\n")
    if commands and not (out / COMMANDS_FILE).exists():
        (out / COMMANDS_FILE).write_text(commands)
    return meta


def response_ids(out: str | Path) -> list[list[int]]:
    """The generated token ids of every response in a data folder (its tokens.jsonl)."""
    return [r["output_ids"] for r in _read_jsonl(Path(out) / "tokens.jsonl")]


class SampleStore(Sequence):
    """The stored samples, read from disk when indexed (nothing but an index is kept in RAM).

    `store[i]` is {"ids": [T] int64, "taps": [T, n*H] fp16, "prompt_len": int, and when the data
    has top-k: "topk_ids" [T, K] int64, "topk_logp" [T, K] float32}. `store.subset(indices)` is a
    view (the trainer's train/validation split).
    """

    def __init__(self, out: Path):
        self.out = Path(out)
        self.prompt_len = {r["id"]: len(r["prompt_ids"]) for r in _read_jsonl(self.out / "tokens.jsonl")}
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


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object of engine arguments, not {type(value).__name__}")
    return value


def _token_file_meta(file: Path) -> dict:
    import numpy as np

    if not file.is_file():
        raise SystemExit(f"--from-tokens {file}: no such file")
    with np.load(file) as z:
        return json.loads(str(z["meta"]))


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
                         "generation settings come from it), then store --taps for it")
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
    args = ap.parse_args(argv)
    # A stopped run (SIGTERM, e.g. `kill`) unwinds like Ctrl-C: the engine's context manager shuts
    # vLLM's engine-core and worker processes down instead of leaving them running; what was
    # written stays, and the same command resumes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from vllm_specx.targets import cache_root, resolve

    if args.export_tokens and args.out and not (args.target or args.prompts):
        print(json.dumps(export_tokens(Path(args.out), Path(args.export_tokens))))
        return
    if args.from_tokens:
        if args.target or args.prompts:
            ap.error("--from-tokens takes the target and prompts from its file: drop --target/--prompts")
        saved = _token_file_meta(Path(args.from_tokens))
        args.target, args.prompts = saved["target"], saved["prompts"]
    elif not (args.target and args.prompts):
        ap.error("--target and --prompts are required (or --from-tokens FILE)")
    out = Path(args.out) if args.out else default_out(args.target, args.prompts, cache_root())
    if args.export_tokens:
        print(json.dumps(export_tokens(out, Path(args.export_tokens))))
        return
    if args.from_tokens:
        import_tokens(Path(args.from_tokens), out)
        args.taps_only = True
        for k in ("max_tokens", "temperature", "limit", "spread"):
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
    _check_meta(out, meta)
    with open(out / COMMANDS_FILE, "a") as f:
        f.write(" ".join(["vllm-specx gen-data", *(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))]) + "\n")
    if not args.taps_only:
        prompts = select_prompts(args.prompts, args.limit, args.spread, evaluation=args.for_eval)
        generate_tokens(target, prompts, out, args.max_tokens, args.temperature, batch=args.batch,
                        ignore_eos=not args.stop_at_eos, engine_args=args.engine_args)
    print(f"data: {out}")
    if taps:
        where = "in vLLM's engine" if via == "vllm" else f"on {args.device}"
        print(f"taps: {len(taps)} layers {where} in {args.dtype}, by {taps_path(args.device, via)}")
        write_taps(target, out, taps, topk=args.topk, dtype=args.dtype, device=args.device, via=via,
                   engine_args=args.engine_args)
    elif args.topk:
        raise ValueError("--topk needs --taps (they are stored together)")


if __name__ == "__main__":
    main()
