"""End to end in vLLM on CPU: `method: "mtp"` with a vllm-specx MTP checkpoint runs our
MTPProposer in the worker; the per-step draft logits vLLM computes equal the training forward's
(`MTPDraft.chain_logits`, the KVShare contract of `methods/mtp/model.py`) with `kv_share` on and
off - and not the other mode's (negative control); greedy output equals no-spec output; our
rejection sampler verifies; probabilistic drafts hand their distributions to it."""

import pytest
import torch
from vllm import SamplingParams

from .. import helpers as T
from .conftest import GREEDY  # target, prompts, nospec_outputs: fixtures of conftest.py

pytestmark = pytest.mark.e2e
K = 7
PASSES = 4
ATOL = 2e-3  # fp32 logits, vLLM's CPU attention/linear kernels vs the reference's


def _max_diffs(target, draft, rec, seq, pos):
    """Max |vLLM logits - reference logits| of one pass, for the draft's own kv_share and the
    other mode; the reference is fed the drafts vLLM sampled (its step inputs)."""
    hidden = T.target_final_hidden(target, seq[:pos])
    ids = torch.tensor(seq[: pos + 1])
    got = torch.tensor(rec["logits"])[:, 0]  # [K, V] (one request)
    drafts = [d[0] for d in rec["drafts"]]
    own = draft.draft_logits(hidden, ids, K, draft.cfg.kv_share, drafts)
    other = draft.draft_logits(hidden, ids, K, not draft.cfg.kv_share, drafts)
    return (got - own).abs().max().item(), (got[1:] - other[1:]).abs().max().item(), (got[0] - other[0]).abs().max().item()


@pytest.mark.parametrize("kv_share", [True, False], ids=["kv_share", "mixed_kv"])
def test_mtp_serving_equals_training_forward(tmp_path, target, prompts, nospec_outputs, kv_share):
    from vllm_specx.methods.mtp.checkpoint import save

    draft = T.random_mtp(target, kv_share)
    save(draft, tmp_path / "mtp")
    spec = {"method": "mtp", "model": str(tmp_path / "mtp"), "num_speculative_tokens": K,
            "draft_sample_method": "probabilistic"}
    with T.cpu_llm(T.REF_TARGET, speculative_config=spec) as llm:
        assert llm.collective_rpc(T.drafter_class) == ["vllm_specx.methods.mtp.proposer.MTPProposer"]
        llm.collective_rpc(T.record_mtp_steps)
        out = llm.generate([prompts[0]], GREEDY)[0]
        records = llm.collective_rpc(T.read_mtp_steps)[0]
        stats = llm.collective_rpc(T.drafter_stats)[0]
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
        metrics = T.spec_metrics(llm)
        sampler = llm.collective_rpc(T.rejection_sampler_info)[0]
        llm.collective_rpc(T.spy_rejection_sampler)
        llm.generate(prompts[:2], SamplingParams(temperature=0.8, max_tokens=8, seed=1))
        prob_stats = llm.collective_rpc(T.drafter_stats)[0]
        seen = [s for s in llm.collective_rpc(T.read_rejection_spy)[0] if s is not None]
    seq = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
    p = len(out.prompt_token_ids)
    assert len(records) >= PASSES
    for j, rec in enumerate(records[:PASSES]):
        # A random layer never gets a draft accepted, so pass j's anchor is generated token j.
        assert rec["anchors"] == [seq[p + j]]
        assert len(rec["logits"]) == K
        own, other_later, other_first = _max_diffs(target, draft, rec, seq, p + j)
        assert own < ATOL, f"pass {j}: vLLM's draft logits differ from the training forward by {own}"
        assert other_first < ATOL  # step 0 does not depend on the option
        assert other_later > 10 * ATOL, f"pass {j}: kv_share on and off are indistinguishable ({other_later})"
    assert (stats["kv_writes_skipped"] > 0) == kv_share
    assert stats["kv_share"] == kv_share
    assert outs == nospec_outputs  # greedy speculative decoding is lossless
    assert metrics["num_drafts"] > 0 and metrics["tau"] < 1.1  # a random layer is (almost) never right
    assert sampler["class"] == "SpecxRejectionSampler" and sampler["calls"] > 0
    assert prob_stats["probabilistic_calls"] > 0
    assert seen and all(s[0] > 0 and s[1] == 4096 for s in seen)  # draft q reaches the verifier


@pytest.mark.full  # a variant of the MTP layer; the plain layer's parity (both KV modes) stays in CI
def test_k3_mtp_serves_through_the_eagle3_plumbing(tmp_path, target, prompts, nospec_outputs):
    """The Kimi-K3 variant (`fusion_layer_ids`): vLLM captures the fused target layers, our model's
    `fc` fuses them, and the per-step logits equal the training forward's on the same taps."""
    from vllm_specx.methods.mtp.checkpoint import save
    from vllm_specx.methods.mtp.config import MTPDraftConfig
    from vllm_specx.methods.mtp.model import MTPDraft

    plain = T.random_mtp(target, kv_share=True)
    layers = (1, 4, 7)
    k3 = MTPDraft(MTPDraftConfig(**{**plain.cfg.to_dict(), "fusion_layer_ids": list(layers)}), *T.embed_and_head(target))
    g = torch.Generator().manual_seed(7)
    k3.load_specx_state_dict({**plain.specx_state_dict(), "fc.weight": torch.randn(256, 768, generator=g) * 0.05})
    save(k3, tmp_path / "k3")
    spec = {"method": "mtp", "model": str(tmp_path / "k3"), "num_speculative_tokens": K}
    with T.cpu_llm(T.REF_TARGET, speculative_config=spec) as llm:
        assert llm.collective_rpc(T.drafter_class) == ["vllm_specx.methods.mtp.proposer.MTPProposer"]
        llm.collective_rpc(T.record_mtp_steps)
        out = llm.generate([prompts[0]], GREEDY)[0]
        records = llm.collective_rpc(T.read_mtp_steps)[0]
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    seq = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
    p = len(out.prompt_token_ids)
    for j, rec in enumerate(records[:PASSES]):
        assert rec["anchors"] == [seq[p + j]]
        taps = T.target_taps(target, torch.tensor([seq[:p + j]]), layers)[0]
        want = k3.draft_logits(taps, torch.tensor(seq[:p + j + 1]), K, True, [d[0] for d in rec["drafts"]])
        diff = (torch.tensor(rec["logits"])[:, 0] - want).abs().max().item()
        assert diff < ATOL, f"pass {j}: vLLM's K3 draft logits differ from the training forward by {diff}"
    assert outs == nospec_outputs
