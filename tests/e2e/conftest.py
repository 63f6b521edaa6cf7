"""Fixtures shared by the end-to-end tests: the reference target (transformers, for reference
drafts), four held-out code prompts and the greedy no-spec outputs of the reference target in vLLM.

One no-spec engine per session (`nospec_reference`) serves every test that compares greedy output
with the default engine settings (`vllm_specx.engine.CPU_ENGINE_ARGS`) against no-spec: 16 code
prompts x 64 tokens with `ignore_eos`, which tests slice (`nospec_tokens`): at temperature 0 the
first n tokens of a 64-token run are the n-token run. Tests whose engine settings are the point
(reliability, lossless) keep their own no-spec engines."""

import pytest
from vllm import SamplingParams

from .. import helpers as T

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
NOSPEC_PROMPTS, NOSPEC_TOKENS = 16, 64  # the shared reference: load_prompts("code", 16), 64 tokens
# the adaptive-drafting tests' greedy runs (DSpark and MTP): 16 code prompts x 48 tokens
ADAPTIVE = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)


@pytest.fixture(scope="session")
def target():
    return T.load_target(T.REF_TARGET)


@pytest.fixture(scope="session")
def prompts():
    return T.load_prompts("code", limit=4)


@pytest.fixture(scope="session")
def nospec_reference() -> list[list[int]]:
    """Greedy no-spec token ids of the first `NOSPEC_PROMPTS` code prompts, `NOSPEC_TOKENS` each
    (ignore_eos), from one engine with `cpu_llm`'s default settings."""
    params = SamplingParams(temperature=0, max_tokens=NOSPEC_TOKENS, ignore_eos=True)
    with T.cpu_llm(T.REF_TARGET) as llm:
        outs = llm.generate(T.load_prompts("code", limit=NOSPEC_PROMPTS), params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="session")
def nospec_tokens(nospec_reference):
    """`nospec_tokens(n_prompts, max_tokens)`: the greedy no-spec token ids of the first `n_prompts`
    code prompts (`load_prompts("code", n_prompts)`), `max_tokens` each."""
    def get(n_prompts: int, max_tokens: int) -> list[list[int]]:
        assert n_prompts <= NOSPEC_PROMPTS and max_tokens <= NOSPEC_TOKENS, (n_prompts, max_tokens)
        return [ids[:max_tokens] for ids in nospec_reference[:n_prompts]]
    return get


@pytest.fixture(scope="session")
def adaptive_prompts():
    """The adaptive-drafting tests' prompts: the shared reference's 16 code prompts."""
    return T.load_prompts("code", limit=NOSPEC_PROMPTS)


@pytest.fixture(scope="session")
def adaptive_nospec(nospec_tokens):
    """Greedy no-spec token ids of `adaptive_prompts` under `ADAPTIVE`."""
    return nospec_tokens(NOSPEC_PROMPTS, ADAPTIVE.max_tokens)


@pytest.fixture(scope="session")
def nospec_outputs(nospec_tokens):
    """Greedy no-spec token ids of `prompts` under `GREEDY`."""
    return nospec_tokens(4, GREEDY.max_tokens)
