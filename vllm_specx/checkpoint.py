"""Read and check draft checkpoints (safetensors) before vLLM starts loading them.

vLLM's own loader fails late (inside a worker, after engine start) and with messages that name
parameters, not files. These checks run in the front-end process while the speculative config is
built, so a bad checkpoint fails in seconds with the file and tensor named.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file


# Tensor dtypes a draft checkpoint may store (safetensors' names): vLLM casts them to the engine's
# dtype. Anything else (integers, booleans, float8 without scales) would be cast silently into
# numbers the draft was never trained with, or refused deep inside a worker.
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
# The exceptions: a reduced draft vocabulary's maps (`vllm_specx.vocab`), integers by nature, and
# optional in a checkpoint (`t2d` is for training; vLLM reads `d2t` only). Their stored form
# (names, `target_ids`) and its check (`check_maps`) live here with the other checks of what a
# checkpoint holds; `vllm_specx.vocab` builds and uses the maps and re-exports these names.
D2T, T2D = "d2t", "t2d"  # checkpoint tensor names (speculators' and vLLM's)
INDEX_DTYPES = {D2T: ("I64", "I32"), T2D: ("BOOL",)}
OPTIONAL_TENSORS = (T2D,)
# The NaN/inf scan reads a tensor in slices of rows of about this many elements (never a full copy).
_FINITE_CHUNK_ELEMENTS = 1 << 24
_MAX_HEADER_BYTES = 100_000_000  # safetensors refuses longer headers


def _readable(path: Path, what: str, listable: bool = False) -> None:
    """ValueError naming `path` when this process may not read it (a folder: also list it)."""
    mode = os.R_OK | (os.X_OK if listable else 0)
    if not os.access(path, mode):
        raise ValueError(f"{what} {path}: permission denied (this process cannot "
                         f"{'list' if listable else 'read'} it)")


def looks_local(model: str) -> bool:
    """Whether a speculative config's `model` names a local path rather than a Hugging Face repo
    id ("name" or "org/name"): it exists, is absolute or relative to ./ ../ ~, or has more parts
    than a repo id can."""
    text = str(model)
    if os.path.lexists(text) or text.startswith(("/", "./", "../", "~", ".\\")) or "\\" in text:
        return True
    return text.count("/") > 1


def check_draft_dir(path: str | Path, field: str = "speculative_config model") -> None:
    """ValueError naming the path (and `field`, where it came from) unless `path` is a readable
    directory with a readable config.json: the checks vLLM would otherwise fail with "Invalid
    repository ID or local directory", which names neither the file nor the cause."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(f"{field} {str(path)!r}: no such directory (a draft checkpoint is a "
                         f"directory with config.json and *.safetensors)")
    if not p.is_dir():
        hint = f"; did you mean its folder {str(p.parent)!r}?" if (p.parent / "config.json").is_file() else ""
        raise ValueError(f"{field} {str(path)!r} is a file, not a directory (a draft checkpoint is a "
                         f"directory with config.json and *.safetensors){hint}")
    _readable(p, "draft checkpoint", listable=True)
    config = p / "config.json"
    if not config.is_file():
        raise ValueError(f"draft checkpoint {path}: no config.json")
    _readable(config, "draft config", listable=False)


def safetensors_files(path: str | Path) -> list[Path]:
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"draft checkpoint {path}: no *.safetensors file")
    for file in files:
        if not file.is_file():
            raise ValueError(f"draft checkpoint {path}: {file.name} is not a file")
        _readable(file, "safetensors file")
    return files


