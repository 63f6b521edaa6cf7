"""The target's hidden-state taps, computed with transformers on the target's own weights.

Tap of layer i for token t = the residual stream after decoder layer i (0-based), which is what
vLLM captures as aux hidden state id i + 1 and what transformers returns as hidden_states[i + 1]
(for i < num_layers - 1; transformers' last entry is post-norm, so the final layer is read with
a hook on the last decoder layer instead).
"""

from __future__ import annotations

from pathlib import Path

import torch


def load_target(path: str | Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model.eval()


def embed_and_head(model) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's input embedding [V, H] and output head [V, H] (the same tensor when tied)."""
    return model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()


@torch.no_grad()
def target_taps(model, token_ids: torch.Tensor, layer_ids: tuple[int, ...]) -> torch.Tensor:
    """Taps for a batch of sequences.

    Args:
        token_ids: [B, T] int64.
        layer_ids: 0-based target layers, ascending.
    Returns:
        [B, T, len(layer_ids) * hidden] float32, concatenated in ascending layer order.
    """
    layers = model.model.layers
    captured: dict[int, torch.Tensor] = {}
    hooks = [layers[i].register_forward_hook(
        lambda _m, _a, out, i=i: captured.__setitem__(i, out[0] if isinstance(out, tuple) else out))
        for i in layer_ids]
    try:
        model.model(input_ids=token_ids)
    finally:
        for h in hooks:
            h.remove()
    return torch.cat([captured[i].float() for i in layer_ids], dim=-1)
