"""The DSpark draft on vLLM's layers: vLLM's DFlash Qwen3 backbone plus a low-rank Markov head.

The backbone (tap fusion `fc`, context K/V projected from the fused taps into every draft layer's
cache, one non-causal pass over the query block) is vLLM's `DFlashQwen3ForCausalLM`, used as is.
This class adds what makes it DSpark: `markov_bias(prev)`, the logit correction that depends on the
previously sampled token, which `DSparkProposer` applies left to right. The same math in plain
PyTorch is `vllm_specx.models.dspark_torch`; a test checks the two agree token for token.

Imported only inside vLLM processes (it imports vLLM).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

from vllm_specx.config import DSparkDraftConfig

_MARKOV = "markov_head."
_IGNORED = ("confidence_head.",)  # adaptive verification is not used on the V1 runner


class SpecxDSparkForCausalLM(DFlashQwen3ForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        cfg = DSparkDraftConfig(**self.config.specx_dspark)
        dtype = vllm_config.model_config.dtype
        self.dspark = cfg
        # W1 is indexed by target-vocab token ids; W2 maps the rank-r embedding to draft logits.
        self.markov_w1 = nn.Parameter(torch.empty(cfg.vocab_size, cfg.markov_rank, dtype=dtype),
                                      requires_grad=False)
        self.markov_w2 = nn.Parameter(torch.empty(cfg.draft_vocab_size, cfg.markov_rank, dtype=dtype),
                                      requires_grad=False)

    def markov_bias(self, prev_token_ids: torch.Tensor) -> torch.Tensor:
        """Markov logit correction for the next slot.

        Args:
            prev_token_ids: [B] int, the previous token of each request (target-vocab ids).
        Returns:
            [B, vocab] float, `W2 @ W1[prev]`, scaled like the base logits.
        """
        e = self.markov_w1[prev_token_ids.long()]  # [B, r]
        return self.logits_processor.scale * (e @ self.markov_w2.t())

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        rest, seen = [], set()
        for name, w in weights:
            if name.startswith(_MARKOV):
                param = {"markov_w1.weight": self.markov_w1,
                         "markov_w2.weight": self.markov_w2}.get(name[len(_MARKOV):])
                if param is None:
                    raise ValueError(f"DSpark checkpoint: unknown Markov head tensor '{name}'")
                if tuple(w.shape) != tuple(param.shape):
                    raise ValueError(f"DSpark checkpoint: '{name}' has shape {list(w.shape)}, "
                                     f"expected {list(param.shape)}")
                param.data.copy_(w)
                seen.add(name)
            elif not name.startswith(_IGNORED):
                rest.append((name, w))
        if len(seen) != 2:
            raise ValueError("DSpark checkpoint: missing markov_head.markov_w1/markov_w2 weights")
        return super().load_weights(rest)
