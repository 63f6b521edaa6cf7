"""Which speculative configs vllm-specx serves, and with what.

A route maps a user-facing method (`"dspark"`, later `"mtp"`) to the vLLM machinery our proposer
builds on (`internal_method`), the draft architecture we register, and our proposer class.
`choose()` decides per config, from the draft's config.json alone:

* our own checkpoints always take our route;
* upstream (speculators-format) DSpark checkpoints take it when vLLM would run the V1 model runner
  (where vLLM cannot run them at all), and stay with vLLM's built-in DSpark on the V2 runner
  unless `VLLM_SPECX_UPSTREAM_DSPARK=specx` opts in.

No vLLM imports here; `_vllm_compat` applies the decision.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from vllm_specx.config import SPECX_DSPARK_ARCH, DSparkDraftConfig, is_dspark_checkpoint, read_config_json

UPSTREAM_ENV = "VLLM_SPECX_UPSTREAM_DSPARK"  # "auto" (default) | "specx" | "vllm"


@dataclasses.dataclass(frozen=True)
class Route:
    user_method: str
    internal_method: str  # the vLLM method whose runner plumbing our proposer reuses
    arch: str  # draft architecture registered with vLLM's ModelRegistry
    model_cls: str  # "module:Class"
    proposer_cls: str  # "module:Class"


ROUTES = {
    "dspark": Route(
        user_method="dspark",
        internal_method="dflash",
        arch=SPECX_DSPARK_ARCH,
        model_cls="vllm_specx.models.dspark_vllm:SpecxDSparkForCausalLM",
        proposer_cls="vllm_specx.proposers.dspark:DSparkProposer",
    ),
}


def choose(method: str | None, model: str | None, v2_would_run: bool
           ) -> tuple[Route, DSparkDraftConfig] | None:
    """The route for a speculative config, or None to leave it to vLLM.

    Args:
        method: the user's `method` (None when omitted).
        model: the user's draft `model` (a local directory for our routes).
        v2_would_run: whether vLLM would pick its V2 model runner for this engine.
    """
    if method not in (None, "dspark") or not model or not (Path(model) / "config.json").is_file():
        return None
    raw = read_config_json(model)
    fmt = is_dspark_checkpoint(raw)
    if fmt is None:
        if method == "dspark" and raw.get("architectures") == [SPECX_DSPARK_ARCH]:
            DSparkDraftConfig.from_dict(raw, f"{model}/config.json")  # raises, naming the field
        return None
    if fmt == "speculators":
        choice = os.environ.get(UPSTREAM_ENV, "auto")
        if choice not in ("auto", "specx", "vllm"):
            raise ValueError(f"{UPSTREAM_ENV}={choice!r}: expected auto, specx or vllm")
        if method is None or choice == "vllm" or (choice == "auto" and v2_would_run):
            return None
    return ROUTES["dspark"], DSparkDraftConfig.from_dict(raw, f"{model}/config.json")
