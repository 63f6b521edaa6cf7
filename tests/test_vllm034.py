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

def _registered_in_fresh_process(method: str, arch: str) -> dict:
    """What a fresh process sees after `vllm_specx.register()` (called twice: it is idempotent),
    as vLLM's plugin loader calls it: the registered methods, `method`'s config class, its base
    method and speculator, whether `arch` is registered, which V1-runner patch modules are
    imported and what the 0.34 path patches."""
    code = f"""
import json, sys
import vllm_specx
vllm_specx.register()
vllm_specx.register()  # idempotent
from vllm import ModelRegistry
from vllm.v1.worker.gpu.spec_decode import speculator_config as sc
from vllm_specx import speculator_api
cls = sc.get_custom_speculator_config_class({method!r})
print(json.dumps({{
    "methods": sc.registered_speculative_methods(),
    "config": f"{{cls.__module__}}.{{cls.__qualname__}}", "base": cls.base_method,
    "speculator": cls.speculator_class,
    "arch": {arch!r} in ModelRegistry.get_supported_archs(),
    "compat_loaded": sorted(m for m in sys.modules if m.startswith("vllm_specx._vllm_compat")),
    "patched": list(speculator_api.PATCHED),
}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_034
def test_register_uses_the_speculator_api_and_patches_nothing():
    """In a fresh process (as vLLM's plugin loader calls it): our method name and draft
    architecture are registered with vLLM, and none of the V1-runner patches are imported."""
    got = _registered_in_fresh_process("specx_dspark", "SpecxDSparkModel")
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


# ---- MTP on vLLM 0.34 ---------------------------------------------------------------------------
#
# Our MTP checkpoint is served by vLLM's own MTP (`MTPSpeculator`, a `TargetDependentARSpeculator`)
# on our layer (`SpecxMTPV2ForCausalLM`), through `SpecxMTPSpeculatorConfig`; vLLM's MTP loop is
# the reference's chain with kv_share off, and with KVShare when our speculator holds the sequence
# length at step 0's; the K3 fusion is refused by name.

MTP_K = 4
REF_MTP = REF_TARGET.parent / "drafts" / "ref-mtp"  # committed; trained with kv_share on


@pytest.fixture(scope="module")
def mtp_dir(target, tmp_path_factory):
    """The committed ref-mtp draft's tensors with kv_share off (what vLLM's MTP loop serves)."""
    from vllm_specx.methods.mtp import checkpoint

    return checkpoint.with_options(REF_MTP, tmp_path_factory.mktemp("v034mtp") / "ref-mtp-mixed", kv_share=False)


@needs_034
def test_mtp_registers_through_the_speculator_api():
    """In a fresh process: `specx_mtp` and the `SpecxMTPModel` architecture are registered, the
    config is ours on vLLM's MTP, and nothing of the V1-runner patches is imported."""
    got = _registered_in_fresh_process("specx_mtp", "SpecxMTPModel")
    assert {"specx_mtp", "specx_dspark"} <= set(got["methods"])
    assert got["config"] == "vllm_specx.methods.mtp.speculator.SpecxMTPSpeculatorConfig"
    assert got["base"] == "mtp"
    assert got["speculator"] == "vllm_specx.methods.mtp.vllm_model_v2.SpecxMTPSpeculator"
    assert got["arch"] and got["compat_loaded"] == []


@needs_034
def test_mtp_speculator_and_config_are_vllms_mtp():
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.worker.gpu.spec_decode.mtp.config import MTPSpeculatorConfig
    from vllm.v1.worker.gpu.spec_decode.mtp.speculator import MTPSpeculator

    from vllm_specx.methods.mtp.speculator import SpecxMTPSpeculatorConfig
    from vllm_specx.methods.mtp.vllm_model_v2 import SpecxMTPV2ForCausalLM

    assert issubclass(SpecxMTPSpeculatorConfig, MTPSpeculatorConfig)
    assert issubclass(resolve_obj_by_qualname(SpecxMTPSpeculatorConfig.speculator_class), MTPSpeculator)
    assert SpecxMTPV2ForCausalLM.speculator_config_class is SpecxMTPSpeculatorConfig
    assert "specx_mtp" in __import__("vllm_specx.speculator_api").speculator_api.method_names()


@needs_034
@pytest.mark.parametrize("method", ["specx_mtp", "mtp", None])
def test_engine_config_picks_our_mtp_for_every_spelling(mtp_dir, method):
    """Our name, vLLM's built-in "mtp" and no method all give our config (the latter two through
    the architecture's declared `speculator_config_class`) on vLLM's MTP setup: the target's
    final hidden states, K lookahead slots, the validated config stored for the worker."""
    from vllm_specx.methods.mtp import checkpoint
    from vllm_specx.methods.mtp.speculator import SpecxMTPSpeculatorConfig

    cfg = _engine_config(mtp_dir, method, num_speculative_tokens=MTP_K)
    spec = cfg.speculative_config
    assert type(spec.speculator_config) is SpecxMTPSpeculatorConfig
    assert spec.method == "mtp"
    assert spec.custom_method == ("specx_mtp" if method == "specx_mtp" else None)
    assert spec.draft_model_config.architectures == ["SpecxMTPModel"]
    hf = spec.draft_model_config.hf_config
    assert hf.specx_route == "mtp"
    assert hf.specx_config == checkpoint.read_config(json.loads((Path(mtp_dir) / "config.json").read_text())).to_dict()
    assert hf.specx_config["kv_share"] is False
    assert spec.uses_target_hidden_states and not spec.uses_aux_hidden_states
    assert spec.num_speculative_tokens == MTP_K and cfg.num_lookahead_tokens == MTP_K


