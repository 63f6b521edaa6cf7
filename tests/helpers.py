"""Shared test helpers: the reference assets, random draft heads for the reference target, and
worker-side spies.

Worker-side helpers (`record_drafts`, `read_drafts`, `spy_rejection_sampler`, ...) are passed to
`LLM.collective_rpc`, which runs them inside the vLLM worker with the worker as argument; the
worker process imports them from this module (it is importable there: the engine's processes
inherit the test process's `sys.path`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vllm_specx import assets
from vllm_specx.engine import cpu_llm  # noqa: F401  (re-exported for the tests)
from vllm_specx.methods.dspark.checkpoint import save
from vllm_specx.methods.dspark.config import DSparkDraftConfig
from vllm_specx.methods.dspark.model import DSparkDraft, reduced
from vllm_specx.metrics import spec_metrics  # noqa: F401  (re-exported for the tests)
from vllm_specx.training.taps import embed_and_head, load_target, target_taps  # noqa: F401

ASSETS = assets.root()
REF_TARGET = ASSETS / "ref-target"
load_prompts = assets.load_prompts


def data_folder(path, rows: list[dict], **meta) -> Path:
    """A gen-data folder holding `rows` (tokens.jsonl) without taps: meta.json for the reference
    target's `train` prompts (`meta` overrides) and a commands file."""
    path = Path(path)
    path.mkdir(parents=True)
    (path / "tokens.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "meta.json").write_text(json.dumps({"target": str(REF_TARGET), "taps": [], "max_tokens": 8,
                                                "temperature": 0.0, "prompts": "train", **meta}))
    (path / "commands.txt").write_text("vllm-specx gen-data --target x --prompts train\n")
    return path


def random_draft(target, taps=(1, 4, 6), block_size=8, layers=1, anchor=True, seed=0, draft_vocab=None,
                 **recipe) -> DSparkDraft:
    """A random DSpark head for the reference target; `recipe`: the full recipe's switches and
    `markov_head_type` (with final_layer_tap the target's last layer 7 is added to the taps);
    `draft_vocab`: target ids of a reduced draft vocabulary (the full draft's rows, `model.reduced`)."""
    if recipe.get("final_layer_tap"):
        taps = tuple(taps) + (target.config.num_hidden_layers - 1,)
    cfg = DSparkDraftConfig.for_target(
        target.config.to_dict(), target_layer_ids=taps, num_hidden_layers=layers, block_size=block_size,
        mask_token_id=2, markov_rank=32, sample_from_anchor=anchor, **recipe)
    torch.manual_seed(seed)
    draft = DSparkDraft(cfg, *embed_and_head(target))
    for name, p in draft.named_parameters():
        if name == "fusion_logits":  # far from the equal mixture, so a shared context would show
            torch.nn.init.normal_(p, std=2.0)
        elif name == "slot_queries":  # rows far apart, so a slot given another's row would show
            torch.nn.init.normal_(p, std=1.0)
        elif p.dim() > 1:
            torch.nn.init.normal_(p, std=0.05)  # large enough that argmaxes are far from ties
        else:  # norm weights differ per layer, so a layer using another's norm shows
            torch.nn.init.normal_(p, mean=1.0, std=0.3)
    return draft if draft_vocab is None else reduced(draft, draft_vocab)


def reduced_ref_dspark(path, size: int = 1024) -> tuple[str, list[int]]:
    """The committed reference DSpark head cut to a reduced draft vocabulary: the `size` tokens
    most frequent in the reference target's training prompts (`model.reduced`); (path, ids)."""
    from transformers import AutoTokenizer

    from vllm_specx import vocab
    from vllm_specx.methods.dspark.checkpoint import load_draft

    target = load_target(REF_TARGET)
    tok = AutoTokenizer.from_pretrained(str(REF_TARGET))
    ids, _ = vocab.by_frequency((tok(p)["input_ids"] for p in load_prompts("train")), size,
                                target.config.vocab_size)
    full = load_draft(ASSETS / "drafts" / "ref-dspark", *embed_and_head(target))
    return write(reduced(full, ids), path), ids.tolist()


def reduced_ref_mtp(path, size: int = 1024) -> tuple[str, list[int]]:
    """The committed reference MTP layer (`assets/drafts/ref-mtp`) cut to the same reduced draft
    vocabulary as `reduced_ref_dspark` (`methods.mtp.model.reduced`); (path, ids)."""
    from transformers import AutoTokenizer

    from vllm_specx import vocab
    from vllm_specx.methods.mtp import checkpoint as mtp_ckpt
    from vllm_specx.methods.mtp.model import reduced as reduced_mtp

    target = load_target(REF_TARGET)
    tok = AutoTokenizer.from_pretrained(str(REF_TARGET))
    ids, _ = vocab.by_frequency((tok(p)["input_ids"] for p in load_prompts("train")), size,
                                target.config.vocab_size)
    full = mtp_ckpt.load(ASSETS / "drafts" / "ref-mtp", *embed_and_head(target))
    mtp_ckpt.save(reduced_mtp(full, ids), path)
    return str(path), ids.tolist()


