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

The confidence head (`--confidence-head hidden|hidden+markov`, DSpark's confidence-scheduled
drafting): p_k = sigmoid(proj([h_k; W1[prev_k]])) per draft slot, trained with the trainer's
`--confidence-weight` / `--train-only confidence` against the slot's realised teacher-forced
acceptance (`training.losses.confidence_labels`, on the slots a block reaches). Its inputs (slot
states, W1[prev]) are detached: its loss trains the head, never the drafts it judges.
`--train-only confidence --init-from <draft>` adds a head to a trained draft and leaves every
other tensor as it was (refused when the warm start would initialise anything else anew or drop
a tensor). The proposer reads the head with prev = its own drafts (`drafted_confidence`), which
is the teacher-forced input wherever the earlier drafts were accepted.

`tests/e2e/test_draft_probs.py` checks that the per-slot q of this forward (for a block whose
continuation is the proposer's drafts) equals what vLLM's rejection sampler receives.
"""

from __future__ import annotations

import argparse
import dataclasses
import random

import torch

from vllm_specx import vocab
from vllm_specx.checkpoint import load_tensors
from vllm_specx.methods.dspark.checkpoint import save_specx
from vllm_specx.methods.dspark.config import DRAFT_OPTIONS, DSparkDraftConfig
from vllm_specx.methods.dspark.model import DSparkDraft, block_mask, next_ids_of
from vllm_specx.methods.dspark.recipe import init_final_tap, warm_start
from vllm_specx.training import blocks
from vllm_specx.training.blocks import add_draft_vocab_arg, make_batch
from vllm_specx.training.losses import DraftOutput, to_draft_vocab
from vllm_specx.training.taps import final_norm, select_taps


# What a training record written before an argument existed meant by leaving it out (the
# trainer's `--config` reads these for absent keys): the baseline, so old records re-run as they ran.
RECORD_DEFAULTS = {"taps": "", "final_layer_tap": False, "per_layer_fusion": False,
                   "slot_queries": False, "init_from": None, "confidence_head": None,
                   "next_token_stream": None, "anchor_draw": "replace", "final_tap_init": "zero"}


def _stream(text: str) -> str | None:
    """`--next-token-stream`'s value: none -> None (a draft without the stream), fused, added."""
    if text not in ("none", "fused", "added"):
        raise argparse.ArgumentTypeError(f"{text!r} is not one of none, fused, added")
    return None if text == "none" else text


def add_args(ap: argparse.ArgumentParser) -> None:
    """DSpark's flags. The defaults are the SmolLM2 ablation's best measured combination
    (`benchmarks/results/dspark-ablation-smollm2`): the baseline's switches (no final-layer tap,
    no per-layer fusion, no slot queries, a vanilla Markov head) with the next-token stream
    "added" and a Markov head of rank 256. The full recipe, below the baseline there, is
    `--final-layer-tap --per-layer-fusion --slot-queries --markov-head-type rnn`."""
    on_off = argparse.BooleanOptionalAction
    ap.add_argument("--taps", default="",
                    help="the draft's taps among the data's, e.g. 1,4,6 (default: the data's taps "
                         "except the target's last layer, which --final-layer-tap adds)")
    ap.add_argument("--final-layer-tap", action=on_off, default=False,
                    help="recipe: the target's final residual (its last layer; in the data) as one more tap")
    ap.add_argument("--final-tap-init", default="zero", choices=["zero", "final-norm"],
                    help="the final-layer tap's fc columns where the target has no native MTP projection "
                         "(whose part is used where it has one): zero (the baseline's function) or "
                         "diag(the target's final norm weight), as our MTP initialises its fusion")
    ap.add_argument("--per-layer-fusion", action=on_off, default=False,
                    help="recipe: each draft layer its own softmax mixture of the per-tap contexts")
    ap.add_argument("--slot-queries", action=on_off, default=False,
                    help="recipe: a learned starting embedding per query slot")
    ap.add_argument("--init-from", default=None,
                    help="warm start from a DSpark checkpoint (ours or speculators'; e.g. a baseline "
                         "head): shared tensors copied, new ones initialised as the recipe says")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=24,
                    help="blocks per sequence (0 with --anchor-draw unique: every valid position)")
    ap.add_argument("--anchor-draw", default="replace", choices=list(blocks.ANCHOR_DRAWS),
                    help="replace: drawn with replacement, the last prompt token included, blocks may "
                         "run past the crop; unique: without replacement, generated tokens only, whole "
                         "blocks (the references'; `training.blocks.anchor_positions`)")
    ap.add_argument("--next-token-stream", type=_stream, default="added", metavar="{none,fused,added}",
                    help="each context row also carries the realised next token x_{t+1}: fused into "
                         "the context before hidden_norm, or added after it (model.py; default added); "
                         "none: taps only")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--markov-rank", type=int, default=256)
    ap.add_argument("--mask-token-id", type=int, default=None,
                    help="default: the tokenizer's <|mask|> or mask token, else pad, unk or the last id")
    ap.add_argument("--markov-head-type", default="vanilla", choices=["vanilla", "gated", "rnn"],
                    help="vanilla (the default), or rnn (the recipe's recurrent head) / gated")
    ap.add_argument("--layout", default="anchor", choices=["anchor", "fill-in"],
                    help="anchor: a block of B slots drafts B tokens; fill-in: DFlash's, B - 1")
    ap.add_argument("--causal", action="store_true", help="causal attention inside the block")
    ap.add_argument("--sliding-window", type=int, default=None, help="context window of a block")
    ap.add_argument("--chain-tokens", default="target", choices=["target", "draft"],
                    help="previous tokens the Markov head is trained on (see the module docstring)")
    add_draft_vocab_arg(ap)
    ap.add_argument("--confidence-head", default=None, choices=["hidden", "hidden+markov"],
                    help="add the per-slot acceptance-probability head, reading the slot's hidden "
                         "state (and W1[prev]); train it with --confidence-weight or --train-only confidence")


