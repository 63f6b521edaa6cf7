"""DSpark on vLLM >= 0.34's V2 model runner: the draft model and the speculator (imports vLLM).

Both reuse vLLM's own DSpark rather than copying it:

* `SpecxDSparkForCausalLM` is vLLM's `Qwen3DSparkForCausalLM` (DFlash Qwen3 backbone, context-K/V
  precompute into the draft KV cache the runner allocates, reduced vocabulary through `d2t`,
  confidence head) with vllm-specx's Markov head (`model.MarkovHead`: "vanilla", "gated", "rnn";
  the same tensor names) behind the hooks vLLM's DSpark loop calls (`SpecxMarkovHooks`). It
  declares `SpecxDSparkSpeculatorConfig` (vLLM's `SpeculativeDraftModel` interface), so a
  `SpecxDSparkModel` checkpoint selects our config under `"method": "dspark"` too.
* `SpecxDSparkSpeculator` is vLLM's `DSparkSpeculator`: its left-to-right loop
  (`_sample_markov_chain`) asks the model for `markov_step` (our head's gated / recurrent step:
  the "embedding" it returns is what W2 projects) and `markov_bias`. For a draft with the
  next-token stream it also hands every context row's next token to the model as vLLM writes
  the rows (`_precompute_context_kv`, on the eager and the FULL-CUDA-graph path alike): the row
  after it, and for a request's last accepted row the pass's anchor (the bonus token, or the
  next prefill token of a chunked prefill), as `model.context_next_ids` lays them out; the
  backbone adds s_t where `model.py` does (`_normalize_context_states`: fused before
  hidden_norm, added after it). On CPU it normalizes each layer's context K with that layer's
  K-norm (`_normalize_context_k`, `cpu_k_norm.py`: vLLM's CPU `rms_norm` reads only the first row
  of the stacked weights vLLM passes; its CUDA kernel reads them all).

The draft math is `model.py`'s: `SpecxMarkovHooks.markov_step` + `markov_bias` give exactly
`MarkovHead.step`'s bias (tests drive vLLM's loop with these hooks against
`DSparkDraft.greedy_drafts`).
"""

from __future__ import annotations

import torch
from vllm.config import VllmConfig
from vllm.model_executor.models.qwen3_dspark import Qwen3DSparkForCausalLM, Qwen3DSparkModel
from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

from vllm_specx import vocab
from vllm_specx.layers import RMSNorm
from vllm_specx.methods.dspark.cpu_k_norm import needs_per_layer_k_norm, normalize_context_k_per_layer
from vllm_specx.methods.dspark.model import MarkovHead, context_next_ids
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
    "vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._normalize_context_states",
    "vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._normalize_context_k",
    "vllm._custom_ops:rms_norm",
    "vllm.platforms:current_platform",
    "vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model.precompute_and_store_context_kv",
    "vllm.v1.worker.gpu.spec_decode.dflash.speculator:DFlashSpeculator._precompute_context_kv",
    "vllm.v1.worker.gpu.spec_decode.dflash.speculator:DFlashSpeculator._prepare_graph_forward",
    "vllm.v1.worker.gpu.spec_decode.dflash.speculator:DFlashSpeculator.propose",
    "vllm.v1.worker.gpu.spec_decode.dspark.speculator:DSparkSpeculator.load_draft_model",
    "vllm.v1.worker.gpu.spec_decode.eagle.utils:get_target_lm_head",
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
        self.next_token_stream = getattr(c, "next_token_stream", None)
        if self.next_token_stream is not None:
            self.next_token_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
            self.next_token_proj = torch.nn.Linear(c.hidden_size, c.hidden_size, bias=False)
        self._next_state: torch.Tensor | None = None  # s_t of the rows being written, or None
        self._per_layer_k_norm = needs_per_layer_k_norm()

    def next_token_state(self, next_ids: torch.Tensor) -> torch.Tensor:
        """s_t = W_e tn(embed(x_{t+1})) [n, H] (`model.DSparkDraft.next_token_state`; the target's
        embedding table, which vLLM's DSpark loader shares with the draft)."""
        e = self.embed_tokens(next_ids.long())
        return self.next_token_proj(self.next_token_norm(e).to(self.next_token_proj.weight.dtype))

    def _normalize_context_states(self, context_states: torch.Tensor) -> torch.Tensor:
        """vLLM's hidden_norm of the context rows, with the next-token stream where the rows
        being written carry it: "fused" hn(c + s), "added" hn(c) + s."""
        s = self._next_state
        if s is None:
            return super()._normalize_context_states(context_states)
        s = s.to(context_states.dtype)
        if self.next_token_stream == "fused":
            return super()._normalize_context_states(context_states + s)
        return super()._normalize_context_states(context_states) + s

    def _normalize_context_k(self, all_k: torch.Tensor) -> torch.Tensor:
        """vLLM's one-call K-norm of every layer's context K, or, where vLLM's CPU `rms_norm` reads
        only the first row of the stacked weights, each layer's own (`cpu_k_norm.py`)."""
        if self._per_layer_k_norm:
            return normalize_context_k_per_layer(self, all_k)
        return super()._normalize_context_k(all_k)

    def load_weights(self, weights):
        """vLLM's loader, but our Markov head's tensors are copied in by name: vLLM's DFlash name
        mapper stacks every `.gate_proj` into the MLP's `.gate_up_proj`, which would send the
        gated head's `markov_head.gate_proj.*` to a parameter that does not exist."""
        ours: dict[str, torch.Tensor] = {}

        def backbone():
            for name, w in weights:
                if name.startswith(("markov_head.", "next_token_norm.", "next_token_proj.")):
                    ours[name] = w
                else:
                    yield name, w

        loaded = set(super().load_weights(backbone()))
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name, w in ours.items():
                params[name].copy_(w)
        return loaded | set(ours)


