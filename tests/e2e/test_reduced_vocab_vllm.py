"""A DSpark draft with a reduced draft vocabulary (`vllm_specx.vocab`) served in vLLM on CPU: our
proposer runs it with its own lm_head rows (not the target's), every draft pass equals the
PyTorch reference's drafts (target ids inside the vocabulary), greedy output equals no-spec, and
with probabilistic drafting the q reaching the rejection sampler is over the target vocabulary
with zero mass outside the draft vocabulary. Losslessness at T = 1 (chi-square against no-spec)
is `test_lossless.py`'s `dspark-reduced-vocab` config."""

import pytest
from vllm import SamplingParams

from .. import helpers as T
from ..helpers import random_draft, write
from .conftest import GREEDY  # target, prompts, nospec_outputs: fixtures of conftest.py
from .test_dspark_vllm import _check_drafts_match_reference

pytestmark = pytest.mark.e2e
IDS = list(range(3, 4096, 4))  # 1,024 target ids; the mask token 2 is not one of them


def test_reduced_vocabulary_draft_in_vllm(tmp_path, target, prompts, nospec_outputs):
    draft = random_draft(target, layers=2, draft_vocab=IDS)
    spec = {"method": "dspark", "model": write(draft, tmp_path / "d"), "num_speculative_tokens": 8,
            "draft_sample_method": "probabilistic"}
    with T.cpu_llm(T.REF_TARGET, speculative_config=spec) as llm:
        assert llm.collective_rpc(T.drafter_class) == ["vllm_specx.methods.dspark.proposer.DSparkProposer"]
        _check_drafts_match_reference(llm, target, draft, prompts[0], 8)
        drafted = {t for _, d in llm.collective_rpc(T.read_drafts)[0] for row in d for t in row}
        assert drafted and drafted <= set(IDS)
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
        llm.collective_rpc(T.spy_draft_probs_mass, args=(IDS,))
        llm.generate(prompts[:2], SamplingParams(temperature=0.8, max_tokens=8, seed=1))
        seen = llm.collective_rpc(T.read_draft_probs_mass)[0]
    assert outs == nospec_outputs  # greedy speculative decoding is lossless
    assert seen, "no draft probabilities reached the rejection sampler"
    for shape, outside, total in seen:
        assert shape[1] == 4096 and outside == 0.0 and abs(total - 1.0) < 1e-4, (shape, outside, total)


def test_reduced_vocabulary_mtp_in_vllm(tmp_path, target, prompts, nospec_outputs):
    """Our MTP layer with a reduced draft vocabulary: vLLM keeps its own lm_head rows (not the
    target's), the per-step logits over the draft vocabulary equal the reference's, drafts are
    target ids inside the vocabulary, greedy output equals no-spec, and probabilistic q reaches
    the rejection sampler over the target vocabulary with zero mass outside."""
    import torch

    from vllm_specx.methods.mtp.checkpoint import save

    draft = T.random_mtp(target, kv_share=True, draft_vocab=IDS)
    save(draft, tmp_path / "m")
    k = 5
    spec = {"method": "mtp", "model": str(tmp_path / "m"), "num_speculative_tokens": k,
            "draft_sample_method": "probabilistic"}
    with T.cpu_llm(T.REF_TARGET, speculative_config=spec) as llm:
        assert llm.collective_rpc(T.drafter_class) == ["vllm_specx.methods.mtp.proposer.MTPProposer"]
        llm.collective_rpc(T.record_mtp_steps)
        out = llm.generate([prompts[0]], GREEDY)[0]
        records = llm.collective_rpc(T.read_mtp_steps)[0]
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
        llm.collective_rpc(T.spy_draft_probs_mass, args=(IDS,))
        llm.generate(prompts[:2], SamplingParams(temperature=0.8, max_tokens=8, seed=1))
        seen = llm.collective_rpc(T.read_draft_probs_mass)[0]
    seq = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
    p = len(out.prompt_token_ids)
    assert len(records) >= 3
    for j, rec in enumerate(records[:3]):
        assert rec["anchors"] == [seq[p + j]]  # a random layer's drafts are (almost) never accepted
        got = torch.tensor(rec["logits"])[:, 0]  # [K, Vd]
        drafts = [d[0] for d in rec["drafts"]]
        assert got.shape == (k, len(IDS)) and set(drafts) <= set(IDS)
        want = draft.draft_logits(T.target_final_hidden(target, seq[: p + j]), torch.tensor(seq[: p + j + 1]), k,
                                  drafts=drafts)
        assert (got - want).abs().max().item() < 2e-3, f"pass {j}: served logits differ from the reference"
        assert drafts[0] == int(torch.tensor(IDS)[want[0].argmax()])  # step 0's pick, mapped to a target id
    assert outs == nospec_outputs  # greedy speculative decoding is lossless
    assert seen, "no draft probabilities reached the rejection sampler"
    for shape, outside, total in seen:
        assert shape[1] == 4096 and outside == 0.0 and abs(total - 1.0) < 1e-4, (shape, outside, total)


