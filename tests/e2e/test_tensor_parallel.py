"""Our drafters under vLLM's tensor parallelism (issue 13): the reference target sharded over two
CPU worker processes (`tensor_parallel_size=2`; vLLM's CPU backend needs one OpenMP core list
per rank, `VLLM_CPU_OMP_THREADS_BIND="0|1"`). At temperature 0 the tokens equal TP=1's token for
token, and so do vLLM's spec-decode counters (drafts, accepted per position: tau unchanged),
with our proposer running in both ranks."""

import pytest
from vllm import SamplingParams

from .. import helpers as T

pytestmark = pytest.mark.e2e

SPECS = {
    "dspark": ({"method": "dspark", "model": str(T.ASSETS / "drafts" / "ref-dspark"), "num_speculative_tokens": 7},
               "DSparkProposer"),
    "mtp": ({"method": "mtp", "model": str(T.ASSETS / "drafts" / "ref-mtp"), "num_speculative_tokens": 7},
            "MTPProposer"),
}


def _run(spec, tp, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1" if tp == 2 else "auto")
    prompts = T.load_prompts("code", limit=8)
    with T.cpu_llm(T.REF_TARGET, speculative_config=spec, tensor_parallel_size=tp) as llm:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True), use_tqdm=False)
        drafters = llm.collective_rpc(T.drafter_class)
        metrics = T.spec_metrics(llm)
    return [list(o.outputs[0].token_ids) for o in outs], drafters, metrics


@pytest.mark.parametrize("method", ["dspark", pytest.param("mtp", marks=pytest.mark.full)])
def test_tp2_equals_tp1(method, monkeypatch):
    spec, proposer = SPECS[method]
    want, _, m1 = _run(spec, 1, monkeypatch)
    got, drafters, m2 = _run(spec, 2, monkeypatch)
    assert len(drafters) == 2 and all(d.endswith(proposer) for d in drafters), drafters
    assert got == want
    assert m2["num_drafts"] > 0 and m2["tau"] > 1.5
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos"):
        assert m2[key] == m1[key], key
