"""The plugin's repairs of vLLM 0.32's CPU engine under its users' traffic, each against a real
engine (with and without speculation), plus negative controls that show the engine dies without
the repair (so they fail, and the repair can go, once upstream fixes the bug; full tier).

- `repair-cpu-seeded-*`: a seeded request whose prompt is prefilled in chunks. vLLM rewinds its
  generator after each discarded chunk sample with `set_offset`, which CPU generators refuse.
  Repaired, the request's tokens equal its tokens when its prompt was prefilled in one piece
  (vLLM's promise: a seeded request does not depend on its batch or on chunking).
- `repair-cpu-empty-topk`: a top_k request (no top_p) on a speculative engine. The first step has
  no draft tokens, and vLLM's CPU top-k takes `k.max()` of the empty per-token top-k tensor in
  vLLM's verification path: vLLM's own methods (n-gram here) always take it; our sampler answers
  a step without drafts by plain sampling unless logprobs are asked, so DSpark needs it with
  logprobs.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from .. import helpers as T

pytestmark = pytest.mark.e2e

DSPARK = {"method": "dspark", "model": str(T.ASSETS / "drafts" / "ref-dspark"), "num_speculative_tokens": 3,
          "draft_sample_method": "probabilistic"}
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
BUDGET = 64  # max_num_batched_tokens: the 64-token seeded prompt fits alone, beside any other request not


def _token_prompts(n=BUDGET):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(T.REF_TARGET))
    ids = [i for p in T.load_prompts("code", limit=8) for i in tok(p)["input_ids"]]
    return ids[:n], ids[100:140], ids[200:230]


# CI keeps the speculative engine (the repair's harder case); the plain engine is full-tier
@pytest.mark.parametrize("spec", [pytest.param(None, marks=pytest.mark.full), DSPARK], ids=["no-spec", "dspark"])
def test_seeded_request_with_chunked_prefill_equals_its_unchunked_run(spec):
    # A speculative engine keeps room for its drafts in the step's budget.
    seeded, other, third = _token_prompts(BUDGET - (spec["num_speculative_tokens"] if spec else 0))
    params = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=1234)
    with T.cpu_llm(T.REF_TARGET, speculative_config=spec, max_num_batched_tokens=BUDGET,
                   enable_chunked_prefill=True, enable_prefix_caching=False, max_num_seqs=4) as llm:
        def run(prompts, seeds):
            ps = [SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=s) for s in seeds]
            outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], ps, use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outs]

        alone = run([seeded], [params.seed])[0]  # alone: one prefill chunk
        assert llm.collective_rpc(T.seeded_rewinds) == [0]
        # Beside a request that is prefilling or decoding, the seeded prompt is split in two
        # chunks: its first sampled token is discarded and its generator rewound.
        chunked = run([other, seeded], [None, params.seed])[1]
        rewinds = llm.collective_rpc(T.seeded_rewinds)[0]
        assert rewinds >= 1  # the repair ran
        # Two seeded prompts chunked in turn, next to an unseeded one.
        both = run([third, seeded, other], [7, params.seed, None])[1]
        assert llm.collective_rpc(T.seeded_rewinds)[0] > rewinds
        metrics = T.spec_metrics(llm) if spec else None
    assert len(alone) == 24
    assert chunked == alone
    assert both == alone
    if spec:
        assert metrics["num_drafts"] > 0


# CI keeps our proposer's engine; vLLM's n-gram engine (the same repaired sampler) is full-tier
@pytest.mark.parametrize("spec, logprobs", [({**DSPARK, "draft_sample_method": "greedy"}, 1),
                                            pytest.param(NGRAM, None, marks=pytest.mark.full)],
                         ids=["dspark-logprobs", "ngram"])
def test_top_k_without_top_p_on_a_speculative_engine(spec, logprobs):
    prompts = T.load_prompts("code", limit=4)
    with T.cpu_llm(T.REF_TARGET, speculative_config=spec) as llm:
        outs = llm.generate(prompts, [SamplingParams(temperature=0.7, top_k=20, max_tokens=16, ignore_eos=True,
                                                     logprobs=logprobs),
                                      SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                                      SamplingParams(temperature=1.0, top_k=5, max_tokens=16, ignore_eos=True,
                                                     seed=3),
                                      SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_tokens=16,
                                                     ignore_eos=True)], use_tqdm=False)
        metrics = T.spec_metrics(llm)
    assert [len(o.outputs[0].token_ids) for o in outs] == [16] * 4
    if spec is not NGRAM:  # n-gram drafts only where the text repeats
        assert metrics["num_drafts"] > 0


NEGATIVE = """
import sys
from vllm import SamplingParams
from vllm.inputs import TokensPrompt
from tests import helpers as T
from tests.e2e.test_cpu_repairs import DSPARK, NGRAM, BUDGET, _token_prompts

def main():
    seeded, other, _ = _token_prompts()
    if sys.argv[1] == "seeded":
        with T.cpu_llm(T.REF_TARGET, max_num_batched_tokens=BUDGET, enable_chunked_prefill=True) as llm:
            llm.generate([TokensPrompt(prompt_token_ids=p) for p in (other, seeded)],
                         [SamplingParams(max_tokens=4), SamplingParams(temperature=1.0, max_tokens=4, seed=1)])
    else:
        spec, logprobs = (NGRAM, None) if sys.argv[1] == "topk" else (DSPARK, 1)
        with T.cpu_llm(T.REF_TARGET, speculative_config=spec) as llm:
            llm.generate(["def f():"], SamplingParams(temperature=0.7, top_k=20, max_tokens=4, logprobs=logprobs))
    print("SURVIVED")

if __name__ == "__main__":
    main()
"""


@pytest.mark.full  # canaries for upstream fixes: the positive tests above keep the repairs in the e2e tier
@pytest.mark.parametrize("case,env,error", [
    ("seeded", "VLLM_SPECX_REPAIR_CPU_SEEDED", "CPU Generator does not use offset"),
    ("topk", "VLLM_SPECX_REPAIR_CPU_EMPTY_TOPK", "Expected reduction dim to be specified for input.numel"),
    ("topk-logprobs", "VLLM_SPECX_REPAIR_CPU_EMPTY_TOPK", "Expected reduction dim to be specified for input.numel"),
])
def test_the_cpu_engine_dies_without_the_repair(case, env, error):
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", NEGATIVE, case], capture_output=True, text=True, timeout=400,
                         cwd=root, env={**os.environ, env: "0", "PYTHONPATH": str(root)})
    log = out.stdout + out.stderr
    assert out.returncode != 0 and "SURVIVED" not in log, "the engine survived without the repair: " \
        "upstream may have fixed the bug (then remove the repair)"
    assert error in log, log[-3000:]
