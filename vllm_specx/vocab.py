"""Reduced draft vocabularies: the contract every method's reduced-vocabulary draft follows.

A draft with a reduced vocabulary scores only Vd < V tokens: its output layers (`lm_head`
[Vd, H], the Markov head's W2 [Vd, r]) are Vd rows, so a draft slot costs Vd / V of a full
vocabulary's logits. The draft vocabulary is a set of target token ids, stored as speculators and
vLLM store it (EAGLE-3 and DFlash/DSpark alike):

    d2t  [Vd] int64   offsets: draft id i is target id  i + d2t[i]        (vLLM's draft_id_to_target_id)
    t2d  [V]  bool    t2d[v] is True iff target id v is in the draft vocabulary   (optional; training)

Draft ids are the selected target ids in ascending order (`maps`), so the two agree exactly when
`t2d.nonzero() == arange(Vd) + d2t`; `check_maps` refuses anything else, naming the tensor. The
stored form (`D2T`, `T2D`, `target_ids`) and `check_maps` are defined in `vllm_specx.checkpoint`
with the other checks of what a checkpoint holds (so it needs nothing from here) and are
re-exported here.

What stays exact: a drafted token is always a target token (`to_target`), and for probabilistic
drafts the distribution q handed to the rejection sampler is the draft's distribution over its
Vd tokens scattered to the target vocabulary, zero elsewhere (`scatter_to_target`). Rejection
sampling is exact for any q whose support holds the drafted token, so output stays the target's
distribution; tokens outside the draft vocabulary are simply never proposed (they cost acceptance,
which `coverage` measures, never correctness).

Inputs that are target tokens (the Markov head's previous token, the embeddings) stay at the
target vocabulary.

A reduced draft's `lm_head` rows are the target's own rows at `d2t`, frozen in training; a
checkpoint may leave them out (`lm_head_from_target: true` in its config, `omit_target_head`):
the reference loaders take them from the target's LM head (`target_rows`) and the served draft
copies them from the target model when vLLM loads it (`TargetHeadRows`). That keeps a draft's
file to its trained weights (SmolLM2's 14,677 rows x 576 are 16 MB of a 36 MB DSpark draft).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

import torch

from vllm_specx import registry
from vllm_specx.checkpoint import (D2T, T2D, check_maps, check_tensors, check_vocab_maps, load_tensors,
                                   read_config_json, safetensors_files, save_tensors, target_ids,
                                   write_config_json)

HEAD = "lm_head.weight"  # a reduced draft's own output rows on disk
FROM_TARGET = "lm_head_from_target"  # the config field: the rows are the target's, not on disk


def maps(target_ids: torch.Tensor | Iterable[int], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [Vd] int64, t2d [V] bool) of a draft vocabulary given as target ids (any order,
    distinct, each in [0, vocab_size))."""
    ids = torch.as_tensor(list(target_ids) if not isinstance(target_ids, torch.Tensor) else target_ids,
                          dtype=torch.long).sort().values
    if ids.numel() == 0 or int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
        raise ValueError(f"a draft vocabulary needs 1..{vocab_size} target ids in [0, {vocab_size})")
    if bool((ids[1:] == ids[:-1]).any()):
        raise ValueError("a draft vocabulary's target ids must be distinct")
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(ids.numel()), t2d


