"""Acceptance sampler: Triton kernel == vectorised torch path == reference, token for token, on the
same injected randomness; output invariants; edge cases; input validation.

The Triton kernels run in the CPU interpreter here (tests/ops/conftest.py sets TRITON_INTERPRET),
so their cases stay small (B <= 8, V <= 400). The statistical suite is
`test_acceptance_distribution.py`.
"""

from dataclasses import replace

import pytest
import torch

from vllm_specx.ops.acceptance import (
    AcceptanceInputs,
    acceptance_sample,
    acceptance_sample_reference,
    acceptance_sample_torch,
    draw_randomness,
)

IMPLS = ("reference", "torch", "triton")

pytestmark = pytest.mark.usefixtures("one_thread")


def make_batch(counts, V, *, has_draft=True, greedy=None, seed=0, sharp=2.0, pad_to=None):
    """A ragged batch with drafts drawn from q (greedy requests: the target argmax 70% of the time).

    `pad_to` appends zero-probability vocab columns (padding) after the first `V`.
    """
    g = torch.Generator().manual_seed(seed)
    counts = torch.tensor(counts, dtype=torch.int64)
    B, T = counts.numel(), int(counts.sum())
    cu = counts.cumsum(0)
    tl = torch.randn(T, V, generator=g) * sharp
    target = tl.softmax(-1)
    draft = (tl + torch.randn(T, V, generator=g)).softmax(-1)
    bonus = (torch.randn(B, V, generator=g) * sharp).softmax(-1)
    greedy = torch.tensor([False] * B if greedy is None else greedy, dtype=torch.bool)
    drafts = torch.multinomial(draft, 1, generator=g).squeeze(1) if T else torch.zeros(0).long()
    req = torch.repeat_interleave(torch.arange(B), counts)
    hit = greedy[req] & (torch.rand(T, generator=g) < 0.7)
    drafts = torch.where(hit, target.argmax(-1), drafts)
    if pad_to is not None:
        pad = lambda x: torch.nn.functional.pad(x, (0, pad_to - V))  # noqa: E731
        target, draft, bonus = pad(target), pad(draft), pad(bonus)
    return AcceptanceInputs(drafts, cu, target, bonus, draft if has_draft else None, greedy,
                            *draw_randomness(cu, target.shape[1]))


def redraw(inp, generators=None):
    """`inp` with fresh uniforms and noise from `draw_randomness`."""
    u, e = draw_randomness(inp.cu_num_draft_tokens, inp.target_probs.shape[1], generators)
    return replace(inp, uniforms=u, exp_noise=e)


def sample(inp, **kw):
    """The public dispatcher `acceptance_sample` on the bundle's tensors."""
    return acceptance_sample(**inp.tensors(), **kw)


def run(impl, inp, method="token", block_v=128, **kw):
    """One implementation on `inp` (CPU tensors); Triton runs on CUDA when there is a GPU and in
    the interpreter otherwise. Returns a CPU tensor."""
    if impl == "triton":
        from vllm_specx.ops.acceptance.kernel import acceptance_sample_triton

        if torch.cuda.is_available():
            inp = inp.to("cuda")
        return acceptance_sample_triton(inp, method, block_v=block_v, **kw).cpu()
    return sample(inp, method=method, impl=impl, **kw)


def check_invariants(out, inp):
    """`-1` only after the emitted tokens; accepted prefix = the drafts; one token past it."""
    drafts, cu = inp.draft_token_ids, inp.cu_num_draft_tokens
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    V = inp.target_probs.shape[1]
    for b in range(out.shape[0]):
        row = out[b]
        k = int((row != -1).sum())
        assert 1 <= k <= int(counts[b]) + 1, f"request {b}: {k} tokens for {int(counts[b])} drafts"
        assert bool((row[:k] >= 0).all() & (row[:k] < V).all()) and bool((row[k:] == -1).all())
        s = int(cu[b] - counts[b])
        assert torch.equal(row[:k - 1].long(), drafts[s:s + k - 1]), f"request {b}: prefix"


# ---------------------------------------------------------------------------------------------
# Exactness: kernel == torch path == reference.


@pytest.mark.parametrize("K", [1, 3, 7])
@pytest.mark.parametrize("has_draft", [True, False], ids=["q", "onehot"])
@pytest.mark.parametrize("method", ["token", "block"])
def test_kernel_matches_reference(method, has_draft, K):
    counts = [K, 0, 1, K, max(K - 2, 0), 2 % (K + 1)]
    inp = make_batch(counts, 333, has_draft=has_draft, greedy=[0, 0, 1, 1, 0, 0], seed=K,
                     sharp=3.0)  # sharp: long accepted prefixes as well as early rejections
    ref = acceptance_sample_reference(inp, method)
    tri = run("triton", inp, method)
    fast = acceptance_sample_torch(inp, method)
    assert torch.equal(ref, tri), f"triton\n{tri}\nreference\n{ref}"
    assert torch.equal(ref, fast), f"torch\n{fast}\nreference\n{ref}"
    assert ref.shape == (len(counts), K + 1) and ref.dtype == torch.int32
    check_invariants(ref, inp)


