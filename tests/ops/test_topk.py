"""Triton radix top-k (`ops/topk/kernel.py`) against its reference, on CPU via the interpreter.

On identical scores the kernel must reproduce the reference exactly (same indices, same order):
the tie rule is part of the contract. Set comparisons (`topk_sets`) are for the indexer tests.
"""

import pytest
import torch

from vllm_specx.ops.topk import topk, topk_reference

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _tri(scores, k, lengths=None, **kw):
    from vllm_specx.ops.topk.kernel import topk_triton

    return topk_triton(scores, k, lengths, **kw)


def _scores(rows, cols, dtype, device, ties=False):
    x = torch.randn(rows, cols, device=device)
    if ties:  # few distinct values: every threshold is a tie
        x = (x * 3).round()
    return x.to(DTYPES[dtype])


@pytest.mark.parametrize(
    "rows,cols,k,dtype,ties,with_len,block",
    [
        pytest.param(*c, id="R{}-S{}-k{}-{}-ties{}-len{}-blk{}".format(*c))
        for c in [
            (1, 1, 1, "fp32", False, False, None),
            (63, 1000, 17, "fp32", False, True, None),  # odd sizes, per-row lengths
            (5, 1000, 2048, "fp32", False, True, None),  # k > length: -1 padding
            (7, 1000, 50, "bf16", True, False, 64),  # heavy ties, 16 programs per row
            (4, 1000, 300, "fp16", True, True, 128),
            (2, 5000, 2048, "bf16", False, True, 256),  # the real index_topk, S > k
        ]
    ],
)
def test_topk_matches_reference(rows, cols, k, dtype, ties, with_len, block, device):
    scores = _scores(rows, cols, dtype, device, ties)
    lengths = torch.randint(0, cols + 1, (rows,), device=device, dtype=torch.int32)
    lengths = lengths if with_len else None
    ref = topk_reference(scores, k, lengths)
    tri = _tri(scores, k, lengths, block=block)
    assert torch.equal(ref, tri)


def test_topk_reference_agrees_with_torch_topk(device):
    scores = torch.randn(9, 333, device=device)  # distinct values: sets are unambiguous
    ref = topk_reference(scores, 40)
    expect = torch.topk(scores, 40).indices.sort(dim=1).values.int()
    assert torch.equal(ref, expect)


def test_topk_tie_rule_and_signed_zero(device):
    scores = torch.tensor(
        [[1.0, 2.0, 2.0, 2.0, 0.0], [0.0, -0.0, 0.0, -0.0, -1.0], [3.0, 3.0, 3.0, 3.0, 3.0]],
        device=device,
    )
    expect = torch.tensor([[1, 2, 3], [0, 1, 2], [0, 1, 2]], device=device, dtype=torch.int32)
    assert torch.equal(topk_reference(scores, 3), expect)
    assert torch.equal(_tri(scores, 3), expect)


def test_topk_empty_and_masked_rows(device):
    inf, nan = float("inf"), float("nan")
    scores = torch.tensor(
        [
            [-inf, -inf, -inf, -inf, -inf, -inf],  # fully masked
            [1.0, nan, -inf, 4.0, inf, -2.0],  # NaN and -inf are never chosen; +inf is
            [5.0, 4.0, 3.0, 2.0, 1.0, 0.0],  # length 0 below
            [5.0, 4.0, 3.0, 2.0, 1.0, 0.0],  # length 2 below
        ],
        device=device,
    )
    lengths = torch.tensor([6, 6, 0, 2], device=device, dtype=torch.int32)
    expect = torch.tensor(
        [[-1] * 4, [0, 3, 4, 5], [-1] * 4, [0, 1, -1, -1]], device=device, dtype=torch.int32
    )
    assert torch.equal(topk_reference(scores, 4, lengths), expect)
    assert torch.equal(_tri(scores, 4, lengths), expect)


@pytest.mark.parametrize("shape,k", [((0, 5), 3), ((3, 0), 3), ((3, 5), 0)], ids=str)
def test_topk_degenerate_shapes(shape, k, device):
    scores = torch.randn(*shape, device=device)
    ref = topk_reference(scores, k)
    assert ref.shape == (shape[0], k) and bool((ref == -1).all())
    assert torch.equal(_tri(scores, k), ref)


def test_topk_launcher_validates(device):
    scores = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match="scores"):
        _tri(scores.int(), 2)
    with pytest.raises(ValueError, match="scores"):
        _tri(scores[None], 2)
    with pytest.raises(ValueError, match="scores"):
        _tri(scores.t(), 2)  # non-unit stride along S
    with pytest.raises(ValueError, match="lengths"):
        _tri(scores, 2, torch.ones(4, device=device, dtype=torch.int64))
    with pytest.raises(ValueError, match="lengths"):
        _tri(scores, 2, torch.ones(3, device=device, dtype=torch.int32))
    with pytest.raises(ValueError, match="k must"):
        _tri(scores, -1)


def test_topk_dispatch(device):
    scores = torch.randn(3, 50, device=device)
    ref = topk_reference(scores, 5)
    assert torch.equal(topk(scores, 5), ref)  # auto: reference on CPU, Triton on CUDA
    assert torch.equal(topk(scores, 5, impl="reference"), ref)
    assert torch.equal(topk(scores, 5, impl="triton"), ref)
    with pytest.raises(ValueError, match="impl"):
        topk(scores, 5, impl="cuda")
