"""vllm-specx on vLLM >= 0.34: its methods registered through vLLM's speculator plugin API.

vLLM 0.34 runs speculative decoding only on its V2 model runner and lets a plugin add a method
with `vllm.v1.worker.gpu.spec_decode.speculator_config.register_speculative_method(name,
config_cls)`. `register()` (called by `vllm_specx.register()` on 0.34, in every vLLM process)
does two things for each method in `v2_methods()` (a method folder's `speculator.V2_METHOD`),
and patches nothing in vLLM:

1. registers the method's draft architecture (`SpecxDSparkModel`, ...) with vLLM's
   `ModelRegistry`, as a model class that declares the method's `SpeculatorConfig`
   (vLLM's `SpeculativeDraftModel` interface, `speculator_config_class`): a vllm-specx
   checkpoint then selects our speculator by itself, under vLLM's built-in method name
   (DSpark: `"method": "dspark"`) or with no `method` at all;
2. registers a method name of our own (`specx_dspark`, ...; vLLM refuses to re-register its
   built-in names) bound to the same `SpeculatorConfig`, which selects our speculator whatever
   the checkpoint's format (e.g. a speculators-format DSpark draft that vLLM's own DSpark would
   otherwise serve).

`PATCHED` lists what this path changes inside vLLM: nothing (tests check it).
"""

from __future__ import annotations

import dataclasses

# What the V2 path replaces inside vLLM: nothing (vLLM's public plugin API only).
PATCHED: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class V2Method:
    """One vllm-specx method on vLLM's speculator API.

    Attributes:
        name: the method name registered with vLLM (not one of vLLM's built-in names).
        builtin: vLLM's built-in method whose setup the config inherits (`base_method`).
        arch: the draft architecture of our checkpoints (config.json `architectures`).
        model_cls: "module:Class" of the vLLM draft model registered for `arch`.
        config_cls: "module.Class" of the `SpeculatorConfig` subclass.
    """

    name: str
    builtin: str
    arch: str
    model_cls: str
    config_cls: str


# vLLM internals this module uses (the layout test reads every module's VLLM_INTERNALS_V2;
# tests/test_vllm034.py checks that each resolves in vLLM 0.34).
VLLM_INTERNALS_V2 = ("vllm.v1.worker.gpu.spec_decode.speculator_config:register_speculative_method",)


def v2_methods() -> list[V2Method]:
    """Every registered vllm-specx method that serves on vLLM >= 0.34: those whose folder has a
    `speculator` module defining `V2_METHOD` (it imports vLLM 0.34, so only call this there)."""
    from importlib import import_module
    from importlib.util import find_spec

    from vllm_specx import registry

    out = []
    for method in registry.methods().values():
        pkg = method.config_cls.__module__.rsplit(".", 1)[0]
        if find_spec(f"{pkg}.speculator") is not None:
            out.append(import_module(f"{pkg}.speculator").V2_METHOD)
    return out


def register() -> None:
    """Register every `v2_methods()` entry with vLLM (idempotent: vLLM accepts the same config
    again under the same name)."""
    from vllm import ModelRegistry
    from vllm.v1.worker.gpu.spec_decode.speculator_config import register_speculative_method

    for m in v2_methods():
        if m.arch not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(m.arch, m.model_cls)
        register_speculative_method(m.name, m.config_cls)


def method_names() -> dict[str, str]:
    """Our registered name -> the built-in vLLM name that also serves our checkpoints."""
    return {m.name: m.builtin for m in v2_methods()}


def checked_draft(spec, method_name: str, what: str, unsupported) -> object:
    """The validated draft config of a vLLM `SpeculativeConfig`'s draft checkpoint for our method
    `method_name`: read with vllm-specx's reader, every pre-engine check run
    (`registry.check_draft`: config against the target, drafts per pass, tensors), and each
    (field, is_set(cfg), why) of `unsupported` that is set refused. ValueError prefixed
    `vllm-specx:` naming the file or field; `what` names the checkpoint kind expected."""
    from vllm_specx import registry
    from vllm_specx.checkpoint import read_config_json

    path = spec.draft_model_config.model
    try:
        raw = read_config_json(path)
        hit = registry.detect(raw)
        if hit is None or hit[0].name != method_name:
            raise ValueError(f"{path}/config.json: not a {what}")
        method = hit[0]
        cfg = method.read_config(raw, f"{path}/config.json")
        target = registry.target_dims(spec.target_model_config.hf_text_config)
        registry.check_draft(method, cfg, path, target, spec.num_speculative_tokens)
        for field, is_set, why in unsupported:
            if is_set(cfg):
                raise ValueError(f"draft {path}: specx.{field} ({why}) is not served on vLLM's V2 "
                                 "model runner yet; serve this draft with vLLM 0.32 / 0.33")
    except ValueError as e:
        msg = str(e)
        raise ValueError(msg if msg.startswith("vllm-specx:") else f"vllm-specx: {msg}") from e
    return cfg


class SpecxSpeculatorConfig:
    """What every vllm-specx `SpeculatorConfig` shares; mixed in before vLLM's own method config
    (`class C(SpecxSpeculatorConfig, DSparkSpeculatorConfig)`), whose setup it inherits. A subclass
    sets `read_draft` (spec -> the validated draft config, `checked_draft`) and `mirror` (hf
    config, draft config -> None: what the worker's model reads)."""

    supported_options: frozenset[str] = frozenset()  # vLLM refuses the rest by name
    read_draft = None
    mirror = None

    @classmethod
    def matches(cls, spec) -> bool:
        # Our checkpoints are found by their architecture (its model class declares this
        # config), never by the draft's path or model_type.
        return False

    @classmethod
    def resolve_num_speculative_tokens(cls, spec) -> None:
        """Default `num_speculative_tokens` to the draft's `max_drafts`; the bound is checked
        with the rest in `apply_options`."""
        if spec.num_speculative_tokens is None:
            spec.num_speculative_tokens = cls.read_draft(spec).max_drafts

    @classmethod
    def apply_options(cls, spec) -> None:
        if getattr(spec, "quantization", None):
            # vLLM would pass it to the draft's model config; our draft models build their layers
            # without a quant_config, so the draft would load unquantized while the option says fp8.
            raise ValueError(f"vllm-specx: speculative_config option 'quantization' (= {spec.quantization!r}) "
                             "is not supported for vllm-specx drafts on vLLM's V2 runner: the draft loads in "
                             "the target's dtype; drop the option")
        cls.mirror(spec.draft_model_config.hf_config, cls.read_draft(spec))
        super().apply_options(spec)
