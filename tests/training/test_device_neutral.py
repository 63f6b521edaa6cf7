"""Device-neutral training: every tensor the training forward, the losses, the validation stats
and the taps forward make is made on the device of their inputs, so a run trains on CUDA as it
does on the CPU. Proven without a GPU on PyTorch's `meta` device: mixing a CPU tensor with meta
tensors raises ("Tensor on device meta is not on the expected device cpu"), so a CPU tensor made
inside model, loss or taps code fails these tests (the negative controls plant one). With a CUDA
device the same checks also run there, and the values match the CPU's.

Every registered trainable method is covered (its default config, and one variant per choice of
each of its own flags); nothing here names a method.
"""

from __future__ import annotations

import argparse
import json
import random

import pytest
import torch

from vllm_specx import registry
from vllm_specx.training import blocks, trainer
from vllm_specx.training.data import load_samples, write_taps
from vllm_specx.training.losses import LOSSES
from vllm_specx.training.taps import embed_and_head, load_target, target_taps

from ..helpers import REF_TARGET

TAPS = (1, 4, 7)
DEVICES = ["meta", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="no CUDA device"))]
# A value for the method flags that take a free one (a method without the flag is not given it).
FREE_VALUES = {"--fusion-layers": "4,7", "--draft-vocab": "64", "--sliding-window": "8"}


def _variants() -> list:
    """(method, extra flags): each method's default config, then one variant per non-default
    choice of each of its own flags (switches flipped, choices and the free values above)."""
    base = {a.dest for a in trainer.parser()._actions}
    out = []
    for name in sorted(registry.trainers()):
        out.append(pytest.param(name, (), id=f"{name}-default"))
        for a in trainer.parser(name)._actions:
            if a.dest in base or not a.option_strings:
                continue
            flag = a.option_strings[0]
            if isinstance(a, argparse.BooleanOptionalAction):
                extras = [(a.option_strings[1] if a.default else flag,)]
            elif isinstance(a, argparse._StoreTrueAction):
                extras = [(flag,)]
            elif a.choices:
                extras = [(flag, str(c)) for c in a.choices if c != a.default]
            elif flag in FREE_VALUES:
                extras = [(flag, FREE_VALUES[flag])]
            else:
                extras = []
            out += [pytest.param(name, e, id=f"{name}{''.join(e)}") for e in extras]
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A small gen-data folder on the reference target: taps (1, 4, 7) and top-8."""
    g = torch.Generator().manual_seed(0)
    rows = [{"id": i, "prompt_ids": torch.randint(5, 4000, (6,), generator=g).tolist(),
             "output_ids": torch.randint(5, 4000, (34,), generator=g).tolist()} for i in range(4)]
    out = tmp_path_factory.mktemp("device-neutral") / "data"
    out.mkdir()
    (out / "tokens.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "meta.json").write_text(json.dumps({"target": str(REF_TARGET), "taps": list(TAPS),
                                               "max_tokens": 34, "temperature": 0.0, "topk": 8}))
    write_taps(str(REF_TARGET), out, TAPS, shard=8, topk=8)
    return out


@pytest.fixture(scope="module")
def target():
    return load_target(REF_TARGET)


def _draft_and_batch(method, extra, data, target):
    """(the method's freshly built draft, one training batch), both on the CPU as the trainer
    makes them; None when the method refuses this flag combination."""
    args = trainer.parser(method).parse_args(
        ["--method", method, "--target", str(REF_TARGET), "--data", str(data), "--out", str(data.parent / "out"),
         "--seq-len", "32", "--anchors", "4", *extra])
    try:
        model = trainer.hooks(method).build(target, args, json.loads((data / "meta.json").read_text()),
                                            *embed_and_head(target))
    except SystemExit as e:
        pytest.skip(f"{method} {' '.join(extra)}: refused ({e})")
    torch.manual_seed(0)
    b = trainer.hooks(method).batch(model, load_samples(data), random.Random(0), 2, args)
    return model, b


def _train_step(method, model, b, device) -> tuple[torch.Tensor, dict]:
    """The trainer's step and validation on `device`: forward, every loss (mixed with CE and, with
    a confidence head, its BCE), backward, and the validation stats. Returns (loss, stats)."""
    model = model.to(device)
    out = trainer.hooks(method).forward(model, blocks.to_device(b, device))
    conf = 0.5 if out.confidence is not None else 0.0
    total = sum(trainer.loss_and_accuracy(out, name, 4.0, ce_weight=0.1, confidence_weight=conf)[0]
                for name in sorted(LOSSES))
    total.backward()
    with torch.no_grad():
        stats = trainer.validation_stats(trainer.hooks(method).forward(model, blocks.to_device(b, device)))
    return total, stats


def _check_on(device, total, stats, model):
    dev = torch.device(device).type
    assert total.device.type == dev
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and g.device.type == dev for g in grads)
    assert "tau_sampled" in stats and all(v.device.type == dev for v in stats.values())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method,extra", _variants())
def test_training_forward_loss_backward_and_validation_stay_on_the_inputs_device(method, extra, device, data, target):
    model, b = _draft_and_batch(method, extra, data, target)
    ref = None
    if device != "meta":  # the CPU's numbers, to compare with
        cpu_model, _ = _draft_and_batch(method, extra, data, target)
        cpu_model.load_state_dict(model.state_dict())
        ref = _train_step(method, cpu_model, b, "cpu")
    total, stats = _train_step(method, model, b, device)
    _check_on(device, total, stats, model)
    if ref is not None:
        torch.testing.assert_close(total.cpu(), ref[0], atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(stats["valid"].cpu(), ref[1]["valid"])


@pytest.mark.parametrize("device", DEVICES)
def test_taps_and_topk_of_a_target_stay_on_its_device(device, target):
    ids = torch.randint(5, 4000, (2, 12), generator=torch.Generator().manual_seed(0))
    taps, (logp, top) = target_taps(load_target(REF_TARGET).to(device), ids.to(device), TAPS, topk=8)
    dev = torch.device(device).type
    assert taps.shape == (2, 12, len(TAPS) * 256) and logp.shape == top.shape == (2, 12, 8)
    assert taps.device.type == logp.device.type == top.device.type == dev
    if device != "meta":
        want_taps, (want_logp, _) = target_taps(target, ids, TAPS, topk=8)
        torch.testing.assert_close(taps.cpu(), want_taps, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(logp.cpu(), want_logp, atol=2e-3, rtol=2e-3)


# ---- negative controls: a CPU tensor made inside is caught on meta -------------------------------

def _plant_cpu_aranges(monkeypatch):
    """Every `torch.arange` made without its `device` (the bug this file guards against)."""
    real = torch.arange
    monkeypatch.setattr(torch, "arange", lambda *a, device=None, **k: real(*a, **k))


@pytest.mark.parametrize("method", sorted(registry.trainers()))
def test_a_cpu_tensor_made_inside_the_training_forward_is_caught(method, data, target, monkeypatch):
    model, b = _draft_and_batch(method, (), data, target)
    _plant_cpu_aranges(monkeypatch)
    with pytest.raises(RuntimeError, match="device"):
        _train_step(method, model, b, "meta")


def test_a_cpu_tensor_made_inside_the_taps_forward_is_caught(monkeypatch):
    model = load_target(REF_TARGET).to("meta")
    _plant_cpu_aranges(monkeypatch)
    with pytest.raises(RuntimeError, match="device"):
        target_taps(model, torch.zeros(1, 8, dtype=torch.long, device="meta"), TAPS, topk=8)
