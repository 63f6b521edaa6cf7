"""Fixtures shared by the end-to-end tests: the reference target (transformers, for reference
drafts), four held-out code prompts and their greedy no-spec outputs in vLLM (one engine per
session)."""

import pytest
from vllm import SamplingParams

from .. import helpers as T

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="session")
def target():
    return T.load_target(T.REF_TARGET)


@pytest.fixture(scope="session")
def prompts():
    return T.load_prompts("code", limit=4)


@pytest.fixture(scope="session")
def nospec_outputs(prompts):
    """Greedy no-spec token ids of `prompts` under `GREEDY`."""
    with T.cpu_llm(T.REF_TARGET) as llm:
        return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
