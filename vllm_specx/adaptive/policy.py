"""The reference for confidence-scheduled drafting: survival, the cut, the planner, and the
draft-pass scheduler. The proposer calls these functions as they are (no second implementation).

Notation, per pass: R requests are decoding; drafting proposed up to m drafts each; c [R, m] is
the confidence of each draft slot (P(draft i accepted | drafts < i accepted)).

    survival  s[r, i] = prod_{j <= i} c[r, j]   (non-increasing along i, since c <= 1)

Verifying the first n[r] drafts of r gives, in expectation, 1 + sum_{i < n[r]} s[r, i] tokens
(the bonus/corrected token plus the accepted drafts), at the price of n[r] more target tokens.

**The cut must not look at the draft it cuts.** Verification is exact for any number of drafts
fixed before they are drawn, and stays exact when whether draft i is verified depends only on
what came before it (drafts < i, earlier passes). It is not exact when it depends on draft i
itself: then the drafts that reach verification are no longer distributed as q (at T > 0 the
output drifts from the target's distribution; `tests/test_adaptive.py` shows both). c[r, i]
depends on drafts < i only (the slot's hidden state, the Markov embedding of draft i - 1, or the
top probability of the distribution draft i is drawn from), so s[r, i] does too, and

    cut:  n[r] = number of leading slots i with s[r, i] >= level

is exact for any `level` fixed before the pass. Choosing the lengths that maximise this pass's
throughput from all of its survivals would not be: s[r, i + 1] depends on draft i.

The level comes from the previous pass (vLLM's V2 `AdaptiveVerificationManager` likewise sizes
its budget one step stale). `plan` takes that pass's survivals and `verify_seconds(T)`, the
modelled time of a step whose target pass holds T tokens (forward, logits, sampling and the
engine's per-step overhead), and finds the budget

    b* = argmax_b  (R + S_b) / (verify_seconds(N0 + b) + spec_seconds [b > 0]),    S_b = sum of the b largest s[r, i]

(N0: tokens of the step without drafts, R for pure decode; spec_seconds: what a step with any
draft to verify costs beyond its tokens); the next level is the midpoint
between the b*-th and (b* + 1)-th largest survival, so the next cut verifies the slots worth
their cost. The draft cost is left out of b*: when the drafts exist their cost is spent. Whether
drafting pays at all (decided for the next passes, so the draft cost counts):

    pays  <=>  max_b (R + S_b) / (draft_seconds + verify_seconds(N0 + b))  >  (1 + MARGIN) R / (skip_seconds + verify_seconds(N0))

(MARGIN 5%: a pass that only breaks even is not worth the risk of a wrong estimate.)
`Scheduler` skips draft passes while it does not pay (a skipped pass still owes the draft's
context cache the verified tokens' K/V, queued and written in one batch before the next draft
pass: `skip_seconds`), probing again after 1, 2, 4, ... up to `max_skip` skipped passes,
or at once when the batch has shrunk below `SHRINK` of the batch of the last draft pass (fewer
requests make a draft pass cheaper relative to its gain: what did not pay for 16 requests may
pay for 4), and computes only as many draft slots as the last pass verified plus one (`horizon`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

MARGIN = 0.05
SHRINK = 0.75


def survival(conf: torch.Tensor) -> torch.Tensor:
    """conf [R, m] in [0, 1] -> survival [R, m] = cumulative product along the slots."""
    return conf.clamp(0.0, 1.0).cumprod(-1)


def cut(surv: torch.Tensor, level: float) -> list[int]:
    """Per request, the number of leading slots whose survival reaches `level` (a prefix)."""
    return (surv >= level).long().cumprod(-1).sum(-1).tolist()


@dataclasses.dataclass
class Plan:
    level: float                # the survival a slot needs to be verified on the next pass
    budget: int                 # b*: drafts worth verifying among this pass's survivals
    expected_tokens: float      # R + S_b*
    tokens_per_second: float    # at b*, the draft cost spent
    pays: bool                  # drafting beats skipping it in the steady state


def plan(surv: torch.Tensor, verify_seconds: Callable[[torch.Tensor], torch.Tensor], base_tokens: int,
         threshold: float = 0.0, draft_seconds: float = 0.0, skip_seconds: float = 0.0,
         spec_seconds: float = 0.0) -> Plan:
    """The budget and the next level (module docstring) from survival `surv` [R, m].

    Args:
        surv: [R, m] survival per request and draft slot.
        verify_seconds: token counts [n] (float64) -> seconds [n] of a step with that many target tokens.
        base_tokens: N0, target tokens of the next step without drafts (>= R).
        threshold: slots with survival below it are never verified.
        draft_seconds, skip_seconds: a draft pass and a skipped pass (its context cache writes).
        spec_seconds: what a step that verifies any draft costs beyond its tokens.
    """
    r = surv.shape[0]
    s = surv.detach().double().cpu().flatten()
    s = torch.sort(s[s >= threshold], descending=True).values
    gains = r + torch.cat([torch.zeros(1, dtype=torch.float64), s.cumsum(0)])
    verify = verify_seconds(base_tokens + torch.arange(len(s) + 1, dtype=torch.float64))
    verify[1:] += spec_seconds
    tput = gains / verify
    b = int(tput.argmax())
    if b == 0:
        level = float(s[0]) * 1.0001 + 1e-9 if len(s) else 1.0
    elif b == len(s):
        level = max(threshold, float(s[-1]) * 0.9999)
    else:
        level = (float(s[b - 1]) + float(s[b])) / 2
    steady = (gains / (verify + draft_seconds)).max() if r else torch.tensor(0.0)
    no_draft = r / (verify[0] + skip_seconds) if r else torch.tensor(0.0)
    return Plan(max(level, threshold), b, float(gains[b]), float(tput[b]),
                bool(steady > (1 + MARGIN) * no_draft))


class Scheduler:
    """Which draft passes run, how many slots they compute, and the level of the next cut.

    `draft_now(reqs)` is asked once per pass (reqs: the pass's batch size); `after_pass(lengths,
    plan)` after a pass that drafted."""

    def __init__(self, num_speculative_tokens: int, max_skip: int = 32, cost_model: bool = True,
                 threshold: float = 0.0):
        self.k = num_speculative_tokens
        self.max_skip = max_skip
        self.cost_model = cost_model
        self.threshold = threshold
        self.level = threshold
        self.horizon = num_speculative_tokens
        self.backoff = 1
        self.skip_left = 0
        self.reqs = 0  # batch size of the last draft pass

    def draft_now(self, reqs: int | None = None) -> bool:
        if self.skip_left > 0:
            if reqs is not None and reqs < SHRINK * self.reqs:
                self.skip_left, self.backoff = 0, 1
                return True
            self.skip_left -= 1
            return False
        return True

    def after_pass(self, lengths: list[int], plan: Plan | None) -> None:
        if not self.cost_model or plan is None:
            return
        self.reqs = len(lengths)
        self.level = max(plan.level, self.threshold)
        self.horizon = max(1, min(self.k, max(lengths, default=0) + 1, plan.budget + 1))
        if plan.pays:
            self.backoff = 1
        else:
            self.skip_left = self.backoff
            self.backoff = min(2 * self.backoff, self.max_skip)
