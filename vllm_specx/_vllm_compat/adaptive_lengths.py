"""Patch `adaptive-lengths`: with adaptive drafting, each request's drafts are cut to the prefix
its proposer chose before the scheduler sees them (the V1 runner hands the scheduler a rectangular
[requests, K] block of drafts; vLLM's per-request cut exists only on its V2 runner)."""

from __future__ import annotations

from vllm_specx._vllm_compat.patching import Blank, logger, patch, probe, resolve

TARGET = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._get_draft_token_ids_cpu"
_warned = []


def cut(drafter, lists: list[list[int]], req_ids) -> list[list[int]]:
    """`lists` (one draft list per row) cut to the lengths `drafter.adaptive` chose for the same
    rows; unchanged without adaptive drafting or when the rows are not the ones it decided for
    (then every draft is verified: slower, never wrong)."""
    a = getattr(drafter, "adaptive", None)
    if a is None or not lists or not a.req_ids:
        return lists
    if list(req_ids[:len(a.req_ids)]) != a.req_ids:
        if not _warned:
            _warned.append(1)
            logger.warning("vllm-specx adaptive drafting: the runner's rows are not the drafted "
                           "ones; verifying every draft of this step")
        return lists
    return [row[:n] for row, n in zip(lists, a.lengths)] + list(lists[len(a.lengths):])


@patch("adaptive-lengths", TARGET,
       why="the V1 runner verifies all K drafts of every request; adaptive drafting verifies a "
           "per-request prefix, so the drafts the scheduler receives are cut here",
       remove_when="vLLM's V1 runner takes per-request draft lengths from the proposer (V2's "
                   "AdaptiveVerificationManager)")
def get_draft_token_ids_cpu(orig):
    def _get_draft_token_ids_cpu(self):
        lists, req_ids = orig(self)
        return cut(getattr(self, "drafter", None), lists, req_ids), req_ids

    return _get_draft_token_ids_cpu


@probe("adaptive-lengths")
def _probe_adaptive_lengths():
    """A fake runner with list drafts [[1, 2, 3], [4, 5, 6]] and a drafter that chose lengths
    [1, 0] gets [[1], []] from the patched method."""
    fn = resolve(TARGET)[2]
    drafter = Blank(adaptive=Blank(req_ids=["a", "b"], lengths=[1, 0]))
    runner = Blank(_draft_token_ids=[[1, 2, 3], [4, 5, 6]], input_batch=Blank(req_ids=["a", "b"]),
                   drafter=drafter)
    lists, _ = fn(runner)
    if lists != [[1], []]:
        raise RuntimeError(f"drafts were not cut to the chosen lengths: {lists}")
