"""The EAGLE-3 baseline end to end in vLLM on CPU: the committed head (`assets/drafts/ref-eagle3`,
trained by `vllm-specx train --method eagle3`) served by vLLM's built-in `eagle3` method and
verified by vLLM's own sampler; vLLM's drafts equal our reference's (`methods.eagle3.model`, the
model the trainer optimises) token for token, and greedy output equals no-spec.

(`test_train_methods.py`, full tier, checks the same for a checkpoint trained in the test.)"""

import pytest
import torch

from vllm_specx.methods.eagle3.checkpoint import load
from vllm_specx.training.taps import embed_and_head

from .. import helpers as T
from .conftest import GREEDY  # target, prompts, nospec_outputs: fixtures of conftest.py

pytestmark = pytest.mark.e2e
EAGLE3 = T.ASSETS / "drafts" / "ref-eagle3"
K = 3


def check_proposals(out, proposals, reference, k: int) -> None:
    """vLLM's first passes (next token, drafts) against `reference(seq, anchor position)`: the
    first pass drafts after the first generated token, each later one after the accepted drafts."""
    seq = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
    pos, checked = len(out.prompt_token_ids), 0
    for nxt, drafts in proposals[:5]:
        assert nxt == [seq[pos]], (nxt, seq[pos])
        want = reference(seq, pos)
        assert drafts[0] == want, f"anchor position {pos}: vLLM {drafts[0]} != reference {want}"
        checked += 1
        a = 0
        while a < k and pos + 1 + a < len(seq) and seq[pos + 1 + a] == drafts[0][a]:
            a += 1
        pos += a + 1
    assert checked >= 3


def test_vllm_eagle3_drafts_equal_the_reference(target, prompts, nospec_outputs):
    ref = load(EAGLE3, *embed_and_head(target))
    spec = {"method": "eagle3", "model": str(EAGLE3), "num_speculative_tokens": K}
    with T.cpu_llm(T.REF_TARGET, speculative_config=spec) as llm:
        llm.collective_rpc(T.record_proposals)
        out = llm.generate([prompts[0]], GREEDY, use_tqdm=False)[0]
        proposals = llm.collective_rpc(T.read_proposals)[0]
        outs = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
        metrics = T.spec_metrics(llm)
        verifier = llm.collective_rpc(T.sampler_counters)[0]
    check_proposals(out, proposals, lambda seq, pos: ref.greedy_drafts(
        T.target_taps(target, torch.tensor([seq[:pos]]), ref.cfg.target_layer_ids)[0], torch.tensor(seq[:pos + 1]), K),
        K)
    assert outs == nospec_outputs
    assert metrics["num_drafts"] > 0 and metrics["tau"] > 1.2, metrics  # a trained head: drafts accepted
    assert verifier["class"] == "RejectionSampler" and not verifier["op_calls"], verifier  # vLLM's sampler