def to_target(draft_ids: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    """Draft ids -> target ids (`ids` = `target_ids(d2t)`; None: a full vocabulary, unchanged)."""
    return draft_ids if ids is None else ids[draft_ids]


def scatter_to_target(probs: torch.Tensor, ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Distributions [..., Vd] over the draft vocabulary -> [..., V] over the target's, zero
    outside the draft vocabulary (unchanged for a full vocabulary)."""
    if ids is None:
        return probs
    out = probs.new_zeros(*probs.shape[:-1], vocab_size)
    out[..., ids] = probs
    return out


def from_target(target: torch.Tensor, t2d: torch.Tensor) -> torch.Tensor:
    """Target ids -> draft ids, -1 where a token is outside the draft vocabulary (negative ids,
    e.g. an ignore index, stay -1)."""
    index = torch.cumsum(t2d.long(), 0) - 1
    index[~t2d] = -1
    safe = target.clamp(min=0)
    return torch.where(target >= 0, index.to(target.device)[safe], torch.full_like(target, -1))


def by_frequency(sequences: Iterable[Iterable[int]], size: int, vocab_size: int,
                 always: Iterable[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """The `size` most frequent tokens of `sequences` (ties: lower id first), with the ids in
    `always` included first (e.g. the end-of-answer token); the token counts [V] too."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        t = torch.as_tensor(list(seq), dtype=torch.long)
        if t.numel():
            counts += torch.bincount(t, minlength=vocab_size)[:vocab_size]
    keep = [int(a) for a in dict.fromkeys(always)]
    if not 0 < size <= vocab_size or len(keep) > size:
        raise ValueError(f"draft vocabulary size {size} must be in [{max(1, len(keep))}, {vocab_size}]")
    score = counts.clone().double()
    score[keep] = float("inf")
    # stable sort on -score: equal counts keep ascending id order
    order = torch.sort(-score, stable=True).indices
    return order[:size].sort().values, counts


def coverage(tokens: torch.Tensor, t2d: torch.Tensor) -> float:
    """Share of `tokens` (target ids, e.g. the target's greedy outputs) inside the draft vocabulary."""
    tokens = tokens.flatten()
    return float(t2d[tokens].float().mean()) if tokens.numel() else float("nan")


def add_output_head(module: torch.nn.Module, lm_head: torch.Tensor, vocab_size: int, draft_vocab_size: int,
                    draft_vocab: torch.Tensor | Iterable[int] | None = None) -> None:
    """A draft module's output head, as every method's reference keeps it: the target's LM head
    [V, H] (not saved: the target's), or for a reduced draft vocabulary (`draft_vocab_size` <
    `vocab_size`) the rows of `draft_vocab` (its target ids; None: placeholders a checkpoint
    fills) as `lm_head` [Vd, H] with the maps `d2t` and `t2d`, all saved with the draft."""
    if draft_vocab_size < vocab_size:
        d2t, t2d = maps(torch.arange(draft_vocab_size) if draft_vocab is None else draft_vocab, vocab_size)
        module.register_buffer("lm_head", lm_head.detach()[target_ids(d2t)].clone())  # [Vd, H]
        module.register_buffer(D2T, d2t)
        module.register_buffer(T2D, t2d)
    else:
        module.register_buffer("lm_head", lm_head.detach().clone(), persistent=False)  # [V, H]
        module.d2t = module.t2d = None


def loaded_maps(tensors: dict[str, torch.Tensor], vocab_size: int, draft_vocab_size: int,
                where: str | None) -> dict[str, torch.Tensor]:
    """A reduced-vocabulary checkpoint's tensors as a reference model loads them: the maps checked
    (`check_maps`, naming `where`; None when the caller has checked the file already), `d2t`
    int64, and `t2d` derived from `d2t` when the checkpoint leaves it out (it is optional on disk)."""
    out = dict(tensors)
    if D2T not in out:
        return out  # the loader's own tensor-name check reports it missing
    if where is not None:
        check_maps(out[D2T], out.get(T2D), vocab_size, draft_vocab_size, where)
    out[D2T] = out[D2T].long()
    if T2D not in out:
        out[T2D] = maps(target_ids(out[D2T]), vocab_size)[1]
    return out


class ReferenceVocabMap:
    """For a reference (PyTorch) draft model built with `add_output_head`: `draft_target_ids`, the
    target id of every draft id from its `d2t` buffer; None for the full vocabulary."""

    @property
    def draft_target_ids(self) -> torch.Tensor | None:
        d2t = getattr(self, D2T, None)
        return None if d2t is None else target_ids(d2t)


class ServedVocabMap:
    """For a draft model served in vLLM: `draft_target_ids`, the target id of every draft id from
    the loaded `draft_id_to_target_id` (vLLM's name for d2t); None for the full vocabulary."""

    _target_ids: torch.Tensor | None = None

    @property
    def draft_target_ids(self) -> torch.Tensor | None:
        d2t = getattr(self, "draft_id_to_target_id", None)
        if d2t is None:
            return None
        if self._target_ids is None:
            self._target_ids = target_ids(d2t.data)
        return self._target_ids


def target_rows(lm_head: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    """The target LM head's rows [Vd, H] of the draft vocabulary `d2t` (what a draft saved with
    `lm_head_from_target` scores with)."""
    ids = target_ids(d2t.long())
    if int(ids.max()) >= lm_head.shape[0]:
        raise ValueError(f"{FROM_TARGET}: d2t maps to target id {int(ids.max())}, but the target's LM "
                         f"head has {lm_head.shape[0]} rows")
    return lm_head.detach()[ids.to(lm_head.device)]


def install_target_rows(draft_model: torch.nn.Module, head, cfg) -> None:
    """Copy the target LM head's rows at the draft's `d2t` into its own reduced [Vd, H] `lm_head`
    (a draft saved with `lm_head_from_target`; `draft_model` is vLLM's draft model on any of our
    vLLM paths). `head` is the target's LM-head weight as this rank holds it; refused, naming the
    field, when it is not the whole [V, H] float table (a tensor-parallel or quantised target)."""
    if not isinstance(head, torch.Tensor) or head.shape[0] < cfg.vocab_size:
        rows = None if not isinstance(head, torch.Tensor) else head.shape[0]
        raise ValueError(f"draft config {FROM_TARGET}: the draft's LM head rows come from the "
                         f"target's LM head, but this rank holds {rows} of its {cfg.vocab_size} "
                         f"rows (a tensor-parallel target?); serve it with tensor_parallel_size 1 "
                         f"or use a draft that carries its own '{HEAD}'")
    lm_head = draft_model.lm_head
    if not head.is_floating_point() or head.shape[-1] != lm_head.weight.shape[-1]:
        raise ValueError(f"draft config {FROM_TARGET}: the target's LM head is stored as {head.dtype} "
                         f"{list(head.shape)} (quantised?), not the [V, {lm_head.weight.shape[-1]}] "
                         f"rows the draft scores with; use a draft that carries its own '{HEAD}'")
    with torch.no_grad():
        lm_head.weight[:cfg.draft_vocab_size].copy_(target_rows(head, draft_model.draft_id_to_target_id.data))
    # vLLM prepared the head's weights after loading (on the CPU: a packed GEMM copy that the
    # logits read); prepare them again from the rows just copied in.
    method = getattr(lm_head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(lm_head)
    draft_model.has_own_lm_head = True


class TargetHeadRows:
    """For a vLLM 0.32 / 0.33 proposer whose draft may take its reduced-vocabulary `lm_head` rows
    from the target (`lm_head_from_target`): when vLLM's `load_model` offers the target's LM head
    (`_maybe_share_lm_head`), copy the target's rows at `d2t` into the draft's own [Vd, H] head
    instead (`install_target_rows`)."""

    def _maybe_share_lm_head(self, target_language_model) -> None:
        _, cfg = registry.config_of(self.draft_model_config.hf_config)
        if not getattr(cfg, FROM_TARGET, False):
            return super()._maybe_share_lm_head(target_language_model)
        head = getattr(getattr(target_language_model, "lm_head", None), "weight", None)
        install_target_rows(self.model, head, cfg)


class TargetHeadRowsV2:
    """The same for a vLLM >= 0.34 speculator (DSpark's and MTP's): after vLLM's draft loader
    (`load_draft_model`, which shares the target's head only with a full-vocabulary draft and
    leaves a reduced one's rows unloaded), copy the target's rows at `d2t` in."""

    def load_draft_model(self, target_model, target_attn_layer_names):
        from vllm.v1.worker.gpu.spec_decode.eagle.utils import get_target_lm_head

        model = super().load_draft_model(target_model, target_attn_layer_names)
        _, cfg = registry.config_of(self.draft_model_config.hf_config)
        if getattr(cfg, FROM_TARGET, False):
            language = target_model.get_language_model() if hasattr(target_model, "get_language_model") else target_model
            install_target_rows(model, getattr(get_target_lm_head(target_model, language), "weight", None), cfg)
        return model


def omit_target_head(path, lm_head: torch.Tensor) -> bool:
    """Rewrite the reduced-vocabulary draft checkpoint at `path` without its `lm_head.weight` when
    those rows are exactly the target LM head's `lm_head` [V, H] rows at `d2t` (compared in the
    file's dtype), setting `specx.lm_head_from_target: true` in config.json; the result is checked
    as `vllm-specx check` reads it. False, and nothing written, when the draft is not a vllm-specx
    method's (a baseline vLLM loads itself, such as EAGLE-3, reads the rows from the file), not in
    the vllm-specx format, of a method without the field, without a reduced vocabulary or own
    rows, or when its rows differ from the target's (a draft that trained its head keeps it)."""
    raw = read_config_json(path)
    hit = registry.detect(raw)
    if hit is None or not isinstance(raw.get("specx"), dict):  # speculators format: no field for it
        return False
    cfg = hit[0].read_config(raw, str(Path(path) / "config.json"))
    if FROM_TARGET not in {f.name for f in dataclasses.fields(cfg)} or not getattr(cfg, "reduced_vocab", False):
        return False
    tensors = load_tensors(path)
    own = tensors.get(HEAD)
    if own is None or D2T not in tensors:
        return False
    if not torch.equal(own, target_rows(lm_head, tensors[D2T]).to(own.dtype)):
        return False
    raw["specx"][FROM_TARGET] = True
    for f in safetensors_files(path):
        f.unlink()
    del tensors[HEAD]
    save_tensors(path, tensors)
    write_config_json(path, raw)
    _, cfg = registry.read_checkpoint(path)  # what `vllm-specx check` reads
    check_tensors(path, cfg.expected_tensors())
    check_vocab_maps(path, cfg.vocab_size, cfg.draft_vocab_size)
    return bool(getattr(cfg, FROM_TARGET))
