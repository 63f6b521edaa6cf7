"""The state of confidence-scheduled drafting inside one proposer (one vLLM worker).

A proposer with `adaptive: true` owns one `AdaptiveDrafting` and calls, per engine step:
`begin_pass` (timing), `draft_now` (or a context-only pass), `decide` with the drafted slots'
confidences (-> the per-request prefix lengths, remembered for `verify_lengths`), `end_pass`;
and, at the start of the next step's draft phase, `observe` with how many tokens each request
kept (its accepted drafts + 1), which trains the online estimator and keeps the calibration
counters. The cut itself happens in vLLM's runner (`_vllm_compat/adaptive_lengths.py`).
"""

from __future__ import annotations

import logging
import time

import torch

from vllm_specx.adaptive import policy
from vllm_specx.adaptive.config import AdaptiveConfig
from vllm_specx.adaptive.costs import CostModel
from vllm_specx.adaptive.estimator import OnlineAcceptanceEstimator

logger = logging.getLogger("vllm.specx")
_LOG_EVERY_S = 30.0


class AdaptiveDrafting:
    def __init__(self, cfg: AdaptiveConfig, num_speculative_tokens: int, source: str):
        self.cfg = cfg
        self.k = num_speculative_tokens
        self.source = source  # "head" | "estimator"
        self.scheduler = policy.Scheduler(num_speculative_tokens, cfg.max_skip, cfg.cost_model, cfg.threshold)
        self.estimator = OnlineAcceptanceEstimator(num_speculative_tokens)
        self.costs: CostModel | None = None
        self.lengths: list[int] = []        # per row of the last pass, for the runner's cut
        self.req_ids: list[str] = []        # the rows' request ids
        self._by_req: dict[str, int] = {}
        self._pending: dict[str, tuple[int, torch.Tensor, torch.Tensor]] = {}  # req -> (pass, feats, conf)
        self._pass = 0
        self._last_start: float | None = None
        self._last_draft_s = 0.0
        self._t0 = 0.0
        self._last_log = time.monotonic()
        self.stats = {"draft_passes": 0, "skipped_passes": 0, "drafted_tokens": 0,
                      "verified_tokens": 0, "verify_length_counts": [0] * (num_speculative_tokens + 1),
                      "observed_slots": 0, "predicted_accepted": 0.0, "realised_accepted": 0,
                      "confidence": source}

    # ---- one pass ------------------------------------------------------------------------
    def begin_pass(self, target_tokens: int) -> None:
        now = time.perf_counter()
        if self._last_start is not None and self.costs is not None and self.cfg.cost_model:
            self.costs.observe_step(now - self._last_start, target_tokens, self._last_draft_s,
                                    drafts=sum(self.lengths) > 0)
        self._last_start = now
        self._t0 = now
        self._pass += 1

    def draft_now(self, reqs: int | None = None) -> bool:
        return self.scheduler.draft_now(reqs)

    def skipped(self, req_ids: list[str]) -> None:
        self.req_ids, self.lengths = list(req_ids), [0] * len(req_ids)
        self._by_req = {}
        self.stats["skipped_passes"] += 1
        self.stats["verify_length_counts"][0] += len(req_ids)
        self._last_draft_s = time.perf_counter() - self._t0

    def decide(self, req_ids: list[str], conf: torch.Tensor, feats: torch.Tensor | None) -> list[int]:
        """conf [R, m]: confidences of the drafted slots; feats [R, m]: the estimator's features
        (None when the confidences come from the head). Returns the lengths to verify."""
        r, m = conf.shape
        surv = policy.survival(conf.double())
        sch = self.scheduler
        lengths = policy.cut(surv, sch.level if self.cfg.cost_model else self.cfg.threshold)
        plan = None
        if self.costs is not None and self.cfg.cost_model:
            plan = policy.plan(surv, self.costs.verify_seconds, r, self.cfg.threshold,
                               self.costs.draft_seconds(r, sch.horizon), self.costs.skip_seconds(r),
                               self.costs.spec_seconds)
        sch.after_pass(lengths, plan)
        lengths = [min(n, self.k) for n in lengths]
        self.req_ids, self.lengths = list(req_ids), lengths
        self._by_req = dict(zip(self.req_ids, lengths))
        for i, rid in enumerate(req_ids):
            self._pending[rid] = (self._pass, feats[i].cpu() if feats is not None else None, conf[i].cpu())
        st = self.stats
        st["draft_passes"] += 1
        st["drafted_tokens"] += r * m
        st["verified_tokens"] += sum(lengths)
        for n in lengths:
            st["verify_length_counts"][n] += 1
        return lengths

    def end_pass(self, reqs: int, slots: int, drafted: bool) -> None:
        self._last_draft_s = time.perf_counter() - self._t0
        if drafted and self.costs is not None:
            self.costs.observe_draft(self._last_draft_s, reqs, slots)
        now = time.monotonic()
        if now - self._last_log > _LOG_EVERY_S:
            self._last_log = now
            logger.info("vllm-specx adaptive drafting: %s", self.summary())

    # ---- what the target kept ------------------------------------------------------------
    def observe(self, req_ids: list[str], kept: list[int]) -> None:
        """kept[i]: tokens request req_ids[i] got from the last verification (accepted drafts + 1;
        0 for a discarded row). Requests whose drafts were cut before verification by vLLM
        itself (token budget) count their uncut slots as rejected: a small bias towards caution."""
        feats, slots, labels = [], [], []
        for rid, got in zip(req_ids, kept):
            entry = self._pending.pop(rid, None)
            if entry is None or entry[0] != self._pass or got <= 0:
                continue
            n = self.lengths_of(rid)
            if n <= 0:
                continue
            accepted = min(got - 1, n)
            seen = min(accepted + 1, n)  # accepted slots, then the first rejected one
            lab = torch.zeros(seen)
            lab[:accepted] = 1.0
            if entry[1] is not None:
                feats.append(entry[1][:seen])
                slots.append(torch.arange(seen))
                labels.append(lab)
            self.stats["observed_slots"] += seen
            self.stats["predicted_accepted"] += float(policy.survival(entry[2][:n].double()).sum())
            self.stats["realised_accepted"] += accepted
        if feats:
            self.estimator.observe(torch.cat(feats), torch.cat(slots), torch.cat(labels))
        self._pending.clear()

    def lengths_of(self, rid: str) -> int:
        return self._by_req.get(rid, 0)

    def summary(self) -> dict:
        st = dict(self.stats)
        st["predicted_accepted"] = round(st["predicted_accepted"], 2)
        st["horizon"] = self.scheduler.horizon
        st["level"] = round(self.scheduler.level, 4)
        if self.source == "estimator":
            st["estimator"] = [round(float(x), 3) for x in self.estimator.theta]
        if self.costs is not None:
            st["costs"] = self.costs.summary()
        return st


def worker_summary(worker) -> dict | None:
    """`LLM.collective_rpc(worker_summary)`: the drafter's adaptive-drafting counters (None
    without adaptive drafting)."""
    a = getattr(getattr(worker.model_runner, "drafter", None), "adaptive", None)
    return a.summary() if a is not None else None
