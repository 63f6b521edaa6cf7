"""Bad DSpark drafts fail while the engine config is built, with the field or file named."""

import json
import shutil

import pytest

from .helpers import REF_TARGET, load_target, random_draft, write


@pytest.fixture(scope="module")
def good_draft(tmp_path_factory):
    return write(random_draft(load_target(REF_TARGET)), tmp_path_factory.mktemp("good") / "d")


def _engine_config(draft, n=7):
    from vllm.engine.arg_utils import EngineArgs

    spec = {"method": "dspark", "model": str(draft), "num_speculative_tokens": n}
    return EngineArgs(model=str(REF_TARGET), dtype="float32", max_model_len=512,
                      enforce_eager=True, speculative_config=spec).create_engine_config()


def _edit_specx(cfg, **kw):
    cfg["specx"].update(kw)


CASES = {
    "missing-safetensors": (lambda d: (d / "model.safetensors").unlink(), "no \\*.safetensors"),
    "corrupt-safetensors": (lambda d: (d / "model.safetensors").write_bytes(b"\x08garbage"),
                            "corrupt safetensors file .*model.safetensors"),
    "wrong-shape": ("config", lambda c: c.update(intermediate_size=512),
                    "tensor 'layers.0.mlp.gate_proj.weight' has shape \\[768, 256\\], expected \\[512, 256\\]"),
    "tap-outside-target": ("config", lambda c: _edit_specx(c, target_layer_ids=[1, 4, 8]),
                           "layer\\(s\\) \\[8\\] outside the target's 8 layers"),
    "hidden-mismatch": ("config", lambda c: _edit_specx(c, target_hidden_size=128),
                        "target_hidden_size 128 != target hidden_size 256"),
    "vocab-mismatch": ("config", lambda c: c.update(vocab_size=5000),
                       "vocab_size 5000 != target vocab_size 4096"),
    "missing-field": ("config", lambda c: c["specx"].pop("markov_rank"),
                      "missing required field 'markov_rank'"),
    "bad-json": (lambda d: (d / "config.json").write_text("{not json"), "config.json: invalid JSON"),
    "future-format-version": ("config", lambda c: _edit_specx(c, format_version=4),
                              "specx.format_version 4 is not supported"),
    "bad-value-for-worker": ("config", lambda c: _edit_specx(c, mask_token_id=4096),
                             "mask_token_id 4096 outside vocab_size 4096"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_draft_is_rejected_with_a_clear_error(tmp_path, good_draft, case):
    draft = tmp_path / "draft"
    shutil.copytree(good_draft, draft)
    spec = CASES[case]
    if spec[0] == "config":
        cfg = json.loads((draft / "config.json").read_text())
        spec[1](cfg)
        (draft / "config.json").write_text(json.dumps(cfg))
        pattern = spec[2]
    else:
        spec[0](draft)
        pattern = spec[1]
    with pytest.raises(Exception, match=pattern):
        _engine_config(draft)


def test_num_speculative_tokens_larger_than_block(good_draft, tmp_path):
    """Anchor layout: a block of 8 slots drafts up to 8 tokens; fill-in layout: up to 7."""
    _engine_config(good_draft, n=8)
    with pytest.raises(Exception, match=r"num_speculative_tokens 9 exceeds this DSpark draft's "
                                        r"block: block_size 8 \(anchor layout\) gives at most 8"):
        _engine_config(good_draft, n=9)
    fill_in = write(random_draft(load_target(REF_TARGET), anchor=False), tmp_path / "fill-in")
    with pytest.raises(Exception, match=r"num_speculative_tokens 8 exceeds this DSpark draft's "
                                        r"block: block_size 8 \(fill-in layout\) gives at most 7"):
        _engine_config(fill_in, n=8)
