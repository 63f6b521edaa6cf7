"""Patch `route`: send speculative configs whose draft belongs to a registered method to that
method's plumbing, check the draft against the target, and check every speculative-config option
before any engine starts.

Speculative-config options on a routed config
---------------------------------------------

Every field of vLLM's `SpeculativeConfig` has a verdict here (`OPTIONS`, plus the method's own
`Method.spec_options`, which take precedence); a routed config that sets a field to anything
but its default is checked against it before vLLM's own `__post_init__` runs (which would
otherwise overwrite some of them silently):

* honoured - ours, or vLLM's plumbing that our proposer inherits, does what the option says;
* vllm - vLLM itself applies, checks or refuses it, with a message that names it;
* irrelevant - has no effect on a routed draft, and none is expected (the note says why);
* internal - set by vLLM's engine, not by users;
* refused - ValueError naming the option: it would be silently ignored (or lossy).

A field this table does not know (a newer vLLM) is refused when set, never ignored. Keys that
are not fields at all, and a `num_speculative_tokens` below 1, are refused before vLLM's own
validation by the `spec_fields` patch (one line naming them, instead of pydantic's report).

Draft checks
------------

For every `method` vllm-specx checks (`registry.draft_methods()`: its registered methods and the
vLLM methods of its baselines, e.g. `eagle3`) with a local `model` path, the route first checks
the path (exists, is a readable directory with a readable config.json: vLLM would say "Invalid
repository ID or local directory"); a routed draft then gets `registry.check_draft` (config
against the target, drafts per pass, tensor names, shapes, dtypes, NaN / inf values), and a
baseline's draft, which vLLM serves itself, its `Baseline.check_draft` after vLLM's post-init.
Every such error is one line starting "vllm-specx:" and naming the field or file.

================================  ==========  ==================================================
field                             verdict     note
================================  ==========  ==================================================
method, model                     honoured    routed by `registry.choose`
num_speculative_tokens            honoured    checked against the draft (`check_target`)
draft_sample_method               honoured    greedy | probabilistic; other values refused
rejection_sample_method           honoured    standard, block: vllm-specx's lossless sampler;
                                              synthetic: vLLM's own RejectionSampler (its
                                              benchmarking mode, lossy by design); refused where
                                              vLLM has no Triton (its CPU kernels assert on it);
                                              anything else (vLLM 0.33's lossy "fly") refused
synthetic_acceptance_rates/length vllm        only with synthetic (vLLM refuses them otherwise)
enforce_eager                     vllm        draft CUDA graphs (inherited load/compile path)
draft_tensor_parallel_size        vllm        1 or the target's TP (vLLM checks); TP > 1 untested
attention_backend, kv_cache_dtype vllm        the draft's attention backend / KV dtype
max_model_len                     vllm        the draft's max length (longer sequences: no spec)
draft_load_config                 vllm        inherited `load_model`
disable_eagle_block_drop          vllm        scheduler's prefix-cache block drop (0.33: no drop
                                              for these routes, so no effect)
disable_lookahead_block_hashes    vllm        (0.33) scheduler's block hashing
tensor_parallel_size              vllm        vLLM refuses it (use draft_tensor_parallel_size)
index_share_for_mtp_iteration     vllm        vLLM refuses it (mtp only)
use_heterogeneous_vocab           vllm        vLLM refuses it (draft_model only)
moe_backend                       irrelevant  drafts have no MoE layers
parallel_drafting                 irrelevant  always on for these routes (vLLM sets it)
target_*/draft_model_config,      internal    set by the engine
draft_parallel_config
quantization                      refused     no quantized checkpoints; the head would stay full
revision, code_revision           refused     routed drafts are local directories
prompt_lookup_min/max             refused     ngram only (vLLM would zero them silently)
suffix_decoding_*                 refused     suffix only
num_speculative_tokens_per_       refused     dynamic speculation is untested with our proposers
batch_size
disable_padded_drafter_batch      refused     parallel drafting needs padding (vLLM would fail
                                              only when the worker starts)
enable_adaptive_verification      refused     needs the V2 runner (DSpark, MTP: honoured, = `adaptive`)
draft_lm_head_quantization        refused     (0.33) EAGLE/MTP only, Model Runner V2 only
xpress_topc                       refused     (0.33) XPress drafts only
fly_window_size, fly_entropy_*    refused     (0.33) only with "fly", which is refused
================================  ==========  ==================================================

Not speculative-config fields, but read by the same code: `use_fp64_gumbel` (ModelConfig; vLLM
passes it to `rejection_sample()`, which our op does not need): vllm-specx's draft sampling and
verification always draw their Exp(1) noise from float64 uniforms (`draw_exp_noise`), so its
tail is exact whatever the flag says (the race itself runs in float32); vLLM's own sampler
(synthetic) honours it. `synthetic_mode` is the RejectionSampler's flag for "synthetic", which
reaches only vLLM's own sampler (`swap_drafter` never installs ours then, and refuses a sampler
of ours that has it or 0.33's `use_fly` set).
"""