def write(draft: DSparkDraft, path, fmt="specx") -> str:
    save(draft, path, fmt, **({"verifier": str(REF_TARGET)} if fmt == "speculators" else {}))
    return str(path)


def reference_drafts(target, draft: DSparkDraft, prefix: list[int], anchor: int, n: int) -> list[int]:
    taps = target_taps(target, torch.tensor([prefix]), draft.cfg.target_layer_ids)[0]
    return draft.greedy_drafts(taps, anchor, n, tokens=torch.tensor(prefix))


def write_eagle3_head(target, path, taps=(1, 4, 6), seed=0) -> str:
    """A random-init EAGLE-3 head in vLLM's native format (llama_eagle3), sharing the target's
    embeddings and lm_head: enough to exercise vLLM's built-in EAGLE-3 path end to end."""
    import json
    from pathlib import Path

    from vllm_specx.checkpoint import save_tensors, to_aux_ids

    c = target.config
    h, hd, kv, inter = c.hidden_size, c.head_dim, c.num_key_value_heads * c.head_dim, c.intermediate_size
    q = c.num_attention_heads * hd
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=g) * 0.05  # noqa: E731
    tensors = {
        "fc.weight": rnd(h, h * len(taps)), "norm.weight": torch.ones(h),
        "midlayer.input_layernorm.weight": torch.ones(h), "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": rnd(q, 2 * h), "midlayer.self_attn.k_proj.weight": rnd(kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": rnd(kv, 2 * h), "midlayer.self_attn.o_proj.weight": rnd(h, q),
        "midlayer.mlp.gate_proj.weight": rnd(inter, h), "midlayer.mlp.up_proj.weight": rnd(inter, h),
        "midlayer.mlp.down_proj.weight": rnd(h, inter),
    }
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
              "num_hidden_layers": 1, "num_attention_heads": c.num_attention_heads,
              "num_key_value_heads": c.num_key_value_heads, "head_dim": hd, "intermediate_size": inter,
              "rms_norm_eps": c.rms_norm_eps, "vocab_size": c.vocab_size, "draft_vocab_size": c.vocab_size,
              "max_position_embeddings": c.max_position_embeddings, "rope_theta": 10000.0,
              "target_hidden_size": h, "num_aux_hidden_states": len(taps),
              "eagle_aux_hidden_state_layer_ids": to_aux_ids(taps), "tie_word_embeddings": False}
    Path(path).mkdir(parents=True, exist_ok=True)
    (Path(path) / "config.json").write_text(json.dumps(config, indent=2))
    save_tensors(path, tensors)
    return str(path)


# ---- worker-side helpers (run through LLM.collective_rpc) -------------------------------------

def drafter_class(worker) -> str:
    d = getattr(worker.model_runner, "drafter", None)
    return f"{type(d).__module__}.{type(d).__qualname__}" if d is not None else "None"


def served_head(worker) -> list:
    """The drafter's own LM head rows [Vd, H] as vLLM serves them (a reduced draft vocabulary)."""
    m = worker.model_runner.drafter.model
    n = int(m.draft_id_to_target_id.numel())
    return m.lm_head.weight[:n].float().cpu().tolist()


def rejection_sampler_info(worker) -> dict:
    rs = worker.model_runner.rejection_sampler
    return {"class": type(rs).__name__, "method": getattr(rs, "method", None),
            "calls": getattr(rs, "calls", None)}


def drafter_stats(worker) -> dict:
    return dict(getattr(worker.model_runner.drafter, "stats", {}))


def record_drafts(worker) -> None:
    """Record (anchor ids, draft ids) of every DSparkProposer draft pass."""
    d = worker.model_runner.drafter
    if getattr(d, "_recorded", None) is not None:
        d._recorded.clear()
        return
    d._recorded = []
    orig = d._sample_draft_tokens

    def _sample_draft_tokens(hidden_states, sampling_metadata):
        ids, probs = orig(hidden_states, sampling_metadata)
        batch = hidden_states.shape[0] // d._rows  # hidden-state rows per request
        d._recorded.append((d._anchor_ids[:batch].tolist(), ids.view(batch, -1).tolist()))
        return ids, probs

    d._sample_draft_tokens = _sample_draft_tokens


