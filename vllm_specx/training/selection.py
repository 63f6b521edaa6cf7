"""A run's data stage: the data's meta checked against the flags, the `--eval-data` folders, and
which samples validate and which train (`load_data`: a seeded shuffle, `split`; or the data's
order, `data_order_split`; only prompts another draft never saw, `usable`)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

from vllm_specx.training.config import RECORD_FILE, TrainConfig
from vllm_specx.training.prompts import trained_prompt_ids
from vllm_specx.training.samples import EVALUATION, load_samples
from vllm_specx.training.losses import NEEDS_TARGET_DISTRIBUTION


@dataclasses.dataclass
class Data:
    """What the data stage reads: the data's meta, the --eval-data folders with their meta, all
    samples, the split (indices into `samples`) and its two views."""

    meta: dict
    evals: list
    samples: object
    pool: list
    val_idx: list
    train_idx: list
    val: object
    train: object



def load_data(cfg: TrainConfig, rng: random.Random) -> Data:
    """The data's meta (checked against the flags), the --eval-data folders, the samples and the
    validation / training split (`rng`: the run's, seeded with --seed). Every rank reads the same."""
    meta = json.loads((Path(cfg.data) / "meta.json").read_text())
    if meta.get("purpose") == EVALUATION:
        raise SystemExit(f"--data {cfg.data}: made with `gen-data --for-eval` (prompts {meta.get('prompts')!r}): "
                         "drafts are measured on it, never trained on it; pass it as --eval-data")
    evals = [(Path(d), _eval_meta(Path(d), meta)) for d in cfg.eval_data]
    if cfg.confidence_label == "soft" and not meta.get("topk"):
        raise SystemExit(f"--confidence-label soft needs the target's distribution: {cfg.data} has no top-k")
    if cfg.train_only != "confidence" and cfg.loss in NEEDS_TARGET_DISTRIBUTION and not meta.get("topk"):
        raise SystemExit(f"--loss {cfg.loss} needs the target's distribution: {cfg.data} has no "
                         "top-k (make it with `vllm-specx gen-data ... --topk 32`, or train with --loss ce)")
    samples = load_samples(Path(cfg.data))
    pool = usable(samples, meta, cfg.unseen_by)
    if len(pool) <= cfg.val_samples:
        raise SystemExit(f"--data {cfg.data}: {len(pool)} usable samples, not more than --val-samples {cfg.val_samples}")
    if cfg.train_samples is None:
        val_idx, train_idx = split(len(pool), cfg.val_samples, rng)
        val_idx, train_idx = [pool[i] for i in val_idx], [pool[i] for i in train_idx]
    else:  # data order: the same validation samples and nested training sets for every N
        val_idx, train_idx = data_order_split(samples, pool, cfg.val_samples, cfg.train_samples)
    return Data(meta, evals, samples, pool, val_idx, train_idx, samples.subset(val_idx), samples.subset(train_idx))



def _eval_meta(folder: Path, train_meta: dict) -> dict:
    """An --eval-data folder's meta, checked against the training data's: the same target and
    the same taps, in the same order."""
    try:
        m = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"--eval-data {folder}: not a gen-data folder ({e})") from None
    if m.get("target") != train_meta.get("target"):
        raise SystemExit(f"--eval-data {folder}: made for target {m.get('target')!r}, the training data "
                         f"for {train_meta.get('target')!r}")
    if m.get("taps") != train_meta.get("taps"):
        raise SystemExit(f"--eval-data {folder}: taps {m.get('taps')} differ from the training data's "
                         f"{train_meta.get('taps')} (the draft reads taps by position: make it with the "
                         f"same --taps)")
    return m



def usable(samples, data_meta: dict, unseen_by: str | None) -> list[int]:
    """Indices of the samples a run may use: all, or with `unseen_by` (a draft directory with a
    training record) those whose prompt its training data did not hold (`prompts.trained_prompt_ids`)."""
    if not unseen_by:
        return list(range(len(samples)))
    rec_file = Path(unseen_by) / RECORD_FILE
    try:
        seen = trained_prompt_ids(json.loads(rec_file.read_text()))
    except (OSError, ValueError) as e:
        raise SystemExit(f"--unseen-by {unseen_by}: cannot tell which prompts it was trained on ({e})") from None
    if seen is None:
        raise SystemExit(f"--unseen-by {unseen_by}: its {RECORD_FILE} does not say which prompts it was trained on")
    spec, ids = seen
    if spec != data_meta.get("prompts"):
        raise SystemExit(f"--unseen-by {unseen_by}: trained on prompts {spec!r}, this data on "
                         f"{data_meta.get('prompts')!r}; prompt ids of different sets cannot be compared")
    return [i for i in range(len(samples)) if samples.index[i][1] not in ids]



def data_order_split(samples, pool: list[int], val_samples: int, n: int) -> tuple[list[int], list[int]]:
    """`--train-samples N`: (validation, training) sample indices in the data's order (gen-data
    writes answers in prompt order): the first `val_samples` samples validate, the next N train.
    Every N gets the same validation samples and nested training sets, and a run needs taps only
    for that prefix (a data set whose prompt order is a mix, like chat-mix, gives representative
    prefixes)."""
    order = sorted(pool, key=lambda i: samples.index[i][1])  # by sample id: prompt order
    if val_samples + n > len(order):
        raise SystemExit(f"--train-samples {n}: the data holds {len(order)} samples with taps, fewer "
                         f"than {val_samples} validation + {n} training samples")
    return order[:val_samples], order[val_samples: val_samples + n]



def split(n: int, val_samples: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """(validation, training) sample indices: a shuffle of range(n) by `rng` (the trainer's, seeded
    with `--seed`), the first `val_samples` held back. `benchmarks/confidence_calibration.py`
    re-draws a run's split from its record with this."""
    order = list(range(n))
    rng.shuffle(order)
    return order[:val_samples], order[val_samples:]