from __future__ import annotations

import contextvars
from typing import Any

from vllm_specx import registry
from vllm_specx._vllm_compat.patching import ProbeReached, logger, patch, probe, register_archs, resolve
from vllm_specx.checkpoint import check_draft_dir, looks_local

TARGET = "vllm.config.speculative:SpeculativeConfig.__post_init__"

HONOURED, VLLM, IRRELEVANT, INTERNAL, REFUSED = "honoured", "vllm", "irrelevant", "internal", "refused"
VERDICTS = (HONOURED, VLLM, IRRELEVANT, INTERNAL, REFUSED)

LOSSLESS_REJECTION = ("standard", "block")  # verified by vllm-specx's sampler
DELEGATED_REJECTION = ("synthetic",)  # verified by vLLM's own RejectionSampler
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")

_ONLY_WITH_FLY = "applies only to rejection_sample_method 'fly', which vllm-specx refuses"
OPTIONS: dict[str, tuple[str, str]] = {
    "method": (HONOURED, "routed by registry.choose"),
    "model": (HONOURED, "the draft checkpoint directory"),
    "num_speculative_tokens": (HONOURED, "checked against the draft"),
    "draft_sample_method": (HONOURED, "greedy or probabilistic"),
    "rejection_sample_method": (HONOURED, "standard, block (vllm-specx), synthetic (vLLM's)"),
    "synthetic_acceptance_rates": (VLLM, "only with rejection_sample_method 'synthetic'"),
    "synthetic_acceptance_length": (VLLM, "only with rejection_sample_method 'synthetic'"),
    "enforce_eager": (VLLM, "the draft's CUDA graphs"),
    "draft_tensor_parallel_size": (VLLM, "1 or the target's tensor-parallel size"),
    "attention_backend": (VLLM, "the draft's attention backend"),
    "kv_cache_dtype": (VLLM, "the draft's KV-cache dtype"),
    "max_model_len": (VLLM, "the draft's maximum length"),
    "draft_load_config": (VLLM, "how the draft's weights are loaded"),
    "disable_eagle_block_drop": (VLLM, "the scheduler's prefix-cache block drop"),
    "disable_lookahead_block_hashes": (VLLM, "the scheduler's block hashing"),
    "tensor_parallel_size": (VLLM, "vLLM refuses it"),
    "index_share_for_mtp_iteration": (VLLM, "vLLM refuses it for these routes"),
    "use_heterogeneous_vocab": (VLLM, "vLLM refuses it for these routes"),
    "moe_backend": (IRRELEVANT, "drafts have no MoE layers"),
    "parallel_drafting": (IRRELEVANT, "always on for these routes"),
    "target_model_config": (INTERNAL, "set by the engine"),
    "target_parallel_config": (INTERNAL, "set by the engine"),
    "draft_model_config": (INTERNAL, "set by the engine"),
    "draft_parallel_config": (INTERNAL, "set by the engine"),
    "quantization": (REFUSED, "vllm-specx drafts have no quantized checkpoints, and their "
                              "method-specific heads would stay unquantized"),
    "revision": (REFUSED, "vllm-specx drafts are local directories; there is no revision"),
    "code_revision": (REFUSED, "vllm-specx drafts are local directories; there is no code revision"),
    "prompt_lookup_max": (REFUSED, "applies to method 'ngram' only"),
    "prompt_lookup_min": (REFUSED, "applies to method 'ngram' only"),
    "suffix_decoding_max_tree_depth": (REFUSED, "applies to method 'suffix' only"),
    "suffix_decoding_max_cached_requests": (REFUSED, "applies to method 'suffix' only"),
    "suffix_decoding_max_spec_factor": (REFUSED, "applies to method 'suffix' only"),
    "suffix_decoding_min_token_prob": (REFUSED, "applies to method 'suffix' only"),
    "num_speculative_tokens_per_batch_size": (REFUSED, "dynamic speculative decoding is not "
                                                       "tested with vllm-specx's proposers"),
    "disable_padded_drafter_batch": (REFUSED, "parallel drafting needs the padded drafter batch "
                                              "(vLLM would fail only when the worker starts)"),
    "enable_adaptive_verification": (REFUSED, "vLLM implements it on its V2 runner only; "
                                              "vllm-specx proposers run on the V1 runner (DSpark "
                                              "and MTP honour it as `adaptive: true`)"),
    "draft_lm_head_quantization": (REFUSED, "vLLM implements it for EAGLE/MTP on its V2 runner"),
    "xpress_topc": (REFUSED, "applies to XPress drafts only"),
    "fly_window_size": (REFUSED, _ONLY_WITH_FLY),
    "fly_entropy_threshold": (REFUSED, _ONLY_WITH_FLY),
    "fly_entropy_top_k": (REFUSED, _ONLY_WITH_FLY),
}


