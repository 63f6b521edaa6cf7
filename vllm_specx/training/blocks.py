"""Training blocks cut out of on-policy samples, shared by every method's trainer hooks.

A block is anchored at a position a of a sequence (the last verified token when serving): the
draft sees the target's taps of positions < a, the anchor token x_a, and is trained to predict
x_{a+1} .. x_{a+n}, against the target's tokens and, when the data has them, its top-k
distributions (row a + k of the data's top-k is the target's distribution of x_{a+1+k}).
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F


def to_device(batch: dict, device) -> dict:
    """A hook's batch (`batch(...)`: tensors and plain values) with its tensors on `device`."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def add_chain_args(ap) -> None:
    """The trainer flags of a recurrent (chain) drafter: sequence crop, chains per sequence, steps
    unrolled per chain and which token each step reads."""
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=24, help="chains per sequence")
    ap.add_argument("--drafts", type=int, default=7, help="draft steps unrolled per chain")
    ap.add_argument("--chain-tokens", default="target", choices=["target", "draft"],
                    help="step j's input token: the target's x_{a+j} or the chain's own draft")


def parse_layers(flag: str, text: str) -> list[int]:
    """A comma-separated list of target layers given to `flag` (empty text: [])."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{flag} {text!r}: expected comma-separated layer numbers") from None


def add_draft_vocab_arg(ap) -> None:
    """`--draft-vocab N`: a reduced draft vocabulary (`vllm_specx.vocab`)."""
    ap.add_argument("--draft-vocab", type=int, default=None,
                    help="a reduced draft vocabulary: the N target tokens most frequent in the data's "
                         "responses (default: the target's full vocabulary; see vllm_specx.vocab)")


def data_vocab(data, size: int, vocab_size: int, exclude: tuple[int, ...] = ()) -> torch.Tensor:
    """The `size` target tokens most frequent in the responses of `data` (a `gen-data` folder's
    tokens.jsonl), tokens in `exclude` (e.g. a mask token, never drafted) left out; ascending ids."""
    from vllm_specx import vocab
    from vllm_specx.training.samples import response_ids

    drop = set(exclude)
    ids, counts = vocab.by_frequency(([t for t in r if t not in drop] for r in response_ids(data)),
                                     size, vocab_size)
    if int((counts[ids] > 0).sum()) < size:  # fewer distinct tokens than the size
        raise SystemExit(f"--draft-vocab {size}: the data's responses have only "
                         f"{int((counts > 0).sum())} distinct tokens; give a smaller size")
    print(f"draft vocabulary: {size} of {vocab_size} tokens, "
          f"{float(counts[ids].sum()) / max(1, int(counts.sum())):.4f} of the data's response tokens")
    return ids


ANCHOR_DRAWS = ("replace", "unique")


def make_batch(samples: list[dict], rng: random.Random, batch: int, seq_len: int, anchors: int,
               n: int, mask_id: int, q: int | None = None,
               at: list[list[int]] | None = None, draw: str = "replace") -> dict[str, torch.Tensor]:
    """Crop `batch` sequences to `seq_len` and place `anchors` random blocks in each (see
    `assemble`). With `at` (one anchor list per sample, equal lengths): every sample of `samples`
    whole, its blocks at those anchors (`serving_count`; `rng`, `batch`, `seq_len` and `anchors`
    unused).

    `draw` says where the anchors fall (`anchor_positions`): "replace" (every method's trainer
    before the choice: drawn with replacement, from the last prompt token on, blocks may run past
    the crop), "unique" (the references' way: without replacement, only generated tokens, whole
    blocks; `anchors` 0 takes every such position).
    """
    if at is not None:
        crops = [{k: s[k] for k in ("ids", "taps", "topk_ids", "topk_logp") if k in s} for s in samples]
        return assemble(crops, [list(a) for a in at], max(len(c["ids"]) for c in crops), n, mask_id, q)
    crops, anc = [], []
    for s in rng.sample(samples, batch):
        total, p = len(s["ids"]), s["prompt_len"]
        hi_start = max(0, total - seq_len)  # crop inside the sequence
        start = rng.randint(min(max(0, p - seq_len // 2), hi_start), hi_start)  # mostly generated text
        crop = slice(start, start + seq_len)
        crops.append({k: s[k][crop] for k in ("ids", "taps", "topk_ids", "topk_logp") if k in s})
        anc.append(anchor_positions(rng, p - start, min(total - start, seq_len), anchors, n, draw))
    if draw == "unique":  # equal counts per sequence: pad with blocks that carry no target
        m = max(len(a) for a in anc)
        anc = [a + [-1] * (m - len(a)) for a in anc]
    return assemble(crops, anc, seq_len, n, mask_id, q)


def anchor_positions(rng: random.Random, prompt_end: int, length: int, anchors: int, n: int,
                     draw: str) -> list[int]:
    """Sorted anchor positions in a crop of `length` tokens whose generated part starts at
    `prompt_end` (may be <= 0), for blocks of `n` targets.

    "replace": `anchors` draws with replacement from [max(1, prompt_end - 1), length - 2] (the
    last prompt token may anchor; a block may run past the crop, its missing targets unscored).
    "unique": without replacement from [max(1, prompt_end), length - 1 - n] (an anchor is a
    generated token, as in serving, and every block is whole), all of them when `anchors` is 0
    or the range is shorter; a crop too short for one whole block falls back to its last
    generated positions."""
    if draw == "replace":
        lo, hi = max(1, prompt_end - 1), length - 2
        return sorted(rng.randint(lo, max(lo, hi)) for _ in range(anchors))
    if draw != "unique":
        raise ValueError(f"anchor draw {draw!r} not one of {list(ANCHOR_DRAWS)}")
    lo, hi = max(1, prompt_end), length - 1 - n
    if hi < lo:
        hi = length - 2
    cands = range(lo, max(lo, hi) + 1)
    if anchors and anchors < len(cands):
        return sorted(rng.sample(cands, anchors))
    return list(cands)


def assemble(crops: list[dict], anchors: list[list[int]], seq_len: int, n: int, mask_id: int,
             q: int | None = None) -> dict[str, torch.Tensor]:
    """Training blocks at given anchors: blocks of `q` slots (default n + 1) at anchor positions
    a of each sequence (its rows < a are the block's context), each with `n` draft targets
    x_{a+1..a+n} and, when the crops carry the target's top-k, its distributions (row a + k of
    the top-k is the target's distribution of x_{a+1+k}).

    Args:
        crops: per sequence {"ids": [T], "taps": [T, n_taps*H], optional "topk_ids"/"topk_logp"
            [T, K]}, T <= seq_len (right-padded here).
        anchors: per sequence, M anchor positions (1 <= a, a + 1 < T); -1 marks a padding
            block (its targets are all -100).
    Returns tensors: taps [B, S, n_taps*H], ids [B, S] (-100 = padding), anchors [B, M], block_ids/pos [B, M*q],
    targets/prev [B, M, n] (-100 = no loss), and topk_ids/topk_logp [B, M, n, K] when given.
    """
    q = n + 1 if q is None else q
    pad_block = torch.tensor(anchors) < 0  # [B, M]: padding blocks (`make_batch`'s "unique" draw)
    anchors = [[max(a, 1) for a in row] for row in anchors]
    taps, ids = [], []
    for c in crops:
        x, pad = c["ids"], seq_len - len(c["ids"])
        ids.append(F.pad(x, (0, pad), value=-100))  # -100 marks padding for the targets below
        taps.append(F.pad(c["taps"].float(), (0, 0, 0, pad)))
    ids, anc = torch.stack(ids), torch.tensor(anchors)
    offs = torch.arange(q)
    pos = (anc[..., None] + offs).reshape(len(anc), -1)  # [B, M*q]
    block_ids = torch.full_like(pos, mask_id)
    block_ids.view(len(anc), anc.shape[1], q)[..., 0] = ids.gather(1, anc)
    tgt_pos = anc[..., None] + 1 + torch.arange(n)  # [B, M, n]
    in_range = tgt_pos < ids.shape[1]
    tpos = tgt_pos.clamp(max=ids.shape[1] - 1)
    targets = torch.where(in_range & ~pad_block[..., None], ids.gather(1, tpos.flatten(1)).view_as(tpos), -100)
    prev = ids.gather(1, (tpos - 1).flatten(1)).view_as(tpos).clamp(min=0)
    out = {"taps": torch.stack(taps), "ids": ids, "anchors": anc, "block_ids": block_ids.clamp(min=0),
           "pos": pos, "targets": targets, "prev": prev}
    if all("topk_ids" in c for c in crops):
        for key in ("topk_ids", "topk_logp"):
            rows = torch.stack([F.pad(c[key], (0, 0, 0, seq_len - len(c[key]))) for c in crops])  # [B, S, K]
            k = rows.shape[-1]
            out[key] = rows.gather(1, (tpos - 1).flatten(1)[..., None].expand(-1, -1, k)).view(*tpos.shape, k)
    return out
