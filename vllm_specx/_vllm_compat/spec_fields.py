"""Patch `spec_fields`: refuse, in one line naming the field, the speculative-config values that
vLLM's pydantic validation would refuse with a multi-line report before any vllm-specx check runs
(its `__post_init__`, where the route lives, is never reached then):

* keys that are not `SpeculativeConfig` fields (a misspelled or unknown option), and
* `num_speculative_tokens` below 1 (0 or negative), or a boolean.

The adaptive-drafting options (`vllm_specx.adaptive.config.KEYS`) are vllm-specx's own: they are
taken out before vLLM's validation, checked (`AdaptiveConfig`), refused for methods whose proposer
does not implement it (`Method.adaptive_drafting`), and kept on the config as `specx_adaptive` for the proposer. vLLM's own switch
`enable_adaptive_verification: true` for a draft served by such a proposer becomes `adaptive:
true` (vLLM's V1 validation would refuse its own switch).

Only configs whose draft vllm-specx checks are affected: `method` one of
`registry.draft_methods()` (its methods and its baselines' vLLM methods), or no `method` and a
draft directory that a registered method claims. Every other config keeps vLLM's own errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_specx import registry
from vllm_specx._vllm_compat.patching import patch, probe, resolve
from vllm_specx.adaptive.config import KEYS as ADAPTIVE_KEYS
from vllm_specx.adaptive.config import VLLM_SWITCH
from vllm_specx.adaptive.config import AdaptiveConfig

TARGET = "vllm.config.speculative:SpeculativeConfig.__init__"


def _claimed_by(model) -> str | None:
    """The registered method that claims the draft directory `model` (its config.json), or None."""
    try:
        if not model or not (Path(model) / "config.json").is_file():
            return None
        from vllm_specx.checkpoint import read_config_json

        hit = registry.detect(read_config_json(model))
        return hit[0].name if hit is not None else None
    except (ValueError, OSError):
        return None


def _claimed(model) -> bool:
    """Whether a registered method claims the draft directory `model` (its config.json)."""
    return _claimed_by(model) is not None


def _ours(kwargs: dict[str, Any]) -> str | None:
    """The registered method that will serve these SpeculativeConfig kwargs, or None."""
    try:
        from vllm_specx._vllm_compat.route import v2_would_run

        hit = registry.choose(kwargs.get("method"), kwargs.get("model"), v2_would_run())
    except (ValueError, OSError):
        return None
    return hit[0].name if hit is not None else None


def take_adaptive(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """Remove the adaptive-drafting options from `kwargs` and return them (None when there are
    none), after checking them; ValueError ("vllm-specx: ...", one line) otherwise."""
    options = {k: kwargs.pop(k) for k in ADAPTIVE_KEYS if k in kwargs}
    if kwargs.get(VLLM_SWITCH) is True and _ours(kwargs) in registry.adaptive_methods():
        # vLLM's switch for a draft our proposer serves: ours on the V1 runner (vLLM's V1
        # validation refuses its own switch there)
        kwargs.pop(VLLM_SWITCH)
        options.setdefault("adaptive", True)
    if not options:
        return None
    method = kwargs.get("method") or _claimed_by(kwargs.get("model"))
    if method not in registry.adaptive_methods():
        raise ValueError(f"vllm-specx: speculative_config option(s) {sorted(options)}: adaptive drafting "
                         f"is implemented for method(s) {registry.adaptive_methods()}, not {method!r}")
    try:
        AdaptiveConfig.from_options(options)
    except ValueError as e:
        raise ValueError(f"vllm-specx: {e}") from None
    return options


def problem(fields, kwargs: dict[str, Any]) -> str | None:
    """The one-line complaint about `kwargs` (SpeculativeConfig's keyword arguments; `fields`:
    its field names), or None."""
    unknown = sorted(k for k in kwargs if k not in fields)
    if unknown:
        return (f"speculative_config option(s) {unknown} are not options of vLLM's "
                f"SpeculativeConfig, so nothing would honour them; remove them or fix the spelling")
    k = kwargs.get("num_speculative_tokens")
    if k is not None and (isinstance(k, bool) or (isinstance(k, int) and k < 1)):
        return (f"speculative_config option 'num_speculative_tokens' = {k!r}: must be a positive "
                f"integer (drafts per pass)")
    return None


def check_fields(cls, kwargs: dict[str, Any]) -> None:
    """ValueError ("vllm-specx: ...", one line) for a config vllm-specx checks (module docstring)."""
    msg = problem(cls.__pydantic_fields__, kwargs)
    if msg is None:
        return
    method = kwargs.get("method")
    if method in registry.draft_methods():
        raise ValueError(f"vllm-specx: method {method!r}: {msg}")
    if method is None and _claimed(kwargs.get("model")):
        raise ValueError(f"vllm-specx: draft {kwargs.get('model')}: {msg}")


def check_confidence_source(spec, adaptive: dict[str, Any]) -> None:
    """`adaptive_confidence: "head"` needs a draft with a confidence head (config time)."""
    if adaptive.get("adaptive_confidence") != "head":
        return
    hf = getattr(getattr(spec, "draft_model_config", None), "hf_config", None)
    try:
        _, cfg = registry.config_of(hf)
    except (ValueError, TypeError, AttributeError):
        return  # not our draft's config: the proposer checks again
    if getattr(cfg, "confidence_head", None) is None:
        raise ValueError(f"vllm-specx: speculative_config option 'adaptive_confidence' = 'head': the "
                         f"draft {spec.model} has no confidence head (use 'auto' or 'estimator')")


@patch("spec_fields", TARGET,
       why="vLLM validates SpeculativeConfig's fields (pydantic) before its __post_init__, where the "
           "route checks everything else, and reports an unknown key or num_speculative_tokens <= 0 "
           "as a multi-line pydantic error; refuse them first, in one line naming the field. "
           "vllm-specx's adaptive-drafting options are not its fields: they are taken out, checked "
           "and kept on the config as `specx_adaptive`",
       remove_when="vLLM reports field errors of the speculative config in one line naming them, or "
                   "has a hook before its validation")
def speculative_init(orig):
    def __init__(self, *args, **kwargs):
        adaptive = take_adaptive(kwargs)
        check_fields(type(self), kwargs)
        out = orig(self, *args, **kwargs)
        if adaptive is not None:
            tp = getattr(getattr(self, "target_parallel_config", None), "tensor_parallel_size", 1)
            if adaptive.get("adaptive", True) and tp and tp > 1:
                raise ValueError("vllm-specx: speculative_config option 'adaptive' is not supported "
                                 "with tensor_parallel_size > 1 yet (each rank would decide on its "
                                 "own timings)")
            check_confidence_source(self, adaptive)
            object.__setattr__(self, "specx_adaptive", adaptive)
        return out

    return __init__


@probe("spec_fields")
def _probe_spec_fields():
    """num_speculative_tokens 0 for a checked method is refused in our words, before vLLM's
    validation (which, reached, would refuse it in pydantic's)."""
    from vllm.config.speculative import SpeculativeConfig

    method = sorted(registry.draft_methods())[0]
    try:
        resolve(TARGET)[2](object.__new__(SpeculativeConfig), method=method, num_speculative_tokens=0)
    except ValueError as e:
        if str(e).startswith("vllm-specx:") and "num_speculative_tokens" in str(e):
            return
        raise RuntimeError(f"num_speculative_tokens 0 reached vLLM's validation: {str(e)[:200]}") from e
    raise RuntimeError("num_speculative_tokens 0 was accepted")
