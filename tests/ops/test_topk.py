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
    "rows,cols,k,dtype,ties,with_len,block,splits,bits",
    [
        pytest.param(*c, id="R{}-S{}-k{}-{}-ties{}-len{}-blk{}-split{}-bits{}".format(*c))
        for c in [
            (1, 1, 1, "fp32", False, False, None, None, 11),
            (63, 1000, 17, "fp32", False, True, None, None, 11),  # odd sizes, per-row lengths
            (5, 1000, 2048, "fp32", False, True, None, None, 11),  # k > length: -1 padding
            (7, 1000, 50, "bf16", True, False, 64, None, 11),  # heavy ties: the last pass decides
            (4, 1000, 300, "fp16", True, True, 128, None, 8),
            (2, 5000, 2048, "bf16", False, True, 256, None, 11),  # the real index_topk, S > k
            # long rows split into chunks, then the merge launch over the chunks' candidates
            (3, 3000, 100, "fp32", False, True, 128, 4, 11),
            (3, 3000, 100, "bf16", True, True, 128, 5, 8),  # ties across chunk borders
            (2, 5000, 2048, "fp32", False, False, 256, 2, 8),  # chunks longer than k
            (4, 2000, 7, "fp16", True, False, None, 3, 11),
        ]
    ],
)
def test_topk_matches_reference(rows, cols, k, dtype, ties, with_len, block, splits, bits, device):
    scores = _scores(rows, cols, dtype, device, ties)
    lengths = torch.randint(0, cols + 1, (rows,), device=device, dtype=torch.int32)
    lengths = lengths if with_len else None
    ref = topk_reference(scores, k, lengths)
    tri = _tri(scores, k, lengths, block=block, num_splits=splits, radix_bits=bits)
    assert torch.equal(ref, tri)


@pytest.mark.parametrize("bits", [8, 11])
def test_topk_all_equal_rows_take_the_lowest_indices(bits, device):
    """Every pass ends on one bin holding more keys than are left to take: the tie rule decides."""
    scores = torch.full((3, 700), 0.5, device=device)
    scores[1, 350:] = -0.0  # two values: the threshold is the upper one's bin, then all of it
    scores[2, ::7] = 2.0
    for splits in (None, 3):
        tri = _tri(scores, 30, block=64, num_splits=splits, radix_bits=bits)
        assert torch.equal(tri, topk_reference(scores, 30))


@pytest.mark.parametrize("splits", [None, 2])
def test_topk_long_rows_with_fewer_candidates_than_k(splits, device):
    """More columns than k but fewer candidates (-inf, NaN): every candidate, then -1."""
    scores = torch.full((2, 300), float("-inf"), device=device)
    scores[0, 7::50] = torch.arange(6, dtype=torch.float32, device=device)
    scores[1, ::3] = float("nan")
    scores[1, 100:104] = 1.0
    tri = _tri(scores, 10, block=64, num_splits=splits)
    assert torch.equal(tri, topk_reference(scores, 10))
    assert tri[0, :6].tolist() == [7, 57, 107, 157, 207, 257] and (tri[:, 6:] == -1).all()


def test_default_splits():
    from vllm_specx.ops.topk.kernel import default_splits

    assert default_splits(1, 4096, 2048, 132) == 1  # short rows: one program per row
    assert default_splits(64, 131072, 2048, 132) == 5  # 64 rows fill 128 SMs, plus a little
    assert default_splits(1, 1 << 20, 2048, 132) == 22  # ~sqrt(S / k): merge ~ a chunk
    assert default_splits(512, 1 << 20, 2048, 132) == 1  # enough rows


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
