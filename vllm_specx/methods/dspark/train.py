"""DSpark's trainer hooks (see `vllm_specx.training.trainer`): build a head for a target, cut
training blocks out of on-policy samples, run the teacher-forced forward, save.

Each batch takes `size` sequences, picks `--anchors` random anchor positions a per sequence in
the generated part, and trains the block [x_a, mask, ...] of block_size slots to predict
x_{a+1..a+N}, N = `max_drafts` (every slot in the anchor layout, slots 1.. in the fill-in layout),
with the Markov head teacher-forced (prev_k = x_{a+k}). All blocks of a sequence run in one attention call
(mask from `model.block_mask`).
"""

from __future__ import annotations

import argparse
import random

import torch
import torch.nn.functional as F

from vllm_specx.methods.dspark.checkpoint import save_specx
from vllm_specx.methods.dspark.config import DSparkDraftConfig
from vllm_specx.methods.dspark.model import DSparkDraft, block_mask
from vllm_specx.training.losses import DraftOutput


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=24, help="blocks per sequence")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--markov-rank", type=int, default=64)
    ap.add_argument("--mask-token-id", type=int, default=None,
                    help="default: the target tokenizer's <|mask|>")
    ap.add_argument("--markov-head-type", default="vanilla", choices=["vanilla", "gated", "rnn"])
    ap.add_argument("--layout", default="anchor", choices=["anchor", "fill-in"],
                    help="anchor: a block of B slots drafts B tokens; fill-in: DFlash's, B - 1")
    ap.add_argument("--causal", action="store_true", help="causal attention inside the block")
    ap.add_argument("--sliding-window", type=int, default=None, help="context window of a block")


def build(target, args, data_meta: dict, embed: torch.Tensor, lm_head: torch.Tensor) -> DSparkDraft:
    """A freshly initialised head for `target` (transformers model) on the data's taps."""
    if args.mask_token_id is None:
        from transformers import AutoTokenizer
        args.mask_token_id = AutoTokenizer.from_pretrained(args.target).convert_tokens_to_ids("<|mask|>")
    cfg = DSparkDraftConfig.for_target(
        target.config.to_dict(), target_layer_ids=tuple(data_meta["taps"]), num_hidden_layers=args.layers,
        block_size=args.block_size, mask_token_id=args.mask_token_id, markov_rank=args.markov_rank,
        sample_from_anchor=getattr(args, "layout", "anchor") == "anchor", causal=getattr(args, "causal", False),
        markov_head_type=getattr(args, "markov_head_type", "vanilla"),
        sliding_window=getattr(args, "sliding_window", None))
    draft = DSparkDraft(cfg, embed, lm_head)
    for name, p in draft.named_parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    torch.nn.init.zeros_(draft.markov_head.markov_w2.weight)  # start as pure DFlash logits
    return draft


def batch(draft: DSparkDraft, samples: list[dict], rng: random.Random, size: int, args) -> dict:
    c = draft.cfg
    return make_batch(samples, rng, size, args.seq_len, args.anchors, c.max_drafts, c.mask_token_id,
                      q=c.block_size)


def make_batch(samples: list[dict], rng: random.Random, batch: int, seq_len: int, anchors: int,
               n: int, mask_id: int, q: int | None = None) -> dict[str, torch.Tensor]:
    """Crop `batch` sequences to `seq_len` and place `anchors` blocks of `q` slots in each
    (default q = n + 1), each with `n` draft targets.

    Returns tensors: taps [B, S, n_taps*H], ids [B, S], anchors [B, M], block_ids/pos [B, M*q],
    targets/prev [B, M, n] (-100 = no loss).
    """
    q = n + 1 if q is None else q
    taps, ids, anc = [], [], []
    for s in rng.sample(samples, batch):
        total, p = len(s["ids"]), s["prompt_len"]
        hi_start = max(0, total - seq_len)  # crop inside the sequence
        start = rng.randint(min(max(0, p - seq_len // 2), hi_start), hi_start)  # mostly generated text
        crop = slice(start, start + seq_len)
        x, t = s["ids"][crop], s["taps"][crop].float()
        pad = seq_len - len(x)
        x = F.pad(x, (0, pad), value=0)
        t = F.pad(t, (0, 0, 0, pad))
        lo, hi = max(1, p - 1 - start), min(total - start, seq_len) - 2  # a >= 1 context row; a+1 in crop
        a = sorted(rng.randint(lo, max(lo, hi)) for _ in range(anchors))
        taps.append(t), ids.append(x), anc.append(a)
        valid_end = min(seq_len, total - start)
        ids[-1][valid_end:] = -100  # marks padding for the targets below
    ids, anc = torch.stack(ids), torch.tensor(anc)
    offs = torch.arange(q)
    pos = (anc[..., None] + offs).reshape(len(anc), -1)  # [B, M*q]
    block_ids = torch.full_like(pos, mask_id)
    block_ids.view(len(anc), anchors, q)[..., 0] = ids.gather(1, anc)
    tgt_pos = anc[..., None] + 1 + torch.arange(n)  # [B, M, n]
    in_range = tgt_pos < ids.shape[1]
    tpos = tgt_pos.clamp(max=ids.shape[1] - 1)
    targets = torch.where(in_range, ids.gather(1, tpos.flatten(1)).view_as(tpos), -100)
    prev = ids.gather(1, (tpos - 1).flatten(1)).view_as(tpos).clamp(min=0)
    return {"taps": torch.stack(taps), "anchors": anc, "block_ids": block_ids.clamp(min=0), "pos": pos,
            "targets": targets, "prev": prev}


def forward(draft: DSparkDraft, b: dict[str, torch.Tensor]) -> DraftOutput:
    """Teacher-forced draft logits [B, M, n, V] for every block, with their targets [B, M, n]."""
    bsz, s = b["taps"].shape[:2]
    m, n = b["targets"].shape[1:]
    q = b["pos"].shape[1] // m
    mask = block_mask(b["anchors"], s, q, draft.cfg.causal, draft.cfg.sliding_window)
    h = draft.block_states(b["taps"], torch.arange(s).expand(bsz, s), b["block_ids"], b["pos"], mask)
    h = h.view(bsz, m, q, -1)
    o = draft.cfg.slot_offset
    slot_prev = b["prev"]  # [B, M, n]: prev of draft k = x_{a+k}
    if o:  # fill-in: slot 0 (the anchor's) has the anchor as prev too
        slot_prev = torch.cat([b["block_ids"].view(bsz, m, q)[..., :1], slot_prev], -1)
    logits = draft.slot_logits(h[:, :, :o + n], slot_prev[..., :o + n])[:, :, o:o + n]
    return DraftOutput(logits=logits, targets=b["targets"])


def save(draft: DSparkDraft, out) -> None:
    save_specx(draft, out)