def build(target, args, data_meta: dict, embed: torch.Tensor, lm_head: torch.Tensor) -> DSparkDraft:
    """A freshly initialised head for `target` (transformers model) on the data's taps."""
    if args.mask_token_id is None:
        args.mask_token_id = default_mask_token(target.name_or_path, int(target.config.vocab_size))
    tc = target.config.to_dict()
    taps = draft_taps(args, list(data_meta["taps"]), int(tc["num_hidden_layers"]))
    # the DSpark options by their one spelling (`config.DRAFT_OPTIONS`); the layout flag names one
    options = {k: getattr(args, k) for k in DRAFT_OPTIONS if getattr(args, k, None) is not None}
    options["sample_from_anchor"] = getattr(args, "layout", "anchor") == "anchor"
    cfg = DSparkDraftConfig.for_target(tc, target_layer_ids=taps, num_hidden_layers=args.layers, **options)
    only_confidence = getattr(args, "train_only", None) == "confidence"
    if cfg.confidence_head and getattr(args, "chain_tokens", "target") != "target":
        raise SystemExit("--confidence-head: its labels are the teacher-forced acceptance (previous "
                         "tokens the target's); train it with --chain-tokens target")
    tap_init = getattr(args, "final_tap_init", "zero")
    if tap_init != "zero" and not cfg.final_layer_tap:
        raise SystemExit(f"--final-tap-init {tap_init}: initialises the final-layer tap's "
                         "columns; add --final-layer-tap")
    if only_confidence and not args.init_from:
        raise SystemExit("--train-only confidence: give the trained draft to add the head to with --init-from")
    if getattr(args, "draft_vocab", None):
        cfg = dataclasses.replace(cfg, draft_vocab_size=args.draft_vocab)
    draft = DSparkDraft(cfg, embed, lm_head, data_vocab(args, cfg) if cfg.reduced_vocab else None)
    for name, p in draft.named_parameters():
        if p.dim() > 1 and name not in ("slot_queries", "fusion_logits"):  # those start at the baseline
            torch.nn.init.normal_(p, std=0.02)
    torch.nn.init.zeros_(draft.markov_head.markov_w2.weight)  # start as pure DFlash logits
    if cfg.confidence_head:
        torch.nn.init.zeros_(draft.confidence_head.proj.bias)  # p = 1/2 up to the small weights
    try:
        norm = final_norm(target).weight.detach().float() if tap_init == "final-norm" else None
        init_final_tap(draft, target.name_or_path, norm)
        if args.init_from:
            fresh = warm_start(draft, args.init_from)
            other = [] if not only_confidence else (
                [n for n in fresh if not n.startswith("confidence_head.")]
                + sorted(set(load_tensors(args.init_from)) - set(draft.state_dict())))  # dropped ones
            if other:
                raise SystemExit(f"--train-only confidence --init-from {args.init_from}: this draft's "
                                 f"{other} would start anew or be dropped (give the same "
                                 "draft flags it was trained with: taps, recipe switches, head type)")
    except (OSError, ValueError) as e:
        raise SystemExit(f"--init-from {args.init_from}: {e}" if args.init_from else str(e)) from None
    if cfg.reduced_vocab and args.init_from:
        # the target's rows of the vocabulary the warm start left (its d2t; its file may not carry them)
        draft.lm_head.copy_(vocab.target_rows(lm_head, draft.d2t))
    draft.tap_slices = [list(data_meta["taps"]).index(t) for t in taps]
    return draft


