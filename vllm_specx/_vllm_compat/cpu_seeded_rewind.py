"""Patch `repair-cpu-seeded-rewind`: the second half of the CPU seeded-generator repair (see
`cpu_seeded_snapshot.py`, which saves the states this one restores). Where vLLM's bookkeeping
would rewind a discarded seeded row's generator with `set_offset` (refused by CPU generators),
the state saved before sampling is put back and vLLM's own loop skips the row.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_specx._vllm_compat.patching import Blank, ProbeReached, patch, probe, resolve
from vllm_specx._vllm_compat.cpu_seeded_snapshot import (_REMOVE_WHEN, _STATES, _WHY, _Batch,
                                                         _discarded_cpu_generators, repair_enabled)

BOOKKEEPING_TARGET = "vllm.v1.worker.cpu_model_runner:CPUModelRunner._bookkeeping_sync"
REWINDS = "specx_seeded_rewinds"  # runner attribute: how many discarded seeded rows were restored


@patch("repair-cpu-seeded-rewind", BOOKKEEPING_TARGET, enabled=repair_enabled, why=_WHY,
       remove_when=_REMOVE_WHEN)
def cpu_bookkeeping_sync(orig):
    def _bookkeeping_sync(self, *args, **kwargs):
        states = getattr(self, _STATES, None) or {}
        setattr(self, _STATES, None)
        gens = self.input_batch.generators
        held = _discarded_cpu_generators(self)
        for i, gen in held.items():
            if i not in states:  # sampling ran without the snapshot patch: nothing to restore from
                raise RuntimeError(f"vllm-specx: no saved generator state for discarded seeded row {i}")
            gen.set_state(states[i])
            del gens[i]  # vLLM's rewind loop skips rows without a generator
        if held:
            setattr(self, REWINDS, (getattr(self, REWINDS, 0) or 0) + len(held))
        try:
            return orig(self, *args, **kwargs)
        finally:
            gens.update(held)

    return _bookkeeping_sync


@probe("repair-cpu-seeded-rewind")
def _probe_rewind():
    """vLLM's bookkeeping on a discarded seeded CPU row restores the saved state (no set_offset)."""
    gen = torch.Generator().manual_seed(7)
    before = gen.get_state()
    torch.empty(4).exponential_(generator=gen)
    batch = _Batch(gen)
    runner = Blank(input_batch=batch, discard_request_mask=Blank(np=np.array([True, False])))
    setattr(runner, _STATES, {0: before})
    try:
        resolve(BOOKKEEPING_TARGET)[2](runner, Blank(), Blank(), None, None, 0)
    except ProbeReached:
        pass
    if not torch.equal(gen.get_state(), before):
        raise RuntimeError("the discarded row's generator was not restored")
    if batch.generators.get(0) is not gen:
        raise RuntimeError("the generator was not put back into the batch")
