"""Shared builders for the end-to-end tests: random DSpark drafts for the reference target."""

from __future__ import annotations

import torch

from vllm_specx.config import DSparkDraftConfig
from vllm_specx.models.dspark_io import save_specx, save_speculators
from vllm_specx.models.dspark_torch import DSparkDraft
from vllm_specx.testing import REF_TARGET
from vllm_specx.training.taps import embed_and_head, load_target, target_taps


def random_draft(target, taps=(1, 4, 6), block_size=8, layers=1, anchor=True, seed=0) -> DSparkDraft:
    cfg = DSparkDraftConfig.for_target(
        target.config.to_dict(), target_layer_ids=taps, num_hidden_layers=layers, block_size=block_size,
        mask_token_id=2, markov_rank=32, sample_from_anchor=anchor)
    torch.manual_seed(seed)
    draft = DSparkDraft(cfg, *embed_and_head(target))
    for p in draft.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.05)  # large enough that argmaxes are far from ties
    return draft


def write(draft: DSparkDraft, path, fmt="specx") -> str:
    if fmt == "specx":
        save_specx(draft, path)
    else:
        save_speculators(draft, path, verifier=str(REF_TARGET))
    return str(path)


def reference_drafts(target, draft: DSparkDraft, prefix: list[int], anchor: int, n: int) -> list[int]:
    taps = target_taps(target, torch.tensor([prefix]), draft.cfg.target_layer_ids)[0]
    return draft.greedy_drafts(taps, anchor, n)


__all__ = ["random_draft", "write", "reference_drafts", "load_target", "REF_TARGET"]
