"""vllm-specx on vLLM 0.34 through vLLM's speculator plugin API, checked without an engine.

`scripts/check_vllm034.sh` runs this file in a venv with vLLM 0.34's CUDA wheel (no GPU here:
`VLLM_TARGET_DEVICE=cpu`, and `CUDA_VISIBLE_DEVICES=` so that vLLM 0.34's CPU platform accepts
the CUDA wheel's Triton when the engine config is built). Everything but the version-routing
test is skipped unless vLLM >= 0.34 is importable.

What it shows: `register()` takes the V2 path on 0.34 and patches nothing; our DSpark config is
what vLLM builds for `"method": "specx_dspark"`, `"dspark"` and no method with a vllm-specx
checkpoint; options vLLM or our checks refuse are refused by name; and vLLM 0.34's own DSpark
draft loop (`DSparkSpeculator._sample_markov_chain`), run on our model hooks on CPU tensors,
gives exactly the reference drafts (`DSparkDraft.greedy_drafts`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vllm_specx.vllm_versions import serving_path

from .helpers import REF_TARGET, load_target, random_draft, target_taps, write

K = 7


def _vllm_at_least_034() -> bool:
    try:
        import vllm
    except Exception:
        return False
    from vllm_specx.vllm_versions import minor

    return minor(vllm.__version__) >= (0, 34)


needs_034 = pytest.mark.skipif(not _vllm_at_least_034(), reason="needs vLLM >= 0.34 (scripts/check_vllm034.sh)")


@pytest.mark.parametrize("version,path", [("0.32.0", "v1"), ("0.32.0+cpu", "v1"), ("0.33.2", "v1"),
                                          ("0.34.0", "v2"), ("0.34.1", "v2"), ("0.34.0rc1", "v2")])
def test_serving_path_by_version(version, path):
    assert serving_path(version) == path


@pytest.mark.parametrize("version", ["0.31.2", "0.35.0", "1.0.0"])
def test_unsupported_versions_name_the_range(version):
    with pytest.raises(RuntimeError, match=rf"vLLM >= 0\.32, < 0\.35.*found vLLM {version}"):
        serving_path(version)


# ---- vLLM >= 0.34 ------------------------------------------------------------------------------

@needs_034
def test_register_uses_the_speculator_api_and_patches_nothing():
    """In a fresh process (as vLLM's plugin loader calls it): our method name and draft
    architecture are registered with vLLM, and none of the V1-runner patches are imported."""
    code = """
import json, sys
import vllm_specx
vllm_specx.register()
vllm_specx.register()  # idempotent
from vllm import ModelRegistry
from vllm.v1.worker.gpu.spec_decode import speculator_config as sc
from vllm_specx import speculator_api
cls = sc.get_custom_speculator_config_class("specx_dspark")
print(json.dumps({
    "methods": sc.registered_speculative_methods(),
    "config": f"{cls.__module__}.{cls.__qualname__}", "base": cls.base_method,
    "speculator": cls.speculator_class,
    "arch": "SpecxDSparkModel" in ModelRegistry.get_supported_archs(),
    "compat_loaded": sorted(m for m in sys.modules if m.startswith("vllm_specx._vllm_compat")),
    "patched": list(speculator_api.PATCHED),
}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert "specx_dspark" in got["methods"]
    assert got["config"] == "vllm_specx.methods.dspark.speculator.SpecxDSparkSpeculatorConfig"
    assert got["base"] == "dspark"
    assert got["speculator"] == "vllm_specx.methods.dspark.vllm_model_v2.SpecxDSparkSpeculator"
    assert got["arch"]
    assert got["compat_loaded"] == [] and got["patched"] == []


@needs_034
def test_speculator_class_is_vllms_dspark_speculator():
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    from vllm_specx.methods.dspark.speculator import SpecxDSparkSpeculatorConfig
    from vllm_specx.methods.dspark.vllm_model_v2 import SpecxDSparkForCausalLM

    assert issubclass(resolve_obj_by_qualname(SpecxDSparkSpeculatorConfig.speculator_class), DSparkSpeculator)
    assert SpecxDSparkForCausalLM.speculator_config_class is SpecxDSparkSpeculatorConfig


@needs_034
def test_every_v2_internal_resolves_in_vllm():
    """Each vLLM internal the 0.34 path names (`VLLM_INTERNALS_V2`, read by tests/test_layout.py
    from every module) exists in the installed vLLM."""
    from vllm_specx import _vllm_compat

    from .test_layout import v2_internals

    names = v2_internals()
    assert "vllm.v1.worker.gpu.spec_decode.dspark.speculator:DSparkSpeculator._sample_markov_chain" in names
    missing = []
    for name in sorted(names):
        try:
            _vllm_compat.resolve(name)
        except (ImportError, AttributeError) as e:
            missing.append(f"{name}: {e}")
    assert not missing, missing


@pytest.fixture(scope="module")
def target():
    return load_target(REF_TARGET)


@pytest.fixture(scope="module")
def draft_dir(target, tmp_path_factory):
    return write(random_draft(target), tmp_path_factory.mktemp("v034") / "d")


def _engine_config(draft, method="specx_dspark", **spec):
    import vllm_specx
    from vllm.engine.arg_utils import EngineArgs

    vllm_specx.register()
    spec = {"model": str(draft), **spec}
    if method is not None:
        spec["method"] = method
    return EngineArgs(model=str(REF_TARGET), dtype="float32", max_model_len=512, enforce_eager=True,
                      speculative_config=spec).create_engine_config()


@needs_034
@pytest.mark.parametrize("method", ["specx_dspark", "dspark", None])
def test_engine_config_picks_our_dspark_for_every_spelling(draft_dir, method):
    """Our own name (a custom method), vLLM's built-in name and no method: all three give our
    config for a vllm-specx checkpoint (the built-in two through the architecture's declared
    `speculator_config_class`), with the checkpoint mirrored into the draft's HF config."""
    from vllm_specx.methods.dspark.speculator import SpecxDSparkSpeculatorConfig

    cfg = _engine_config(draft_dir, method, num_speculative_tokens=K)
    spec = cfg.speculative_config
    assert type(spec.speculator_config) is SpecxDSparkSpeculatorConfig
    assert spec.method == "dspark"
    assert spec.custom_method == ("specx_dspark" if method == "specx_dspark" else None)
    hf = spec.draft_model_config.hf_config
    assert spec.draft_model_config.architectures == ["SpecxDSparkModel"]
    assert (hf.block_size, hf.markov_rank, hf.sample_from_anchor, hf.mask_token_id) == (8, 32, True, 2)
    assert hf.dflash_config["target_layer_ids"] == [1, 4, 6]
    assert spec.uses_aux_hidden_states and spec.speculator_config.parallel_drafting
    assert cfg.num_lookahead_tokens == K  # anchor layout: K query slots, the anchor predicts


@needs_034
def test_num_speculative_tokens_defaults_to_the_block(draft_dir):
    assert _engine_config(draft_dir).speculative_config.num_speculative_tokens == 8


@needs_034
@pytest.mark.parametrize("method", ["specx_dspark", "dspark"])
def test_vllm_refuses_options_we_do_not_honour_by_name(draft_dir, method):
    with pytest.raises(Exception, match=f"dspark_draft_topk is not supported with speculative method '{method}'"):
        _engine_config(draft_dir, method, num_speculative_tokens=K, dspark_draft_topk=4)


@needs_034
def test_too_many_drafts_refused_naming_the_block(draft_dir):
    with pytest.raises(Exception, match=r"vllm-specx: .*num_speculative_tokens 9 exceeds .*block_size 8"):
        _engine_config(draft_dir, num_speculative_tokens=9)


@needs_034
def test_bad_checkpoint_refused_naming_the_field(draft_dir, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(draft_dir, bad)
    raw = json.loads((bad / "config.json").read_text())
    raw["specx"]["target_layer_ids"] = [1, 4, 99]
    (bad / "config.json").write_text(json.dumps(raw))
    with pytest.raises(Exception, match=r"vllm-specx: .*target_layer_ids .*\[99\] outside the target's 8 layers"):
        _engine_config(bad, num_speculative_tokens=K)


@needs_034
def test_v2_unsupported_draft_features_refused_by_name(target, tmp_path):
    d = write(random_draft(target, slot_queries=True), tmp_path / "sq")
    with pytest.raises(Exception, match=r"vllm-specx: .*slot_queries .*not served on vLLM's V2"):
        _engine_config(d, num_speculative_tokens=K)


# ---- vLLM 0.34's DSpark draft loop on our model hooks, against the reference ------------------

def _hooks(draft):
    """Our V2 model's Markov hooks and vLLM's draft->target map, over a reference DSparkDraft."""
    from vllm.model_executor.models.qwen3_dspark import Qwen3DSparkForCausalLM

    from vllm_specx.methods.dspark.vllm_model_v2 import SpecxMarkovHooks

    class Hooks(SpecxMarkovHooks):
        map_draft_to_target = Qwen3DSparkForCausalLM.map_draft_to_target

    h = Hooks()
    h.model = SimpleNamespace(markov_head=draft.markov_head)
    h.draft_id_to_target_id = getattr(draft, "d2t", None) if draft.cfg.reduced_vocab else None
    return h


def _vllm_loop(draft, hidden, anchors, n):
    """vLLM 0.34's `DSparkSpeculator._sample_markov_chain` (greedy drafts: its Triton argmax, run
    by the Triton interpreter on CPU) on `SpecxDSparkSpeculator` with our hooks.
    hidden: [B, n, H] post-norm states of the sample slots."""
    from vllm_specx.methods.dspark.vllm_model_v2 import SpecxDSparkSpeculator

    spec = object.__new__(SpecxDSparkSpeculator)
    spec.num_speculative_steps, spec.use_confidence_head, spec._fuse_markov_bias = n, False, False
    spec.model, spec.draft_logits, spec.acceptance_estimator = _hooks(draft), None, None
    spec._d2t_scatter_index, spec._step_cols = None, torch.arange(n, dtype=torch.int32)
    b = hidden.shape[0]
    out = torch.zeros(b, n, dtype=torch.long)
    base = hidden @ draft.lm_head.t()
    with torch.no_grad():
        spec._sample_markov_chain(base, hidden.reshape(b * n, -1), anchors, torch.zeros(b, n, dtype=torch.long),
                                  torch.arange(n).repeat(b, 1), out)
    return out


HEADS = [dict(markov_head_type="vanilla"), dict(markov_head_type="gated"), dict(markov_head_type="rnn"),
         dict(markov_head_type="rnn", draft_vocab=list(range(0, 4096, 3)))]


@needs_034
@pytest.mark.parametrize("kw", HEADS, ids=["vanilla", "gated", "rnn", "rnn-reduced-vocab"])
def test_markov_hooks_give_the_reference_heads_bias(target, kw):
    """markov_step + markov_bias (what vLLM's loop adds to the base logits) equal our
    MarkovHead.step's bias, step by step with the recurrent state carried."""
    draft = random_draft(target, **kw)
    hooks = _hooks(draft)
    prev = torch.tensor([5, 17, 300])
    hidden = torch.randn(3, 4, draft.cfg.hidden_size)
    state_ref = state = None
    for k in range(4):
        bias_ref, state_ref = draft.markov_head.step(prev, hidden[:, k], state_ref)
        embed, state = hooks.markov_step(prev, hidden[:, k], state)
        torch.testing.assert_close(hooks.markov_bias(embed), bias_ref, rtol=0, atol=0)
        prev = bias_ref.argmax(-1)


@needs_034
@pytest.mark.parametrize("kw", HEADS, ids=["vanilla", "gated", "rnn", "rnn-reduced-vocab"])
def test_vllm_dspark_loop_on_our_hooks_drafts_the_reference(target, kw):
    """Two requests, K drafts each: vLLM 0.34's draft loop on our hooks, fed the reference
    model's slot states, gives `DSparkDraft.greedy_drafts` token for token (reduced vocabulary:
    target ids through vLLM's `map_draft_to_target`)."""
    draft = random_draft(target, **kw)
    torch.manual_seed(1)
    prefixes = [torch.randint(3, 4000, (12,)) for _ in range(2)]
    anchors = [int(p[-1]) for p in prefixes]
    refs, hidden = [], []
    for p, a in zip(prefixes, anchors):
        ctx = p[:-1]
        taps = target_taps(target, ctx[None], draft.cfg.target_layer_ids)[0]
        refs.append(draft.greedy_drafts(taps, a, K, tokens=ctx))
        hidden.append(draft.query_states(taps, a, K, tokens=ctx)[draft.cfg.slot_offset:])
    got = _vllm_loop(draft, torch.stack(hidden), torch.tensor(anchors), K)
    assert got.tolist() == refs
    assert len({tuple(r) for r in refs}) == 2  # the two requests draft differently