def read_drafts(worker) -> list:
    return list(getattr(worker.model_runner.drafter, "_recorded", []))


def spy_rejection_sampler(worker) -> None:
    """Record what the runner's rejection sampler receives as draft probabilities."""
    rs = worker.model_runner.rejection_sampler
    rs._specx_seen = []
    orig = rs.forward

    def forward(metadata, draft_probs, *args, **kwargs):
        rs._specx_seen.append(None if draft_probs is None else tuple(draft_probs.shape))
        return orig(metadata, draft_probs, *args, **kwargs)

    rs.forward = forward


def spy_draft_probs_mass(worker, allowed: list[int]) -> None:
    """Record, for every draft-probability tensor the rejection sampler receives, (its shape, its
    largest row mass on target ids outside `allowed`): a reduced draft vocabulary's q must be
    zero there."""
    rs = worker.model_runner.rejection_sampler
    rs._specx_mass = []
    orig = rs.forward
    keep = None

    def forward(metadata, draft_probs, *args, **kwargs):
        nonlocal keep
        if draft_probs is not None:
            if keep is None:
                keep = torch.zeros(draft_probs.shape[-1], dtype=torch.bool)
                keep[allowed] = True
            outside = draft_probs.float()[:, ~keep.to(draft_probs.device)].sum(-1)
            rs._specx_mass.append((tuple(draft_probs.shape), float(outside.max()) if outside.numel() else 0.0,
                                   float(draft_probs.float().sum(-1).min()) if draft_probs.numel() else 1.0))
        return orig(metadata, draft_probs, *args, **kwargs)

    rs.forward = forward


def read_draft_probs_mass(worker) -> list:
    return list(getattr(worker.model_runner.rejection_sampler, "_specx_mass", []))


def read_rejection_spy(worker) -> list:
    return list(getattr(worker.model_runner.rejection_sampler, "_specx_seen", []))


def sampler_counters(worker) -> dict | None:
    """The runner's rejection sampler: class, and (ours) forward calls, the acceptance op's
    completed calls per method (`op_calls`, `random_op_calls`: counted inside the op's call) and
    the steps without any draft, answered without the op (`empty_calls`)."""
    rs = getattr(worker.model_runner, "rejection_sampler", None)
    if rs is None:
        return None
    return {"class": type(rs).__name__, "method": getattr(rs, "method", None),
            "calls": getattr(rs, "calls", None), "op_calls": dict(getattr(rs, "op_calls", {}) or {}),
            "random_op_calls": dict(getattr(rs, "random_op_calls", {}) or {}),
            "empty_calls": getattr(rs, "empty_calls", None)}


def record_draft_passes(worker, limit: int = 8) -> None:
    """Record the first `limit` DSparkProposer passes as (anchor ids, draft ids, draft probs or
    None) and what the rejection sampler then receives, (draft ids, draft_probs or None)."""
    d, rs = worker.model_runner.drafter, worker.model_runner.rejection_sampler
    d._specx_passes, rs._specx_verified = [], []
    if not hasattr(d, "_specx_orig_sample"):
        d._specx_orig_sample, rs._specx_orig_forward = d._sample_draft_tokens, rs.forward

    def _sample_draft_tokens(hidden_states, sampling_metadata):
        ids, probs = d._specx_orig_sample(hidden_states, sampling_metadata)
        if len(d._specx_passes) < limit:
            batch = hidden_states.shape[0] // d._rows  # hidden-state rows per request
            d._specx_passes.append((d._anchor_ids[:batch].tolist(), ids.view(batch, -1).tolist(),
                                    None if probs is None else probs.detach().cpu().clone()))
        return ids, probs

    def forward(metadata, draft_probs, *args, **kwargs):
        if len(rs._specx_verified) < limit:
            rs._specx_verified.append((metadata.draft_token_ids.tolist(),
                                       None if draft_probs is None else draft_probs.detach().cpu().clone()))
        return rs._specx_orig_forward(metadata, draft_probs, *args, **kwargs)

    d._sample_draft_tokens, rs.forward = _sample_draft_tokens, forward


def read_draft_passes(worker) -> tuple[list, list]:
    """What `record_draft_passes` recorded, tensors as nested lists (exact for fp32; the RPC
    reply does not carry tensors): rebuild them with `torch.tensor`."""
    d, rs = worker.model_runner.drafter, worker.model_runner.rejection_sampler

    def lists(rec):
        return tuple(x.tolist() if isinstance(x, torch.Tensor) else x for x in rec)

    return ([lists(r) for r in getattr(d, "_specx_passes", [])],
            [lists(r) for r in getattr(rs, "_specx_verified", [])])


