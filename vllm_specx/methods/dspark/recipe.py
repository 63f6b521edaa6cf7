"""The full recipe's initialisations: the final-layer tap's fc columns, and a warm start of a
full-recipe head from a baseline DSpark checkpoint (ours or speculators').

Every new parameter starts where the baseline's function is kept (`model.py`'s docstring):
fusion_logits 0, slot_queries = the mask embedding, final-tap columns 0, except where the
target ships a native MTP projection (GLM / DeepSeek `eh_proj`), whose final-residual half
initialises the final-tap columns (the recipe's "GLM projection init"), or where the trainer asks
for the target's final norm instead of zero (`--final-tap-init final-norm`, issue 45 item 4).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vllm_specx.checkpoint import load_tensors


def native_mtp_final_columns(target_dir: str | Path) -> torch.Tensor | None:
    """The final-residual part of the target's native MTP projection, or None when it has none.

    A GLM-5 / DeepSeek-V3 MTP layer (`model.layers.{num_hidden_layers}.*`) computes
    u = eh_proj([enorm(embed(x)); hnorm(r)]) with eh_proj [H, 2H]; its part that reads the final
    residual r is eh_proj[:, H:] diag(hnorm.weight) (hnorm's 1/rms left out: the fc reads raw
    taps). Returns that [H, H] matrix, float32.
    """
    path = Path(target_dir)
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not int(cfg.get("num_nextn_predict_layers") or 0):
        return None
    prefix = f"model.layers.{int(cfg['num_hidden_layers'])}."
    tensors = load_tensors(path)
    eh, hnorm = tensors.get(prefix + "eh_proj.weight"), tensors.get(prefix + "hnorm.weight")
    if eh is None or hnorm is None:
        raise ValueError(f"{path}: num_nextn_predict_layers is set but {prefix}eh_proj.weight / "
                         f"{prefix}hnorm.weight are missing")
    h = eh.shape[0]
    if tuple(eh.shape) != (h, 2 * h):
        raise ValueError(f"{path}: {prefix}eh_proj.weight has shape {list(eh.shape)}, expected [H, 2H]")
    return eh[:, h:].float() * hnorm.float()[None, :]


@torch.no_grad()
def init_final_tap(draft, target_dir: str | Path | None, final_norm: torch.Tensor | None = None) -> str:
    """Set the final-layer tap's fc columns (the last tap's block): the target's native MTP
    projection part when it has one; else diag(final_norm) when given (the target's final norm
    weight, as our MTP's `init_fusion_as_final_norm`: the context starts with the target's own
    next-token state, norm(r) up to hidden_norm's scale); else zero (the baseline's function).
    Returns which ("eh_proj", "final-norm" or "zero"; "none" without a final-layer tap)."""
    if not draft.cfg.final_layer_tap:
        return "none"
    ht = draft.cfg.target_hidden_size
    cols = draft.fc.weight[:, -ht:]
    native = native_mtp_final_columns(target_dir) if target_dir is not None else None
    if native is not None:
        if tuple(native.shape) != tuple(cols.shape):
            raise ValueError(f"{target_dir}: native MTP projection part {list(native.shape)} does not fit "
                             f"the final-tap columns {list(cols.shape)}")
        cols.copy_(native)
        return "eh_proj"
    if final_norm is not None:
        if tuple(final_norm.shape) != (ht,) or cols.shape[0] != ht:
            raise ValueError(f"--final-tap-init final-norm: the target's final norm {list(final_norm.shape)} "
                             f"does not fit the final-tap columns {list(cols.shape)} (the draft's hidden size "
                             "must equal the target's)")
        cols.copy_(torch.diag(final_norm.float()).to(cols.dtype))
        return "final-norm"
    cols.zero_()
    return "zero"


@torch.no_grad()
def warm_start(draft, src: str | Path) -> list[str]:
    """Load a DSpark checkpoint `src` (either format; typically a baseline) into `draft`, a head
    for the same target with possibly more of the recipe. Returns what was initialised anew.

    Copied: every tensor both have with the same shape; fc column blocks of the taps both have
    (the others keep `draft`'s initialisation: the final tap's from `init_final_tap`); the Markov
    head's W1/W2. New (kept as `draft` initialised them): fusion_logits (0), slot_queries (the
    mask embedding). A vanilla head warm-starting a recurrent one gets joint_proj = 0 except the
    output gate's rows reading e = W1[prev], set to the identity (bias = W2 tanh(e), the vanilla
    bias W2 e up to tanh). Refused (ValueError naming the tensor): a different draft shape
    (hidden size, layers, vocabulary, Markov rank).
    """
    from vllm_specx.methods.dspark.checkpoint import read_pretrained

    old_cfg = read_pretrained(src)
    old = load_tensors(src)
    mine = draft.state_dict()
    fresh = []
    for name, value in mine.items():
        if name == "fc.weight":
            continue
        got = old.get(name)
        if got is None:
            fresh.append(name)
            continue
        if tuple(got.shape) != tuple(value.shape):
            raise ValueError(f"{src}: tensor '{name}' has shape {list(got.shape)}, this draft's is "
                             f"{list(value.shape)}")
        value.copy_(got.to(value.dtype))
    ht, fc = draft.cfg.target_hidden_size, draft.fc.weight
    if old["fc.weight"].shape[0] != fc.shape[0]:
        raise ValueError(f"{src}: fc.weight has {old['fc.weight'].shape[0]} rows, this draft's hidden size is {fc.shape[0]}")
    for i, layer in enumerate(draft.cfg.target_layer_ids):
        if layer in old_cfg.target_layer_ids:
            j = old_cfg.target_layer_ids.index(layer)
            fc[:, i * ht:(i + 1) * ht] = old["fc.weight"][:, j * ht:(j + 1) * ht].to(fc.dtype)
        else:
            fresh.append(f"fc.weight[tap {layer}]")
    head = draft.markov_head
    if head.head_type == "rnn" and old_cfg.markov_head_type != "rnn":
        r = head.rank
        w = head.joint_proj.weight
        w.zero_()
        head.joint_proj.bias.zero_()
        w[2 * r:, r:2 * r] = torch.eye(r)  # o = e: bias = W2 tanh(W1[prev])
        fresh = [n for n in fresh if not n.startswith("markov_head.joint_proj")] + ["markov_head.joint_proj (o = e)"]
    return fresh
