"""Patch `repair-cpu-seeded-snapshot` (with `repair-cpu-seeded-rewind`, `cpu_seeded_rewind.py`): on
vLLM's CPU engine a
seeded request whose sampled token is discarded (its prompt is still being prefilled in chunks)
gets its generator rewound by restoring the state it had before sampling, instead of vLLM's
`gen.set_offset(gen.get_offset() - 4)`, which CPU generators refuse ("CPU Generator does not use
offset") and which kills the engine.

Contract (vLLM's, for GPUs): a token sampled for a request that is not done with its prompt is
thrown away, and the request's generator is left as if that sample never happened, so a seeded
request's output does not depend on how its prompt was chunked. On GPUs the generator is
Philox and the rewind is an offset; on CPUs it is a Mersenne Twister whose whole state is saved
(`get_state`, about 5 KB) right before the runner samples and put back (`set_state`) where vLLM
would rewind. Only the discarded rows of seeded requests are touched; GPU generators are left to
vLLM.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_specx import envs
from vllm_specx._vllm_compat.patching import Blank, ProbeReached, patch, probe, resolve

REPAIR_ENV = "VLLM_SPECX_REPAIR_CPU_SEEDED"
SAMPLE_TARGET = "vllm.v1.worker.cpu_model_runner:CPUModelRunner._sample"
_STATES = "_specx_discarded_generator_states"  # runner attribute: {batch index: state}


def repair_enabled() -> bool:
    if envs.get(REPAIR_ENV) == "0":
        return False
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _discarded_cpu_generators(runner) -> dict[int, torch.Generator]:
    """{batch index: generator} of the seeded requests whose sampled token this step discards."""
    batch = runner.input_batch
    num_reqs = batch.num_reqs
    out = {}
    for i in np.nonzero(runner.discard_request_mask.np[:num_reqs])[0]:
        gen = batch.generators.get(int(i))
        if gen is not None and gen.device.type == "cpu":
            out[int(i)] = gen
    return out


_WHY = ("vLLM 0.32's V1 runner rewinds the generator of a seeded request whose sampled token is "
        "discarded (chunked prefill) with gen.set_offset, which CPU generators refuse: the first "
        "seeded request whose prompt is chunked kills the CPU engine, with or without "
        "speculation. The repair saves the state of those generators before sampling and restores "
        "it instead. On by default on CPU; VLLM_SPECX_REPAIR_CPU_SEEDED=0 turns it off")
_REMOVE_WHEN = "vLLM's runner rewinds CPU generators without set_offset (report upstream)"


@patch("repair-cpu-seeded-snapshot", SAMPLE_TARGET, enabled=repair_enabled, why=_WHY,
       remove_when=_REMOVE_WHEN)
def cpu_sample(orig):
    def _sample(self, logits, spec_decode_metadata):
        states = {i: g.get_state() for i, g in _discarded_cpu_generators(self).items()}
        out = orig(self, logits, spec_decode_metadata)
        setattr(self, _STATES, states)
        return out

    return _sample


class _Batch:
    def __init__(self, gen):
        self.num_reqs = 2
        self.generators = {0: gen}
        self.sampling_metadata = Blank()

    def update_async_output_token_ids(self):
        pass

    @property
    def req_ids(self):  # read by vLLM's _bookkeeping_sync right after its rewind loop
        raise ProbeReached


@probe("repair-cpu-seeded-snapshot")
def _probe_snapshot():
    """The runner's sampling step keeps the pre-sampling state of a discarded seeded row."""
    gen = torch.Generator().manual_seed(7)
    before = gen.get_state()

    def sampler(logits, sampling_metadata):
        torch.empty(4).exponential_(generator=gen)
        return "sampled"

    runner = Blank(input_batch=_Batch(gen), discard_request_mask=Blank(np=np.array([True, False])),
                   sampler=sampler)
    if resolve(SAMPLE_TARGET)[2](runner, None, None) != "sampled":
        raise RuntimeError("the patched _sample did not return the sampler's output")
    saved = getattr(runner, _STATES, None) or {}
    if 0 not in saved or not torch.equal(saved[0], before):
        raise RuntimeError("the discarded row's generator state was not saved before sampling")
