"""Training pieces without vLLM: taps storage is resumable, and the trainer learns a pattern."""

import json
import random

import torch

from vllm_specx.methods.dspark import train as dspark_train
from vllm_specx.training.data import load_samples, write_taps
from vllm_specx.training.taps import load_target
from vllm_specx.training.trainer import loss_and_accuracy

from .helpers import REF_TARGET
from .test_dspark_torch import tiny


def test_taps_are_written_once_and_reloaded(tmp_path):
    rows = [{"id": i, "prompt_ids": [5, 6, 7], "output_ids": list(range(10, 10 + i + 1))} for i in range(5)]
    (tmp_path / "tokens.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_taps(str(REF_TARGET), tmp_path, (1, 4), shard=2)
    files = sorted((tmp_path / "taps").glob("*.safetensors"))
    assert len(files) == 3
    stamps = [f.stat().st_mtime_ns for f in files]
    write_taps(str(REF_TARGET), tmp_path, (1, 4), shard=2)  # resume: nothing left to do
    assert [f.stat().st_mtime_ns for f in files] == stamps
    samples = {len(s["ids"]): s for s in load_samples(tmp_path)}
    s = samples[3 + 3]  # id 2: 3 prompt + 3 output tokens
    assert s["prompt_len"] == 3 and s["taps"].shape == (6, 2 * 256)
    from vllm_specx.training.taps import target_taps
    ref = target_taps(load_target(REF_TARGET), s["ids"][None], (1, 4))[0]
    torch.testing.assert_close(s["taps"].float(), ref, atol=2e-2, rtol=1e-2)  # stored as fp16


def test_trainer_learns_a_deterministic_continuation():
    """Sequences count up mod 40; after a few steps the draft predicts every next token."""
    torch.manual_seed(0)
    draft = tiny()
    samples = []
    for i in range(16):
        ids = (torch.arange(48) + i) % 40 + 10
        samples.append({"ids": ids, "taps": torch.nn.functional.one_hot(ids % 32, 32).half(), "prompt_len": 8})
    rng = random.Random(0)
    opt = torch.optim.AdamW(draft.parameters(), lr=3e-2)
    first = None
    for _ in range(80):
        b = dspark_train.make_batch(samples, rng, 4, 32, 4, 4, draft.cfg.mask_token_id)
        loss, acc = loss_and_accuracy(dspark_train.forward(draft, b), "ce", gamma=4.0)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.2 * first
    with torch.no_grad():
        _, acc = loss_and_accuracy(dspark_train.forward(draft, dspark_train.make_batch(samples, rng, 16, 32, 8, 4, 3)),
                                   "ce", 4.0)
    assert acc.min().item() > 0.9, acc  # every draft position, on 16 x 8 fresh blocks
