"""`specx_rejection_sample` (the serving entry of the acceptance op, what vLLM's `rejection_sample()`
becomes under a SpecxRejectionSampler) on synthetic inputs, no engine: non-distribution target
logits, per-request generators, and the counters that prove which method ran."""

import logging
import re
from types import SimpleNamespace

import pytest
import torch

from vllm_specx.sample import rejection_sampler as rs

V = 16


def _inputs(num_draft, *, generators=None, all_greedy=False, seed=0):
    """vLLM's positional rejection_sample() arguments for a batch with `num_draft` drafts each."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(num_draft), sum(num_draft)
    cu = torch.tensor(num_draft, dtype=torch.int32).cumsum(0).int()
    logits = torch.randn(T, V, generator=g)
    drafts = torch.randint(0, V, (T,), generator=g, dtype=torch.int32)
    draft_probs = torch.randn(T, V, generator=g).softmax(-1)
    bonus = torch.randint(0, V, (B, 1), generator=g, dtype=torch.int32)
    temperature = torch.full((B,), 0.0 if all_greedy else 1.0)
    meta = SimpleNamespace(all_greedy=all_greedy, all_random=not all_greedy, temperature=temperature,
                           generators=generators or {})
    return [drafts, list(num_draft), max(num_draft), cu, draft_probs, logits, bonus, meta]


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "posinf"])
@pytest.mark.parametrize("all_greedy", [False, True], ids=["random", "greedy"])
def test_nan_or_inf_target_logits_are_never_silent(bad, all_greedy, monkeypatch):
    """Before: the op silently emitted token 0 (or the first NaN's index) for such rows. Now an
    error naming the rows and requests is logged and the batch goes on (the request's drafts
    from the bad row on are rejected, token 0 emitted there; the engine keeps serving), and
    vLLM's own VLLM_RAISE_ON_LOGIT_NANS=1 turns it into an exception."""
    args = _inputs([2, 3, 1], all_greedy=all_greedy)
    args[5][3, 7] = bad  # request 1's second draft row (rows 2..4 belong to request 1)
    pattern = r"NaN or \+inf.*rows \[3\].*request\(s\) \[1\]"
    monkeypatch.delenv(rs.RAISE_ENV, raising=False)
    records = _Records()
    logging.getLogger("vllm.specx").addHandler(records)
    try:
        out = rs.specx_rejection_sample(*args)
    finally:
        logging.getLogger("vllm.specx").removeHandler(records)
    assert len(records.messages) == 1 and re.search(pattern, records.messages[0]), records.messages
    emitted = out[1][out[1] >= 0].tolist()
    assert out.shape == (3, 4) and 1 <= len(emitted) <= 2  # nothing accepted past the bad row
    assert len(emitted) == 1 or emitted[1] == 0  # reaching the bad row: token 0 there
    monkeypatch.setenv(rs.RAISE_ENV, "1")
    with pytest.raises(RuntimeError, match=pattern):
        rs.specx_rejection_sample(*args)


def test_all_masked_target_row_emits_token_0_like_vllm():
    """Every logit -inf (all tokens masked by sampling parameters): not a model failure, so no
    error; the op emits token 0, which is what vLLM's own sampler returns for such a row."""
    from vllm.v1.sample.ops.topk_topp_sampler import random_sample

    args = _inputs([2, 1])
    args[5][0] = float("-inf")  # request 0's first draft row: rejected there, resampled
    args[0][0] = 5
    out = rs.specx_rejection_sample(*args)
    assert out[0].tolist() == [0, -1, -1]
    vllm_token = random_sample(torch.full((1, V), float("-inf")).softmax(-1), {})
    assert vllm_token.tolist() == [0]


def test_finite_logits_do_not_raise_and_match_the_op():
    args = _inputs([3, 0, 2])
    out = rs.specx_rejection_sample(*args)
    assert out.shape == (3, 4)


def _state(g):
    return g.get_state().clone()


def test_zero_draft_seeded_request_draws_nothing_from_its_generator():
    """vLLM's sampler skips a zero-draft request's generator "for reproducibility"; so must ours.
    Before: every seeded request's generator gave V noise values even with zero drafts."""
    g0, g1 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    s0, s1 = _state(g0), _state(g1)
    rs.specx_rejection_sample(*_inputs([0, 2], generators={0: g0, 1: g1}))
    assert torch.equal(_state(g0), s0), "the zero-draft request's generator was used"
    assert not torch.equal(_state(g1), s1), "the request with drafts must draw from its generator"


def test_seeded_request_does_not_depend_on_its_neighbours():
    """A seeded request's step with 3 drafts emits the same tokens whether or not it went through
    a zero-draft verification step before (next to other neighbours), and whatever the global RNG
    state. Before: that zero-draft step took V noise values from its generator."""
    mine = _inputs([3], seed=0)
    outs = []
    for earlier, global_seed in ((None, 0), ([0, 2], 1), ([0, 1, 4], 2)):
        torch.manual_seed(global_seed)
        g = torch.Generator().manual_seed(7)
        if earlier is not None:  # the request (index 0) has no drafts yet; its neighbours do
            rs.specx_rejection_sample(*_inputs(earlier, generators={0: g}, seed=global_seed))
        args = _inputs([3, 2], generators={0: g}, seed=10 + global_seed)
        for i in (0, 4, 5):  # drafts, draft_probs, logits: request 0 owns the first 3 rows
            args[i][:3] = mine[i]
        args[6][0] = mine[6][0]
        outs.append(rs.specx_rejection_sample(*args)[0].tolist())
    assert outs[0] == outs[1] == outs[2], outs


def test_counters_record_the_method_passed_to_the_op(monkeypatch):
    """`op_calls` counts completed op calls per method, from inside the call: the proof (read in
    the worker by tests/e2e/test_lossless.py) that our op verified, with which method."""
    seen = []
    real = rs.acceptance_sample
    monkeypatch.setattr(rs, "acceptance_sample", lambda *a, **k: seen.append(k["method"]) or real(*a, **k))
    sampler = SimpleNamespace(op_calls={"token": 0, "block": 0}, random_op_calls={"token": 0, "block": 0})
    for method, all_greedy in (("block", False), ("block", True), ("token", False)):
        t1, t2 = rs._ACTIVE.set(method), rs._SAMPLER.set(sampler)
        try:
            rs.specx_rejection_sample(*_inputs([2, 1], all_greedy=all_greedy))
        finally:
            rs._SAMPLER.reset(t2)
            rs._ACTIVE.reset(t1)
    assert seen == ["block", "block", "token"]
    assert sampler.op_calls == {"token": 1, "block": 2}
    assert sampler.random_op_calls == {"token": 1, "block": 1}


@pytest.mark.parametrize("all_greedy", [False, True], ids=["random", "greedy"])
@pytest.mark.parametrize("method", ["token", "block"])
def test_step_without_drafts_returns_the_op_result_without_the_op(all_greedy, method, monkeypatch):
    """A verification step with no draft in the batch (every draft cut, or a skipped pass) is
    answered without building the op's [B, V] inputs: the same tokens and dtype the op gives,
    no generator touched, counted as `empty_calls`; a step with one draft still runs the op."""
    g = torch.Generator().manual_seed(3)
    state = _state(g)
    args = _inputs([0, 0, 0], generators={1: g}, all_greedy=all_greedy)
    t1 = rs._ACTIVE.set(method)
    try:
        want = rs.acceptance_sample(args[0].long(), args[3], torch.zeros(0, V),
                                    torch.nn.functional.one_hot(args[6].view(-1).long(), V).float(),
                                    args[4], torch.ones(3, dtype=torch.bool), torch.zeros(0, dtype=torch.float64),
                                    torch.ones(3, V), method=method, max_num_draft_tokens=0)
        calls = []
        real = rs.acceptance_sample
        monkeypatch.setattr(rs, "acceptance_sample", lambda *a, **k: calls.append(1) or real(*a, **k))
        sampler = SimpleNamespace(op_calls={"token": 0, "block": 0}, random_op_calls={"token": 0, "block": 0},
                                  empty_calls=0)
        t2 = rs._SAMPLER.set(sampler)
        try:
            got = rs.specx_rejection_sample(*args)
            assert not calls and sampler.empty_calls == 1
            rs.specx_rejection_sample(*_inputs([0, 1, 0], all_greedy=all_greedy))
            assert calls == [1] and sampler.empty_calls == 1  # negative control: a draft runs the op
        finally:
            rs._SAMPLER.reset(t2)
    finally:
        rs._ACTIVE.reset(t1)
    assert got.dtype == want.dtype == torch.int32 and torch.equal(got, want), (got, want)
    assert torch.equal(_state(g), state)


def _sampling_metadata(batch, *, greedy_rows=(), generators=None, max_num_logprobs=None):
    import dataclasses

    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    temperature = torch.tensor([0.0 if i in greedy_rows else 0.8 for i in range(batch)])
    values = dict(temperature=temperature, all_greedy=len(greedy_rows) == batch, all_random=not greedy_rows,
                  top_p=None, top_k=None, generators=generators or {}, max_num_logprobs=max_num_logprobs,
                  no_penalties=True, prompt_token_ids=None, frequency_penalties=torch.zeros(batch),
                  presence_penalties=torch.zeros(batch), repetition_penalties=torch.ones(batch),
                  output_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None,
                  bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    names = {f.name for f in dataclasses.fields(SamplingMetadata)}
    return SamplingMetadata(**{k: v for k, v in values.items() if k in names})


def test_forward_without_drafts_samples_like_no_spec(monkeypatch):
    """A step with no draft anywhere in the batch goes straight to vLLM's sampler with the step's
    sampling parameters: the tokens a no-spec engine samples from the same logits and generators
    (greedy and seeded rows), int32 [B, 1], counted as `empty_calls`. With logprobs requested
    (or any draft) vLLM's full path runs instead (negative control)."""
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    B = 4
    logits = torch.randn(B, 64, generator=torch.Generator().manual_seed(0))

    def no_drafts():  # what the runner builds for a step whose requests have no draft
        i32 = dict(dtype=torch.int32)
        return SpecDecodeMetadata(torch.zeros(0, **i32), [0] * B, torch.zeros(B, **i32),
                                  torch.arange(1, B + 1, **i32), torch.zeros(0, **i32),
                                  torch.arange(B, **i32), torch.arange(B, **i32))

    rsampler = rs.SpecxRejectionSampler(Sampler(), None, torch.device("cpu"))

    def gens():
        return {1: torch.Generator().manual_seed(5), 3: torch.Generator().manual_seed(6)}

    torch.manual_seed(11)
    got = rsampler(no_drafts(), None, logits.clone(),
                   _sampling_metadata(B, greedy_rows=(0,), generators=gens()))
    torch.manual_seed(11)
    want = Sampler()(logits.clone(), _sampling_metadata(B, greedy_rows=(0,), generators=gens()))
    assert got.sampled_token_ids.dtype == torch.int32 and got.sampled_token_ids.shape == (B, 1)
    assert got.sampled_token_ids.view(-1).tolist() == want.sampled_token_ids.view(-1).tolist()
    assert got.logprobs_tensors is None and rsampler.empty_calls == 1
    assert got.sampled_token_ids[0, 0] == logits[0].argmax()

    full = []
    monkeypatch.setattr(RejectionSampler, "forward", lambda self, *a: full.append(a) or "vllm path")
    assert rsampler(no_drafts(), None, logits.clone(),
                    _sampling_metadata(B, max_num_logprobs=0)) == "vllm path"
    assert rsampler(SpecDecodeMetadata.make_dummy([[], [7], [], []], torch.device("cpu")), None,
                    torch.randn(B + 1, 64), _sampling_metadata(B)) == "vllm path"
    assert len(full) == 2 and rsampler.empty_calls == 1
