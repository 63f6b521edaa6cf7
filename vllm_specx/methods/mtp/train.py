"""MTP's trainer hooks (see `vllm_specx.training.trainer`): the target frozen, one shared MTP layer
unrolled for `--drafts` steps from each anchor (`model.MTPDraft.chain_logits`), its KV handled
exactly as it will be served (`--kv-share`).

The recipes of the issue are flag sets of one trainer (the README's ablation lists them):

* GLM-5.1 style: `--loss ce --gamma 4 --kv-share off` (per-step CE with FastMTP-style
  exp(-k / gamma) decay, mixed KV);
* single-step MTP (pre-training style, the layer only ever sees target hidden states):
  `--drafts 1 --loss ce` (served for K steps all the same);
* GLM-5.2: `--loss chain-tv --ce-weight 0.1 --kv-share on` (end-to-end chain TV, KVShare in
  training as in serving), served with probabilistic drafts;
* Kimi K3: `--fusion-layers 1,4,7 --init-from <a trained MTP layer> --loss nla` (fusion over
  low/mid/high target layers, initialised to select the last through the target's final norm -
  the starting layer up to the norms' epsilon - then 7 recurrent steps on the layer's own outputs, -log sum min(p, q)).

The layer reads the target's final hidden state H_t = the target's final norm applied to the
residual stream after its last layer, so the data must tap the last layer (`gen-data --taps`
including num_hidden_layers - 1).
"""

from __future__ import annotations

import argparse
import random

import torch

from vllm_specx import vocab
from vllm_specx.methods.mtp.checkpoint import save as save_mtp
from vllm_specx.methods.mtp.config import MTPDraftConfig
from vllm_specx.methods.mtp.model import MTPDraft, final_hidden
from vllm_specx.training.blocks import add_chain_args, add_draft_vocab_arg, data_vocab, make_batch, parse_layers
from vllm_specx.training.losses import DraftOutput, to_draft_vocab
from vllm_specx.training.taps import final_norm, select_taps


def add_args(ap: argparse.ArgumentParser) -> None:
    add_chain_args(ap)
    add_draft_vocab_arg(ap)
    ap.add_argument("--kv-share", default="on", choices=["on", "off"],
                    help="KVShare in training and in the saved checkpoint (how it is served)")
    ap.add_argument("--serve-drafts", type=int, default=7,
                    help="the checkpoint's default num_speculative_tokens")
    ap.add_argument("--fusion-layers", default="",
                    help="K3 variant: 0-based target layers fused into step 0's input (the data's taps), "
                         "e.g. 1,4,7; empty = the plain MTP layer on the final hidden state")
    ap.add_argument("--init-from", default=None,
                    help="start from this MTP checkpoint's layer (K3: the pre-trained MTP layer)")


def build(target, args, data_meta: dict, embed: torch.Tensor, lm_head: torch.Tensor) -> MTPDraft:
    tc = target.config.to_dict()
    last = tc["num_hidden_layers"] - 1
    taps = list(data_meta["taps"])
    if last not in taps:
        raise SystemExit(f"--data: its taps {taps} do not include the target's last layer ({last}); "
                         f"the MTP layer reads the target's final hidden state (make the data with "
                         f"`vllm-specx gen-data ... --taps ...,{last}`)")
    fusion = tuple(parse_layers("--fusion-layers", args.fusion_layers))
    missing = [i for i in fusion if i not in taps]
    if missing:
        raise SystemExit(f"--fusion-layers {args.fusion_layers}: layer(s) {missing} are not among the data's taps {taps}")
    cfg = MTPDraftConfig.for_target(tc, kv_share=args.kv_share == "on", max_drafts=args.serve_drafts,
                                    trained_steps=args.drafts, fusion_layer_ids=fusion,
                                    draft_vocab_size=getattr(args, "draft_vocab", None) or 0)
    ids = data_vocab(args.data, cfg.draft_vocab_size, cfg.vocab_size) if cfg.reduced_vocab else None
    draft = MTPDraft(cfg, embed, lm_head, ids)
    for p in draft.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    norm = final_norm(target)
    if args.init_from:
        from vllm_specx.checkpoint import load_tensors

        start = load_tensors(args.init_from)
        start.pop("fc.weight", None)  # the layer only; a fusion is (re)initialised below
        if fusion:
            start["fc.weight"] = draft.fc.weight
        if cfg.reduced_vocab and "d2t" not in start:  # a full-vocabulary layer: this run's vocabulary
            start.update({k: v for k, v in draft.specx_state_dict().items() if k in ("lm_head.weight", "d2t", "t2d")})
        elif cfg.reduced_vocab and "lm_head.weight" not in start:  # saved with lm_head_from_target
            start["lm_head.weight"] = vocab.target_rows(lm_head, start["d2t"])
        try:
            draft.load_specx_state_dict(start)  # names and shapes checked
        except ValueError as e:
            raise SystemExit(f"--init-from {args.init_from}: {e}") from None
    if fusion:
        draft.init_fusion_as_final_norm(norm.weight.detach())
    draft.tap_slices = [taps.index(i) for i in fusion]
    draft.register_buffer("target_norm", norm.weight.detach().clone(), persistent=False)
    draft.target_norm_eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
    draft.tap_index = taps.index(last)
    return draft


def batch(draft: MTPDraft, samples, rng: random.Random, size: int, args, at=None) -> dict:
    b = make_batch(samples, rng, size, args.seq_len, args.anchors, args.drafts, mask_id=0, at=at)
    h = draft.cfg.hidden_size
    taps = b.pop("taps")
    if draft.cfg.fusion_layer_ids:  # K3: the fused layers' residual streams, in order
        b["hidden"] = select_taps(taps, draft.tap_slices, h)
    else:
        i = draft.tap_index
        b["hidden"] = final_hidden(draft.target_norm.to(taps.device), draft.target_norm_eps, taps[..., i * h:(i + 1) * h])
    b["chain_tokens"] = args.chain_tokens
    return b


def forward(draft: MTPDraft, b: dict) -> DraftOutput:
    n = b["targets"].shape[-1]
    logits = draft.chain_logits(b["hidden"], b["ids"], b["anchors"], n, None, b.get("chain_tokens", "target"))
    out = DraftOutput(logits=logits, targets=b["targets"], target_ids=b.get("topk_ids"),
                      target_logp=b.get("topk_logp"))
    return to_draft_vocab(out, draft.t2d) if draft.cfg.reduced_vocab else out


def save(draft: MTPDraft, out, dtype: torch.dtype = torch.float32) -> None:
    save_mtp(draft, out, dtype)
