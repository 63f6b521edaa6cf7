"""DSpark's trainer hooks (see `vllm_specx.training.trainer`): build a head for a target, cut
training blocks out of on-policy samples, run the teacher-forced forward, save.

Each batch takes `size` sequences, picks `--anchors` random anchor positions a per sequence in
the generated part, and trains the block [x_a, mask, ...] of block_size slots to predict
x_{a+1..a+N}, N = `max_drafts` (every slot in the anchor layout, slots 1.. in the fill-in layout).
All blocks of a sequence run in one attention call (mask from `model.block_mask`).

Which tokens the sequential (Markov) head sees, `--chain-tokens`:

* `target` (default): prev_k = x_{a+k}, the target's own continuation. In serving, draft k is
  only ever verified when drafts 0..k-1 were accepted; at temperature 0 that means they *were*
  x_{a+1..a+k}, so these are exactly the tokens the head conditions on whenever its output
  counts, and the target distribution at k (the data's top-k) is conditioned on the same prefix.
* `draft`: prev_k = the head's own greedy draft k-1 (what it sees before verification, right or
  wrong). Where it is wrong the chain is rejected in serving anyway, and the stored target
  distribution is conditioned on x, not on the draft, so this trains on cases serving discards;
  it is here to measure that.

`tests/e2e/test_draft_probs.py` checks that the per-slot q of this forward (for a block whose
continuation is the proposer's drafts) equals what vLLM's rejection sampler receives.
"""

from __future__ import annotations

import argparse
import random

import torch

from vllm_specx.methods.dspark.checkpoint import save_specx
from vllm_specx.methods.dspark.config import DSparkDraftConfig
from vllm_specx.methods.dspark.model import DSparkDraft, block_mask
from vllm_specx.methods.dspark.recipe import init_final_tap, warm_start
from vllm_specx.training.blocks import make_batch
from vllm_specx.training.losses import DraftOutput
from vllm_specx.training.taps import select_taps


# What a training record written before an argument existed meant by leaving it out (the
# trainer's `--config` reads these for absent keys): the baseline, so old records re-run as they ran.
RECORD_DEFAULTS = {"taps": "", "final_layer_tap": False, "per_layer_fusion": False,
                   "slot_queries": False, "init_from": None}


def add_args(ap: argparse.ArgumentParser) -> None:
    """DSpark's flags; the full recipe is the default (`--no-final-layer-tap --no-per-layer-fusion
    --no-slot-queries --markov-head-type vanilla` is the baseline)."""
    on_off = argparse.BooleanOptionalAction
    ap.add_argument("--taps", default="",
                    help="the draft's taps among the data's, e.g. 1,4,6 (default: the data's taps "
                         "except the target's last layer, which --final-layer-tap adds)")
    ap.add_argument("--final-layer-tap", action=on_off, default=True,
                    help="recipe: the target's final residual (its last layer; in the data) as one more tap")
    ap.add_argument("--per-layer-fusion", action=on_off, default=True,
                    help="recipe: each draft layer its own softmax mixture of the per-tap contexts")
    ap.add_argument("--slot-queries", action=on_off, default=True,
                    help="recipe: a learned starting embedding per query slot")
    ap.add_argument("--init-from", default=None,
                    help="warm start from a DSpark checkpoint (ours or speculators'; e.g. a baseline "
                         "head): shared tensors copied, new ones initialised as the recipe says")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=24, help="blocks per sequence")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--markov-rank", type=int, default=64)
    ap.add_argument("--mask-token-id", type=int, default=None,
                    help="default: the target tokenizer's <|mask|>")
    ap.add_argument("--markov-head-type", default="rnn", choices=["vanilla", "gated", "rnn"],
                    help="rnn (the recipe's recurrent head), or vanilla (the baseline) / gated")
    ap.add_argument("--layout", default="anchor", choices=["anchor", "fill-in"],
                    help="anchor: a block of B slots drafts B tokens; fill-in: DFlash's, B - 1")
    ap.add_argument("--causal", action="store_true", help="causal attention inside the block")
    ap.add_argument("--sliding-window", type=int, default=None, help="context window of a block")
    ap.add_argument("--chain-tokens", default="target", choices=["target", "draft"],
                    help="previous tokens the Markov head is trained on (see the module docstring)")


