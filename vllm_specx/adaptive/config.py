"""The adaptive-drafting knobs of the speculative config, validated on every construction path.

    adaptive               true to turn it on (vLLM's `enable_adaptive_verification: true` is the
                           same switch)
    adaptive_confidence    "auto" (the draft's confidence head when it has one, else the online
                           estimator), "head" (refused for a draft without one) or "estimator"
    adaptive_threshold     in [0, 1): a draft whose survival (probability of being accepted) is
                           below it is never verified (default 0)
    adaptive_cost_model    true (default): verify the prefix lengths that maximise expected tokens
                           per second under the profiled cost tables, and skip draft passes while
                           drafting does not pay; false: verify every draft whose survival reaches
                           the threshold, never skip a pass
    adaptive_max_skip      longest run of skipped draft passes before a probe pass (default 32)

Plain Python: no vLLM, no torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

CONFIDENCE_SOURCES = ("auto", "head", "estimator")
KEYS = ("adaptive", "adaptive_confidence", "adaptive_threshold", "adaptive_cost_model", "adaptive_max_skip")
VLLM_SWITCH = "enable_adaptive_verification"  # vLLM's own field (its V2 runner's switch)


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
    enabled: bool = False
    confidence: str = "auto"
    threshold: float = 0.0
    cost_model: bool = True
    max_skip: int = 32

    def __post_init__(self) -> None:
        def fail(field: str, msg: str):
            raise ValueError(f"speculative_config option '{field}' = {msg}")

        if not isinstance(self.enabled, bool):
            fail("adaptive", f"{self.enabled!r}: must be true or false")
        if self.confidence not in CONFIDENCE_SOURCES:
            fail("adaptive_confidence", f"{self.confidence!r}: must be one of {list(CONFIDENCE_SOURCES)}")
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= t < 1.0:
            fail("adaptive_threshold", f"{t!r}: must be a number in [0, 1)")
        if not isinstance(self.cost_model, bool):
            fail("adaptive_cost_model", f"{self.cost_model!r}: must be true or false")
        m = self.max_skip
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= 4096:
            fail("adaptive_max_skip", f"{m!r}: must be an integer in [1, 4096]")

    @classmethod
    def from_options(cls, options: dict[str, Any], vllm_switch: bool = False) -> "AdaptiveConfig":
        """From the speculative config's adaptive keys (`KEYS`); `vllm_switch`: vLLM's
        `enable_adaptive_verification`. Knobs without the switch are refused (they would do
        nothing)."""
        unknown = sorted(set(options) - set(KEYS))
        if unknown:
            raise ValueError(f"speculative_config option(s) {unknown} are not adaptive-drafting options")
        enabled = options.get("adaptive", False)
        if not isinstance(enabled, bool):
            raise ValueError(f"speculative_config option 'adaptive' = {enabled!r}: must be true or false")
        enabled = enabled or bool(vllm_switch)
        knobs = sorted(k for k in options if k != "adaptive")
        if knobs and not enabled:
            raise ValueError(f"speculative_config option(s) {knobs} need 'adaptive': true")
        return cls(enabled=enabled, confidence=options.get("adaptive_confidence", "auto"),
                   threshold=options.get("adaptive_threshold", 0.0),
                   cost_model=options.get("adaptive_cost_model", True),
                   max_skip=options.get("adaptive_max_skip", 32))