@needs_034
@pytest.mark.parametrize("method", ["specx_mtp", None])
def test_mtp_num_speculative_tokens_defaults_to_max_drafts(mtp_dir, method):
    assert _engine_config(mtp_dir, method).speculative_config.num_speculative_tokens == 7


@needs_034
@pytest.mark.parametrize("method", ["specx_mtp", "mtp"])
@pytest.mark.parametrize("option,value", [("index_share_for_mtp_iteration", True),
                                          ("draft_lm_head_quantization", "fp8")])
def test_vllm_refuses_mtp_options_we_do_not_honour_by_name(mtp_dir, method, option, value):
    """vLLM's MTP accepts both options; our config does not (dense layer; the reference scores
    with the target's own LM head), so vLLM refuses them naming the option and our method."""
    with pytest.raises(Exception, match=f"{option} is not supported with speculative method '{method}'"):
        _engine_config(mtp_dir, method, num_speculative_tokens=MTP_K, **{option: value})


@needs_034
def test_bad_mtp_checkpoint_refused_naming_the_field(mtp_dir, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(mtp_dir, bad)
    raw = json.loads((bad / "config.json").read_text())
    raw["specx"]["target_num_hidden_layers"] = 9
    (bad / "config.json").write_text(json.dumps(raw))
    with pytest.raises(Exception, match=r"vllm-specx: .*target_num_hidden_layers = 9 but the target's "
                                        r"num_hidden_layers is 8"):
        _engine_config(bad, "specx_mtp", num_speculative_tokens=MTP_K)


@needs_034
@pytest.mark.parametrize("method", ["specx_mtp", "mtp", None])
def test_mtp_v2_unsupported_features_refused_by_name(target, tmp_path, method):
    """The committed ref-mtp-k3 (K3 fusion: vLLM's MTP loop hands an MTP drafter no aux hidden
    states) is refused naming its field, on every spelling; the committed KVShare drafts are not
    (they are served: `test_vllm_mtp_propose_on_our_model_drafts_the_reference`)."""
    with pytest.raises(Exception, match=r"vllm-specx: draft .*specx\.fusion_layer_ids .*not served on vLLM's V2"):
        _engine_config(REF_MTP.parent / "ref-mtp-k3", method, num_speculative_tokens=MTP_K)
    _engine_config(REF_MTP, method, num_speculative_tokens=MTP_K)  # KVShare: accepted


# ---- vLLM 0.34's MTP propose on our V2 model, against the reference ----------------------------

class _DenseAttention(torch.nn.Module):
    """Stands in for vLLM's attention layer (no attention backend runs on this CPU without vLLM's
    CPU kernels): paged-attention semantics on a dense K/V store, read from the speculator's own
    input buffers. Every token of request r writes its K/V at (r, its slot's position): for the
    draft prefill the target's positions (vLLM reuses the target's slot mappings there), for a
    decode step the speculator's `positions` buffer (what vLLM computes its slot mappings from);
    query j of a request with query length Q and sequence length S attends to positions
    0 .. S - Q + j (vLLM's causal rule for a chunk ending at S)."""

    def __init__(self, bufs, heads, kv_heads, head_dim, scale, max_reqs, max_len):
        super().__init__()
        self.bufs, self.heads, self.kv_heads, self.head_dim, self.scale = bufs, heads, kv_heads, head_dim, scale
        self.k = torch.zeros(max_reqs, max_len, kv_heads, head_dim)
        self.v = torch.zeros_like(self.k)
        self.num_reqs = 0
        self.prefill_positions = None  # the target's positions, for the next (prefill) call

    def forward(self, q, k, v):
        n, b = q.shape[0], self.bufs
        q, k, v = (t.reshape(n, -1, self.head_dim) for t in (q, k, v))
        pos, qsl, seq_lens = b.positions[:n], b.query_start_loc, b.seq_lens
        if self.prefill_positions is not None:
            pos, self.prefill_positions = self.prefill_positions, None
        rep = self.heads // self.kv_heads
        out = torch.zeros(n, self.heads, self.head_dim)
        spans = [(int(qsl[r]), int(qsl[r + 1]), int(seq_lens[r])) for r in range(self.num_reqs)]
        for r, (lo, hi, _) in enumerate(spans):
            self.k[r, pos[lo:hi]], self.v[r, pos[lo:hi]] = k[lo:hi], v[lo:hi]
        for r, (lo, hi, s) in enumerate(spans):
            for j in range(hi - lo):
                n_keys = s - (hi - lo) + j + 1
                kk = self.k[r, :n_keys].repeat_interleave(rep, 1)
                vv = self.v[r, :n_keys].repeat_interleave(rep, 1)
                w = torch.einsum("hd,shd->hs", q[lo + j], kk) * self.scale
                out[lo + j] = torch.einsum("hs,shd->hd", w.softmax(-1), vv)
        return out.reshape(n, -1)


def _init_dist_once():
    import socket

    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if model_parallel_is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                 distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo")
    initialize_model_parallel(1, 1)


def _target_head_module(target):
    """The parts of a target model vLLM's MTP loader shares with the draft: `model.embed_tokens`
    and `lm_head` (vLLM's layers, holding the reference target's weights)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    v, h = target.config.vocab_size, target.config.hidden_size
    tm = torch.nn.Module()
    tm.model = torch.nn.Module()
    tm.model.embed_tokens, tm.lm_head = VocabParallelEmbedding(v, h), ParallelLMHead(v, h)
    with torch.no_grad():
        tm.model.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        tm.lm_head.weight.copy_(target.lm_head.weight)
    tm.lm_head.quant_method.process_weights_after_loading(tm.lm_head)
    return tm


class _MTPRun:
    """vLLM 0.34's `SpecxMTPSpeculator` (vLLM's MTPSpeculator) built from a real engine config,
    its draft loaded by vLLM's MTP loader (`load_eagle_model`: our `load_weights`, the target's
    embeddings and LM head shared), its attention replaced by `_DenseAttention`; `propose` is
    vLLM's own (prefill on the target's batch, then one decode step per further draft: its Triton
    input kernels and greedy argmax run in the Triton interpreter)."""

    MAX_REQS, MAX_LEN = 8, 512

    def __init__(self, target, draft_dir, k):
        from vllm.config import set_current_vllm_config

        from vllm_specx.methods.mtp.vllm_model_v2 import SpecxMTPSpeculator

        self.cfg = _engine_config(draft_dir, "specx_mtp", num_speculative_tokens=k)
        # vLLM's native torch ops (its CPU custom ops need vllm._C, absent from the CUDA wheel)
        self.cfg.compilation_config.custom_ops = ["none"]
        with set_current_vllm_config(self.cfg):
            _init_dist_once()
            self.target_parts = _target_head_module(target)
            self.spec = SpecxMTPSpeculator(self.cfg, torch.device("cpu"))
            self.spec.model = self.spec.load_draft_model(self.target_parts, set())
        # loading the draft (lm_head_from_target: rows copied in) leaves the target's own head alone
        assert torch.equal(self.target_parts.lm_head.weight, target.lm_head.weight)
        assert self.spec.model.lm_head is not self.target_parts.lm_head or self.spec.model.draft_id_to_target_id is None
        sa = self.spec.model.model.mtp_block.self_attn
        self.attn = _DenseAttention(self.spec.input_buffers, sa.num_heads, sa.num_kv_heads, sa.head_dim,
                                    sa.scaling, self.MAX_REQS, self.MAX_LEN)
        sa.attn = self.attn

    def propose(self, chunks, starts, hidden, num_rejected, next_tokens):
        """One `propose` after a target pass: request r's target pass ran `chunks[r]` (token ids)
        at positions starts[r].., `hidden` their final hidden states (concatenated), the last
        num_rejected[r] of them rejected drafts, next_tokens[r] the token sampled after."""
        import numpy as np
        from vllm.config import set_current_vllm_config

        n = len(chunks)
        lens = [len(c) for c in chunks]
        seq_lens = torch.tensor([s + q for s, q in zip(starts, lens)], dtype=torch.int32)
        batch = SimpleNamespace(
            num_reqs=n, num_tokens=sum(lens), num_tokens_after_padding=sum(lens),
            num_scheduled_tokens=np.array(lens, dtype=np.int32), seq_lens_cpu_upper_bound=seq_lens,
            idx_mapping=torch.arange(n, dtype=torch.int32), input_ids=torch.cat(chunks).int(),
            positions=torch.cat([torch.arange(s, s + q) for s, q in zip(starts, lens)]),
            query_start_loc=torch.tensor([0, *np.cumsum(lens)], dtype=torch.int32), seq_lens=seq_lens,
            decode_graph_eligible=False)
        m = self.spec.max_num_reqs  # vLLM's per-request-state buffers
        last_sampled = torch.zeros(m, dtype=torch.int64)
        last_sampled[:n] = torch.tensor(next_tokens)
        self.attn.num_reqs, self.attn.prefill_positions = n, batch.positions
        with set_current_vllm_config(self.cfg):
            # dummy_run + skip_attn_for_dummy_run: vLLM's switches that skip building attention
            # metadata (no backend here: `_DenseAttention` reads the buffers instead); is_profile:
            # eager, no CUDA-graph manager. Greedy drafting reads neither.
            out = self.spec.propose(batch, None, None, hidden, None, torch.ones(n, dtype=torch.int32),
                                    torch.tensor(num_rejected, dtype=torch.int32), last_sampled,
                                    torch.zeros(m, dtype=torch.int32), torch.zeros(m), torch.zeros(m, dtype=torch.int64),
                                    dummy_run=True, skip_attn_for_dummy_run=True, is_profile=True)
        return out.tolist()


def _final_hidden(target, ids):
    with torch.no_grad():
        return target.model(ids[None]).last_hidden_state[0]


def _mtp_drafts_vs_reference(target, draft_dir, reference):
    """Two requests through two passes of vLLM's MTP propose; returns (vLLM's drafts, the
    reference's greedy drafts with kv_share off, with kv_share on) per pass."""
    torch.manual_seed(3)
    prompts = [torch.randint(3, 4000, (9,)), torch.randint(3, 4000, (14,))]
    bonus = [17, 301]
    run = _MTPRun(target, draft_dir, MTP_K)
    # Pass 1: the target prefilled each prompt and sampled `bonus`.
    got1 = run.propose(prompts, [0, 0], torch.cat([_final_hidden(target, p) for p in prompts]), [0, 0], bonus)
    # Pass 2: the target verified [bonus, its K drafts]; request 0 keeps 2 drafts, request 1 none.
    accepted, new_bonus = [2, 0], [29, 3001]
    chunks, hidden, verified = [], [], []
    for p, b, d, a, nb in zip(prompts, bonus, got1, accepted, new_bonus):
        chunk = torch.tensor([b, *d])
        chunks.append(chunk)
        hidden.append(_final_hidden(target, torch.cat([p, chunk]))[len(p):])
        verified.append(torch.cat([p, torch.tensor([b, *d[:a], nb])]))
    got2 = run.propose(chunks, [len(p) for p in prompts], torch.cat(hidden),
                       [MTP_K - a for a in accepted], new_bonus)

    def ref(ids, kv_share):
        return reference.greedy_drafts(_final_hidden(target, ids[:-1]), ids, MTP_K, kv_share=kv_share)

    seqs1 = [torch.cat([p, torch.tensor([b])]) for p, b in zip(prompts, bonus)]
    return [(got1, [ref(s, False) for s in seqs1], [ref(s, True) for s in seqs1]),
            (got2, [ref(s, False) for s in verified], [ref(s, True) for s in verified])]


