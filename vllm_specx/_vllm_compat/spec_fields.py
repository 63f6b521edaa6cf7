"""Patch `spec_fields`: refuse, in one line naming the field, the speculative-config values that
vLLM's pydantic validation would refuse with a multi-line report before any vllm-specx check runs
(its `__post_init__`, where the route lives, is never reached then):

* keys that are not `SpeculativeConfig` fields (a misspelled or unknown option), and
* `num_speculative_tokens` below 1 (0 or negative), or a boolean.

Only configs whose draft vllm-specx checks are affected: `method` one of
`registry.draft_methods()` (its methods and its baselines' vLLM methods), or no `method` and a
draft directory that a registered method claims. Every other config keeps vLLM's own errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_specx import registry
from vllm_specx._vllm_compat import patch, probe, resolve

TARGET = "vllm.config.speculative:SpeculativeConfig.__init__"


def _claimed(model) -> bool:
    """Whether a registered method claims the draft directory `model` (its config.json)."""
    try:
        if not model or not (Path(model) / "config.json").is_file():
            return False
        from vllm_specx.checkpoint import read_config_json

        return registry.detect(read_config_json(model)) is not None
    except (ValueError, OSError):
        return False


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


@patch("spec_fields", TARGET,
       why="vLLM validates SpeculativeConfig's fields (pydantic) before its __post_init__, where the "
           "route checks everything else, and reports an unknown key or num_speculative_tokens <= 0 "
           "as a multi-line pydantic error; refuse them first, in one line naming the field",
       remove_when="vLLM reports field errors of the speculative config in one line naming them, or "
                   "has a hook before its validation")
def speculative_init(orig):
    def __init__(self, *args, **kwargs):
        check_fields(type(self), kwargs)
        return orig(self, *args, **kwargs)

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
