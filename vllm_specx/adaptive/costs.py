"""Cost tables for confidence-scheduled drafting, measured on the running machine.

At start-up (after the KV cache exists) `profile()` times, for a grid of token counts T, the
target's forward (`runner._dummy_run(T, force_attention=True)`) plus its logits for T rows, and for
a grid of batch sizes R the draft's backbone pass over R requests' query slots plus one draft
slot's logits and Markov step for R rows. Online, `CostModel` learns what the tables cannot
know from every engine step: y = the time between the starts of two consecutive draft passes
minus the first pass's own time (everything the engine did for the step: scheduling, the target
pass over T tokens, sampling and verification, output processing) is fitted as
y = overhead + scale * target(T) + spec * [the step verified drafts] by least squares over the
last 128 steps (refitted when the model is next read, not at every step), pulled towards
(0, 1, 0) with the weight of one step (`spec`: what a step with drafts costs beyond its tokens:
the rejection sampler, the speculative metadata); and a correction factor of the draft pass
(measured / modelled, median of the last 64). The tables are made non-decreasing (`monotone`): on a busy
machine a single timing can dip.

    verify_seconds(T)  = overhead + scale * target(T)             (target piecewise linear in T)
    spec_seconds       = spec                                      (added when drafts are verified)
    draft_seconds(R, m) = correction * (backbone(R) + m * slot(R))
"""

from __future__ import annotations

import collections
import statistics
import time
from collections.abc import Callable

import torch

_WINDOW = 64
_PRIOR = 1.0