def _mtp_cases(target, tmp, mtp_dir):
    from vllm_specx.methods.mtp import checkpoint

    from .helpers import embed_and_head, random_mtp

    if tmp is None:  # the committed ref-mtp, kv_share off
        return mtp_dir, checkpoint.load(mtp_dir, *embed_and_head(target))
    if tmp == "ref-mtp-kv-share":  # the committed ref-mtp as trained
        return str(REF_MTP), checkpoint.load(REF_MTP, *embed_and_head(target))
    tmp, case = tmp
    d = random_mtp(target, kv_share=case != "random-reduced-vocab", draft_vocab=list(range(0, 4096, 3)))
    checkpoint.save(d, tmp / case)
    if case == "random-kv-share-lm-head-from-target":  # as the committed SmolLM2 MTP draft
        from vllm_specx import vocab

        assert vocab.omit_target_head(tmp / case, embed_and_head(target)[1])
    return str(tmp / case), checkpoint.load(tmp / case, *embed_and_head(target))


@needs_034
@pytest.mark.parametrize("case", ["ref-mtp", "random-reduced-vocab", "ref-mtp-kv-share", "random-kv-share",
                                  "random-kv-share-lm-head-from-target"])
def test_vllm_mtp_propose_on_our_model_drafts_the_reference(target, mtp_dir, tmp_path, case):
    """vLLM 0.34's MTP `propose` (two passes: a prompt prefill, then a verify pass with rejected
    drafts) on our V2 model loaded by vLLM's MTP loader gives `MTPDraft.greedy_drafts` token for
    token, for both requests and both passes (reduced vocabulary: target ids through the model's
    scatter): the mixed-KV chain for a `kv_share: false` draft and not the KVShare one, and the
    KVShare chain for a KVShare draft (the committed ref-mtp as trained; a reduced one whose LM-head
    rows are the target's, as the committed SmolLM2 draft) and not the mixed one."""
    tmp = {"ref-mtp": None, "ref-mtp-kv-share": "ref-mtp-kv-share"}.get(case, (tmp_path, case))
    draft_dir, reference = _mtp_cases(target, tmp, mtp_dir)
    passes = _mtp_drafts_vs_reference(target, draft_dir, reference)
    shared = reference.cfg.kv_share
    assert shared == ("kv-share" in case)
    for got, ref_mixed, ref_shared in passes:
        assert got == (ref_shared if shared else ref_mixed)
        assert len({tuple(r) for r in ref_mixed}) == 2  # the requests draft differently
    assert any(got != (ref_mixed if shared else ref_shared) for got, ref_mixed, ref_shared in passes)


