#!/usr/bin/env python
"""Train the vllm-specx *reference target model* from scratch on CPU.

One command, deterministic (seeded), time-bounded and resumable:

    .venv/bin/python scripts/train_ref_target.py --steps 1000 --max-minutes 35

Pipeline
--------
1. Corpus: every ``*.py`` file of the running CPython's stdlib
   (``sysconfig.get_paths()["stdlib"]``), sorted by relative path, excluding
   ``site-packages`` and every directory named ``test``/``tests``/``idle_test``
   (this covers ``test/``, ``idlelib/idle_test/``, ``lib2to3/tests/``,
   ``tkinter/test/``, ...). Test suites are huge, repetitive and full of
   deliberately odd encodings; the rest (~730 files, ~12 MB) is plenty for the
   compute we have. Files that are not valid UTF-8 are skipped (none are, on
   3.11.7).
2. Split by file: ``sha1(relpath) % 20 == 0`` -> held out (never used for the
   tokenizer nor for training; ``scripts/make_prompts.py`` draws prompts from
   these files). ``relpath`` is POSIX-style, relative to the stdlib root.
3. Byte-level BPE tokenizer (``tokenizers``), vocab 4096, special tokens
   ``<|endoftext|>`` (0), ``<|pad|>`` (1), ``<|mask|>`` (2). ``<|mask|>`` is a
   noise / mask slot for parallel drafters; the target never sees it in
   training.
4. Documents are joined with ``<|endoftext|>``; training batches are random
   windows of ``seq_len + 1`` tokens (offsets drawn from a generator seeded by
   ``(seed, step)`` so a resumed run sees exactly the same batches).
5. ``transformers.LlamaForCausalLM`` trained with AdamW + linear warmup + cosine
   decay, fp32, 2 threads; periodic held-out loss on fixed windows.
6. Saved with ``save_pretrained(safe_serialization=True)`` plus the tokenizer
   files and ``generation_config.json``; ``TRAINING.md`` + ``training.json``
   record the command, steps, wall time, params and losses.

``--max-minutes`` stops gracefully (and still saves). A checkpoint with
optimizer state is written to ``--ckpt-dir`` (default ``runs/ref-target-ckpt``,
git-ignored) every ``--ckpt-every`` steps and at the end; ``--resume`` continues
from it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import time
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|mask|>"]
EXCLUDED_DIRS = {"site-packages", "test", "tests", "idle_test"}
HELDOUT_MOD = 20


# --------------------------------------------------------------------------
# Corpus (also imported by scripts/make_prompts.py -- keep import-light)
# --------------------------------------------------------------------------
def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relpath: str) -> bool:
    return int(hashlib.sha1(relpath.encode("utf-8")).hexdigest(), 16) % HELDOUT_MOD == 0


def corpus_files(root: Path | None = None) -> list[tuple[str, str]]:
    """Return sorted ``[(relpath, text)]`` for the whole corpus (train + held out)."""
    root = root or stdlib_root()
    out = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        if set(rel.parts[:-1]) & EXCLUDED_DIRS:
            continue
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
        out.append((rel.as_posix(), text))
    out.sort(key=lambda x: x[0])
    return out


def split_corpus(files):
    train = [(r, t) for r, t in files if not is_heldout(r)]
    held = [(r, t) for r, t in files if is_heldout(r)]
    return train, held


# --------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------
def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,  # -> ids 0, 1, 2
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    return tok


def wrap_hf_tokenizer(tok, model_max_length: int):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        mask_token="<|mask|>",
        unk_token=None,
        bos_token=None,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


# --------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="assets/ref-target")
    ap.add_argument("--steps", type=int, default=1000, help="optimizer steps (schedule length)")
    ap.add_argument("--max-minutes", type=float, default=None, help="stop gracefully once the training loop (summed over --resume runs) has run this long, then save")
    ap.add_argument("--anneal-by-time", action="store_true",
                    help="cosine progress = max(step/steps, elapsed/max-minutes): the LR reaches --min-lr when "
                         "the time budget runs out even on contended CPUs (the batches stay seeded per step, but "
                         "the LR per step -- hence the exact weights -- then depends on wall-clock speed)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--max-pos", type=int, default=2048)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-windows", type=int, default=48, help="fixed held-out windows of seq_len")
    ap.add_argument("--ckpt-dir", default="runs/ref-target-ckpt")
    ap.add_argument("--ckpt-every", type=int, default=200)
    ap.add_argument("--resume", action="store_true", help="resume from --ckpt-dir/ckpt.pt (tokenizer is reloaded from there)")
    ap.add_argument("--no-progress", action="store_true")
    return ap.parse_args(argv)


def lr_at(step: int, a, time_frac: float = 0.0) -> float:
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    prog = min(1.0, max((step - a.warmup) / max(1, a.steps - a.warmup), time_frac))
    return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * prog))


def main(argv=None):
    a = parse_args(argv)
    t_start = time.time()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

    import numpy as np
    import torch
    from tokenizers import Tokenizer
    from tqdm import tqdm
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    out = Path(a.out)
    ckpt_dir = Path(a.ckpt_dir)
    ckpt_path = ckpt_dir / "ckpt.pt"

    # ---- corpus + tokenizer -------------------------------------------------
    files = corpus_files()
    train_files, held_files = split_corpus(files)
    print(f"corpus: {len(files)} files ({sum(len(t) for _, t in files) / 1e6:.1f} MB chars); "
          f"train {len(train_files)}, held-out {len(held_files)}", flush=True)
    if a.resume:
        tok = Tokenizer.from_file(str(ckpt_dir / "tokenizer.json"))
    else:
        t0 = time.time()
        tok = train_tokenizer([t for _, t in train_files], a.vocab_size)
        print(f"tokenizer trained in {time.time() - t0:.1f}s", flush=True)
    eot = tok.token_to_id("<|endoftext|>")

    def encode_stream(fs):
        encs = tok.encode_batch([t for _, t in fs], add_special_tokens=False)
        ids = []
        for e in encs:
            ids.extend(e.ids)
            ids.append(eot)
        return np.asarray(ids, dtype=np.int64)

    t0 = time.time()
    train_ids = torch.from_numpy(encode_stream(train_files))
    held_ids = torch.from_numpy(encode_stream(held_files))
    n_chars = sum(len(t) for _, t in train_files)
    print(f"tokens: train {len(train_ids):,} ({n_chars / len(train_ids):.2f} chars/token), "
          f"held-out {len(held_ids):,}; encoded in {time.time() - t0:.1f}s", flush=True)

    L = a.seq_len
    n_eval = min(a.eval_windows, (len(held_ids) - 1) // L)
    eval_starts = torch.linspace(0, len(held_ids) - L - 1, n_eval).long()
    eval_batch = torch.stack([held_ids[s : s + L + 1] for s in eval_starts])

    def get_batch(step):
        g = torch.Generator().manual_seed(a.seed * 1_000_003 + step)
        starts = torch.randint(0, len(train_ids) - L - 1, (a.batch_size,), generator=g)
        return torch.stack([train_ids[s : s + L + 1] for s in starts])

    # ---- model ---------------------------------------------------------------
    cfg = LlamaConfig(
        vocab_size=a.vocab_size,
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        head_dim=a.hidden // a.heads,
        hidden_act="silu",
        max_position_embeddings=a.max_pos,
        initializer_range=0.02,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=None,
        eos_token_id=eot,
        pad_token_id=tok.token_to_id("<|pad|>"),
        torch_dtype="float32",
    )
    # transformers>=5 keeps rope params in `rope_parameters`; older in rope_theta.
    model = LlamaForCausalLM(cfg)
    model.float()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M params (tied embeddings)", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
    )

    step = 0
    history = []  # (step, train_loss_avg, heldout_loss)
    prior_train_seconds = 0.0
    if a.resume:
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step = ck["step"]
        history = ck["history"]
        prior_train_seconds = ck.get("train_seconds", 0.0)
        print(f"resumed from {ckpt_path} at step {step}", flush=True)

    @torch.no_grad()
    def heldout_loss():
        model.eval()
        tot = 0.0
        for i in range(0, len(eval_batch), 8):
            b = eval_batch[i : i + 8]
            logits = model(input_ids=b[:, :-1]).logits
            tot += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), b[:, 1:].reshape(-1), reduction="sum").item()
        model.train()
        return tot / (len(eval_batch) * L)

    def save_ckpt():
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        tok.save(str(ckpt_dir / "tokenizer.json"))
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "history": history, "train_seconds": prior_train_seconds + (time.time() - t_loop),
                    "args": vars(a)}, ckpt_path.with_suffix(".tmp"))
        os.replace(ckpt_path.with_suffix(".tmp"), ckpt_path)

    # ---- train loop ----------------------------------------------------------
    model.train()
    t_loop = time.time()
    deadline = t_loop + a.max_minutes * 60 - prior_train_seconds if a.max_minutes else None
    recent = []
    stopped_early = False
    pbar = tqdm(total=a.steps, initial=step, disable=a.no_progress, dynamic_ncols=True, mininterval=5)
    while step < a.steps:
        if deadline is not None and time.time() >= deadline:
            stopped_early = True
            print(f"\n--max-minutes reached at step {step}; stopping", flush=True)
            break
        time_frac = 0.0
        if a.anneal_by_time and a.max_minutes:
            time_frac = (prior_train_seconds + time.time() - t_loop) / (a.max_minutes * 60)
        lr = lr_at(step, a, time_frac)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = get_batch(step)
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        step += 1
        recent.append(loss.item())
        recent = recent[-50:]
        pbar.update(1)
        pbar.set_postfix(loss=f"{sum(recent) / len(recent):.3f}", lr=f"{lr:.2e}")
        if step % a.eval_every == 0 or step == a.steps:
            hl = heldout_loss()
            history.append((step, sum(recent) / len(recent), hl))
            tqdm.write(f"step {step}: train {history[-1][1]:.4f}  held-out {hl:.4f}  "
                       f"({(time.time() - t_loop) / 60:.1f} min)")
        if step % a.ckpt_every == 0:
            save_ckpt()
    pbar.close()
    train_seconds = prior_train_seconds + (time.time() - t_loop)
    final_heldout = heldout_loss()
    final_train = sum(recent) / len(recent) if recent else float("nan")
    if not history or history[-1][0] != step:
        history.append((step, final_train, final_heldout))
    save_ckpt()

    # ---- save ----------------------------------------------------------------
    out.mkdir(parents=True, exist_ok=True)
    model.config.use_cache = True
    model.save_pretrained(out, safe_serialization=True)
    hf_tok = wrap_hf_tokenizer(tok, a.max_pos)
    hf_tok.save_pretrained(out)
    # transformers 5 writes tokenizer_class "TokenizersBackend", which older
    # transformers (and tools pinned to them) do not know; the portable name is
    # PreTrainedTokenizerFast (an alias in v5).
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc.pop("backend", None)
    tc_path.write_text(json.dumps(tc, indent=2) + "\n")
    gen = GenerationConfig(eos_token_id=eot, pad_token_id=cfg.pad_token_id, do_sample=False, max_new_tokens=128)
    gen.save_pretrained(out)

    wall = time.time() - t_start
    info = {
        "command": "python " + " ".join([sys.argv[0]] + (argv if argv is not None else sys.argv[1:])),
        "steps": step,
        "planned_steps": a.steps,
        "stopped_early_by_max_minutes": stopped_early,
        "train_loop_seconds": round(train_seconds, 1),
        "wall_seconds_this_invocation": round(wall, 1),
        "params": n_params,
        "tokens_seen": step * a.batch_size * a.seq_len,
        "train_tokens": int(len(train_ids)),
        "heldout_tokens": int(len(held_ids)),
        "train_files": len(train_files),
        "heldout_files": len(held_files),
        "final_train_loss_avg50": round(final_train, 4),
        "final_heldout_loss": round(final_heldout, 4),
        "heldout_eval": f"{n_eval} fixed windows x {L} tokens from held-out files",
        "history": [{"step": s, "train_loss": round(tl, 4), "heldout_loss": round(hl, 4)} for s, tl, hl in history],
        "args": vars(a),
        "special_tokens": {s: tok.token_to_id(s) for s in SPECIAL_TOKENS},
        "env": {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": __import__("transformers").__version__,
                "tokenizers": __import__("tokenizers").__version__},
    }
    (out / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps({k: v for k, v in info.items() if k not in ("history", "args")}, indent=2), flush=True)
    return info


if __name__ == "__main__":
    main()
