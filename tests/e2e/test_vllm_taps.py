"""`gen-data --taps-via vllm` equals the contract, transformers' taps (`taps.target_taps`): the same
data folder's taps and top-k computed both ways on the reference target (a middle layer and the
final one, whose tap is before the final norm in both), one vLLM engine with its
`extract_hidden_states` drafter and our CPU hidden-state connector."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from vllm_specx.training.data import main

from .. import helpers as T

pytestmark = pytest.mark.e2e
TAPS, TOPK, HIDDEN = "1,4,7", 8, 256  # the reference target: 8 layers, hidden 256


def test_vllm_taps_equal_transformers_taps(tmp_path, capsys):
    g = torch.Generator().manual_seed(0)
    rows = [{"id": i, "prompt_ids": torch.randint(0, 4000, (5 + 3 * i,), generator=g).tolist(),
             "output_ids": torch.randint(0, 4000, (8,), generator=g).tolist()} for i in range(6)]
    for via in ("transformers", "vllm"):
        T.data_folder(tmp_path / via, rows)
        main(["--target", str(T.REF_TARGET), "--prompts", "train", "--out", str(tmp_path / via), "--taps", TAPS,
              "--topk", str(TOPK), "--max-tokens", "8", "--taps-only", "--taps-via", via, "--device", "cpu"])
    assert "by vLLM's extract_hidden_states export" in capsys.readouterr().out
    ref, got = (load_file(next((tmp_path / v / "taps").glob("*.safetensors"))) for v in ("transformers", "vllm"))
    assert ref.keys() == got.keys() and len(ref) == 4 * len(rows)
    for r in rows:
        i = r["id"]
        assert torch.equal(ref[f"ids_{i}"], got[f"ids_{i}"])
        a, b = ref[f"taps_{i}"].float(), got[f"taps_{i}"].float()
        assert a.shape == b.shape == (len(r["prompt_ids"]) + 8, 3 * HIDDEN)
        assert (a - b).abs().max() <= 1e-2 * a.abs().max(), f"sample {i}: taps differ"
        # negative control: the same rows' taps of another layer are far off
        assert (a[:, :HIDDEN] - b[:, HIDDEN:2 * HIDDEN]).abs().max() > 0.1 * a.abs().max()
        assert (ref[f"topk_ids_{i}"] == got[f"topk_ids_{i}"]).float().mean() >= 0.95
        assert torch.allclose(ref[f"topk_logp_{i}"][:, 0], got[f"topk_logp_{i}"][:, 0], atol=1e-3)