class SpecxDSparkForCausalLM(SpecxMarkovHooks, Qwen3DSparkForCausalLM):
    """The `SpecxDSparkModel` architecture on vLLM >= 0.34."""

    speculator_config_class = SpecxDSparkSpeculatorConfig
    model_cls = SpecxDSparkBackbone

    # x_{t+1} of the context rows about to be written (`SpecxDSparkSpeculator` sets it for every
    # write of a draft with the next-token stream; the write consumes it).
    pending_next_ids: torch.Tensor | None = None

    def precompute_and_store_context_kv(self, context_states, context_positions, context_slot_mapping=None) -> None:
        """vLLM's context K/V write, with the next-token stream of `pending_next_ids` where the
        draft has one. Rows written without their next tokens are refused (vLLM's profiling run
        writes nothing: it may compute without them)."""
        backbone, next_ids, self.pending_next_ids = self.model, self.pending_next_ids, None
        if backbone.next_token_stream is not None and next_ids is not None:
            backbone._next_state = backbone.next_token_state(next_ids)
        elif backbone.next_token_stream is not None and context_slot_mapping is not None:
            raise RuntimeError("vllm-specx DSpark next_token_stream: context rows reached the draft "
                               "without their next tokens; cannot build the context")
        try:
            super().precompute_and_store_context_kv(context_states, context_positions, context_slot_mapping)
        finally:
            backbone._next_state = None


class SpecxDSparkSpeculator(vocab.TargetHeadRowsV2, DSparkSpeculator):
    """vLLM's DSpark speculator, run on `SpecxDSparkForCausalLM`; for a draft with the next-token
    stream it builds every context row's next token (module docstring); a reduced draft saved
    with `lm_head_from_target` gets the target's rows (`vocab.TargetHeadRowsV2`)."""

    _speculator_name = "vllm-specx DSpark"

    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        super().__init__(vllm_config, device)
        hf = self.draft_model_config.hf_config
        self._stream = getattr(hf, "next_token_stream", None) is not None
        self._stream_batch: tuple[torch.Tensor, torch.Tensor, int] | None = None  # ids, qsl, num_reqs
        if self._stream:
            # vLLM's FULL graph stages num_rejected here (as for LiLiCorr's context anchor); the
            # eager path fills it in `propose`, so both read the same buffer.
            self._num_rejected = torch.zeros(self.max_num_reqs, dtype=torch.int32, device=device)

    def propose(self, input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states,
                num_sampled, num_rejected, *args, **kwargs):
        if self._stream:
            n = input_batch.num_reqs
            self._num_rejected[:n].copy_(num_rejected[:n])
            self._stream_batch = (input_batch.input_ids, input_batch.query_start_loc, n)
        return super().propose(input_batch, attn_metadata, slot_mappings, last_hidden_states,
                               aux_hidden_states, num_sampled, num_rejected, *args, **kwargs)

    def _prepare_graph_forward(self, num_reqs, attn_metadata):
        if self._stream:  # the captured context step reads the runner's fixed input buffers
            buffers = self.target_input_buffers
            self._stream_batch = (buffers.input_ids, buffers.query_start_loc, num_reqs)
        return super()._prepare_graph_forward(num_reqs, attn_metadata)

    def _precompute_context_kv(self, start: int, end: int, dummy_run: bool = False) -> None:
        if not self._stream:
            return super()._precompute_context_kv(start, end, dummy_run)
        ids, qsl, n = self._stream_batch
        # each row's x_{t+1}; a request's last accepted row gets its anchor (input_ids of the
        # query block's first slot, which vLLM's prepare_dflash_inputs just wrote)
        anchors = self.input_buffers.input_ids[self._anchor_idx[:n]]
        self.model.pending_next_ids = context_next_ids(ids[:end], anchors, qsl, self._num_rejected, n)[start:end]
        super()._precompute_context_kv(start, end, dummy_run)
