"""The Triton-interpreter test harness (`vllm_specx.testing.triton_harness`) runs vLLM 0.34's own
kernels exactly: vLLM's top-k/top-p sampling kernel (a `tl.range` loop whose variable it casts,
which the bare interpreter cannot run) masks the same logits as vLLM's PyTorch reference. Negative
control: with the interpreter's plain `tl.range` the kernel fails."""

import pytest
import torch

from vllm_specx.testing import triton_harness

pytestmark = [pytest.mark.e2e034, pytest.mark.e2e034_ci]


def _masks():
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch
    from vllm.v1.sample.ops.topk_topp_triton import apply_top_k_top_p_triton

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 1000, generator=g)
    k, p = torch.tensor([20, 1000, 5, 50]), torch.tensor([0.9, 0.9, 1.0, 0.5])
    return (apply_top_k_top_p_triton(logits.clone(), k, p) > -1e30,
            apply_top_k_top_p_pytorch(logits.clone(), k, p) > -1e30)


def test_vllms_topk_topp_kernel_matches_its_reference():
    from vllm.triton_utils import HAS_TRITON

    assert HAS_TRITON  # the harness's stand-in backend is what vLLM's probe found
    kernel, reference = _masks()
    assert torch.equal(kernel, reference)
    assert reference.sum(1).tolist() == [17, 605, 5, 16]


def test_the_engine_masks_top_k_top_p_by_vllms_pytorch_function():
    """The harness routes the engine's top-k/top-p to vLLM's PyTorch function (the kernel above is
    95 % of a sampled request's time in the interpreter), leaving vLLM's Triton probe true."""
    from vllm.triton_utils import HAS_TRITON
    from vllm.v1.sample.ops import topk_topp_sampler as m

    assert HAS_TRITON and m.HAS_TRITON is False and m.specx_topk_topp_by_pytorch
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 500, generator=g)
    k, p = torch.tensor([10, 500, 3]), torch.tensor([0.8, 0.5, 1.0])
    assert torch.equal(m.apply_top_k_top_p(logits.clone(), k, p), m.apply_top_k_top_p_pytorch(logits.clone(), k, p))


def test_negative_control_the_bare_interpreter_fails(monkeypatch):
    from triton.runtime import interpreter

    patched = interpreter._patch_lang_core
    monkeypatch.setattr(interpreter, "_patch_lang_core", patched.specx_original)
    with pytest.raises(Exception, match="has no attribute 'to'"):
        _masks()
    assert getattr(patched, "specx_scalar_range", False) and triton_harness.ENV
