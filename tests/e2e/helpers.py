"""Shared builders for the end-to-end tests: random DSpark drafts for the reference target."""

from __future__ import annotations

import torch

from vllm_specx.config import DSparkDraftConfig
from vllm_specx.models.dspark_io import save_specx, save_speculators
from vllm_specx.models.dspark_torch import DSparkDraft
from vllm_specx.testing import REF_TARGET
from vllm_specx.training.taps import embed_and_head, load_target, target_taps


def random_draft(target, taps=(1, 4, 6), block_size=8, layers=1, anchor=True, seed=0) -> DSparkDraft:
    c = target.config
    cfg = DSparkDraftConfig(
        source_format="specx", target_layer_ids=taps, target_hidden_size=c.hidden_size,
        hidden_size=c.hidden_size, vocab_size=c.vocab_size, draft_vocab_size=c.vocab_size,
        num_hidden_layers=layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
        intermediate_size=c.intermediate_size, rms_norm_eps=c.rms_norm_eps, rope_theta=10000.0,
        block_size=block_size, mask_token_id=2, markov_rank=32, sample_from_anchor=anchor, causal=False)
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