@needs_034
def test_reduced_vocab_logits_scatter_to_target_ids():
    from vllm_specx import vocab
    from vllm_specx.methods.mtp.vllm_model_v2 import scatter_to_target

    ids = torch.tensor([0, 3, 7, 9])
    d2t = ids - torch.arange(4)  # vLLM's offsets
    assert torch.equal(vocab.target_ids(d2t), ids)
    logits = torch.tensor([[1.0, 5.0, 2.0, -1.0], [0.5, 0.1, 0.2, 3.0]])
    full = scatter_to_target(logits, d2t, 12)
    assert full.shape == (2, 12) and torch.equal(full[:, ids], logits)
    assert full.argmax(-1).tolist() == [3, 9]
    assert torch.isinf(full[:, [1, 2, 4, 5, 6, 8, 10, 11]]).all()
    assert scatter_to_target(logits, None, 12) is logits


# ---- vLLM 0.34's DSpark propose on our V2 model, against the reference --------------------------
#
# `DSparkSpeculator.propose` (vLLM's, unchanged, as `SpecxDSparkSpeculator`) on our
# `SpecxDSparkForCausalLM` loaded by vLLM's DSpark loader, after `load_model` / `set_attn` /
# `init_cudagraph_manager`: vLLM's DFlash input-preparation kernel (Triton interpreter) writes the
# query slots, positions, context positions and slot mappings; `precompute_and_store_context_kv`
# writes the context K/V into the draft KV cache; vLLM builds the draft attention metadata
# (`_build_attn_metadata`) and the forward context; the backbone runs; the Markov loop drafts
# (Triton greedy argmax). Stand-ins: the attention layer (`_PagedDenseAttention`: a paged K/V
# cache read through vLLM's slot mappings, block table, query_start_loc and seq_lens), the
# attention backend's metadata builder (returns vLLM's `CommonAttentionMetadata` as is), the
# runner's block table (a plain tensor vLLM's kernel reads) and two `vllm._C` kernels the CUDA
# wheel lacks on CPU (`rms_norm`, `rotary_embedding`, as vLLM's own PyTorch-native code).