def default_mask_token(target_dir: str, vocab_size: int) -> int:
    """The token the query block's mask slots are fed (recorded in the draft's config): the
    tokenizer's `<|mask|>` or mask token; else its pad token when that is not also its end of
    text, else its unknown token, else the vocabulary's last id. Any id works: the slots only start
    from its embedding (and with --slot-queries learn their own)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    for why, tid in (("<|mask|>", tok.get_vocab().get("<|mask|>")), ("the mask token", tok.mask_token_id),
                     ("the pad token", tok.pad_token_id if tok.pad_token_id != tok.eos_token_id else None),
                     ("the unknown token", tok.unk_token_id), ("the vocabulary's last id", vocab_size - 1)):
        if tid is not None and 0 <= tid < vocab_size:
            if why != "<|mask|>" and why != "the mask token":
                print(f"mask token: the tokenizer has none; using {why}, id {tid} (--mask-token-id to choose)")
            return int(tid)
    raise AssertionError("unreachable")


def data_vocab(args, cfg: DSparkDraftConfig) -> torch.Tensor:
    """The `--draft-vocab` most frequent target tokens of the data's responses, the mask token
    excluded (it is never drafted)."""
    return blocks.data_vocab(args.data, cfg.draft_vocab_size, cfg.vocab_size, (cfg.mask_token_id,))


def draft_taps(args, data_taps: list[int], num_layers: int) -> tuple[int, ...]:
    """The draft's taps (ascending) from `--taps` / `--final-layer-tap` and the data's taps."""
    last = num_layers - 1
    taps = blocks.parse_layers("--taps", args.taps) or [t for t in data_taps if t != last]
    if args.final_layer_tap:
        taps = [t for t in taps if t != last] + [last]
    missing = [t for t in taps if t not in data_taps]
    if missing:
        hint = (f" (--final-layer-tap needs the target's last layer {last}: make the data with "
                f"`vllm-specx gen-data ... --taps ...,{last}`, or pass --no-final-layer-tap)"
                if last in missing else "")
        raise SystemExit(f"--data: its taps {data_taps} lack layer(s) {missing}{hint}")
    return tuple(sorted(taps))


def batch(draft: DSparkDraft, samples: list[dict], rng: random.Random, size: int, args, at=None) -> dict:
    c = draft.cfg
    if at is None and args.anchors == 0 and getattr(args, "anchor_draw", "replace") != "unique":
        raise SystemExit("--anchors 0 (every valid position) needs --anchor-draw unique")
    b = make_batch(samples, rng, size, args.seq_len, args.anchors, c.max_drafts, c.mask_token_id,
                   q=c.block_size, at=at, draw=getattr(args, "anchor_draw", "replace"))
    slices, ht = getattr(draft, "tap_slices", None), c.target_hidden_size
    if slices is not None and slices != list(range(b["taps"].shape[-1] // ht)):
        b["taps"] = select_taps(b["taps"], slices, ht)
    b["chain_tokens"] = getattr(args, "chain_tokens", "target")
    return b


def slot_states(draft: DSparkDraft, b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher-forced blocks' query-slot states [B, M, o + n, H] (post-norm) and each slot's
    previous token [B, M, o + n] (prev of draft k = x_{a+k}; in the fill-in layout slot 0, the
    anchor's, has the anchor too)."""
    bsz, s = b["taps"].shape[:2]
    m, n = b["targets"].shape[1:]
    q = b["pos"].shape[1] // m
    mask = block_mask(b["anchors"], s, q, draft.cfg.causal, draft.cfg.sliding_window)
    ctx_pos = torch.arange(s, device=b["anchors"].device).expand(bsz, s)
    nxt = None
    if draft.cfg.next_token_stream is not None:  # x_{t+1} of row t: every row < a is a real token
        nxt = next_ids_of(b["ids"], b["ids"][:, -1:]).clamp(min=0)
    h = draft.block_states(b["taps"], ctx_pos, b["block_ids"], b["pos"], mask, q, nxt)
    h = h.view(bsz, m, q, -1)
    o = draft.cfg.slot_offset
    slot_prev = b["prev"]  # [B, M, n]: prev of draft k = x_{a+k}
    if o:  # fill-in: slot 0 (the anchor's) has the anchor as prev too
        slot_prev = torch.cat([b["block_ids"].view(bsz, m, q)[..., :1], slot_prev], -1)
    return h[:, :, :o + n], slot_prev[..., :o + n]