@pytest.mark.parametrize("method", ["token", "block"])
def test_kernel_single_block_and_tail(method):
    """Vocab 1 and a vocab that is one past a power of two (a 1-column tail tile)."""
    for V, bv in ((1, 16), (129, 128)):
        inp = make_batch([2, 3], V, greedy=[0, 1], seed=V)
        tri = run("triton", inp, method, block_v=bv)
        assert torch.equal(acceptance_sample_reference(inp, method), tri)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="real vocab: too slow in the interpreter")
@pytest.mark.parametrize("method", ["token", "block"])
def test_kernel_real_vocab_on_gpu(method):
    """Qwen's 151936 vocab with the default 4096-wide tiles (38 blocks, a partial tail)."""
    for has_draft in (True, False):
        inp = make_batch([4, 0, 7, 1, 3, 4, 2, 5], 151936, has_draft=has_draft,
                         greedy=[0, 1, 0, 0, 1, 0, 0, 0], seed=11, sharp=4.0)
        from vllm_specx.ops.acceptance.kernel import acceptance_sample_triton

        tri = acceptance_sample_triton(inp.to("cuda"), method).cpu()
        assert torch.equal(acceptance_sample_reference(inp, method), tri)


@pytest.mark.parametrize("has_draft", [True, False], ids=["q", "onehot"])
@pytest.mark.parametrize("method", ["token", "block"])
def test_torch_path_matches_reference(method, has_draft):
    """Many batches, from flat to very peaked targets, on the fast path only."""
    for seed, sharp in enumerate((0.5, 2.0, 5.0, 12.0)):
        counts = torch.randint(0, 9, (48,), generator=torch.Generator().manual_seed(seed))
        greedy = (torch.arange(48) % 5 == 0).tolist()
        inp = make_batch(counts.tolist(), 61, has_draft=has_draft, greedy=greedy, seed=seed,
                         sharp=sharp)
        ref = acceptance_sample_reference(inp, method)
        assert torch.equal(ref, acceptance_sample_torch(inp, method)), f"sharp={sharp}"
        check_invariants(ref, inp)


def test_auto_is_torch_on_cpu_and_width_follows_max_num_draft_tokens():
    inp = make_batch([3, 0, 2], 50, greedy=[0, 1, 0])
    out = sample(inp)
    assert torch.equal(out, acceptance_sample_reference(inp))
    wide = sample(inp, max_num_draft_tokens=5)  # vLLM's max_spec_len
    assert wide.shape == (3, 6) and torch.equal(wide[:, :4], out)
    assert bool((wide[:, 4:] == -1).all())


# ---------------------------------------------------------------------------------------------
# Greedy semantics and determinism.


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("method", ["token", "block"])
def test_greedy_is_argmax_logic_and_ignores_randomness(impl, method):
    counts = [4, 2, 0, 3]
    inp = make_batch(counts, 97, greedy=[1, 1, 1, 1], seed=3, sharp=4.0)
    drafts, cu = inp.draft_token_ids, inp.cu_num_draft_tokens
    target, bonus = inp.target_probs, inp.bonus_probs
    expect = torch.full((4, 5), -1, dtype=torch.int32)
    for b, n in enumerate(counts):
        s = int(cu[b]) - n
        for i in range(n + 1):
            g = int((target[s + i] if i < n else bonus[b]).argmax())
            expect[b, i] = g
            if i == n or int(drafts[s + i]) != g:
                break
    out = run(impl, inp, method)
    inp = redraw(inp)  # fresh uniforms and noise: no effect on greedy
    assert torch.equal(out, expect) and torch.equal(run(impl, inp, method), expect)


def test_seeded_requests_reproduce():
    """Per-request generators (vLLM's seeded requests) make a request's tokens batch-independent."""
    inp = make_batch([3, 2, 4], 40, seed=1, sharp=0.5)
    outs = []
    for _ in range(2):
        inp = redraw(inp, {1: torch.Generator().manual_seed(7)})
        outs.append(sample(inp))
    assert torch.equal(outs[0][1], outs[1][1])


# ---------------------------------------------------------------------------------------------
# Edge cases.


def _single(p, q, draft, u, noise=None, bonus=None):
    """One request with one draft over a hand-written vocabulary."""
    V = len(p)
    return AcceptanceInputs(
        torch.tensor([draft]), torch.tensor([1]), torch.tensor([p]),
        torch.tensor([bonus or [1.0 / V] * V]), None if q is None else torch.tensor([q]),
        torch.tensor([False]), torch.tensor([u], dtype=torch.float64),
        torch.tensor([noise or [1.0] * V]))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("method", ["token", "block"])
