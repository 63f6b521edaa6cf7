"""A real `vllm serve` refuses bad drafts at start-up: it exits non-zero within two minutes, never
starts serving (no silent fallback to no-spec), and its output carries the one-line
"vllm-specx: ..." message naming the file or field (the full table of broken inputs, checked
without starting a server, is `tests/test_malformed_drafts.py`)."""

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from ..helpers import REF_TARGET, load_target, random_draft, write
from .serving import expect_exit, spawn_vllm_serve

pytestmark = pytest.mark.e2e


def _no_config(d):
    (d / "config.json").unlink()


def _nan_weights(d):
    t = load_file(d / "model.safetensors")
    t["fc.weight"].fill_(float("nan"))
    save_file(t, d / "model.safetensors")


# name -> (mutation of a good DSpark draft, num_speculative_tokens, pattern of the one line)
BAD = {
    "missing-config-json": (_no_config, 7, r"vllm-specx: draft checkpoint \S+/missing-config-json: no config\.json"),
    "nan-weights": (_nan_weights, 7, r"vllm-specx: draft checkpoint \S+/nan-weights: tensor 'fc\.weight' in "
                                     r"\S+/model\.safetensors has 196608 NaN"),
    "k-zero": (None, 0, r"vllm-specx: method 'dspark': speculative_config option 'num_speculative_tokens' = 0"),
}


def test_vllm_serve_exits_at_startup_with_one_line_naming_the_problem(tmp_path):
    good = write(random_draft(load_target(REF_TARGET)), tmp_path / "good")
    running = {}
    for name, (mutate, k, _) in BAD.items():  # the three servers start side by side
        draft = tmp_path / name
        shutil.copytree(good, draft)
        if mutate:
            mutate(draft)
        spec = json.dumps({"method": "dspark", "model": str(draft), "num_speculative_tokens": k})
        args = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
                "--speculative-config", spec]
        running[name] = (*spawn_vllm_serve(REF_TARGET, args, tmp_path / f"{name}.log"), tmp_path / f"{name}.log")
    for name, (proc, base, log) in running.items():
        rc, out = expect_exit(proc, base, log, timeout=120)
        assert rc != 0, f"{name}: vllm serve exited 0:\n{out[-3000:]}"
        lines = [line for line in out.splitlines() if re.search(BAD[name][2], line)]
        assert lines, f"{name}: no line matching {BAD[name][2]!r} in:\n{out[-3000:]}"
        assert not any("Starting vLLM API server" in line or "EngineCore" in line and "started" in line
                       for line in out.splitlines()), f"{name}: an engine started:\n{out[-3000:]}"
    assert torch.isnan(load_file(tmp_path / "nan-weights" / "model.safetensors")["fc.weight"]).all()