def forward(draft: DSparkDraft, b: dict[str, torch.Tensor]) -> DraftOutput:
    """Teacher-forced draft logits [B, M, n, V] for every block, with their targets [B, M, n] (and
    the confidence head's logits [B, M, n] when the draft has one)."""
    h, slot_prev = slot_states(draft, b)
    o = draft.cfg.slot_offset
    if b.get("chain_tokens", "target") == "draft":
        logits = own_chain_logits(draft, h, slot_prev)[:, :, o:]
    else:
        logits = draft.slot_logits(h, slot_prev)[:, :, o:]
    conf = None
    if draft.cfg.confidence_head is not None:  # inputs detached: the BCE trains the head only
        conf = draft.confidence_logits(h, slot_prev, detach=True)[:, :, o:]
    out = DraftOutput(logits=logits, targets=b["targets"], target_ids=b.get("topk_ids"),
                      target_logp=b.get("topk_logp"), confidence=conf)
    return to_draft_vocab(out, draft.t2d) if draft.cfg.reduced_vocab else out


@torch.no_grad()
def drafted_confidence(draft: DSparkDraft, b: dict[str, torch.Tensor]) -> torch.Tensor:
    """The confidence logits [B, M, n] as the proposer has them before verification: slot k's
    previous token is the head's own greedy draft k - 1 (the anchor for the first), not the
    target's token. Equal to `forward`'s wherever drafts < k are the target's tokens, i.e. on
    every slot a greedy-verified block reaches."""
    h, slot_prev = slot_states(draft, b)
    o = draft.cfg.slot_offset
    own = vocab.to_target(own_chain_logits(draft, h, slot_prev).argmax(-1), draft.draft_target_ids)
    prev = slot_prev.clone()
    prev[..., o + 1:] = own[..., o:-1]
    return draft.confidence_logits(h, prev)[:, :, o:]


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
            prev = vocab.to_target(out[-1].detach().argmax(-1), draft.draft_target_ids)
    return torch.stack(out, -2)


def save(draft: DSparkDraft, out, dtype: torch.dtype = torch.float32) -> None:
    save_specx(draft, out, dtype=dtype)
