"""Read and check draft checkpoints (safetensors) before vLLM starts loading them.

vLLM's own loader fails late (inside a worker, after engine start) and with messages that name
parameters, not files. These checks run in the front-end process while the speculative config is
built, so a bad checkpoint fails in seconds with the file and tensor named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def safetensors_files(path: str | Path) -> list[Path]:
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"draft checkpoint {path}: no *.safetensors file")
    return files


def read_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape over every safetensors file in `path` (headers only)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in safetensors_files(path):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    shapes[name] = tuple(f.get_slice(name).get_shape())
        except Exception as e:  # safetensors raises its own error types for bad headers
            raise ValueError(f"corrupt safetensors file {file}: {e}") from e
    return shapes


def check_tensors(path: str | Path, expected: dict[str, tuple[int, ...]]) -> None:
    """Raise ValueError naming the file and tensor on a missing tensor or a wrong shape."""
    shapes = read_shapes(path)
    missing = [n for n in expected if n not in shapes]
    if missing:
        raise ValueError(
            f"draft checkpoint {path}: missing tensor(s) {missing[:5]}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        )
    for name, shape in expected.items():
        if shapes[name] != shape:
            raise ValueError(
                f"draft checkpoint {path}: tensor '{name}' has shape {list(shapes[name])}, "
                f"expected {list(shape)} from config.json"
            )


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
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{file}: invalid JSON ({e})") from e


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
