"""DSpark config checks on every construction path: read from disk, built for a target, and
rebuilt from a dict inside a worker (`DSparkDraftConfig(**d)`, `registry.config_of`)."""

from __future__ import annotations

import dataclasses
import types

import pytest

from vllm_specx import registry
from vllm_specx.methods.dspark.checkpoint import FORMAT_VERSION, read_config
from vllm_specx.methods.dspark.config import DSparkDraftConfig

TARGET = {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
          "intermediate_size": 32, "vocab_size": 50, "rms_norm_eps": 1e-6, "rope_theta": 100.0}


def good() -> DSparkDraftConfig:
    return DSparkDraftConfig.for_target(TARGET, target_layer_ids=(0, 2), num_hidden_layers=1,
                                        block_size=5, mask_token_id=3, markov_rank=4)


def test_a_config_survives_the_trip_to_the_worker():
    cfg = good()
    assert DSparkDraftConfig(**cfg.to_dict()) == cfg  # JSON lists come back as tuples
    hf = types.SimpleNamespace(specx_route="dspark", specx_config=cfg.to_dict())
    method, back = registry.config_of(hf)
    assert method.name == "dspark" and back == cfg


BAD = {
    "mask-outside-vocab": (dict(mask_token_id=50), "mask_token_id 50 outside vocab_size 50"),
    "block-of-one": (dict(block_size=1), "block_size must be >= 2"),
    "unsorted-taps": (dict(target_layer_ids=[2, 0]), "must be distinct, ascending"),
    "duplicate-taps": (dict(target_layer_ids=[1, 1]), "must be distinct, ascending"),
    "negative-tap": (dict(target_layer_ids=[-1, 2]), ">= 0"),
    "no-taps": (dict(target_layer_ids=[]), "target_layer_ids"),
    "string-int": (dict(markov_rank="4"), "markov_rank must be an integer"),
    "zero-rank": (dict(markov_rank=0), "markov_rank must be positive"),
    "bool-flag": (dict(causal="no"), "causal must be true or false"),
    "gqa": (dict(num_key_value_heads=3), "not a multiple of num_key_value_heads"),
    "draft-vocab": (dict(draft_vocab_size=60), "draft_vocab_size 60 exceeds vocab_size 50"),
    "format": (dict(source_format="hub"), "source_format 'hub'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_dict_is_refused_in_the_worker_too(case):
    change, pattern = BAD[case]
    d = {**good().to_dict(), **change}
    with pytest.raises(ValueError, match=pattern):
        DSparkDraftConfig(**d)
    with pytest.raises(ValueError, match=pattern):
        registry.config_of(types.SimpleNamespace(specx_route="dspark", specx_config=d))


def test_frozen_after_checks():
    with pytest.raises(dataclasses.FrozenInstanceError):
        good().block_size = 9


def _specx_raw(**specx):
    return {**TARGET, "num_hidden_layers": 1, "architectures": ["SpecxDSparkModel"],
            "specx": {"method": "dspark", "format_version": FORMAT_VERSION, "target_layer_ids": [0, 2],
                      "block_size": 5, "mask_token_id": 3, "markov_rank": 4, **specx}}


def test_format_version_is_read_and_checked():
    assert read_config(_specx_raw()) == good()
    raw = _specx_raw()
    del raw["specx"]["format_version"]
    with pytest.raises(ValueError, match="missing required field 'specx.format_version'"):
        read_config(raw, "d/config.json")
    assert read_config(_specx_raw(format_version=1)) == good()  # committed drafts are version 1
    assert read_config(_specx_raw(format_version=3)) == good()  # 3 added the next-token stream
    with pytest.raises(ValueError, match="d/config.json: specx.format_version 4 is not supported"):
        read_config(_specx_raw(format_version=4), "d/config.json")


def test_a_bad_value_on_disk_names_the_file():
    with pytest.raises(ValueError, match="d/config.json: DSpark draft config: mask_token_id 77"):
        read_config(_specx_raw(mask_token_id=77), "d/config.json")
