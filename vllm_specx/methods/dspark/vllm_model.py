"""The DSpark draft on vLLM's layers: vLLM's DFlash Qwen3 backbone plus the low-rank Markov head.

The backbone (tap fusion `fc`, context K/V projected from the fused taps into every draft layer's
cache, one non-causal pass over the query block) is vLLM's `DFlashQwen3ForCausalLM`, used as is.
This class adds what makes it DSpark: `markov_bias(prev)`, the logit correction that depends on the
previously sampled token, which `DSparkProposer` applies left to right. The head is `MarkovHead`
from `model.py`, the PyTorch reference, so both load the same tensors under the same names; a test
checks the two models agree token for token.

Imported only inside vLLM processes (it imports vLLM; the internals it uses are listed in this
method's `vllm_internals`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

from vllm_specx import registry
from vllm_specx.methods.dspark.model import MarkovHead

_MARKOV = "markov_head."
_IGNORED = ("confidence_head.",)  # adaptive verification is not used on the V1 runner


class SpecxDSparkForCausalLM(DFlashQwen3ForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        _, cfg = registry.config_of(self.config)  # validated again here, in the worker
        self.dspark = cfg
        self.markov_head = MarkovHead(cfg.vocab_size, cfg.draft_vocab_size, cfg.markov_rank).to(
            vllm_config.model_config.dtype).requires_grad_(False)

    def markov_bias(self, prev_token_ids: torch.Tensor) -> torch.Tensor:
        """Markov logit correction for the next slot.

        Args:
            prev_token_ids: [B] int, the previous token of each request (target-vocab ids).
        Returns:
            [B, vocab] float, `W2 @ W1[prev]`, scaled like the base logits.
        """
        return self.logits_processor.scale * self.markov_head(prev_token_ids)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        params = dict(self.markov_head.named_parameters())
        rest, seen = [], set()
        for name, w in weights:
            if name.startswith(_MARKOV):
                param = params.get(name[len(_MARKOV):])
                if param is None:
                    raise ValueError(f"DSpark checkpoint: unknown Markov head tensor '{name}'")
                if tuple(w.shape) != tuple(param.shape):
                    raise ValueError(f"DSpark checkpoint: '{name}' has shape {list(w.shape)}, "
                                     f"expected {list(param.shape)}")
                param.data.copy_(w)
                seen.add(name)
            elif not name.startswith(_IGNORED):
                rest.append((name, w))
        if len(seen) != len(params):
            raise ValueError("DSpark checkpoint: missing markov_head.markov_w1/markov_w2 weights")
        loaded = super().load_weights(rest)
        return loaded | {_MARKOV + n for n in params} if isinstance(loaded, set) else loaded
