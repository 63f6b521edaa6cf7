"""DSA indexer kernels (`ops/dsa_indexer/kernel.py`) against the reference, on CPU via the
interpreter, plus checks of the reference's own input preparation and the IndexShare cache.

Tolerances are relative to the largest |logit| of the case: the kernel sees the same inputs as the
reference and accumulates in fp32, so only the summation order differs.
"""

import pytest
import torch

from vllm_specx.ops import dsa_indexer as ops
from vllm_specx.ops.dsa_indexer import reference as R

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Relative logit tolerance: fp32 accumulation of identical products, different order (the GPU's
# bf16 MMA adds its own order, so bf16 gets 10x headroom).
REL_TOL = {"fp32": 1e-5, "bf16": 1e-4}
REAL = dict(H=64, D=128, R=64, topk=2048)  # DeepSeek-V3.2 / GLM-5 indexer


def _kernel():
    from vllm_specx.ops.dsa_indexer import kernel

    return kernel


def _assert_logits(name, ref, tri, rel):
    assert ref.shape == tri.shape, f"{name}: shape {tuple(tri.shape)} != {tuple(ref.shape)}"
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(tri)), f"{name}: causal masks differ"
    if fin.any():
        scale = ref[fin].abs().max().clamp(min=1.0)
        err = ((ref[fin] - tri[fin]).abs().max() / scale).item()
        assert err <= rel, f"{name}: relative error {err:.3g} > {rel:.3g}"


def _prefill_inputs(q_lens, kv_lens, H, D, dtype, device):
    cu_q = torch.tensor([0, *q_lens], device=device).cumsum(0).int()
    cu_k = torch.tensor([0, *kv_lens], device=device).cumsum(0).int()
    q = torch.randn(int(cu_q[-1]), H, D, device=device).to(DTYPES[dtype])
    k = torch.randn(int(cu_k[-1]), D, device=device).to(DTYPES[dtype])
    w = torch.randn(int(cu_q[-1]), H, device=device)
    return q, k, w, cu_q, cu_k


