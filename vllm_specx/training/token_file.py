"""A data folder's token ids as one small file (`gen-data --export-tokens FILE`, about 2 bytes a
token, no taps) and the folder rebuilt from it (`gen-data --from-tokens FILE`), its taps then
stored by `generate.write_taps`."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_specx.training.samples import COMMANDS_FILE, TAPS_FIELDS, check_meta, read_jsonl


def export_tokens(out: Path, file: Path) -> dict:
    """Write a data folder's token ids compactly (no taps) to `file` (.npz): every sample's
    prompt and response ids concatenated (uint16 when every id fits, else int32), their lengths,
    the sample ids, and the folder's meta.json and commands; `import_tokens` rebuilds the folder
    from it, and `gen-data --from-tokens FILE --taps ...` its taps. Returns a summary."""
    import numpy as np

    rows = read_jsonl(out / "tokens.jsonl")
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


def import_tokens(file: Path, out: Path, prompts: str | None = None) -> dict:
    """The data folder's tokens.jsonl and meta.json from an `export_tokens` file (the taps are
    then made by `write_taps`); refused when `out` already holds other data. `prompts`: a join
    "A+B" the file's set A starts (`prompts.extension_refusal`), recorded as the folder's prompt set
    (its other prompts then answered by gen-data). Returns the meta."""
    import numpy as np

    with np.load(file) as z:
        ids, plen, olen, sid = z["ids"].astype(np.int64), z["prompt_len"], z["output_len"], z["sample_id"]
        meta, commands = json.loads(str(z["meta"])), str(z["commands"])
    if prompts is not None and prompts != meta.get("prompts"):
        meta = {k: v for k, v in meta.items() if k not in ("limit", "spread")}
        meta["prompts"] = prompts
    check_meta(out, meta, with_taps=False)  # a resumed taps pass: its taps are checked by gen-data
    have = {r["id"] for r in read_jsonl(out / "tokens.jsonl")}
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


def token_file_meta(file: Path) -> dict:
    """The meta of an `export_tokens` file (`--from-tokens` takes the target, prompts and generation
    settings from it); exits naming the flag when there is no such file."""
    import numpy as np

    if not file.is_file():
        raise SystemExit(f"--from-tokens {file}: no such file")
    with np.load(file) as z:
        return json.loads(str(z["meta"]))