def v2_would_run() -> bool:
    """Whether vLLM would pick its V2 model runner for this process's engines."""
    import vllm.envs as envs
    from vllm.triton_utils import HAS_TRITON

    forced = envs.VLLM_USE_V2_MODEL_RUNNER
    return bool(forced) if forced is not None else bool(HAS_TRITON)


def has_triton() -> bool:
    from vllm.triton_utils import HAS_TRITON

    return bool(HAS_TRITON)


def option_table(method: registry.Method) -> dict[str, tuple[str, str]]:
    """Verdict and note per SpeculativeConfig field for configs routed to `method`."""
    return {**OPTIONS, **{name: (verdict, why) for name, verdict, why in method.spec_options}}


def spec_defaults(cls) -> dict[str, Any]:
    """Field name -> default value of vLLM's SpeculativeConfig (a pydantic dataclass)."""
    return {name: info.get_default(call_default_factory=True)
            for name, info in cls.__pydantic_fields__.items()}


def set_options(spec) -> dict[str, Any]:
    """The fields of `spec` that differ from their defaults (what the user set)."""
    out = {}
    for name, default in spec_defaults(type(spec)).items():
        value = getattr(spec, name, default)
        try:
            differs = bool(value != default)
        except Exception:  # objects whose == is not a plain bool
            differs = value is not default
        if differs:
            out[name] = value
    return out


def check_options(spec, method: registry.Method) -> None:
    """ValueError naming the option for any set speculative-config option that a config routed to
    `method` cannot honour (see the module docstring)."""
    where = f"vllm-specx: method {method.name!r}"
    table = option_table(method)
    for name, value in set_options(spec).items():
        verdict, why = table.get(name, (None, None))
        if verdict is None:
            raise ValueError(
                f"{where}: speculative_config option {name!r} (= {value!r}) is not known to this "
                f"vllm-specx, so it cannot say whether it would be honoured; remove it or upgrade "
                f"vllm-specx")
        if verdict not in VERDICTS:
            raise RuntimeError(f"{where}: bad verdict {verdict!r} for option {name!r}")
        if verdict == REFUSED:
            raise ValueError(f"{where}: speculative_config option {name!r} (= {value!r}) is not "
                             f"supported: {why}. Remove it")
    rsm = getattr(spec, "rejection_sample_method", "standard")
    if rsm in DELEGATED_REJECTION:
        if not has_triton():
            raise ValueError(
                f"{where}: speculative_config option 'rejection_sample_method' = {rsm!r} is "
                f"verified by vLLM's own RejectionSampler, which implements it only in its Triton "
                f"kernels; this platform has no Triton (vLLM's CPU kernels refuse it). Use "
                f"'standard' or 'block'")
    elif rsm not in LOSSLESS_REJECTION:
        lossy = " is lossy (it accepts drafts the target would reject) and" if rsm == "fly" else ""
        raise ValueError(
            f"{where}: speculative_config option 'rejection_sample_method' = {rsm!r}{lossy} is "
            f"not supported: vllm-specx verifies its drafts losslessly with 'standard' or "
            f"'block' (or hands 'synthetic' benchmarking to vLLM's sampler)")
    dsm = getattr(spec, "draft_sample_method", "greedy")
    if dsm not in DRAFT_SAMPLE_METHODS:
        raise ValueError(f"{where}: speculative_config option 'draft_sample_method' = {dsm!r} is "
                         f"not supported: use one of {list(DRAFT_SAMPLE_METHODS)}")


# Set only by the probe: the (method, config) choice the patched __post_init__ must route.
_PROBE_CHOICE: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("specx_route_probe",
                                                                             default=None)


def one_line(e: BaseException) -> ValueError:
    """`e` as the one-line ValueError vllm-specx reports at config time ("vllm-specx: ...")."""
    msg = " ".join(str(e).split()) or type(e).__name__
    return ValueError(msg if msg.startswith("vllm-specx") else f"vllm-specx: {msg}")


def ours(fn, *args):
    """`fn(*args)`, with its ValueError / OSError re-raised as one line prefixed "vllm-specx:"."""
    try:
        return fn(*args)
    except (ValueError, OSError) as e:
        raise one_line(e) from e


def _choose(spec):
    forced = _PROBE_CHOICE.get()
    if forced is not None:
        return forced
    return registry.choose(spec.method, spec.model, v2_would_run())


