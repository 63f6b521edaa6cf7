"""Which prompts gen-data answers (`select_prompts`: a prompt set or file, `--limit`, `--spread`),
and which of them a training run's data held (`trained_prompt_ids`)."""

from __future__ import annotations

from pathlib import Path

from vllm_specx.training.samples import read_jsonl


def read_prompts(spec: str, limit: int | None = None, evaluation: bool = False) -> list[dict]:
    """[{"id", "prompt"}] from a prompt-set name (`vllm_specx.assets.PROMPT_SETS`, or training sets
    joined "A+B": `assets.prompt_set_parts`; a chat set's prompt is its message list) or a jsonl file with "id" and "prompt" or "messages".

    Refuses evaluation sets unless `evaluation` (gen-data --for-eval: data the trainer only
    measures on, never trains on): drafts are never trained on what they are measured on."""
    from vllm_specx import assets

    if spec.split("+")[0] in assets.PROMPT_SETS:
        try:
            _, role, what = assets.prompt_set(spec)
        except ValueError as e:
            raise ValueError(f"--prompts {spec}: {e}") from None
        if role != "train" and not evaluation:
            raise ValueError(f"--prompts {spec}: an evaluation set ({what}); "
                             "train on a training set: "
                             + ", ".join(n for n, v in assets.PROMPT_SETS.items() if v[1] == "train"))
        return [{"id": i, "prompt": p} for i, p in enumerate(assets.load_prompts(spec, limit))]
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"--prompts {spec}: neither a prompt set ({', '.join(assets.PROMPT_SETS)}) nor a file")
    rows = read_jsonl(path)[:limit]
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
        return spec, {r["id"] for r in read_jsonl(Path(folder) / "tokens.jsonl")}
    n = int(record.get("data_samples") or 0) or int(record.get("train_samples") or 0) + int(record.get("val_samples") or 0)
    if not n:
        return None
    return spec, {p["id"] for p in select_prompts(spec, meta.get("limit"), meta.get("spread"))[:n]}


def extension_refusal(saved: dict, prompts: str) -> str | None:
    """Why a token file's answers (meta `saved`) cannot start data on the prompt set `prompts`, or
    None: they can when `prompts` joins the file's whole set first ("A+B" after data on A: A's
    prompts keep their ids, `assets.prompt_set_parts`)."""
    from vllm_specx import assets

    base = saved.get("prompts")
    if not isinstance(base, str) or not prompts.startswith(base + "+"):
        return f"the file answers {base!r}; name that set, or a join that starts with it ({base}+...)"
    if saved.get("spread") is not None:
        return f"the file answers a spread of {base!r} (--spread {saved['spread']}), not its first prompts"
    try:
        assets.prompt_set_parts(prompts)
    except ValueError as e:
        return str(e)
    return None
