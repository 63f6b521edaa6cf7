"""The target's hidden-state taps, computed with transformers on the target's own weights.

Tap of layer i for token t = the residual stream after decoder layer i (0-based), which is what
vLLM captures as aux hidden state id i + 1 and what transformers returns as hidden_states[i + 1]
(for i < num_layers - 1; transformers' last entry is post-norm, so the final layer is read with
a hook on the last decoder layer instead).
"""

from __future__ import annotations

from pathlib import Path

import torch


def load_target(path: str | Path, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.eval()


def final_norm(model):
    """The target's final norm module (transformers: the decoder's `norm`), read by the drafts that
    start from it (MTP's fusion, DSpark's `--final-tap-init final-norm`)."""
    norm = getattr(model.get_decoder(), "norm", None)
    if norm is None or getattr(norm, "weight", None) is None:
        raise SystemExit(f"{type(model).__name__}: no final norm (decoder.norm.weight) to start a draft from")
    return norm


def embed_and_head(model) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's input embedding [V, H] and output head [V, H] (the same tensor when tied)."""
    return model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()


@torch.no_grad()
def target_taps(model, token_ids: torch.Tensor, layer_ids: tuple[int, ...], topk: int = 0):
    """Taps for a batch of sequences.

    Args:
        token_ids: [B, T] int64.
        layer_ids: 0-based target layers, ascending.
        topk: also return the target's top-k next-token log-probabilities (temperature 1).
    Returns:
        [B, T, len(layer_ids) * hidden] float32, concatenated in ascending layer order; with
        topk > 0 also (logp [B, T, topk] float32, ids [B, T, topk] int64): row t is the
        distribution of token t + 1, log-probabilities under the full softmax, largest first.
    """
    layers = model.model.layers
    captured: dict[int, torch.Tensor] = {}
    hooks = [layers[i].register_forward_hook(
        lambda _m, _a, out, i=i: captured.__setitem__(i, out[0] if isinstance(out, tuple) else out))
        for i in layer_ids]
    try:
        last = model.model(input_ids=token_ids).last_hidden_state  # after the final norm
    finally:
        for h in hooks:
            h.remove()
    taps = torch.cat([captured[i].float() for i in layer_ids], dim=-1)
    if not topk:
        return taps
    top = []
    for row in last:  # one sequence at a time: [T, V] logits, not [B, T, V]
        logp = torch.log_softmax(model.lm_head(row).float(), -1)
        top.append(logp.topk(topk, -1))
    return taps, (torch.stack([t.values for t in top]), torch.stack([t.indices for t in top]))


def select_taps(taps: torch.Tensor, indices: list[int], hidden: int) -> torch.Tensor:
    """Some of the data's taps, in the given order: taps [..., n * hidden] (the data's tap order)
    -> [..., len(indices) * hidden], block j = the data's tap `indices[j]`."""
    return torch.cat([taps[..., i * hidden:(i + 1) * hidden] for i in indices], -1)