def test_draft_off_draft_support(impl, method):
    """q(x) = 0 for the drafted x: accepted iff p(x) > 0 (ratio +inf), whatever u is."""
    out = run(impl, _single([0.1, 0.6, 0.3], [0.5, 0.0, 0.5], 1, 0.999999), method)
    assert out.tolist() == [[1, 0]]  # accepted; bonus is uniform with unit noise -> token 0
    # p(x) = q(x) = 0: rejected even at u = 0; residual max(p - q, 0) = [0, 0, 0.1, 0.4] -> 3.
    out = run(impl, _single([0.5, 0.0, 0.1, 0.4], [0.5, 0.0, 0.0, 0.0], 1, 0.0), method)
    assert out.tolist() == [[3, -1]]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("method", ["token", "block"])
def test_point_mass_target(impl, method):
    """p puts all its mass on token 2: a draft of 2 is always kept, any other draft becomes 2."""
    p = [0.0, 0.0, 1.0, 0.0]
    assert run(impl, _single(p, [0.1, 0.2, 0.3, 0.4], 2, 0.9999999), method).tolist()[0][0] == 2
    assert run(impl, _single(p, [0.1, 0.2, 0.3, 0.4], 3, 0.0), method).tolist() == [[2, -1]]
    assert run(impl, _single(p, None, 0, 0.0), method).tolist() == [[2, -1]]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("method", ["token", "block"])
def test_zero_residual_falls_back_to_target(impl, method):
    """p == q and the drafted token has p = q = 0: rejected with an all-zero residual.

    The documented fallback samples p itself: argmax p / E over p > 0, never a zero-p token.
    """
    p = [0.0, 0.25, 0.5, 0.25]
    noise = [1e-9, 4.0, 8.0, 0.5]  # p / E = [-, 0.0625, 0.0625, 0.5] -> token 3
    assert run(impl, _single(p, p, 0, 0.3, noise), method).tolist() == [[3, -1]]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("has_draft", [True, False], ids=["q", "onehot"])
@pytest.mark.parametrize("method", ["token", "block"])
def test_padding_columns_never_emitted(impl, method, has_draft):
    """Zero-probability padding columns get near-zero noise (a huge race key if not masked)."""
    V, padded = 100, 128
    inp = make_batch([3, 0, 2, 1, 3, 2, 0, 1], V, has_draft=has_draft, greedy=[0, 1] * 4,
                     seed=5, sharp=0.3, pad_to=padded)
    inp.exp_noise[:, V:] = 1e-30
    out = run(impl, inp, method)
    assert bool((out < V).all()), out
    check_invariants(out, inp)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("method", ["token", "block"])
def test_zero_draft_requests(impl, method):
    """Requests without drafts (all of them, or some) emit exactly their bonus token."""
    inp = make_batch([0, 0, 0], 37, greedy=[1, 0, 0], seed=2)
    out = run(impl, inp, method)
    bonus, noise = inp.bonus_probs, inp.exp_noise
    assert out.shape == (3, 1)
    assert out[0, 0] == bonus[0].argmax() and out[1, 0] == (bonus[1] / noise[1]).argmax()
    empty = make_batch([], 37)
    assert run(impl, empty, method).shape == (0, 1)


# ---------------------------------------------------------------------------------------------
# Validation: ValueError naming the argument.


def _corrupt(inp, name, value):
    t = getattr(inp, name).clone()
    t.view(-1)[1] = value
    return replace(inp, **{name: t})


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.5], ids=["nan", "inf", "neg"])
@pytest.mark.parametrize("name", ["target_probs", "bonus_probs", "draft_probs", "exp_noise"])
def test_non_finite_inputs_raise(impl, bad, name):
    inp = _corrupt(make_batch([2, 1], 20), name, bad)
    with pytest.raises(ValueError, match=name):
        run(impl, inp)


def test_bad_layouts_raise():
    good = make_batch([2, 1], 20)
    cases = [  # (field, its bad value); the error must name the field
        ("target_probs", lambda t: t.half()),
        ("target_probs", lambda t: t.t().contiguous().t()),
        ("draft_probs", lambda t: t[:, :10]),
        ("uniforms", lambda t: t.float()),
        ("uniforms", lambda t: t + 1.0),
        ("is_greedy", lambda t: t.int()),
        ("draft_token_ids", lambda t: t.float()),
        ("draft_token_ids", lambda t: t + 20),
        ("cu_num_draft_tokens", lambda t: t - 1),
        ("exp_noise", lambda t: t[:1]),
        ("bonus_probs", lambda t: t[:, :-1]),
    ]
    for name, change in cases:
        with pytest.raises(ValueError, match=name):
            sample(replace(good, **{name: change(getattr(good, name))}))
    with pytest.raises(ValueError, match="method"):
        sample(good, method="tree")
    with pytest.raises(ValueError, match="impl"):
        sample(good, impl="cuda")