def _interp(table: dict[int, float], x: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear interpolation of `table` at x (float64), linear extrapolation past the
    ends (from the last two points), never below 0."""
    keys = sorted(table)
    xs = torch.tensor(keys, dtype=torch.float64)
    ys = torch.tensor([table[k] for k in keys], dtype=torch.float64)
    if len(keys) == 1:
        return torch.full_like(x, float(ys[0]))
    idx = torch.searchsorted(xs, x).clamp(1, len(keys) - 1)
    x0, x1, y0, y1 = xs[idx - 1], xs[idx], ys[idx - 1], ys[idx]
    return (y0 + (y1 - y0) * (x - x0) / (x1 - x0)).clamp_min(0.0)


def monotone(table: dict[int, float]) -> dict[int, float]:
    """The closest non-decreasing table in least squares (pool adjacent violators): a cost does not
    fall when the work grows, so a timing dip is noise."""
    keys = sorted(table)
    blocks: list[list[float]] = []  # [sum, count]
    for k in keys:
        blocks.append([table[k], 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    values = [b[0] / b[1] for b in blocks for _ in range(b[1])]
    return dict(zip(keys, values))


class CostModel:
    def __init__(self, target: dict[int, float], backbone: dict[int, float], slot: dict[int, float],
                 skip: dict[int, float] | None = None):
        if not target or not backbone or not slot:
            raise ValueError("CostModel needs non-empty target, backbone and slot tables")
        self.target, self.backbone, self.slot = monotone(target), monotone(backbone), monotone(slot)
        self.skip = monotone(skip or {1: 0.0})
        self._steps = collections.deque(maxlen=2 * _WINDOW)  # (target(T), drafts?, y) per step
        self._draft_ratio = collections.deque(maxlen=_WINDOW)
        self._fit = (0.0, 1.0, 0.0)  # overhead, scale, spec
        self._stale = False  # steps observed since the last fit (refitted when the model is read)

    @property
    def overhead(self) -> float:
        return self._fitted()[0]

    @property
    def scale(self) -> float:
        return self._fitted()[1]

    @property
    def spec_seconds(self) -> float:
        return self._fitted()[2]

    def _fitted(self) -> tuple[float, float, float]:
        if self._stale:
            self._stale = False
            self._refit()
        return self._fit

    # ---- the model -------------------------------------------------------------------------
    def _refit(self) -> None:
        """Least squares y = a + b x + f z over the step samples, pulled towards (0, 1, 0) with
        the weight of `_PRIOR` samples (a 3x3 solve)."""
        data = torch.tensor(list(self._steps), dtype=torch.float64)
        xs, zs, ys = data[:, 0], data[:, 1], data[:, 2]
        feats = torch.stack([torch.ones_like(xs), xs, zs], 1)
        scale2 = float((xs * xs).mean())
        lam = torch.diag(torch.tensor([_PRIOR, _PRIOR * scale2, _PRIOR * scale2], dtype=torch.float64))
        prior = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
        try:
            a, b, f = torch.linalg.solve(feats.t() @ feats + lam, feats.t() @ ys + lam @ prior).tolist()
        except RuntimeError:
            return
        if b <= 0.1:  # a steeper-than-flat fit only; else keep the table's shape, shift it
            b = 0.1
            a = float((ys - b * xs - f * zs).mean())
        self._fit = (max(a, 0.0), b, max(f, 0.0))

    @property
    def draft_correction(self) -> float:
        return statistics.median(self._draft_ratio) if self._draft_ratio else 1.0

    def target_seconds(self, tokens: torch.Tensor) -> torch.Tensor:
        return _interp(self.target, tokens.double())

    def verify_seconds(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.overhead + self.scale * self.target_seconds(tokens)

    def modelled_draft(self, reqs: int, slots: int) -> float:
        r = torch.tensor([float(reqs)], dtype=torch.float64)
        return float(_interp(self.backbone, r) + slots * _interp(self.slot, r))

    def draft_seconds(self, reqs: int, slots: int) -> float:
        return self.draft_correction * self.modelled_draft(reqs, slots)

    def skip_seconds(self, reqs: int) -> float:
        return float(_interp(self.skip, torch.tensor([float(reqs)], dtype=torch.float64)))

    # ---- online samples --------------------------------------------------------------------
    def observe_step(self, period: float, tokens: int, drafted_seconds: float, drafts: bool = False) -> None:
        """One engine step: `period` seconds between the starts of two consecutive draft passes,
        the second step's target pass held `tokens` tokens (`drafts`: some were drafts to verify),
        the first pass took `drafted_seconds`. Periods far above the model (an idle engine, a
        prefill burst) are not a step's cost."""
        x = float(self.target_seconds(torch.tensor([float(tokens)])))
        y = period - drafted_seconds
        a, b, f = self._fit  # the last fit is enough to spot an outlier
        modelled = a + b * x + (f if drafts else 0.0)
        if y <= 0 or (len(self._steps) >= 8 and y > 3 * modelled + 0.05):
            return
        self._steps.append((x, float(drafts), y))
        self._stale = True

    def observe_draft(self, seconds: float, reqs: int, slots: int) -> None:
        modelled = self.modelled_draft(reqs, slots)
        if modelled > 0:
            self._draft_ratio.append(min(max(seconds / modelled, 0.25), 4.0))

    def summary(self) -> dict:
        return {"target_ms": {k: round(v * 1e3, 3) for k, v in self.target.items()},
                "draft_backbone_ms": {k: round(v * 1e3, 3) for k, v in self.backbone.items()},
                "draft_slot_ms": {k: round(v * 1e3, 3) for k, v in self.slot.items()},
                "skip_ms": {k: round(v * 1e3, 3) for k, v in self.skip.items()},
                "overhead_ms": round(self.overhead * 1e3, 3), "target_scale": round(self.scale, 3),
                "spec_step_ms": round(self.spec_seconds * 1e3, 3),
                "steps_observed": len(self._steps), "draft_correction": round(self.draft_correction, 3)}


def time_call(fn: Callable[[], object], device: torch.device, reps: int = 5) -> float:
    """Median seconds of `fn()` over `reps` runs after one warm-up run."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def grid(limit: int, start: int = 1) -> list[int]:
    """1, 2, 4, ... up to `limit`, with `limit` itself."""
    out, x = [], start
    while x < limit:
        out.append(x)
        x *= 2
    return out + [limit]
