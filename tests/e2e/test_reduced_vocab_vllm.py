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