@pytest.mark.parametrize("method", ["dspark", "mtp"])
def test_reduced_vocabulary_rows_from_the_target_in_vllm(tmp_path, target, prompts, nospec_outputs, method):
    """A draft saved without its lm_head rows (`lm_head_from_target`, `vocab.omit_target_head`):
    when vLLM loads it, the proposer copies the target's rows at d2t into the draft's own head
    (`vocab.TargetHeadRows`): the served head is exactly those rows (uninitialised, or the
    target's whole [V, H] head, otherwise), DSpark's drafts equal the reference's and greedy
    output equals no-spec."""
    import torch

    from vllm_specx import vocab
    from vllm_specx.methods.mtp.checkpoint import save

    if method == "dspark":
        draft = random_draft(target, layers=2, draft_vocab=IDS)
        path = write(draft, tmp_path / "d")
    else:
        draft = T.random_mtp(target, kv_share=True, draft_vocab=IDS)
        save(draft, path := tmp_path / "m")
    head = T.embed_and_head(target)[1]
    assert vocab.omit_target_head(path, head)
    spec = {"method": method, "model": str(path), "num_speculative_tokens": 5}
    with T.cpu_llm(T.REF_TARGET, speculative_config=spec) as llm:
        served = torch.tensor(llm.collective_rpc(T.served_head)[0])
        if method == "dspark":
            _check_drafts_match_reference(llm, target, draft, prompts[0], 5)
        else:
            llm.collective_rpc(T.record_mtp_steps)
            out = llm.generate([prompts[0]], GREEDY)[0]
            records = llm.collective_rpc(T.read_mtp_steps)[0]
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert torch.equal(served, head[torch.tensor(IDS)].float())
    assert outs == nospec_outputs
    if method == "mtp":  # the logits vLLM computes with the copied rows are the reference's
        seq, p = list(out.prompt_token_ids) + list(out.outputs[0].token_ids), len(out.prompt_token_ids)
        for j, rec in enumerate(records[:2]):
            got = torch.tensor(rec["logits"])[:, 0]  # [K, Vd]
            want = draft.draft_logits(T.target_final_hidden(target, seq[: p + j]), torch.tensor(seq[: p + j + 1]),
                                      5, drafts=[d[0] for d in rec["drafts"]])
            assert (got - want).abs().max().item() < 2e-3, f"pass {j}: served logits differ from the reference"


@pytest.mark.full  # the baseline: vLLM's own llama_eagle3 reads d2t; our part is the checkpoint
def test_reduced_vocabulary_eagle3_baseline_in_vllm(tmp_path, target, prompts, nospec_outputs):
    """An EAGLE-3 draft our trainer writes with a reduced draft vocabulary is served by vLLM's
    built-in eagle3: every draft is a target id inside the vocabulary (vLLM maps through d2t),
    greedy output equals no-spec, and the drafts equal our reference's."""
    import torch

    from vllm_specx.methods.eagle3.checkpoint import save
    from vllm_specx.methods.eagle3.config import Eagle3Config
    from vllm_specx.methods.eagle3.model import Eagle3Draft

    torch.manual_seed(0)
    draft = Eagle3Draft(Eagle3Config.for_target(target.config.to_dict(), (1, 4, 6), len(IDS)),
                        *T.embed_and_head(target), IDS)
    for p in draft.parameters():
        torch.nn.init.normal_(p, std=0.05) if p.dim() > 1 else torch.nn.init.normal_(p, mean=1.0, std=0.3)
    save(draft, tmp_path / "e")
    k = 4
    spec = {"method": "eagle3", "model": str(tmp_path / "e"), "num_speculative_tokens": k}
    with T.cpu_llm(T.REF_TARGET, speculative_config=spec) as llm:
        llm.collective_rpc(T.record_mtp_steps)  # any EAGLE-style drafter: per step, its drafts
        out = llm.generate([prompts[0]], GREEDY)[0]
        records = llm.collective_rpc(T.read_mtp_steps)[0]
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    seq = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
    p = len(out.prompt_token_ids)
    assert len(records) >= 3
    for j, rec in enumerate(records[:3]):
        drafts = [d[0] for d in rec["drafts"]]
        assert set(drafts) <= set(IDS)
        ids = torch.tensor(seq[: p + j + 1])
        taps = T.target_taps(target, ids[None, :-1], (1, 4, 6))[0]
        assert drafts == draft.greedy_drafts(taps, ids, k), f"pass {j}"
    assert outs == nospec_outputs
