"""Training end to end, reduced, for every trainable method and baseline of the registry: on-policy
data from vLLM (`vllm-specx gen-data`, with taps and the target's top-k), a few steps of
`vllm-specx train` per method (the validation loss falls), then each checkpoint served by vLLM
(ours through the registry's method, a baseline by vLLM's built-in method): greedy output equals
no-spec and vLLM's spec-decode counters show drafts. For EAGLE-3 the drafts vLLM proposes equal
our reference's (`methods.eagle3.model`, the model the trainer optimises) token for token, so the
baseline is trained for exactly what vLLM runs.

Full tier (gen-data, three trainings, 6 engines); the e2e tier checks vLLM's EAGLE-3 drafts against
the reference with the committed head (`test_eagle3_vllm.py`), MTP's in `test_mtp_vllm.py`."""

import json
import subprocess
import sys

import pytest
import torch
from vllm import SamplingParams

from vllm_specx import registry
from vllm_specx.bench.eval import run_configs
from vllm_specx.training import trainer

from .. import helpers as T
from .test_eagle3_vllm import check_proposals

pytestmark = [pytest.mark.e2e, pytest.mark.full]
K = 3


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "data"
    proc = subprocess.run([sys.executable, "-m", "vllm_specx.cli", "gen-data", "--target", str(T.REF_TARGET),
                           "--prompts", "train", "--limit", "40", "--max-tokens", "48", "--taps", "1,4,7",
                           "--topk", "16", "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "meta.json").read_text())["topk"] == 16
    return out


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """{method: (checkpoint dir, training record)} after 40 steps of each trainer."""
    root, out = tmp_path_factory.mktemp("drafts"), {}
    for name in sorted(registry.trainers()):
        argv = ["--method", name, "--target", str(T.REF_TARGET), "--data", str(data), "--out", str(root / name),
                "--steps", "40", "--batch", "4", "--lr", "3e-3", "--val-samples", "8", "--val-every", "20",
                "--seq-len", "96", "--anchors", "8", "--loss", "ce-tv"]
        out[name] = (root / name, trainer.train(trainer.parse_args(argv)))
    return out


def _spec(name, path) -> dict:
    vllm_method = registry.baselines()[name].vllm_method if name in registry.baselines() else name
    return {"method": vllm_method, "model": str(path), "num_speculative_tokens": K}


def test_each_methods_loss_falls(trained):
    for name, (_, rec) in trained.items():
        first, last = rec["log"][0], rec["log"][-1]
        assert last["val_loss"] < 0.9 * first["val_loss"], (name, first, last)
        assert last["tau_greedy"] > first["tau_greedy"], (name, first, last)


def test_each_checkpoint_serves_in_vllm_losslessly(trained, nospec_tokens):
    configs = {name: _spec(name, path) for name, (path, _) in trained.items()}
    rows = run_configs(T.REF_TARGET, configs, T.load_prompts("code", limit=4), max_tokens=32)
    for row in rows:  # greedy output: the session's no-spec engine's (conftest.py)
        assert row["outputs"] == nospec_tokens(4, 32), row
        assert row["num_drafts"] > 0 and row["tau"] >= 1.0, row


def test_vllm_eagle3_drafts_equal_the_trained_reference(trained, target):
    from vllm_specx.methods.eagle3.checkpoint import load
    from vllm_specx.training.taps import embed_and_head

    path, _ = trained["eagle3"]
    ref = load(path, *embed_and_head(target))
    prompt = T.load_prompts("code", limit=1)[0]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    with T.cpu_llm(T.REF_TARGET, speculative_config=_spec("eagle3", path)) as llm:
        llm.collective_rpc(T.record_proposals)
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        proposals = llm.collective_rpc(T.read_proposals)[0]
    check_proposals(out, proposals, lambda seq, pos: ref.greedy_drafts(
        T.target_taps(target, torch.tensor([seq[:pos]]), ref.cfg.target_layer_ids)[0], torch.tensor(seq[:pos + 1]),
        K), K)


def test_vllm_mtp_drafts_equal_the_trained_reference(trained, target):
    """The trained MTP checkpoint, as the trainer saved it: vLLM's greedy drafts equal the
    reference chain (the model the trainer optimised, with the checkpoint's kv_share)."""
    from vllm_specx.methods.mtp.checkpoint import load
    from vllm_specx.training.taps import embed_and_head

    path, _ = trained["mtp"]
    ref = load(path, *embed_and_head(target))
    prompt = T.load_prompts("code", limit=1)[0]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    with T.cpu_llm(T.REF_TARGET, speculative_config=_spec("mtp", path)) as llm:
        llm.collective_rpc(T.record_proposals)
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        proposals = llm.collective_rpc(T.read_proposals)[0]
    check_proposals(out, proposals, lambda seq, pos: ref.greedy_drafts(
        T.target_final_hidden(target, seq[:pos]), torch.tensor(seq[:pos + 1]), K), K)