def build(target, args, data_meta: dict, embed: torch.Tensor, lm_head: torch.Tensor) -> DSparkDraft:
    """A freshly initialised head for `target` (transformers model) on the data's taps."""
    if args.mask_token_id is None:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(target.name_or_path)
        args.mask_token_id = tok.get_vocab().get("<|mask|>", tok.mask_token_id)
        if args.mask_token_id is None:
            raise SystemExit(f"--target {args.target}: its tokenizer has no <|mask|> or mask token; pass "
                             "--mask-token-id (any id whose target embedding the mask slots start from)")
    tc = target.config.to_dict()
    taps = draft_taps(args, list(data_meta["taps"]), int(tc["num_hidden_layers"]))
    cfg = DSparkDraftConfig.for_target(
        tc, target_layer_ids=taps, num_hidden_layers=args.layers,
        block_size=args.block_size, mask_token_id=args.mask_token_id, markov_rank=args.markov_rank,
        sample_from_anchor=getattr(args, "layout", "anchor") == "anchor", causal=getattr(args, "causal", False),
        markov_head_type=getattr(args, "markov_head_type", "vanilla"),
        sliding_window=getattr(args, "sliding_window", None),
        final_layer_tap=args.final_layer_tap, per_layer_fusion=args.per_layer_fusion,
        slot_queries=args.slot_queries)
    draft = DSparkDraft(cfg, embed, lm_head)
    for name, p in draft.named_parameters():
        if p.dim() > 1 and name not in ("slot_queries", "fusion_logits"):  # those start at the baseline
            torch.nn.init.normal_(p, std=0.02)
    torch.nn.init.zeros_(draft.markov_head.markov_w2.weight)  # start as pure DFlash logits
    try:
        init_final_tap(draft, target.name_or_path)
        if args.init_from:
            warm_start(draft, args.init_from)
    except (OSError, ValueError) as e:
        raise SystemExit(f"--init-from {args.init_from}: {e}" if args.init_from else str(e)) from None
    draft.tap_slices = [list(data_meta["taps"]).index(t) for t in taps]
    return draft


def draft_taps(args, data_taps: list[int], num_layers: int) -> tuple[int, ...]:
    """The draft's taps (ascending) from `--taps` / `--final-layer-tap` and the data's taps."""
    last = num_layers - 1
    if args.taps.strip():
        try:
            taps = [int(x) for x in args.taps.split(",") if x.strip()]
        except ValueError:
            raise SystemExit(f"--taps {args.taps!r}: expected comma-separated layer numbers") from None
    else:
        taps = [t for t in data_taps if t != last]
    if args.final_layer_tap:
        taps = [t for t in taps if t != last] + [last]
    missing = [t for t in taps if t not in data_taps]
    if missing:
        hint = (f" (--final-layer-tap needs the target's last layer {last}: make the data with "
                f"`vllm-specx gen-data ... --taps ...,{last}`, or pass --no-final-layer-tap)"
                if last in missing else "")
        raise SystemExit(f"--data: its taps {data_taps} lack layer(s) {missing}{hint}")
    return tuple(sorted(taps))


def batch(draft: DSparkDraft, samples: list[dict], rng: random.Random, size: int, args) -> dict:
    c = draft.cfg
    b = make_batch(samples, rng, size, args.seq_len, args.anchors, c.max_drafts, c.mask_token_id,
                   q=c.block_size)
    slices, ht = getattr(draft, "tap_slices", None), c.target_hidden_size
    if slices is not None and slices != list(range(b["taps"].shape[-1] // ht)):
        b["taps"] = select_taps(b["taps"], slices, ht)
    b["chain_tokens"] = getattr(args, "chain_tokens", "target")
    return b


def forward(draft: DSparkDraft, b: dict[str, torch.Tensor]) -> DraftOutput:
    """Teacher-forced draft logits [B, M, n, V] for every block, with their targets [B, M, n]."""
    bsz, s = b["taps"].shape[:2]
    m, n = b["targets"].shape[1:]
    q = b["pos"].shape[1] // m
    mask = block_mask(b["anchors"], s, q, draft.cfg.causal, draft.cfg.sliding_window)
    h = draft.block_states(b["taps"], torch.arange(s).expand(bsz, s), b["block_ids"], b["pos"], mask, q)
    h = h.view(bsz, m, q, -1)
    o = draft.cfg.slot_offset
    slot_prev = b["prev"]  # [B, M, n]: prev of draft k = x_{a+k}
    if o:  # fill-in: slot 0 (the anchor's) has the anchor as prev too
        slot_prev = torch.cat([b["block_ids"].view(bsz, m, q)[..., :1], slot_prev], -1)
    if b.get("chain_tokens", "target") == "draft":
        logits = own_chain_logits(draft, h[:, :, :o + n], slot_prev[..., :o + n])[:, :, o:o + n]
    else:
        logits = draft.slot_logits(h[:, :, :o + n], slot_prev[..., :o + n])[:, :, o:o + n]
    return DraftOutput(logits=logits, targets=b["targets"], target_ids=b.get("topk_ids"),
                       target_logp=b.get("topk_logp"))


def own_chain_logits(draft: DSparkDraft, h: torch.Tensor, slot_prev: torch.Tensor) -> torch.Tensor:
    """Slot logits [..., Q, V] with the Markov head fed its own greedy drafts, as the proposer
    drafts: slot 0 (anchor layout) or slots 0 and 1 (fill-in) take the anchor, later slots the
    argmax of the slot before (no gradient through the choice)."""
    o = draft.cfg.slot_offset
    base = h @ draft.lm_head.t()
    prev, state, out = slot_prev[..., 0], None, []
    for j in range(h.shape[-2]):
        bias, state = draft.markov_head.step(prev, h[..., j, :], state)
        out.append(base[..., j, :] + bias)
        if j >= o:
            prev = out[-1].detach().argmax(-1)
    return torch.stack(out, -2)


def save(draft: DSparkDraft, out, dtype: torch.dtype = torch.float32) -> None:
    save_specx(draft, out, dtype=dtype)