class _PagedDenseAttention(torch.nn.Module):
    """Stands in for one draft layer's vLLM `Attention` (no attention backend runs here): a paged
    K/V cache [2, blocks, block_size, kv_heads, head_dim] with vLLM's slot semantics (slot =
    block * block_size + offset, PAD_SLOT_ID < 0 writes nothing). `do_kv_cache_update` is what
    `precompute_and_store_context_kv` calls with vLLM's context slot mapping; `forward` writes the
    query K/V through the forward context's slot mapping for this layer, then attends request r's
    queries over positions 0 .. seq_lens[r] - 1 read through its block-table row (causal inside
    the chunk only when the metadata says so), all from vLLM's `CommonAttentionMetadata`."""

    def __init__(self, layer_name, heads, kv_heads, head_dim, scale, num_blocks, block_size):
        super().__init__()
        self.layer_name, self.heads, self.kv_heads, self.head_dim = layer_name, heads, kv_heads, head_dim
        self.scale, self.block_size = scale, block_size
        self.kv_cache = torch.zeros(2, num_blocks, block_size, kv_heads, head_dim)
        self.impl = self  # vLLM calls attn.impl.do_kv_cache_update(attn, k, v, attn.kv_cache, slots)

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        n = key.shape[0]
        slots = slot_mapping[:n].long()
        keep = slots >= 0
        for cache, x in zip(kv_cache, (key, value)):
            cache.view(-1, self.kv_heads, self.head_dim)[slots[keep]] = x.reshape(n, self.kv_heads, self.head_dim)[keep]

    def forward(self, q, k, v):
        from vllm.forward_context import get_forward_context

        ctx = get_forward_context()
        md = ctx.attn_metadata[self.layer_name]
        n = q.shape[0]
        self.do_kv_cache_update(self, k, v, self.kv_cache, ctx.slot_mapping[self.layer_name])
        q = q.reshape(n, self.heads, self.head_dim)
        ck, cv = (c.view(-1, self.kv_heads, self.head_dim) for c in self.kv_cache)
        rep = self.heads // self.kv_heads
        out = torch.zeros(n, self.heads, self.head_dim)
        qsl = md.query_start_loc
        for r in range(md.num_reqs):
            lo, hi, s = int(qsl[r]), int(qsl[r + 1]), int(md.seq_lens[r])
            pos = torch.arange(s)
            slots = md.block_table_tensor[r].long()[pos // self.block_size] * self.block_size + pos % self.block_size
            kk, vv = ck[slots].repeat_interleave(rep, 1), cv[slots].repeat_interleave(rep, 1)
            for j in range(hi - lo):
                m = s - (hi - lo) + j + 1 if md.causal else s
                w = torch.einsum("hd,shd->hs", q[lo + j], kk[:m]) * self.scale
                out[lo + j] = torch.einsum("hs,shd->hd", w.softmax(-1), vv[:m])
        return out.reshape(n, -1)


def _rms_norm(out, x, weight, eps):
    """`vllm._custom_ops.rms_norm` (absent from the CUDA wheel on CPU) as vLLM's RMSNorm
    forward_native; a 2-D weight [L, d] is per outermost index (the grouped K-norm)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        w = weight.float()
        if w.dim() == 2:
            w = w.view(w.shape[0], *([1] * (x.dim() - 2)), w.shape[1])
        y = y * w
    out.copy_(y.to(out.dtype))


def _rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
    """`vllm._custom_ops.rotary_embedding` (in place) through vLLM's `RotaryEmbedding.forward_static`."""
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    q, k = RotaryEmbedding.forward_static(positions, query, key, head_size, cos_sin_cache.shape[-1],
                                          cos_sin_cache, is_neox)
    query.copy_(q)
    if key is not None:
        key.copy_(k)


class _DSparkRun:
    """vLLM 0.34's `SpecxDSparkSpeculator` built from a real engine config and set up as the runner
    does (`load_model`: vLLM's DSpark loader, the target's embeddings and LM head shared;
    `set_attn` with one draft KV-cache group; `init_cudagraph_manager(NONE)`), with the stand-ins
    listed above. Request r's block-table row is `blocks[r]` (block 0 is vLLM's null block)."""

    BLOCK, MAX_BLOCKS = 16, 32

    def __init__(self, target, draft_dir, k, monkeypatch):
        from vllm.config import set_current_vllm_config
        from vllm.config.compilation import CUDAGraphMode
        from vllm.model_executor.models import qwen3_dflash
        from vllm.v1.attention.backend import AttentionCGSupport
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.worker.gpu.spec_decode import speculator as base_speculator

        from vllm_specx.methods.dspark.vllm_model_v2 import SpecxDSparkSpeculator

        monkeypatch.setattr(qwen3_dflash, "ops", SimpleNamespace(rms_norm=_rms_norm,
                                                                 rotary_embedding=_rotary_embedding))
        self.cfg = _engine_config(draft_dir, "specx_dspark", num_speculative_tokens=k)
        self.cfg.compilation_config.custom_ops = ["none"]  # vLLM's native torch ops
        with set_current_vllm_config(self.cfg):
            _init_dist_once()
            self.spec = spec = SpecxDSparkSpeculator(self.cfg, torch.device("cpu"))
            spec.load_model(parts := _target_head_module(target))
        # loading the draft (lm_head_from_target: rows copied in) leaves the target's own head alone
        assert torch.equal(parts.lm_head.weight, target.lm_head.weight)
        model = spec.model
        names = model.get_draft_kv_cache_layer_names()
        num_blocks = 1 + 2 * self.MAX_BLOCKS
        self.attn = []
        for i, layer in enumerate(model.model.layers):
            sa = layer.self_attn
            st = _PagedDenseAttention(names[i], sa.num_heads, sa.num_kv_heads, sa.head_dim, sa.scaling,
                                      num_blocks, self.BLOCK)
            sa.attn = model.model._attn_layers[i] = st  # the forward's layer and the precompute's
            self.attn.append(st)
        kv_spec = FullAttentionSpec(block_size=self.BLOCK, num_kv_heads=self.attn[0].kv_heads,
                                    head_size=self.attn[0].head_dim, dtype=torch.float32)
        kv_cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                               kv_cache_groups=[KVCacheGroupSpec(names, kv_spec)])
        group = SimpleNamespace(  # an attention group whose builder hands back vLLM's common metadata
            layer_names=names, kv_cache_spec=kv_spec, supports_draft_decode_metadata_update=False,
            backend=SimpleNamespace(get_name=lambda: "dense stand-in"),
            get_metadata_builder=lambda ubatch_idx=0: SimpleNamespace(supports_update_block_table=False),
            build_metadata=lambda common, ubatch_idx=0, **kw: common)
        cg = SimpleNamespace(min_cg_support=AttentionCGSupport.NEVER, min_cg_attn_backend="dense stand-in")
        monkeypatch.setattr(base_speculator, "init_attn_backend", lambda *a, **kw: ([[group]], cg, []))
        self.block_tables = SimpleNamespace(  # the fields of vLLM's BlockTables the DFlash path reads
            block_sizes=[self.BLOCK], cp_rank=0, cp_size=1, cp_interleave=1,
            input_block_tables=[torch.zeros(spec.max_num_reqs, self.MAX_BLOCKS, dtype=torch.int32)],
            slot_mappings=torch.zeros(1, spec.max_num_tokens, dtype=torch.int64))
        spec.set_attn(None, kv_cfg, self.block_tables, None, [])
        spec.init_cudagraph_manager(CUDAGraphMode.NONE)

    def propose(self, chunks, starts, taps, num_rejected, bonus, state_idx, blocks):
        """One `propose` after a target pass: request r ran `chunks[r]` at positions starts[r]..,
        `taps` [tokens, n_taps * H] their tapped hidden states (vLLM's aux hidden states, one per
        tap), the last num_rejected[r] rejected drafts, bonus[r] the token sampled after; its
        per-request state is row state_idx[r]."""
        import numpy as np
        from vllm.config import set_current_vllm_config

        spec, n = self.spec, len(chunks)
        lens = [len(c) for c in chunks]
        for r, b in enumerate(blocks):
            self.block_tables.input_block_tables[0][r] = torch.tensor(b, dtype=torch.int32)
        seq_lens = torch.tensor([s + q for s, q in zip(starts, lens)], dtype=torch.int32)
        idx = torch.tensor(state_idx, dtype=torch.int32)
        batch = SimpleNamespace(
            num_reqs=n, num_tokens=sum(lens), num_tokens_after_padding=sum(lens),
            num_scheduled_tokens=np.array(lens, dtype=np.int32), seq_lens_cpu_upper_bound=seq_lens,
            idx_mapping=idx, input_ids=torch.cat(chunks).int(), seq_lens=seq_lens,
            positions=torch.cat([torch.arange(s, s + q) for s, q in zip(starts, lens)]),
            query_start_loc=torch.tensor([0, *np.cumsum(lens)], dtype=torch.int32))
        m = spec.max_num_reqs
        last_sampled = torch.zeros(m, dtype=torch.int64)
        last_sampled[idx.long()] = torch.tensor(bonus)
        aux = list(taps.split(taps.shape[-1] // len(spec.model.config.dflash_config["target_layer_ids"]), -1))
        with set_current_vllm_config(self.cfg):
            out = spec.propose(batch, None, None, aux[-1], aux, torch.ones(n, dtype=torch.int32),
                               torch.tensor(num_rejected, dtype=torch.int32), last_sampled,
                               torch.zeros(m, dtype=torch.int32), torch.zeros(m), torch.zeros(m, dtype=torch.int64))
        return out.tolist()


DSPARK_K = 7  # block 8, anchor layout: 7 query slots, 7 drafts


def _dspark_two_passes(target, draft_dir, draft, monkeypatch, mutate=None):
    """Two requests through two `propose` passes: a prompt prefill, then a verify pass where
    request 0 keeps 2 of its drafts and request 1 none. Returns per pass (vLLM's drafts, the
    reference's `greedy_drafts(taps[:a], ids[a], K, tokens=ids[:a])` per request). `mutate(run,
    monkeypatch, pass)` breaks something before pass 1 / 2."""
    k, layers = DSPARK_K, draft.cfg.target_layer_ids
    run = _DSparkRun(target, draft_dir, k, monkeypatch)
    torch.manual_seed(3)
    prompts = [torch.randint(3, 4000, (9,)), torch.randint(3, 4000, (14,))]
    bonus, state = [17, 301], [3, 1]  # per-request state rows differ from batch rows
    blocks = [list(range(1, 33)), list(range(64, 32, -1))]  # request 1's blocks in reverse
    if mutate:
        mutate(run, monkeypatch, 1)
    got1 = run.propose(prompts, [0, 0], torch.cat([target_taps(target, p[None], layers)[0] for p in prompts]),
                       [0, 0], bonus, state, blocks)
    if mutate:
        mutate(run, monkeypatch, 2)
    accepted, chunks, taps, seqs2 = [2, 0], [], [], []
    for p, b, d, a in zip(prompts, bonus, got1, accepted):
        chunk = torch.tensor([b, *d])  # the target verified the bonus and the k drafts
        chunks.append(chunk)
        taps.append(target_taps(target, torch.cat([p, chunk])[None], layers)[0][len(p):])
        seqs2.append(torch.cat([p, torch.tensor([b, *d[:a], (d[a] + 1) % 4000])]))  # a kept, then a new token
    got2 = run.propose(chunks, [len(p) for p in prompts], torch.cat(taps), [k - a for a in accepted],
                       [int(s[-1]) for s in seqs2], state, blocks)
    assert all(float(a.kv_cache[:, 0].abs().sum()) == 0 for a in run.attn)  # vLLM's null block: never written

    def ref(ids):
        a = len(ids) - 1
        return draft.greedy_drafts(target_taps(target, ids[None, :a], layers)[0], int(ids[a]), k, tokens=ids[:a])

    seqs1 = [torch.cat([p, torch.tensor([b])]) for p, b in zip(prompts, bonus)]
    return [(got1, [ref(s) for s in seqs1]), (got2, [ref(s) for s in seqs2])]


def _dspark_case(target, case, tmp_path):
    """(draft dir, reference DSparkDraft): the committed ref-dspark (vanilla head), or a random
    draft whose Markov head is scaled up so its bias moves the argmax."""
    from .helpers import ASSETS, embed_and_head

    if case == "ref-dspark":
        from vllm_specx.methods.dspark.checkpoint import load_draft

        path = ASSETS / "drafts" / "ref-dspark"
        return str(path), load_draft(path, *embed_and_head(target))
    kw = {"vanilla": dict(markov_head_type="vanilla"), "rnn": dict(markov_head_type="rnn"),
          "gated": dict(markov_head_type="gated"),
          "rnn-reduced-vocab": dict(markov_head_type="rnn", draft_vocab=list(range(0, 4096, 3))),
          "next-added": dict(next_token_stream="added"), "next-fused": dict(next_token_stream="fused"),
          "next-added-reduced-vocab": dict(next_token_stream="added", draft_vocab=list(range(0, 4096, 3))),
          "next-added-lm-head-from-target": dict(next_token_stream="added", draft_vocab=list(range(0, 4096, 3)))}[case]
    draft = random_draft(target, **kw)
    with torch.no_grad():
        draft.markov_head.markov_w1.weight.mul_(40.0)
    path = write(draft, tmp_path / case)
    if case.endswith("lm-head-from-target"):  # as the committed SmolLM2 draft: no lm_head rows on disk
        from vllm_specx import vocab

        assert vocab.omit_target_head(path, embed_and_head(target)[1])
    return path, draft


@needs_034
@pytest.mark.parametrize("case", ["ref-dspark", "rnn", "gated", "rnn-reduced-vocab", "next-added", "next-fused",
                                  "next-added-reduced-vocab", "next-added-lm-head-from-target"])
def test_vllm_dspark_propose_on_our_model_drafts_the_reference(target, tmp_path, monkeypatch, case):
    """vLLM 0.34's DSpark `propose` (two passes, two requests; the second a verify pass with one
    request keeping 2 drafts and the other none) on our V2 model loaded by vLLM's DSpark loader
    gives `DSparkDraft.greedy_drafts` token for token (reduced vocabulary: target ids through
    vLLM's `map_draft_to_target`). Anchor layout; the committed ref-dspark is a vanilla head.
    next-*: the next-token stream, its context rows' next tokens built by our speculator (the
    reference reads x_{t+1} of every row from the token sequence)."""
    draft_dir, draft = _dspark_case(target, case, tmp_path)
    passes = _dspark_two_passes(target, draft_dir, draft, monkeypatch)
    for got, ref in passes:
        assert got == ref
        assert len({tuple(r) for r in ref}) == 2  # the two requests draft differently
    assert passes[0][1] != passes[1][1]


def _skip_context_kv_in_pass_2(run, monkeypatch, stage):
    if stage == 2:  # the verified tokens' context K/V never reach the draft KV cache
        model = run.spec.model
        orig = model.precompute_and_store_context_kv
        monkeypatch.setattr(model, "precompute_and_store_context_kv", lambda s, p, slots=None: orig(s, p, None))


def _shift_context_positions(run, monkeypatch, stage):
    if stage == 1:  # context K rotated one position too far
        model = run.spec.model
        orig = model.precompute_and_store_context_kv
        monkeypatch.setattr(model, "precompute_and_store_context_kv", lambda s, p, slots=None: orig(s, p + 1, slots))


def _markov_anchor_from_slot_1(run, monkeypatch, stage):
    if stage == 1:  # the Markov chain starts from the first mask slot's id, not the anchor
        run.spec._anchor_idx += 1


def _ignore_rejected(run, monkeypatch, stage):
    if stage == 2:  # rejected drafts taken as context
        orig = run.propose
        run.propose = lambda chunks, starts, taps, rejected, *a: orig(chunks, starts, taps, [0] * len(rejected), *a)


@needs_034
@pytest.mark.parametrize("mutate", [_skip_context_kv_in_pass_2, _shift_context_positions,
                                    _markov_anchor_from_slot_1, _ignore_rejected],
                         ids=["skip-context-kv", "shift-context-positions", "wrong-markov-anchor",
                              "ignore-rejected"])
def test_dspark_propose_check_catches_mutations(target, tmp_path, monkeypatch, mutate):
    """The comparison above is not vacuous: each of these breaks makes some draft differ."""
    draft_dir, draft = _dspark_case(target, "vanilla", tmp_path)
    passes = _dspark_two_passes(target, draft_dir, draft, monkeypatch, mutate)
    assert any(got != ref for got, ref in passes)


def _stream_without_bonus(run, monkeypatch, stage):
    if stage == 2:  # a request's last accepted row gets its own token, not the anchor, as next token
        from vllm_specx.methods.dspark import vllm_model_v2 as v2

        orig = v2.context_next_ids
        monkeypatch.setattr(v2, "context_next_ids", lambda ids, anchors, *a: orig(ids, ids[:0].new_zeros(
            anchors.shape) + ids[0], *a))


def _stream_ignoring_rejected(run, monkeypatch, stage):
    if stage == 2:  # the bonus token written after the rejected drafts, not after the last accepted row
        from vllm_specx.methods.dspark import vllm_model_v2 as v2

        orig = v2.context_next_ids
        monkeypatch.setattr(v2, "context_next_ids", lambda ids, anchors, qsl, rej, n: orig(ids, anchors, qsl, None, n))


def _stream_cut(run, monkeypatch, stage):
    if stage == 1:  # the speculator hands the model no next tokens: the write is refused
        monkeypatch.setattr(run.spec, "_stream", False)


@needs_034
@pytest.mark.parametrize("mutate", [_stream_without_bonus, _stream_ignoring_rejected],
                         ids=["no-bonus-token", "ignore-rejected"])
def test_dspark_stream_check_catches_mutations(target, tmp_path, monkeypatch, mutate):
    """The next-token stream's comparison is not vacuous: the wrong next token for the last
    accepted row changes some draft."""
    draft_dir, draft = _dspark_case(target, "next-added", tmp_path)
    passes = _dspark_two_passes(target, draft_dir, draft, monkeypatch, mutate)
    assert passes[0][0] == passes[0][1] and passes[1][0] != passes[1][1]


@needs_034
def test_dspark_stream_rows_without_next_tokens_are_refused(target, tmp_path, monkeypatch):
    draft_dir, draft = _dspark_case(target, "next-added", tmp_path)
    with pytest.raises(RuntimeError, match="next_token_stream: context rows reached the draft without"):
        _dspark_two_passes(target, draft_dir, draft, monkeypatch, _stream_cut)


# ---- vLLM 0.34's rejection sampler verifies our drafts exactly ---------------------------------

def _vllm_rejection_sample(target_logits, draft_logits, drafts, temperature, block=False, seed0=1000):
    """vLLM 0.34's `rejection_sample` (its Triton kernels, in the interpreter) over N independent
    requests: request r verifies drafts[r] (K tokens, sampled by the caller) against the same
    target logits [K + 1, V] per position and the draft's logits [K, V] (vLLM's draft-logits cache:
    row = request state, one row per draft step), each request with its own seed. Returns
    (sampled [N, K + 1], num_sampled [N])."""
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils import rejection_sample

    n, k = drafts.shape
    v = target_logits.shape[-1]
    ids = torch.zeros(n, k + 1, dtype=torch.int64)
    ids[:, 1:] = drafts  # a request's logit i verifies input token i + 1 (the drafts follow the anchor)
    cache = SimpleNamespace(values=draft_logits[None].expand(n, k, v).contiguous().float(), row_mapping=None)
    local = torch.arange(k + 1).repeat(n)
    return rejection_sample(
        target_logits.repeat(n, 1).float().contiguous(), cache, ids.flatten(),
        torch.arange(0, n * (k + 1) + 1, k + 1, dtype=torch.int32), 100 + local,
        torch.arange(n, dtype=torch.int32), torch.arange(n, dtype=torch.int32).repeat_interleave(k + 1), local,
        torch.full((n,), float(temperature)), torch.arange(seed0, seed0 + n, dtype=torch.int64), k,
        use_block_verification=block)


def _emitted_p_values(sampled, num_sampled, probs):
    """Per position j, the chi-square goodness-of-fit p-value of the j-th emitted token (over the
    requests that emitted one) against probs[j] (the target's p; tokens with p = 0 never appear)."""
    out = []
    for j in range(probs.shape[0]):
        got = sampled[num_sampled > j, j]
        obs = torch.bincount(got, minlength=probs.shape[1]).double()
        exp = probs[j].double() * len(got)
        keep = exp > 0
        assert float(obs[~keep].sum()) == 0  # never a token the target gives no mass
        chi2 = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
        out.append(float(torch.special.gammaincc(torch.tensor((int(keep.sum()) - 1) / 2), torch.tensor(chi2 / 2))))
    return out


@needs_034
@pytest.mark.parametrize("block", [False, True], ids=["token-wise", "block"])
def test_vllm_rejection_sampler_keeps_the_target_distribution_for_reduced_vocab_drafts(block, monkeypatch):
    """On vLLM 0.34 its own rejection sampler verifies our speculators' drafts (we plug none in).
    With drafts sampled from q whose support is a reduced draft vocabulary (q = 0 elsewhere: how
    our DSpark and MTP scatter a reduced vocabulary's logits, -inf outside it), each emitted token
    is distributed as the target's p at its position (T = 1; token-wise and vLLM's block
    verification; chi-square over 2,000 independent requests); at T = 0 the output is the
    target's argmax.
    Negative control: drafts sampled from another distribution than the q handed to the sampler
    break it (so the check can fail)."""
    from vllm.triton_utils import tl
    from vllm.v1.worker.gpu.spec_decode import rejection_sampler_utils

    # libdevice has no interpreter implementation: log1p(x) as log(1 + x) (|x| < 1 here)
    monkeypatch.setattr(rejection_sampler_utils, "tldevice", SimpleNamespace(log1p=lambda x: tl.log(1.0 + x)))
    v, k, n = 12, 2, 2000
    g = torch.Generator().manual_seed(0)
    target = torch.randn(k + 1, v, generator=g) * 1.5
    draft = target[:k] + torch.randn(k, v, generator=g)  # close to the target, as a trained draft is
    draft[:, ::3] = float("-inf")  # outside the draft vocabulary
    q, p = draft.softmax(-1), target.softmax(-1)
    drafts = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=g) for i in range(k)], 1)
    sampled, num = _vllm_rejection_sample(target, draft, drafts, 1.0, block)
    p_values = _emitted_p_values(sampled, num, p)
    assert min(p_values) > 1e-3, p_values  # fixed seeds: the same draw every run
    assert 1.5 < float(num.float().mean()) < k + 1  # drafts are accepted, not all
    greedy, num0 = _vllm_rejection_sample(target, draft, target[:k].argmax(-1).expand(n, k), 0.0, block)
    assert bool((num0 == k + 1).all()) and bool((greedy == target.argmax(-1)).all())
    wrong = torch.stack([torch.multinomial(q[i].flip(0), n, replacement=True, generator=g) for i in range(k)], 1)
    bad, num_bad = _vllm_rejection_sample(target, draft, wrong, 1.0, block)
    assert min(_emitted_p_values(bad, num_bad, p)) < 1e-6