def _why_unreadable(file: Path) -> str | None:
    """A precise reason a safetensors file cannot be parsed (truncated, bad header), or None."""
    size = file.stat().st_size
    if size < 8:
        return f"truncated: {size} bytes, shorter than the 8-byte header length"
    with open(file, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > _MAX_HEADER_BYTES or f.read(1) not in (b"{", b""):
            return "not a safetensors file (its first 8 bytes are not the length of a JSON header)"
        f.seek(8)
        if 8 + n > size:
            return f"truncated: {size} bytes, but its header alone declares {8 + n}"
        try:
            header = json.loads(f.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
                      default=0)
        except Exception:
            return "corrupt header (not a safetensors JSON header)"
    if 8 + n + end > size:
        return f"truncated: {size} bytes, but its header declares {8 + n + end}"
    return None


def read_header(path: str | Path) -> dict[str, tuple[str, tuple[int, ...], Path]]:
    """Tensor name -> (safetensors dtype, shape, file) over every safetensors file in `path`
    (headers only); ValueError naming the file for an unreadable, truncated or corrupt file, and
    the tensor for one stored in two files."""
    out: dict[str, tuple[str, tuple[int, ...], Path]] = {}
    for file in safetensors_files(path):
        try:
            with safe_open(str(file), framework="pt") as f:
                entries = {name: (str(f.get_slice(name).get_dtype()), tuple(f.get_slice(name).get_shape()))
                           for name in f.keys()}
        except Exception as e:  # safetensors raises its own error types for bad headers
            why = _why_unreadable(file) or (str(e).splitlines() or [type(e).__name__])[0]
            raise ValueError(f"corrupt safetensors file {file}: {why}") from e
        for name, (dtype, shape) in entries.items():
            if name in out:
                raise ValueError(f"draft checkpoint {path}: tensor '{name}' is stored twice, in "
                                 f"{out[name][2].name} and {file.name}")
            out[name] = (dtype, shape, file)
    return out


def read_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape over every safetensors file in `path` (headers only)."""
    return {name: shape for name, (_, shape, _) in read_header(path).items()}


def check_tensors(path: str | Path, expected: dict[str, tuple[int, ...]] | None,
                  values: bool = True) -> None:
    """Raise ValueError naming the file and tensor on a missing or unexpected tensor, a wrong
    shape, a dtype that is not floating point, or (`values`) a NaN or infinite value.

    `expected` None: the tensor names and shapes are not known here (a draft served by vLLM's own
    method); only the dtypes and values are checked.
    """
    header = read_header(path)
    if expected is not None:
        missing = [n for n in expected if n not in header and n not in OPTIONAL_TENSORS]
        if missing:
            raise ValueError(
                f"draft checkpoint {path}: missing tensor(s) {missing[:5]}"
                + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            )
        extra = sorted(n for n in header if n not in expected)
        if extra:
            raise ValueError(
                f"draft checkpoint {path}: unexpected tensor(s) {extra[:5]}"
                + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
                + f" in {header[extra[0]][2].name}: config.json does not use them, and a tensor the "
                  "draft would not load is refused rather than ignored")
        for name, shape in expected.items():
            if name in header and header[name][1] != shape:
                raise ValueError(
                    f"draft checkpoint {path}: tensor '{name}' has shape {list(header[name][1])}, "
                    f"expected {list(shape)} from config.json"
                )
    for name, (dtype, _, file) in header.items():
        if name in INDEX_DTYPES:
            if dtype not in INDEX_DTYPES[name]:
                raise ValueError(f"draft checkpoint {path}: tensor '{name}' in {file.name} has dtype "
                                 f"{dtype}; expected {' or '.join(INDEX_DTYPES[name])}")
        elif dtype not in FLOAT_DTYPES:
            raise ValueError(f"draft checkpoint {path}: tensor '{name}' in {file.name} has dtype "
                             f"{dtype}; draft weights must be floating point ({', '.join(FLOAT_DTYPES)})")
    if values:
        check_finite(path, header)


def check_vocab_maps(path: str | Path, vocab_size: int, draft_vocab_size: int) -> None:
    """ValueError naming the tensor when a reduced-vocabulary draft's `d2t` / `t2d` do not map
    `draft_vocab_size` distinct ids into the target vocabulary, or disagree (`check_maps`)."""
    header = read_header(path)
    if D2T not in header:
        raise ValueError(f"draft checkpoint {path}: missing tensor '{D2T}': a draft vocabulary of "
                         f"{draft_vocab_size} < {vocab_size} tokens needs its draft-to-target map")
    get = {}
    for name in (D2T, T2D):
        if name in header:
            with safe_open(str(header[name][2]), framework="pt") as f:
                get[name] = f.get_tensor(name)
    check_maps(get[D2T], get.get(T2D), vocab_size, draft_vocab_size, f"draft checkpoint {path}")


def target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """The target id of every draft id: arange(Vd) + d2t."""
    return torch.arange(d2t.numel(), device=d2t.device) + d2t.long()


def check_maps(d2t: torch.Tensor, t2d: torch.Tensor | None, vocab_size: int, draft_vocab_size: int,
               where: str) -> None:
    """ValueError naming the tensor when the maps do not describe a draft vocabulary of
    `draft_vocab_size` distinct target ids below `vocab_size` (and, with t2d, the same one)."""
    if tuple(d2t.shape) != (draft_vocab_size,) or d2t.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{where}: tensor '{D2T}' must be int64 of shape [{draft_vocab_size}] "
                         f"(draft_vocab_size), got {d2t.dtype} {list(d2t.shape)}")
    ids = target_ids(d2t)
    bad = ((ids < 0) | (ids >= vocab_size)).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"{where}: tensor '{D2T}' maps draft id {i} to target id {int(ids[i])}, outside "
                         f"the target vocabulary [0, {vocab_size}) ({bad.numel()} such ids)")
    if bool((ids[1:] <= ids[:-1]).any()):
        raise ValueError(f"{where}: tensor '{D2T}' must map draft ids to distinct target ids in "
                         "ascending order (speculators' and vLLM's layout)")
    if t2d is None:
        return
    if tuple(t2d.shape) != (vocab_size,) or t2d.dtype != torch.bool:
        raise ValueError(f"{where}: tensor '{T2D}' must be bool of shape [{vocab_size}] (vocab_size), "
                         f"got {t2d.dtype} {list(t2d.shape)}")
    if int(t2d.sum()) != draft_vocab_size or not bool(t2d[ids].all()):
        raise ValueError(f"{where}: tensors '{T2D}' and '{D2T}' disagree: t2d marks {int(t2d.sum())} "
                         f"target ids, d2t maps {draft_vocab_size}, "
                         f"{int((~t2d[ids]).sum())} of d2t's target ids are not marked in t2d")


def check_finite(path: str | Path, header=None) -> None:
    """ValueError naming the tensor and file when a weight is NaN or infinite (every tensor is
    streamed once from the memory-mapped file, in slices of rows: O(checkpoint size), no full copy)."""
    header = read_header(path) if header is None else header
    by_file: dict[Path, list[str]] = {}
    for name, (_, _, file) in header.items():
        by_file.setdefault(file, []).append(name)
    for file, names in by_file.items():
        with safe_open(str(file), framework="pt") as f:
            for name in names:
                sl = f.get_slice(name)
                shape = tuple(sl.get_shape())
                if not shape:
                    chunks = iter([f.get_tensor(name)])
                else:
                    step = max(1, _FINITE_CHUNK_ELEMENTS // max(1, math.prod(shape[1:])))
                    chunks = (sl[i:i + step] for i in range(0, shape[0], step))
                nan = bad = 0
                for t in chunks:
                    if not t.is_floating_point():
                        break
                    if not bool(torch.isfinite(t).all()):
                        nan += int(torch.isnan(t).sum())
                        bad += int((~torch.isfinite(t)).sum())
                if bad:
                    raise ValueError(
                        f"draft checkpoint {path}: tensor '{name}' in {file} has {nan} NaN and "
                        f"{bad - nan} infinite value(s) of {math.prod(shape)}; non-finite weights "
                        f"are refused at load")


def load_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                out[name] = f.get_tensor(name)
    return out


def save_tensors(path: str | Path, tensors: dict[str, torch.Tensor]) -> None:
    Path(path).mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
              str(Path(path) / "model.safetensors"))


def read_config_json(path: str | Path) -> dict[str, Any]:
    """Read `<path>/config.json`, with errors that name the file."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise ValueError(f"draft checkpoint {path}: no config.json")
    _readable(file, "draft config")
    try:
        raw = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file}: invalid JSON ({e})") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{file}: invalid config (a JSON object expected, got {type(raw).__name__})")
    return raw