def record_proposals(worker, limit: int = 8) -> None:
    """Record the drafter's first `limit` `propose` calls as (next token ids, draft ids) (any
    vLLM proposer: its 2nd-5th positional arguments are target ids, positions, hidden states and
    the next token ids; it returns draft ids [B, K])."""
    d = worker.model_runner.drafter
    d._specx_proposals = []
    orig = getattr(d, "_specx_orig_propose", None) or d.propose
    d._specx_orig_propose = orig

    def propose(*args, **kwargs):
        out = orig(*args, **kwargs)
        ids = out[0] if isinstance(out, tuple) else out
        nxt = kwargs.get("next_token_ids", args[4] if len(args) > 4 else None)
        if len(d._specx_proposals) < limit:
            d._specx_proposals.append((nxt.tolist(), ids.tolist()))
        return out

    d.propose = propose


def read_proposals(worker) -> list:
    return list(getattr(worker.model_runner.drafter, "_specx_proposals", []))


def random_mtp(target, kv_share: bool, seed=0, max_drafts=7, draft_vocab=None):
    """A random-init MTP layer for the reference target (norm weights away from 1, so a norm
    applied in the wrong place shows); `draft_vocab` (target ids): a reduced draft vocabulary
    (the same layer weights for the same seed, lm_head = the target's rows at those ids)."""
    from vllm_specx.methods.mtp.config import MTPDraftConfig
    from vllm_specx.methods.mtp.model import MTPDraft

    cfg = MTPDraftConfig.for_target(target.config.to_dict(), kv_share=kv_share, max_drafts=max_drafts,
                                    draft_vocab_size=0 if draft_vocab is None else len(draft_vocab))
    torch.manual_seed(seed)
    draft = MTPDraft(cfg, *embed_and_head(target), draft_vocab)
    for p in draft.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.05)
        else:
            torch.nn.init.normal_(p, mean=1.0, std=0.3)
    return draft


@torch.no_grad()
def target_final_hidden(target, prefix: list[int]) -> torch.Tensor:
    """H_t [T, H]: the target's final (post-norm) hidden states, what vLLM hands an MTP drafter."""
    return target.model(input_ids=torch.tensor([prefix])).last_hidden_state[0].float()


def record_mtp_steps(worker, limit: int = 6) -> None:
    """Record the first `limit` MTPProposer passes: per pass the next (anchor) token ids and, per
    draft step, the step's logits [batch, V] and drafts."""
    d = worker.model_runner.drafter
    d._specx_steps = []
    if not hasattr(d, "_specx_orig_mtp"):
        d._specx_orig_mtp = (d.propose, d._sample_draft_tokens)
    orig_propose, orig_sample = d._specx_orig_mtp

    def propose(*args, **kwargs):
        if len(d._specx_steps) < limit:
            d._specx_steps.append({"anchors": kwargs["next_token_ids"].tolist(), "logits": [], "drafts": []})
        return orig_propose(*args, **kwargs)

    def _sample_draft_tokens(hidden_states, sampling_metadata):
        ids, probs = orig_sample(hidden_states, sampling_metadata)
        if d._specx_steps and len(d._specx_steps) <= limit:
            rec = d._specx_steps[-1]
            if len(rec["drafts"]) < d.num_speculative_tokens:
                rec["logits"].append(d.model.compute_logits(hidden_states).float().tolist())
                rec["drafts"].append(ids.tolist())
        return ids, probs

    d.propose, d._sample_draft_tokens = propose, _sample_draft_tokens


def read_mtp_steps(worker) -> list:
    return list(getattr(worker.model_runner.drafter, "_specx_steps", []))


def write_random_mtp_for(target_config: dict, path, kv_share: bool = True, seed: int = 0) -> str:
    """A random MTP checkpoint for any target config (no target weights needed: the layer's
    tensors only; embeddings and LM head are the target's at serving time)."""
    from vllm_specx.checkpoint import save_tensors, write_config_json
    from vllm_specx.methods.mtp.checkpoint import config_json
    from vllm_specx.methods.mtp.config import MTPDraftConfig

    cfg = MTPDraftConfig.for_target(target_config, kv_share=kv_share)
    g = torch.Generator().manual_seed(seed)
    tensors = {k: (torch.randn(*shape, generator=g) * 0.05 if len(shape) > 1 else 1 + 0.3 * torch.randn(*shape, generator=g))
               for k, shape in cfg.expected_tensors().items()}
    write_config_json(path, config_json(cfg))
    save_tensors(path, tensors)
    return str(path)


