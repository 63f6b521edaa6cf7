"""EAGLE-3's trainer hooks (see `vllm_specx.training.trainer`): the shared on-policy blocks
(`training.blocks.make_batch`), the chain of `model.Eagle3Draft.chain_logits`
unrolled for `--drafts` steps (training-time test), saved in vLLM's native EAGLE-3 format."""

from __future__ import annotations

import argparse
import random

import torch

from vllm_specx.training.blocks import add_chain_args, make_batch
from vllm_specx.methods.eagle3.checkpoint import save as save_eagle3
from vllm_specx.methods.eagle3.config import Eagle3Config
from vllm_specx.methods.eagle3.model import Eagle3Draft
from vllm_specx.training.losses import DraftOutput


def add_args(ap: argparse.ArgumentParser) -> None:
    add_chain_args(ap)


def build(target, args, data_meta: dict, embed: torch.Tensor, lm_head: torch.Tensor) -> Eagle3Draft:
    cfg = Eagle3Config.for_target(target.config.to_dict(), data_meta["taps"])
    draft = Eagle3Draft(cfg, embed, lm_head)
    for p in draft.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    return draft


def batch(draft: Eagle3Draft, samples, rng: random.Random, size: int, args) -> dict:
    b = make_batch(samples, rng, size, args.seq_len, args.anchors, args.drafts, mask_id=0)
    b["chain_tokens"] = args.chain_tokens
    return b


def forward(draft: Eagle3Draft, b: dict) -> DraftOutput:
    n = b["targets"].shape[-1]
    logits = draft.chain_logits(b["taps"], b["ids"], b["anchors"], n, b.get("chain_tokens", "target"))
    return DraftOutput(logits=logits, targets=b["targets"], target_ids=b.get("topk_ids"),
                       target_logp=b.get("topk_logp"))


def save(draft: Eagle3Draft, out, dtype: torch.dtype = torch.float32) -> None:
    save_eagle3(draft, out, dtype)
