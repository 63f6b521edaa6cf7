"""EAGLE-3's trainer hooks (see `vllm_specx.training.trainer`): the shared on-policy blocks
(`training.blocks.make_batch`), the chain of `model.Eagle3Draft.chain_logits`
unrolled for `--drafts` steps (training-time test), saved in vLLM's native EAGLE-3 format."""

from __future__ import annotations

import argparse
import random

import torch

from vllm_specx.training.blocks import add_chain_args, add_draft_vocab_arg, data_vocab, make_batch, parse_layers
from vllm_specx.training.taps import select_taps
from vllm_specx.methods.eagle3.checkpoint import save as save_eagle3
from vllm_specx.methods.eagle3.config import Eagle3Config
from vllm_specx.methods.eagle3.model import Eagle3Draft
from vllm_specx.training.losses import DraftOutput, to_draft_vocab


def add_args(ap: argparse.ArgumentParser) -> None:
    add_chain_args(ap)
    add_draft_vocab_arg(ap)
    ap.add_argument("--taps", default="",
                    help="comma-separated target layers the draft fuses, among the data's taps "
                         "(default: all of the data's taps)")
    ap.add_argument("--init-from", default=None,
                    help="start from this EAGLE-3 draft (vLLM's format, e.g. one this trainer wrote): "
                         "its config must match this run's (taps, vocabulary)")


def build(target, args, data_meta: dict, embed: torch.Tensor, lm_head: torch.Tensor) -> Eagle3Draft:
    data_taps = list(data_meta["taps"])
    taps = parse_layers("--taps", args.taps) or data_taps
    missing = [t for t in taps if t not in data_taps]
    if missing:
        raise SystemExit(f"--taps {args.taps}: layer(s) {missing} are not among the data's taps {data_taps}")
    tc = target.config.to_dict()
    cfg = Eagle3Config.for_target(tc, sorted(taps), getattr(args, "draft_vocab", None) or 0)
    ids = data_vocab(args.data, cfg.draft_vocab_size, cfg.vocab_size) if cfg.reduced_vocab else None
    draft = Eagle3Draft(cfg, embed, lm_head, ids)
    for p in draft.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    if getattr(args, "init_from", None):
        from vllm_specx.checkpoint import load_tensors, read_config_json

        try:
            start = Eagle3Config.from_vllm_config_json(read_config_json(args.init_from))
            if start != cfg:
                raise ValueError(f"its config {start} is not this run's {cfg} (give the same --taps "
                                 f"and --draft-vocab it was trained with)")
            draft.load_vllm_state_dict(load_tensors(args.init_from))
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            raise SystemExit(f"--init-from {args.init_from}: {e}") from None
    draft.tap_slices = [data_taps.index(t) for t in cfg.target_layer_ids]
    return draft


def batch(draft: Eagle3Draft, samples, rng: random.Random, size: int, args, at=None) -> dict:
    b = make_batch(samples, rng, size, args.seq_len, args.anchors, args.drafts, mask_id=0, at=at)
    if draft.tap_slices != list(range(b["taps"].shape[-1] // draft.cfg.target_hidden_size)):
        b["taps"] = select_taps(b["taps"], draft.tap_slices, draft.cfg.target_hidden_size)
    b["chain_tokens"] = args.chain_tokens
    return b


def forward(draft: Eagle3Draft, b: dict) -> DraftOutput:
    n = b["targets"].shape[-1]
    logits = draft.chain_logits(b["taps"], b["ids"], b["anchors"], n, b.get("chain_tokens", "target"))
    out = DraftOutput(logits=logits, targets=b["targets"], target_ids=b.get("topk_ids"),
                      target_logp=b.get("topk_logp"))
    return to_draft_vocab(out, draft.t2d) if draft.cfg.reduced_vocab else out


def save(draft: Eagle3Draft, out, dtype: torch.dtype = torch.float32) -> None:
    save_eagle3(draft, out, dtype)