def write_config_json(path: str | Path, config: dict[str, Any]) -> None:
    Path(path).mkdir(parents=True, exist_ok=True)
    (Path(path) / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def dtype_name(dtype: torch.dtype) -> str:
    """config.json's `torch_dtype` spelling of a torch dtype: torch.bfloat16 -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


# vLLM and speculators name a target tap by its "aux hidden state" id: id k is the residual stream
# after k decoder layers, i.e. the output of 0-based layer k - 1. vllm-specx configs store 0-based
# layer ids; these two functions are the only place the +1 lives.
def to_aux_ids(layer_ids) -> list[int]:
    """0-based target layers -> vLLM / speculators aux-hidden-state ids."""
    return [int(i) + 1 for i in layer_ids]


def from_aux_ids(aux_ids) -> list[int]:
    """vLLM / speculators aux-hidden-state ids -> 0-based target layers."""
    return [int(i) - 1 for i in aux_ids]


# The decoder-block shape fields a one-layer draft (MTP, EAGLE-3) shares with its target: read from
# the target by `decoder_block_fields`, written to the draft's config.json by `one_layer_llama_config`.
DECODER_BLOCK_FIELDS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                        "intermediate_size", "rms_norm_eps", "vocab_size", "rope_theta",
                        "max_position_embeddings")


def one_layer_llama_config(cfg) -> dict[str, Any]:
    """The Llama config.json keys of a one-layer draft whose config has `DECODER_BLOCK_FIELDS`
    (what vLLM's draft-model plumbing parses): the block's shapes, one layer, silu, untied."""
    out = {"model_type": "llama", "num_hidden_layers": 1, "hidden_act": "silu", "tie_word_embeddings": False,
           **{f: getattr(cfg, f) for f in DECODER_BLOCK_FIELDS}}
    out["rope_parameters"] = {"rope_theta": cfg.rope_theta, "rope_type": "default"}
    return out


def decoder_block_fields(target: dict[str, Any]) -> dict[str, Any]:
    """The decoder-block shape fields a one-layer draft copies from its target's HF config (as a
    dict): hidden size, heads, head dim, MLP width, norm eps, vocab, RoPE base, max positions."""
    rope = target.get("rope_theta") or (target.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    h = target["hidden_size"]
    return {"hidden_size": h, "num_attention_heads": target["num_attention_heads"],
            "num_key_value_heads": target.get("num_key_value_heads") or target["num_attention_heads"],
            "head_dim": target.get("head_dim") or h // target["num_attention_heads"],
            "intermediate_size": target["intermediate_size"], "rms_norm_eps": target["rms_norm_eps"],
            "vocab_size": target["vocab_size"], "rope_theta": float(rope),
            "max_position_embeddings": target.get("max_position_embeddings", 8192),
            "target_hidden_size": h}


def specx_block(raw: dict[str, Any], method: str, format_version: int | tuple[int, ...], where: str,
                kind: str, or_else: str = "") -> dict[str, Any]:
    """The `specx` block of a vllm-specx checkpoint's config.json, checked: it names `method` and
    carries a `format_version` this reader knows (one, or a tuple of them); ValueError naming
    `where` and the field (`or_else`: the other format the reader accepts, for the message)."""
    specx = raw.get("specx")
    if not isinstance(specx, dict) or specx.get("method") != method:
        raise ValueError(f"{where}: not {kind} (needs a 'specx' block with method '{method}'{or_else})")
    version = specx.get("format_version")
    if version is None:
        raise ValueError(f"{where}: missing required field 'specx.format_version'")
    known = format_version if isinstance(format_version, tuple) else (format_version,)
    if isinstance(version, bool) or version not in known:
        raise ValueError(f"{where}: specx.format_version {version!r} is not supported by this "
                         f"vllm-specx (reads version {' and '.join(map(str, known))}); upgrade vllm-specx")
    return specx
