"""gen-data's two passes over a data folder (`vllm_specx.training.samples` has its format): the
target's answers generated in vLLM (`generate_tokens`), then its taps and top-k stored for them
(`write_taps`: a forward in transformers, or vLLM's hidden-state export)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from vllm_specx.progress import Reporter
from vllm_specx.training.samples import SKIPPED_FILE, read_jsonl


def generate_tokens(target: str, prompts: list[dict], out: Path, max_tokens: int,
                    temperature: float = 0.0, batch: int = 256, ignore_eos: bool = True,
                    engine_args: dict | None = None, report: Reporter = Reporter()) -> None:
    """Append vLLM generations for the prompts not yet in <out>/tokens.jsonl (chats rendered
    with the target's chat template).

    The engine is fed continuously: up to `batch` prompts are in flight at once, so the batch never
    drains between chunks; responses are written as soon as every earlier prompt's is (prompt
    order, so a stopped run holds a prefix of the set and loses only what was in flight). The
    progress bar (`report`'s) counts prompts over the whole set (its ETA is for the rest) and the
    tokens generated."""
    rows = read_jsonl(out / "tokens.jsonl")
    done = {r["id"] for r in rows} | {r["id"] for r in read_jsonl(out / SKIPPED_FILE)}
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
    with contextlib.ExitStack() as stack:
        with report.heartbeat("gen-data: starting the engine"):
            llm = stack.enter_context(cpu_llm(target, **(engine_args or {})))
        f = stack.enter_context(open(out / "tokens.jsonl", "a"))
        bar = stack.enter_context(report.bar(total=len(prompts), initial=len(prompts) - len(todo),
                                             desc="generate", unit="prompt", smoothing=0.05, tick=1.0))
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
                    report.line(f"gen-data: prompt {p['id']!r} has {n} tokens, not below max_model_len "
                                f"{limit}: skipped (listed in {out / SKIPPED_FILE})")
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
               engine_args: dict | None = None, report: Reporter = Reporter()) -> None:
    """Store the target's taps (and, with topk > 0, its top-k next-token log-probabilities) for
    every generated sequence, one safetensors file per shard: by a forward in transformers on
    `device` (`taps_device`), or (via="vllm") exported by vLLM's engine (`vllm_taps`, with
    `engine_args` over `engine.CPU_ENGINE_ARGS`). Both give the same tensors (`taps.target_taps`
    is the contract; a test compares them)."""
    from vllm_specx.training.taps import load_target, target_taps

    rows = read_jsonl(out / "tokens.jsonl")
    (out / "taps").mkdir(exist_ok=True)
    model, device, engine = None, taps_device(device), None
    try:
        for i in report.bar(iterable=range(0, len(rows), shard), desc="taps", unit="shard"):
            file = _shard_file(out, rows[i]["id"], i)
            if file.exists() and _holds(file, rows[i:i + shard]):
                continue  # done (a last shard written short, before more answers came, is made again)
            seqs = [torch.tensor(r["prompt_ids"] + r["output_ids"]) for r in rows[i:i + shard]]
            if via == "vllm":
                if engine is None:
                    from vllm_specx.training.vllm_taps import VllmTaps

                    with report.heartbeat("gen-data: starting the engine of the taps"):
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


def _holds(file: Path, rows) -> bool:
    """Whether a stored shard holds every one of `rows` (gen-data resumed after it was written may
    have appended answers to a shard that was the last, short one)."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        keys = set(f.keys())
    return all(f"ids_{r['id']}" in keys for r in rows)


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
