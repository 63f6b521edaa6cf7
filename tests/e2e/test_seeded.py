"""A request with a `seed` gives the same output whatever else is in the batch (vLLM's promise for
its own sampler), with DSpark speculation: probabilistic drafts (drawn from the request's own
generator), token-wise verification by our sampler, temperature 1 and top-p 0.9.

One engine. Each seeded request runs alone first, then inside batches mixed with other seeded and
unseeded requests of other prompts and lengths; with `max_num_seqs=3` requests join and leave
while others decode, so the neighbours change from step to step. Before: the drafts' noise came
from the global RNG (vLLM's `compute_probs_and_sample_next_token`), so a seeded request's drafts,
and with them its output, changed with its batch (and even between two solo runs).

(The other fix of this issue, zero-draft rows taking nothing from their generator, cannot show
here: vLLM 0.32's V1 runner verifies every step of a speculative engine, so a request's prefill
step is a zero-draft row alone and batched alike; `tests/ops/test_acceptance_serving.py` tests
it.) Batches stay at <= 8 requests and prompts are never chunked: vLLM 0.32's CPU build kills the
engine when a partially prefilled seeded request's CPU generator is rewound (`set_offset`),
independently of speculation.
"""

import pytest
from vllm import SamplingParams

from .. import helpers as T

pytestmark = pytest.mark.e2e

SPEC = {"method": "dspark", "model": str(T.ASSETS / "drafts" / "ref-dspark"), "num_speculative_tokens": 3,
        "draft_sample_method": "probabilistic"}


def _params(max_tokens, seed=None):
    return SamplingParams(temperature=1.0, top_p=0.9, max_tokens=max_tokens, ignore_eos=True, seed=seed)


def test_seeded_requests_do_not_depend_on_their_batch():
    prompts = T.load_prompts("code", limit=8)
    seeded = {0: (prompts[0], 20, 11), 1: (prompts[1], 28, 12), 2: (prompts[2], 14, 13)}
    others = [(prompts[3], 9, None), (prompts[4], 30, None), (prompts[5], 17, 99), (prompts[6], 5, None),
              (prompts[7], 23, 7)]
    with T.cpu_llm(T.REF_TARGET, speculative_config=SPEC, max_num_seqs=3) as llm:
        def run(reqs):
            outs = llm.generate([r[0] for r in reqs], [_params(r[1], r[2]) for r in reqs], use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outs]

        alone = {k: run([r])[0] for k, r in seeded.items()}
        batches = [  # (seeded key or -1 for a neighbour, request)
            [(-1, others[0]), (0, seeded[0]), (-1, others[1]), (1, seeded[1]), (2, seeded[2])],
            [(2, seeded[2]), (-1, others[2]), (-1, others[3]), (0, seeded[0]), (-1, others[4]),
             (1, seeded[1])],
            [(-1, others[1]), (-1, others[4]), (1, seeded[1]), (-1, others[0]), (0, seeded[0])],
        ]
        mixed = [list(zip([k for k, _ in b], run([r for _, r in b]))) for b in batches]
        metrics = T.spec_metrics(llm)
        verifier = llm.collective_rpc(T.sampler_counters)[0]
    assert verifier["class"] == "SpecxRejectionSampler" and verifier["random_op_calls"]["token"] > 0
    assert metrics["num_drafts"] > 0 and metrics["tau"] > 1.2  # speculation really ran (and accepted)
    for i, batch in enumerate(mixed):
        for key, tokens in batch:
            if key >= 0:
                assert tokens == alone[key], f"batch {i}: seeded request {key} differs from its solo run"
