"""Train a DSpark head on on-policy data (see `training.data`), write it in vllm-specx format.

    python -m vllm_specx.training.train_dspark --target assets/ref-target --data runs/data \
        --out assets/drafts/ref-dspark --steps 600

Each step takes `--batch` sequences, picks `--anchors` random anchor positions a per sequence in
the generated part, and trains the block [x_a, mask, ...] to predict x_{a+1..a+N} (teacher-forced
Markov head: prev_k = x_{a+k}) with cross-entropy weighted exp(-k / gamma) over draft position k.
All blocks of a sequence run in one attention call (mask from `dspark_torch.block_mask`).
Deterministic given --seed. Losses beyond cross-entropy come with the training issue.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from vllm_specx.config import DSparkDraftConfig
from vllm_specx.models.dspark_io import save_specx
from vllm_specx.models.dspark_torch import DSparkDraft, block_mask
from vllm_specx.training.data import load_samples
from vllm_specx.training.taps import embed_and_head, load_target


def make_batch(samples: list[dict], rng: random.Random, batch: int, seq_len: int, anchors: int,
               n: int, mask_id: int) -> dict[str, torch.Tensor]:
    """Crop `batch` sequences to `seq_len` and place `anchors` blocks in each.

    Returns tensors: taps [B, S, n*H], ids [B, S], anchors [B, M], block_ids/pos [B, M*(n+1)],
    targets/prev [B, M, n] (-100 = no loss).
    """
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
    q = n + 1
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


def loss_fn(draft: DSparkDraft, b: dict[str, torch.Tensor], gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted CE and per-position greedy accuracy [n] of one batch."""
    bsz, s = b["taps"].shape[:2]
    m, n = b["targets"].shape[1:]
    q = n + 1
    mask = block_mask(b["anchors"], s, q, draft.cfg.causal)
    h = draft.block_states(b["taps"], torch.arange(s).expand(bsz, s), b["block_ids"], b["pos"], mask)
    slots = torch.tensor([draft.slot_of_draft(k) for k in range(n)])
    h = h.view(bsz, m, q, -1)[:, :, slots]  # [B, M, n, H]
    logits = h @ draft.lm_head.t() + draft.markov_bias(b["prev"])
    ce = F.cross_entropy(logits.flatten(0, 2), b["targets"].flatten(), reduction="none").view(bsz, m, n)
    valid = (b["targets"] != -100).float()
    w = torch.exp(-torch.arange(n) / gamma)
    loss = (ce * valid * w).sum() / (valid * w).sum().clamp(min=1)
    acc = ((logits.argmax(-1) == b["targets"]).float() * valid).sum((0, 1)) / valid.sum((0, 1)).clamp(min=1)
    return loss, acc


def build_draft(target, args, taps: tuple[int, ...]) -> DSparkDraft:
    cfg = DSparkDraftConfig.for_target(
        target.config.to_dict(), target_layer_ids=taps, num_hidden_layers=args.layers,
        block_size=args.block_size, mask_token_id=args.mask_token_id, markov_rank=args.markov_rank)
    draft = DSparkDraft(cfg, *embed_and_head(target))
    for name, p in draft.named_parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    torch.nn.init.zeros_(draft.markov_head.markov_w2.weight)  # start as pure DFlash logits
    return draft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=24)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--markov-rank", type=int, default=64)
    ap.add_argument("--mask-token-id", type=int, default=None, help="default: the target tokenizer's <|mask|>")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--gamma", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    meta = json.loads((Path(args.data) / "meta.json").read_text())
    target = load_target(args.target)
    if args.mask_token_id is None:
        from transformers import AutoTokenizer
        args.mask_token_id = AutoTokenizer.from_pretrained(args.target).convert_tokens_to_ids("<|mask|>")
    samples = load_samples(Path(args.data))
    rng.shuffle(samples)
    val, train = samples[:32], samples[32:]
    draft = build_draft(target, args, tuple(meta["taps"]))
    n = args.block_size - 1
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=args.lr,
                            weight_decay=0.01, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / args.steps))))
    val_batch = make_batch(val, random.Random(1), len(val), args.seq_len, args.anchors, n, args.mask_token_id)
    t0, log = time.time(), []
    for step in (bar := tqdm(range(args.steps), desc="train")):
        b = make_batch(train, rng, args.batch, args.seq_len, args.anchors, n, args.mask_token_id)
        loss, _ = loss_fn(draft, b, args.gamma)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % 100 == 0 or step + 1 == args.steps:
            with torch.no_grad():
                vloss, vacc = loss_fn(draft, val_batch, args.gamma)
            # Expected accepted length under greedy verification if positions were independent.
            est_tau = 1 + torch.cumprod(vacc, 0).sum().item()
            log.append({"step": step + 1, "train_loss": round(loss.item(), 4), "val_loss": round(vloss.item(), 4),
                        "val_acc_per_pos": [round(a, 3) for a in vacc.tolist()], "est_tau": round(est_tau, 3)})
            tqdm.write(json.dumps(log[-1]))
    record = {"command": "python -m vllm_specx.training.train_dspark " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()), "data": meta,
        "train_samples": len(train), "wall_s": round(time.time() - t0, 1), "log": log}
    save_specx(draft, args.out)
    (Path(args.out) / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