def seeded_rewinds(worker) -> int:
    """Discarded seeded rows whose CPU generator the plugin restored (`repair-cpu-seeded-*`)."""
    return int(getattr(worker.model_runner, "specx_seeded_rewinds", 0) or 0)


def schedule_skipped_passes(worker, every: int = 3, context: str = "deferred") -> None:
    """Worker side, DSparkProposer or MTPProposer with `adaptive: true`: draft on every `every`-th pass only
    (the others are skipped passes, deterministically) and record each draft pass's drafts.
    `context` says how the skipped passes' context K/V reach the draft's cache: "deferred" (as
    served: queued, written in one batch before the next draft pass), "eager" (the reference:
    vLLM's DFlash input kernel and `build_model_inputs_first_pass` at once, in the skipped pass;
    for MTP vLLM's own step 0 with no drafts),
    "lost" (the queue dropped unwritten: a negative control)."""
    import itertools
    import types

    d = worker.model_runner.drafter
    counter = itertools.count()
    d.adaptive.scheduler.draft_now = lambda reqs=None: next(counter) % every == 0
    d._specx_drafts = []
    mtp = not hasattr(d, "_adaptive_drafts")  # MTPProposer: drafts come from `_draft_pass`
    orig = d._draft_pass if mtp else d._adaptive_drafts

    def record(*args, **kwargs):
        out = orig(*args, **kwargs)
        d._specx_drafts.append((out if mtp else out[0]).tolist())
        return out

    if mtp:
        d._draft_pass = record
    else:
        d._adaptive_drafts = record
    if context == "eager":
        d._context_only = types.MethodType(_eager_mtp_context if mtp else _eager_context, d)
    elif context == "lost":
        def drop():
            d._deferred = []
        d._flush_context = drop
    elif context != "deferred":
        raise ValueError(f"context must be deferred, eager or lost, got {context!r}")


def _eager_context(self, num_speculative_tokens, batch, *, target_token_ids, target_positions,
                   target_hidden_states, next_token_ids, token_indices_to_sample, common_attn_metadata,
                   num_rejected_tokens_gpu, **_):
    """A skipped pass writing its context K/V through vLLM's own DFlash path at once (the
    reference for `DSparkProposer._defer_context`)."""
    self.num_speculative_tokens = num_speculative_tokens
    self._last_draft_probs = None
    fused = self.model.combine_hidden_states(target_hidden_states)
    num_tokens, _, _ = self.set_inputs_first_pass(
        target_token_ids=target_token_ids, next_token_ids=next_token_ids,
        target_positions=target_positions, target_hidden_states=fused,
        token_indices_to_sample=token_indices_to_sample, cad=common_attn_metadata,
        num_rejected_tokens_gpu=num_rejected_tokens_gpu)
    self.build_model_inputs_first_pass(num_tokens, num_tokens, None)
    return torch.zeros(batch, num_speculative_tokens, dtype=torch.int64, device=self.device)


def _eager_mtp_context(self, num_speculative_tokens, batch, **kw):
    """A skipped MTP pass writing step 0's K/V at once through vLLM's own first pass (its
    propose with 0 drafts runs step 0 and returns no drafts): the reference for
    `MTPProposer._defer_context`."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    try:
        SpecDecodeBaseProposer.propose(self, 0, **kw)
    finally:
        self.num_speculative_tokens = num_speculative_tokens
    self._last_draft_probs = None
    return torch.zeros(batch, num_speculative_tokens, dtype=torch.int64, device=self.device)


def scheduled_runs(target, spec: dict, prompts, params, every: int = 3) -> dict[str, tuple]:
    """{context: (outputs, drafts of every draft pass, drafter counters)} for the three contexts of
    `schedule_skipped_passes` ("eager", "deferred", "lost"), one engine each, a draft pass on every
    `every`-th step. In-process engines: the requests reach the scheduler together, so the three
    runs see the same steps (over IPC the engine may start stepping before the last one arrives)."""
    import pytest

    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        for context in ("eager", "deferred", "lost"):
            with cpu_llm(target, speculative_config=spec) as llm:
                llm.collective_rpc(schedule_skipped_passes, kwargs={"every": every, "context": context})
                outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
                drafts, stats = llm.collective_rpc(read_scheduled_drafts)[0]
                out[context] = (outs, drafts, stats)
    return out


def read_scheduled_drafts(worker) -> tuple[list, dict]:
    """What `schedule_skipped_passes` recorded, and the drafter's counters."""
    d = worker.model_runner.drafter
    return list(getattr(d, "_specx_drafts", [])), dict(d.stats)
