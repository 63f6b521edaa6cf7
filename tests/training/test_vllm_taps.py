"""Taps by vLLM's own hidden-state export (`gen-data --taps-via vllm`), engine-free: which path
`auto` picks, the drafter and connector configs vLLM builds an engine config from, the refusal of
engine arguments the export sets itself, the top-k read of vLLM's log-probabilities, and the CPU
copy path of `HiddenStatesConnector` on a hand-made cache (the rows of the request's blocks,
written to its file, reported done). `scripts/check_vllm033.sh` runs these against vLLM 0.33; the
engine path equals transformers' taps in tests/e2e/test_vllm_taps.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from vllm_specx.training import data
from vllm_specx.training.vllm_taps import (HiddenStatesConnector, VllmTaps, _read, _top, kv_transfer_config,
                                           speculative_config)

from ..helpers import REF_TARGET


def test_auto_uses_vllm_for_cuda_taps_and_transformers_on_cpu():
    assert data.taps_via("auto", "cuda") == "vllm" and data.taps_via("auto", "cuda:1") == "vllm"
    assert data.taps_via("auto", "cpu") == "transformers"
    assert data.taps_via("vllm", "cpu") == "vllm" and data.taps_via("transformers", "cuda") == "transformers"
    with pytest.raises(ValueError, match="--taps-via 'hf'"):
        data.taps_via("hf", "cpu")
    assert "extract_hidden_states" in data.taps_path("cpu", "vllm")
    assert "transformers on cpu" in data.taps_path("cpu", "transformers")


def test_vllm_builds_an_engine_config_for_the_export(tmp_path):
    """Our tap i is vLLM's aux id i + 1 (the final layer's included); the connector is ours."""
    from vllm.engine.arg_utils import EngineArgs

    cfg = EngineArgs(model=str(REF_TARGET), dtype="float32", max_model_len=256, enforce_eager=True,
                     speculative_config=speculative_config((1, 4, 7)),
                     kv_transfer_config=kv_transfer_config(tmp_path)).create_engine_config()
    spec = cfg.speculative_config
    assert spec.method == "extract_hidden_states"
    assert list(spec.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids) == [2, 5, 8]
    assert cfg.model_config.hf_config.num_hidden_layers == 8  # aux id 8 = the last layer's output
    kv = cfg.kv_transfer_config
    assert (kv.kv_connector, kv.kv_connector_module_path) == ("HiddenStatesConnector",
                                                              "vllm_specx.training.vllm_taps")


@pytest.mark.parametrize("key", ["speculative_config", "kv_transfer_config"])
def test_engine_arguments_the_export_sets_are_refused(key):
    with pytest.raises(ValueError, match=f"--engine-args \\['{key}'\\]"):
        VllmTaps(str(REF_TARGET), (1,), engine_args={key: {}})


def test_top_k_from_vllm_logprobs():
    lp = lambda v, r: SimpleNamespace(logprob=v, rank=r)  # noqa: E731
    # the actual token (id 9) ranked 5th is listed beside the top 2
    assert _top({9: lp(-4.0, 5), 3: lp(-0.1, 1), 7: lp(-2.5, 2)}, 2) == ([-0.1, -2.5], [3, 7])
    with pytest.raises(RuntimeError, match="returned 1 log-probabilities"):
        _top({3: lp(-0.1, 1)}, 2)


def test_a_missing_file_is_a_timeout_not_a_hang(tmp_path):
    with pytest.raises(TimeoutError, match="did not write .*x.safetensors"):
        _read(str(tmp_path / "x.safetensors"), wait_s=0.05)


def test_connector_copies_a_cpu_cache_to_the_request_file(tmp_path):
    """Block b, offset o of the cache-only layer ([blocks, n_taps, block_size, hidden]) holds
    token b * block_size + o of the request's slots: the file holds the request's tokens' rows,
    in its block order, and get_finished reports the request done."""
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import PendingSave

    block, n, hidden = 4, 3, 5
    cache = torch.randn(6, n, block, hidden)
    conn = HiddenStatesConnector.__new__(HiddenStatesConnector)  # worker state only, no vLLM config
    conn._kv_cache, conn._block_size, conn._is_tp_rank_zero = cache, block, True
    conn._lock_fds, conn._req_copy_events, conn._req_futures = {}, {}, {}
    conn._accumulated_finished_req_ids, conn._connector_metadata = set(), None
    tokens = torch.arange(7)
    conn._submit_async_write(PendingSave("r", str(tmp_path / "r.safetensors"), tokens, [5, 2]))
    saved = load_file(tmp_path / "r.safetensors")
    want = torch.cat([cache[5].permute(1, 0, 2), cache[2].permute(1, 0, 2)])[:7]  # [tokens, n, hidden]
    assert torch.equal(saved["hidden_states"], want) and torch.equal(saved["token_ids"], tokens)
    assert conn.get_finished({"r"}) == ({"r"}, None)
    # negative control: other blocks give other rows
    conn._submit_async_write(PendingSave("s", str(tmp_path / "s.safetensors"), tokens, [2, 5]))
    assert not torch.equal(load_file(tmp_path / "s.safetensors")["hidden_states"], want)