@patch("route", TARGET,
       why="route a speculative config whose draft checkpoint belongs to a registered vllm-specx "
           "method (`registry.choose`) to the vLLM plumbing that method reuses, with its "
           "architecture, and check the draft and every option against the target before any "
           "engine starts; vLLM has no way to add a speculative method (a closed Literal) and "
           "would otherwise treat the draft as one of its own (and rewrite it to vLLM's "
           "architecture)",
       remove_when="vLLM has a registry for speculative methods / proposers")
def speculative_post_init(orig):
    def __post_init__(self):
        requested, model = self.method, self.model
        checked = requested in registry.draft_methods() and bool(model) and looks_local(model)
        if checked:  # vLLM would report a missing or bad path as "Invalid repository ID"
            ours(check_draft_dir, model)
        choice = ours(_choose, self)
        if choice is None:
            orig(self)
            baseline = registry.baseline_for(requested) if checked else None
            if baseline is not None:  # a draft vLLM serves itself: checked before any engine starts
                target = self.target_model_config.hf_config.get_text_config()
                ours(baseline.check_draft, model, registry.target_dims(target),
                     self.num_speculative_tokens)
            return
        method, cfg = choice
        ours(check_options, self, method)  # before vLLM's post-init rewrites some of them
        if self.num_speculative_tokens is None:
            ours(registry.check_num_drafts, cfg, self.model, None)
            self.num_speculative_tokens = cfg.max_drafts
        self.method = method.internal(cfg)
        register_archs(method)  # before vLLM validates the draft's architecture (also for methods
        orig(self)              # registered after install())
        finish_route(self, method, cfg)

    return __post_init__


def finish_route(spec, method: registry.Method, cfg) -> None:
    """Check the draft, point the draft config at the method's architecture, let the method
    mirror its fields into the keys vLLM reads, and store the config for the workers."""
    target = spec.target_model_config.hf_config.get_text_config()
    ours(registry.check_draft, method, cfg, spec.model, registry.target_dims(target),
         spec.num_speculative_tokens)
    hf = spec.draft_model_config.hf_config
    hf.architectures = [method.arch]
    method.finish_hf(hf, cfg)
    hf.specx_route = method.name
    hf.specx_config = cfg.to_dict()
    spec.update_arch_()
    logger.info("vllm-specx: method %r with draft %s -> %s (%s format, %d drafts per pass)",
                method.name, spec.model, method.proposer_cls, cfg.source_format,
                spec.num_speculative_tokens)


class _ProbeSpec:
    """A fake SpeculativeConfig: the user gave no method and no draft, and set no option; the
    first read of `method` after something assigned it ends the probe with the assigned value
    (that read is vLLM's post-init starting, when the route ran before it)."""

    __pydantic_fields__: dict = {}  # no options set
    rejection_sample_method = "standard"
    draft_sample_method = "greedy"

    def __init__(self):
        object.__setattr__(self, "_assigned", [])
        object.__setattr__(self, "num_speculative_tokens", None)
        object.__setattr__(self, "model", None)

    @property
    def method(self):
        if self._assigned:
            raise ProbeReached(self._assigned[-1])
        return None

    @method.setter
    def method(self, value):
        self._assigned.append(value)

    def __getattr__(self, name):  # anything else vLLM's post-init reads: it has started
        raise ProbeReached(self._assigned[-1] if self._assigned else None)


class _ProbeConfig:
    max_drafts = 3


_PROBE_METHOD = registry.Method(
    name="specx-route-probe", config_cls=_ProbeConfig, detect=lambda raw: None,
    read_config=lambda raw, where: _ProbeConfig(), internal_method="specx-route-probe-internal",
    arch="", model_cls="-:-", proposer_cls="-:-")  # no architecture: register_archs skips it


@probe("route")
def _probe_route():
    """A config that `choose` routes reaches vLLM's post-init with the method's internal method
    and a defaulted draft count (vLLM's post-init itself is not run: the fake ends it)."""
    spec = _ProbeSpec()
    token = _PROBE_CHOICE.set((_PROBE_METHOD, _ProbeConfig()))
    try:
        resolve(TARGET)[2](spec)
    except ProbeReached as reached:
        seen = reached.args[0]
    else:
        seen = None
    finally:
        _PROBE_CHOICE.reset(token)
    if seen != _PROBE_METHOD.internal_method:
        raise RuntimeError(f"a routed config reached vLLM's post-init with method {seen!r}, "
                           f"expected {_PROBE_METHOD.internal_method!r}")
    if spec.__dict__.get("num_speculative_tokens") != _ProbeConfig.max_drafts:
        raise RuntimeError("num_speculative_tokens was not defaulted from the draft")