def _decode_inputs(B, N, H, D, page, seq_lens, dtype, device, k_scale=False):
    seq = torch.tensor(seq_lens, device=device, dtype=torch.int32)
    max_pages = max(1, -(-max(seq_lens) // page))
    num_pages = B * max_pages + 3
    block_table = torch.randperm(num_pages, device=device)[: B * max_pages].view(B, max_pages)
    k_cache = torch.randn(num_pages, page, D, device=device).to(DTYPES[dtype])
    q = torch.randn(B, N, H, D, device=device).to(DTYPES[dtype])
    w = torch.randn(B, N, H, device=device)
    ks = torch.rand(num_pages, page, device=device) + 0.5 if k_scale else None
    return q, k_cache, w, block_table.int().contiguous(), seq, ks


PREFILL = [  # (q_lens, kv_lens, H, D, dtype): queries are the last q_len of kv_len tokens
    ([1], [1], 1, 16, "fp32"),
    ([5, 0, 3], [7, 4, 300], 3, 20, "fp32"),  # odd H / D (padded), an empty request
    ([63], [1000], 4, 32, "bf16"),
    ([2, 1], [1000, 63], REAL["H"], REAL["D"], "bf16"),
]
PREFILL_IDS = ["T{}-S{}-H{}-D{}-{}".format(sum(c[0]), max(c[1]), *c[2:]) for c in PREFILL]

DECODE = [  # (B, N, H, D, page, seq_lens, dtype, k_scale)
    (1, 1, 1, 16, 16, [1], "fp32", False),
    (3, 4, 5, 24, 16, [4, 37, 100], "fp32", True),  # N = 1 + 3 draft tokens, fp8-style k scale
    (2, 8, REAL["H"], REAL["D"], 64, [1000, 63], "bf16", False),
]
DECODE_IDS = [
    "B{}-N{}-H{}-D{}-P{}-S{}-{}-kscale{}".format(*c[:5], max(c[5]), *c[6:]) for c in DECODE
]


# --------------------------------------------------------------------------- logits


@pytest.mark.parametrize("q_lens,kv_lens,H,D,dtype", PREFILL, ids=PREFILL_IDS)
def test_prefill_logits(q_lens, kv_lens, H, D, dtype, device):
    q, k, w, cu_q, cu_k = _prefill_inputs(q_lens, kv_lens, H, D, dtype, device)
    ref = R.indexer_logits_prefill_reference(q, k, w, cu_q, cu_k)
    tri = _kernel().indexer_logits_prefill_triton(q, k, w, cu_q, cu_k)
    _assert_logits("prefill", ref, tri, REL_TOL[dtype])


@pytest.mark.parametrize("B,N,H,D,page,seq_lens,dtype,k_scale", DECODE, ids=DECODE_IDS)
def test_decode_logits(B, N, H, D, page, seq_lens, dtype, k_scale, device):
    q, kc, w, bt, seq, ks = _decode_inputs(B, N, H, D, page, seq_lens, dtype, device, k_scale)
    ref = R.indexer_logits_decode_reference(q, kc, w, bt, seq, ks)
    tri = _kernel().indexer_logits_decode_triton(q, kc, w, bt, seq, ks)
    _assert_logits("decode", ref, tri, REL_TOL[dtype])


@pytest.mark.parametrize("tune", [dict(block_t=2, num_warps=8), dict(block_s=128), dict(block_t=4),
                                  dict(keys_as_rows=True), dict(keys_as_rows=True, block_t=4)],
                         ids=str)
def test_decode_logits_tuning_overrides(tune, device):
    """The benchmark's tile variants compute the same logits (tokens per product, key tile, the
    product's orientation)."""
    q, kc, w, bt, seq, ks = _decode_inputs(3, 4, 8, 32, 16, [4, 37, 200], "fp32", device, True)
    ref = R.indexer_logits_decode_reference(q, kc, w, bt, seq, ks)
    tri = _kernel().indexer_logits_decode_triton(q, kc, w, bt, seq, ks, **tune)
    _assert_logits(f"decode-{tune}", ref, tri, REL_TOL["fp32"])
    with pytest.raises(ValueError, match="block_t"):
        _kernel().indexer_logits_decode_triton(q, kc, w, bt, seq, ks, block_t=3)


def test_decode_logits_wider_output_is_masked(device):
    q, kc, w, bt, seq, _ = _decode_inputs(2, 2, 2, 16, 16, [5, 20], "fp32", device)
    tri = _kernel().indexer_logits_decode_triton(q, kc, w, bt, seq, max_seq_len=40)
    ref = R.indexer_logits_decode_reference(q, kc, w, bt, seq, max_seq_len=40)
    _assert_logits("decode-wide", ref, tri, REL_TOL["fp32"])
    assert bool(torch.isneginf(tri[:, :, 20:]).all())


def test_fp8_path_matches_reference(device):
    """fp8 e4m3 values are exact in bf16: the kernel on bf16(q8), bf16(k8), k_scale and the
    q-scaled weights reproduces the reference evaluated on the fp8 tensors themselves."""
    q, k, w, cu_q, cu_k = _prefill_inputs([4, 3], [50, 9], 8, 128, "fp32", device)
    q8, q_scale = R.quantize_fp8_ue8m0(q)
    k8, k_scale = R.quantize_fp8_ue8m0(k)
    w8 = R.prepare_indexer_weights(w, 128, q_scale)
    ref = R.indexer_logits_prefill_reference(q8, k8, w8, cu_q, cu_k, k_scale)
    tri = _kernel().indexer_logits_prefill_triton(
        q8.to(torch.bfloat16), k8.to(torch.bfloat16), w8, cu_q, cu_k, k_scale
    )
    _assert_logits("fp8", ref, tri, REL_TOL["bf16"])
    # And fp8 stays close to the unquantised logits (e4m3 has a 3-bit mantissa).
    exact = R.indexer_logits_prefill_reference(q, k, R.prepare_indexer_weights(w, 128), cu_q, cu_k)
    _assert_logits("fp8-vs-fp32", exact, ref, 0.1)


@pytest.mark.parametrize("q_fp8", [False, True], ids=["q-bf16", "q-fp8"])
def test_fp8_k_cache_is_read_as_fp8(q_fp8, device, topk_sets):
    """vLLM's fp8 indexer cache as stored: K in e4m3 with per-key scales, q in bf16 (widened on
    chip) or e4m3 too; logits and the fused top-k match the reference on the same fp8 tensors."""
    kern = _kernel()
    H, D = 8, 128
    q, kc, w, bt, seq, _ = _decode_inputs(2, 2, H, D, 16, [90, 37], "fp32", device)
    q8, q_scale = R.quantize_fp8_ue8m0(q)
    k8, k_scale = R.quantize_fp8_ue8m0(kc)
    w8 = R.prepare_indexer_weights(w, D, q_scale)
    q_in = q8 if q_fp8 else q8.to(torch.bfloat16)  # exact: e4m3 values are bf16 values
    ref = R.indexer_logits_decode_reference(q8, k8, w8, bt, seq, k_scale)
    for keys_as_rows in (False, True):  # fp8 MMA operands in both orientations
        tri = kern.indexer_logits_decode_triton(q_in, k8, w8, bt, seq, k_scale, keys_as_rows=keys_as_rows)
        _assert_logits(f"fp8-decode-keys_as_rows={keys_as_rows}", ref, tri, REL_TOL["bf16"])
    top_ref = R.indexer_topk_decode_reference(q8, k8, w8, bt, seq, 9, k_scale)
    top = kern.indexer_topk_decode_triton(q_in, k8, w8, bt, seq, 9, k_scale, group=4)
    atol = REL_TOL["bf16"] * max(1.0, ref[torch.isfinite(ref)].abs().max().item())
    topk_sets("fp8-topk", ref.flatten(0, 1), top_ref.flatten(0, 1), top.flatten(0, 1), atol)
    with pytest.raises(ValueError, match="k dtype"):  # fp8 K only with bf16 or fp8 queries
        kern.indexer_logits_decode_triton(q8.float(), k8, w8, bt, seq, k_scale)


# --------------------------------------------------------------------------- top-k


TOPK_PREFILL = [  # (q_lens, kv_lens, H, D, dtype, topk, path): group=0 materialises the logits,
    # group=G fuses through group maxima, chunk=C keeps per-chunk candidates on chip, then merges
    ([5, 0, 3], [7, 4, 300], 3, 20, "fp32", 17, dict(group=0)),
    ([5, 0, 3], [7, 4, 300], 3, 20, "fp32", 17, dict(group=4)),
    ([63], [1000], 4, 32, "bf16", 17, dict(group=8)),  # prunes 125 groups down to 17
    ([1], [1000], 4, 32, "fp32", 2048, dict(group=8)),  # k > length: every causal key, then -1
    ([2], [3000], REAL["H"], REAL["D"], "bf16", REAL["topk"], dict(group=4)),  # real config
    ([5, 0, 3], [7, 4, 300], 3, 20, "fp32", 17, dict(chunk=64)),  # 5 chunks, an empty request
    ([1], [1000], 4, 32, "fp32", 2048, dict(chunk=256)),  # k > length, across 4 chunks
    ([3], [200], 2, 16, "fp32", 5, dict(chunk=1024)),  # one chunk: written directly, no merge
]


def _path_id(path: dict) -> str:
    return "-".join(f"{'G' if k == 'group' else 'C'}{v}" for k, v in path.items())


@pytest.mark.parametrize(
    "q_lens,kv_lens,H,D,dtype,topk,path",
    TOPK_PREFILL,
    ids=["T{}-S{}-H{}-D{}-{}-k{}-".format(sum(c[0]), max(c[1]), *c[2:6]) + _path_id(c[6]) for c in TOPK_PREFILL],
)
def test_prefill_topk(q_lens, kv_lens, H, D, dtype, topk, path, device, topk_sets):
    q, k, w, cu_q, cu_k = _prefill_inputs(q_lens, kv_lens, H, D, dtype, device)
    logits = R.indexer_logits_prefill_reference(q, k, w, cu_q, cu_k)
    ref = R.indexer_topk_prefill_reference(q, k, w, cu_q, cu_k, topk)
    tri = _kernel().indexer_topk_prefill_triton(q, k, w, cu_q, cu_k, topk, **path)
    atol = REL_TOL[dtype] * max(1.0, logits[torch.isfinite(logits)].abs().max().item())
    topk_sets("prefill-topk", logits, ref, tri, atol)


TOPK_DECODE = [  # (B, N, H, D, page, seq_lens, dtype, k_scale, topk, path)
    (1, 1, 1, 16, 16, [1], "fp32", False, 4, dict(group=0)),  # one key, k > length
    (3, 4, 5, 24, 16, [4, 37, 100], "fp32", True, 9, dict(group=0)),
    (3, 4, 5, 24, 16, [4, 37, 100], "fp32", True, 9, dict(group=4)),
    (2, 2, REAL["H"], REAL["D"], 64, [3000, 63], "bf16", False, REAL["topk"], dict(group=4)),
    (3, 4, 5, 24, 16, [4, 37, 100], "fp32", True, 9, dict(chunk=64)),
    (2, 1, REAL["H"], REAL["D"], 64, [1500, 63], "bf16", False, 512, dict(chunk=512)),
]


@pytest.mark.parametrize(
    "B,N,H,D,page,seq_lens,dtype,k_scale,topk,path",
    TOPK_DECODE,
    ids=["B{}-N{}-H{}-D{}-P{}-S{}-{}-kscale{}-k{}-".format(*c[:5], max(c[5]), *c[6:9]) + _path_id(c[9])
         for c in TOPK_DECODE],
)
def test_decode_topk(B, N, H, D, page, seq_lens, dtype, k_scale, topk, path, device, topk_sets):
    q, kc, w, bt, seq, ks = _decode_inputs(B, N, H, D, page, seq_lens, dtype, device, k_scale)
    logits = R.indexer_logits_decode_reference(q, kc, w, bt, seq, ks).flatten(0, 1)
    ref = R.indexer_topk_decode_reference(q, kc, w, bt, seq, topk, ks)
    tri = _kernel().indexer_topk_decode_triton(q, kc, w, bt, seq, topk, ks, **path)
    assert tri.shape == (B, N, topk)
    atol = REL_TOL[dtype] * max(1.0, logits[torch.isfinite(logits)].abs().max().item())
    topk_sets("decode-topk", logits, ref.flatten(0, 1), tri.flatten(0, 1), atol)


def test_topk_causal_and_padding(device):
    """Query i of a request sees keys 0..pos_i only: with k > pos_i + 1 the row is exactly the
    causal prefix, then -1."""
    q, k, w, cu_q, cu_k = _prefill_inputs([3], [5], 2, 16, "fp32", device)
    w = w.abs() + 0.1  # positive weights: every causal logit is finite and >= 0
    tri = _kernel().indexer_topk_prefill_triton(q, k, w, cu_q, cu_k, 6, group=0)
    expect = torch.tensor([[0, 1, 2, -1, -1, -1], [0, 1, 2, 3, -1, -1], [0, 1, 2, 3, 4, -1]],
                          dtype=torch.int32, device=device)
    assert torch.equal(tri, expect)


def test_topk_chunks_ties_go_to_the_lower_index(device):
    """All logits equal (zero head weights): every chunk is one tie, and the merge must still
    keep the lowest key ids, exactly as the reference; a row is its causal prefix."""
    q, k, w, cu_q, cu_k = _prefill_inputs([4], [700], 2, 16, "fp32", device)
    w = torch.zeros_like(w)
    ref = R.indexer_topk_prefill_reference(q, k, w, cu_q, cu_k, 150)
    tri = _kernel().indexer_topk_prefill_triton(q, k, w, cu_q, cu_k, 150, chunk=64)
    assert torch.equal(tri, ref)
    assert torch.equal(tri[0], torch.arange(150, dtype=torch.int32, device=device))


def test_topk_chunks_validate(device):
    q, k, w, cu_q, cu_k = _prefill_inputs([2], [5], 2, 16, "fp32", device)
    with pytest.raises(ValueError, match="chunk must be a power of two"):
        _kernel().indexer_topk_prefill_triton(q, k, w, cu_q, cu_k, 4, chunk=96)
    with pytest.raises(ValueError, match="choose one fused path"):
        _kernel().indexer_topk_prefill_triton(q, k, w, cu_q, cu_k, 4, chunk=64, group=4)
    with pytest.raises(ValueError, match="chunk=64: a Triton path option"):
        ops.indexer_topk_prefill(q, k, w, cu_q, cu_k, 4, impl="reference", chunk=64)
    assert torch.equal(ops.indexer_topk_prefill(q, k, w, cu_q, cu_k, 4, impl="triton", chunk=64),
                       ops.indexer_topk_prefill(q, k, w, cu_q, cu_k, 4, impl="reference"))


def test_choose_group():
    choose = _kernel().choose_group
    assert choose(4096, 2048) == 0  # short context: materialise
    assert choose(128 * 1024, 2048) == 0
    g = choose(1 << 20, 2048)
    assert g >= 4 and g & (g - 1) == 0


# --------------------------------------------------------------------------- launcher checks


def test_launchers_validate(device):
    kern = _kernel()
    q, k, w, cu_q, cu_k = _prefill_inputs([2], [5], 2, 16, "fp32", device)
    cases = [
        ("q", dict(q=q.int())),
        ("q", dict(q=q.transpose(0, 1))),  # non-contiguous
        ("k", dict(k=k.bfloat16())),  # dtype differs from q
        ("weights", dict(w=w[:, :1].contiguous())),
        ("weights", dict(w=w.double())),
        ("cu_seqlens_q", dict(cu_q=cu_q.long())),
        ("k_scale", dict(ks=torch.ones(3, device=device))),
    ]
    base = dict(q=q, k=k, w=w, cu_q=cu_q, cu_k=cu_k, ks=None)
    for name, override in cases:
        a = {**base, **override}
        with pytest.raises(ValueError, match=name):
            kern.indexer_logits_prefill_triton(
                a["q"], a["k"], a["w"], a["cu_q"], a["cu_k"], a["ks"]
            )
    qd, kc, wd, bt, seq, _ = _decode_inputs(2, 1, 2, 16, 16, [3, 9], "fp32", device)
    with pytest.raises(ValueError, match="block_table"):
        kern.indexer_logits_decode_triton(qd, kc, wd, bt.long(), seq)
    with pytest.raises(ValueError, match="page size"):
        kern.indexer_logits_decode_triton(qd, kc[:, :12].contiguous(), wd, bt, seq)


class _Recorder:
    """Stands in for a Triton kernel: `kernel[grid](...)` records its name and runs nothing."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def __getitem__(self, grid):
        return lambda *a, **kw: self.log.append(self.name)


# Host-side tensor work a CUDA-graph-captured decode step may do: allocate and reinterpret.
_HOST_OK = {"empty.memory_format", "empty_like.default", "view.default", "view.dtype", "_unsafe_view.default"}


def _host_work(monkeypatch, fn):
    """(Triton launches, aten ops) of one launcher call, kernels recorded instead of run."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from vllm_specx.ops.topk import kernel as tk

    kern, launches, aten = _kernel(), [], []
    for mod, name in [(kern, "_indexer_logits_kernel"), (kern, "_indexer_gather_kernel"),
                      (kern, "_indexer_chunk_topk_kernel"), (kern, "_row_meta_kernel"),
                      (tk, "_topk_kernel")]:
        monkeypatch.setattr(mod, name, _Recorder(name.strip("_").removesuffix("_kernel"), launches))

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            aten.append(str(func).removeprefix("aten."))
            return func(*args, **(kwargs or {}))

    with Ops():
        fn(kern)
    return launches, aten


DECODE_LAUNCHES = [  # (path, the Triton launches of one decode indexer -> top-k call)
    (None, ["indexer_logits"]),  # the logits alone
    (dict(group=0), ["indexer_logits", "row_meta", "topk"]),
    (dict(group=8), ["indexer_logits", "topk", "row_meta", "indexer_gather", "topk"]),
    (dict(chunk=256), ["row_meta", "indexer_chunk_topk", "topk"]),
    (dict(chunk=4096), ["row_meta", "indexer_chunk_topk"]),
]


@pytest.mark.parametrize("path,expect", DECODE_LAUNCHES,
                         ids=["logits"] + [_path_id(p) for p, _ in DECODE_LAUNCHES[1:]])
def test_decode_launches_only_kernels(path, expect, monkeypatch, device):
    """The short-context floor is the launches: a decode call with `max_seq_len` given is its
    Triton kernels and allocations only; no PyTorch compute op and no host sync (`.item()`,
    `int(t)`: `_local_scalar_dense`), so vLLM can capture it in a CUDA graph."""
    q, kc, w, bt, seq, ks = _decode_inputs(2, 2, 4, 32, 16, [1000, 63], "bf16", device, True)
    if path is None:
        call = lambda kern: kern.indexer_logits_decode_triton(q, kc, w, bt, seq, ks, 1000)  # noqa: E731
    else:
        call = lambda kern: kern.indexer_topk_decode_triton(q, kc, w, bt, seq, 64, ks,  # noqa: E731
                                                            max_seq_len=1000, **path)
    launches, aten = _host_work(monkeypatch, call)
    assert launches == expect
    assert set(aten) <= _HOST_OK, f"host-side tensor ops: {sorted(set(aten) - _HOST_OK)}"


def test_prefill_launches_only_kernels(monkeypatch, device):
    """The same for prefill when the caller gives the longest query and key spans."""
    q, k, w, cu_q, cu_k = _prefill_inputs([5, 0, 3], [7, 4, 300], 2, 16, "fp32", device)
    for path, expect in DECODE_LAUNCHES[1:]:
        launches, aten = _host_work(monkeypatch, lambda kern: kern.indexer_topk_prefill_triton(
            q, k, w, cu_q, cu_k, 4, max_q_len=5, max_kv_len=300, **path))
        assert launches == expect, path
        assert set(aten) <= _HOST_OK, f"{path}: host-side tensor ops: {sorted(set(aten) - _HOST_OK)}"


def test_dispatch(device):
    q, k, w, cu_q, cu_k = _prefill_inputs([3], [40], 2, 16, "fp32", device)
    ref = ops.indexer_topk_prefill(q, k, w, cu_q, cu_k, 8, impl="reference")
    assert torch.equal(ops.indexer_topk_prefill(q, k, w, cu_q, cu_k, 8), ref)  # auto
    assert torch.equal(ops.indexer_topk_prefill(q, k, w, cu_q, cu_k, 8, impl="triton"), ref)
    lg = ops.indexer_logits_prefill(q, k, w, cu_q, cu_k, impl="triton")
    _assert_logits("dispatch", ops.indexer_logits_prefill(q, k, w, cu_q, cu_k), lg, 1e-5)
    qd, kc, wd, bt, seq, _ = _decode_inputs(2, 2, 2, 16, 16, [3, 9], "fp32", device)
    for impl in ("triton", "reference"):
        assert ops.indexer_topk_decode(qd, kc, wd, bt, seq, 4, impl=impl).shape == (2, 2, 4)
        assert ops.indexer_logits_decode(qd, kc, wd, bt, seq, impl=impl).shape == (2, 2, 9)


# --------------------------------------------------------------------------- reference prep


@pytest.mark.parametrize("interleave", [False, True], ids=["neox", "interleave"])
def test_partial_rope_is_relative(interleave):
    """RoPE on dims [0, R): q(m) . k(n) depends only on m - n, and dims >= R are untouched."""
    D, rope_dim = 32, 16
    q, k = torch.randn(1, D).double(), torch.randn(1, D).double()

    def rot(x, p):
        cos, sin = R.rope_cos_sin(torch.tensor([p]), rope_dim)
        return R.apply_partial_rope(x, cos, sin, interleave)

    assert torch.allclose(rot(q, 7) @ rot(k, 3).T, rot(q, 104) @ rot(k, 100).T, atol=1e-4)
    assert torch.equal(rot(q, 7)[:, rope_dim:], q.float()[:, rope_dim:])
    assert torch.allclose(rot(q, 0), q.float())


def test_prepare_k_is_layernorm_then_rope():
    S, D, rope_dim = 5, 32, 16
    x, gamma, beta = torch.randn(S, D), torch.rand(D) + 0.5, torch.randn(D)
    cos, sin = R.rope_cos_sin(torch.arange(S), rope_dim)
    k = R.prepare_indexer_k(x, gamma, beta, cos, sin)
    var = x.var(-1, unbiased=False, keepdim=True)
    normed = (x - x.mean(-1, keepdim=True)) / (var + 1e-6).sqrt() * gamma + beta
    assert torch.allclose(k[:, rope_dim:], normed[:, rope_dim:], atol=1e-5)
    # Rotations preserve the norm of every (i, i + R/2) pair of the RoPE'd prefix.
    h = rope_dim // 2
    pair = lambda t: t[:, :h] ** 2 + t[:, h:rope_dim] ** 2  # noqa: E731
    assert torch.allclose(pair(k), pair(normed), atol=1e-4)


def test_weights_scaling():
    w = torch.randn(3, 64)
    assert torch.allclose(R.prepare_indexer_weights(w, 128), w * 128**-0.5 * 64**-0.5)
    s = torch.rand(3, 64)
    assert torch.allclose(R.prepare_indexer_weights(w, 128, s), w * s * 128**-0.5 * 64**-0.5)


def test_quantize_fp8_ue8m0():
    x = torch.randn(6, 128) * torch.logspace(-3, 3, 6)[:, None]
    x8, s = R.quantize_fp8_ue8m0(x)
    assert x8.dtype == torch.float8_e4m3fn
    assert torch.equal(s, torch.exp2(torch.log2(s).round()))  # powers of two (ue8m0)
    assert float(x8.float().abs().max()) <= 448.0
    rel = ((x8.float() * s[:, None] - x).abs().amax(-1) / x.abs().amax(-1)).max()
    assert rel < 2**-3  # e4m3: 3 mantissa bits
    assert torch.equal(x8.to(torch.bfloat16).float(), x8.float())  # exact in bf16


# --------------------------------------------------------------------------- IndexShare


def test_index_share_reuses_step0():
    share = ops.IndexShareCache()
    calls = []

    def compute():
        calls.append(1)
        return torch.arange(12, dtype=torch.int32).view(4, 3)

    last_rows = torch.tensor([1, 3])  # each request's last query row at step 0
    step0 = share.get_or_compute(0, compute, last_rows)
    assert step0.shape == (4, 3)
    for step in (1, 2, 3):
        assert torch.equal(share.get_or_compute(step, compute), step0[[1, 3]])
    assert len(calls) == 1 and share.num_computed == 1 and share.num_reused == 3
    share.get_or_compute(0, compute)  # next round recomputes and keeps every row
    assert len(calls) == 2 and share.indices.shape == (4, 3)
    share.reset()
    with pytest.raises(ValueError, match="step 0"):
        share.get_or_compute(1, compute)
