"""DSpark on vLLM >= 0.34's V2 model runner: the draft model and the speculator (imports vLLM).

Both reuse vLLM's own DSpark rather than copying it:

* `SpecxDSparkForCausalLM` is vLLM's `Qwen3DSparkForCausalLM` (DFlash Qwen3 backbone, context-K/V
  precompute into the draft KV cache the runner allocates, reduced vocabulary through `d2t`,
  confidence head) with vllm-specx's Markov head (`model.MarkovHead`: "vanilla", "gated", "rnn";
  the same tensor names) behind the hooks vLLM's DSpark loop calls (`SpecxMarkovHooks`). It
  declares `SpecxDSparkSpeculatorConfig` (vLLM's `SpeculativeDraftModel` interface), so a
  `SpecxDSparkModel` checkpoint selects our config under `"method": "dspark"` too.
* `SpecxDSparkSpeculator` is vLLM's `DSparkSpeculator` unchanged but for its name: its
  left-to-right loop (`_sample_markov_chain`) asks the model for `markov_step` (our head's
  gated / recurrent step: the "embedding" it returns is what W2 projects) and `markov_bias`.

The draft math is `model.py`'s: `SpecxMarkovHooks.markov_step` + `markov_bias` give exactly
`MarkovHead.step`'s bias (tests drive vLLM's loop with these hooks against
`DSparkDraft.greedy_drafts`).
"""

from __future__ import annotations

import torch
from vllm.config import VllmConfig
from vllm.model_executor.models.qwen3_dspark import Qwen3DSparkForCausalLM, Qwen3DSparkModel
from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

from vllm_specx.methods.dspark.model import MarkovHead
from vllm_specx.methods.dspark.speculator import SpecxDSparkSpeculatorConfig

# vLLM internals this module imports, overrides or relies on (checked against vLLM 0.34 by
# tests/test_vllm034.py; the hooks are what DSparkSpeculator._sample_markov_chain calls).
VLLM_INTERNALS_V2 = (
    "vllm.config:VllmConfig",
    "vllm.model_executor.models.qwen3_dspark:Qwen3DSparkForCausalLM",
    "vllm.model_executor.models.qwen3_dspark:Qwen3DSparkForCausalLM.map_draft_to_target",
    "vllm.model_executor.models.qwen3_dspark:Qwen3DSparkForCausalLM.markov_embed",
    "vllm.model_executor.models.qwen3_dspark:Qwen3DSparkForCausalLM.markov_bias",
    "vllm.model_executor.models.qwen3_dspark:Qwen3DSparkModel",
    "vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model.load_weights",
    "vllm.v1.worker.gpu.spec_decode.dspark.speculator:DSparkSpeculator",
    "vllm.v1.worker.gpu.spec_decode.dspark.speculator:DSparkSpeculator._sample_markov_chain",
    "vllm.v1.worker.gpu.spec_decode.dspark.speculator:DSparkSpeculator._markov_step",
)


class SpecxMarkovHooks:
    """The Markov-head hooks vLLM 0.34's `DSparkSpeculator` calls on its draft model, over our
    `MarkovHead` (`self.specx_markov_head`). vLLM's loop, per draft k:
    `embed, state = markov_step(prev, hidden_k, state)` (state None at k = 0), then
    `logits_k = base_k + markov_bias(embed)`; with W2 = markov_w2:

        vanilla: embed = W1[prev]                                   (bias W2 W1[prev])
        gated:   embed = sigmoid(gate_proj([h; W1[prev]])) * W1[prev]
        rnn:     g, c, o = split3(joint_proj([s; W1[prev]; h])); embed = tanh(o),
                 s' = sigmoid(g) s + (1 - sigmoid(g)) tanh(c)
    """

    # Route every head type through markov_step (vLLM calls markov_embed otherwise).
    has_recurrent_markov_head = True

    @property
    def specx_markov_head(self) -> MarkovHead:
        return self.model.markov_head

    def markov_embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.specx_markov_head.markov_w1(token_ids.long())

    def markov_step(self, prev: torch.Tensor, hidden: torch.Tensor,
                    state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        head = self.specx_markov_head
        e = head.markov_w1(prev.long())
        if head.head_type == "vanilla":
            return e, None
        hidden = hidden.to(e.dtype)
        if head.head_type == "gated":
            return torch.sigmoid(head.gate_proj(torch.cat([hidden, e], -1))) * e, None
        if state is None:
            state = e.new_zeros(*e.shape[:-1], head.rank)
        g, c, o = head.joint_proj(torch.cat([state, e, hidden], -1)).chunk(3, -1)
        g = torch.sigmoid(g)
        return torch.tanh(o), g * state + (1.0 - g) * torch.tanh(c)

    def markov_bias(self, markov_embed: torch.Tensor) -> torch.Tensor:
        return self.specx_markov_head.markov_w2(markov_embed)


class SpecxDSparkBackbone(Qwen3DSparkModel):
    """vLLM's DSpark Qwen3 backbone with our Markov head in place of vLLM's (vanilla-only) one."""

    def __init__(self, *, vllm_config: VllmConfig, start_layer_id: int = 0, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, start_layer_id=start_layer_id, prefix=prefix)
        c = self.config
        self.markov_head = MarkovHead(c.vocab_size, getattr(c, "draft_vocab_size", None) or c.vocab_size,
                                      c.markov_rank, c.hidden_size, getattr(c, "markov_head_type", "vanilla"))

    def load_weights(self, weights):
        """vLLM's loader, but our Markov head's tensors are copied in by name: vLLM's DFlash name
        mapper stacks every `.gate_proj` into the MLP's `.gate_up_proj`, which would send the
        gated head's `markov_head.gate_proj.*` to a parameter that does not exist."""
        head: dict[str, torch.Tensor] = {}

        def backbone():
            for name, w in weights:
                if name.startswith("markov_head."):
                    head[name.removeprefix("markov_head.")] = w
                else:
                    yield name, w

        loaded = set(super().load_weights(backbone()))
        params = dict(self.markov_head.named_parameters())
        with torch.no_grad():
            for name, w in head.items():
                params[name].copy_(w)
        return loaded | {f"markov_head.{name}" for name in head}


class SpecxDSparkForCausalLM(SpecxMarkovHooks, Qwen3DSparkForCausalLM):
    """The `SpecxDSparkModel` architecture on vLLM >= 0.34."""

    speculator_config_class = SpecxDSparkSpeculatorConfig
    model_cls = SpecxDSparkBackbone


class SpecxDSparkSpeculator(DSparkSpeculator):
    """vLLM's DSpark speculator, run on `SpecxDSparkForCausalLM`."""

    _speculator_name = "vllm-specx DSpark"
