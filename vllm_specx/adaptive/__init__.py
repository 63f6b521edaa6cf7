"""Confidence-scheduled drafting on vLLM's V1 runner (`adaptive: true` in the speculative config).

A drafter proposes up to K tokens per request; each draft slot i of request r gets a confidence
c[r, i], the probability that the target accepts draft i given that drafts < i were accepted
(from the draft's confidence head, or from the online estimator over the draft distribution's
top probability). Survival s[r, i] = prod_{j <= i} c[r, j] is the probability that draft i is
accepted, so verifying the first n[r] drafts of r yields 1 + sum_{i < n[r]} s[r, i] tokens in
expectation. `policy.choose` picks the n[r] that maximise expected tokens per second under a cost
model of the next step (`costs.CostModel`: target forward + logits per token count and the draft
pass per batch, profiled on the running machine at start-up and corrected online), and
`policy.Scheduler` skips whole draft passes (keeping the draft's context cache) while drafting
does not pay, probing again with exponential back-off.

Verification is untouched: a request's drafts are cut to a prefix before vLLM schedules them, and
the rejection sampler verifies that prefix exactly as it verifies any draft (lossless whatever is
cut; `tests/test_adaptive.py`, `tests/e2e/test_lossless.py`).

Modules: `config` (the knobs, validated on every construction path), `policy` (the reference:
survival, the budget choice, the pass scheduler), `costs` (profiled and online cost tables),
`estimator` (the online acceptance estimator).
"""
