"""Load against a real `vllm serve` with the plugin (issue 13): concurrent streaming completions with
mixed temperature / top-p / top-k / seed / max_tokens / n, a quarter closed mid-stream, the last
eight sent one at a time to the then idle server; every
other request completes with its token count, and afterwards the server answers, KV-cache usage is
back to 0 and the spec-decode counters are consistent (`vllm_specx.bench.loadgen.check_server`).

A small step budget (`--max-num-batched-tokens 128`) splits prompts into chunks under load, so
seeded requests go through the CPU engine's rewind (the plugin's `repair-cpu-seeded-*`), and
a lone top_k request without top_p starts with a step without drafts (`repair-cpu-empty-topk`):
without those repairs
vLLM 0.32's CPU engine dies on this load (tests/e2e/test_cpu_repairs.py shows each).

CI sends 32 requests to the DSpark server (the e2e tier; MTP and n-gram are in the full tier); the
full run (64 per drafter, as in the README) is part of
`bash scripts/reliability.sh`, which also sets SPECX_RELIABILITY_OUT: each run's summary is written
there as load-<drafter>.json.
"""

import json
import os
from pathlib import Path

import pytest

from vllm_specx.bench import loadgen

from .. import helpers as T
from .serving import vllm_serve

pytestmark = pytest.mark.e2e

COUNT = int(os.environ.get("SPECX_LOAD_REQUESTS", "32"))
DRAFTERS = {
    "dspark": {"method": "dspark", "model": str(T.ASSETS / "drafts" / "ref-dspark"), "num_speculative_tokens": 7},
    "mtp": {"method": "mtp", "model": str(T.ASSETS / "drafts" / "ref-mtp"), "num_speculative_tokens": 7},
    "ngram": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
}


@pytest.mark.parametrize("drafter", [d if d == "dspark" else pytest.param(d, marks=pytest.mark.full)
                                     for d in DRAFTERS])
def test_concurrent_streams_with_aborts_and_seeds(tmp_path, drafter):
    args = ["--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
            "--gpu-memory-utilization", "0.2", "--served-model-name", "ref", "--max-num-batched-tokens", "128",
            "--speculative-config", json.dumps(DRAFTERS[drafter])]
    prompts = T.load_prompts("code", limit=16)
    requests = loadgen.make_requests(prompts, COUNT, abort_fraction=0.25, seed=13, alone=8)
    log = tmp_path / "serve.log"
    with vllm_serve(T.REF_TARGET, args, log) as base:
        results = loadgen.run_load(base, "ref", requests, concurrency=COUNT, timeout=600)
        summary = loadgen.check_server(base, "ref", results)
        text = log.read_text()  # before the shutdown (which logs errors of its own)
    assert "EngineDeadError" not in text and "Traceback" not in text, text[-3000:]
    assert summary["aborted"] == sum(r.abort_after is not None for r in requests) > 0 and summary["lost"] == 0
    assert summary["completed"] == COUNT - summary["aborted"]
    assert summary["seeded"] > 0
    assert any(r.alone and r.params.get("top_k", -1) > 0 and r.params["top_p"] == 1.0 for r in requests)
    assert summary["spec"]["drafts"] > 0 and summary["spec"]["accepted_tokens"] > 0
    proposer = {"dspark": "DSparkProposer", "mtp": "MTPProposer"}.get(drafter)
    if proposer:
        assert f"{proposer} active" in text
    out = os.environ.get("SPECX_RELIABILITY_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        spec = dict(DRAFTERS[drafter])
        if "model" in spec:  # recorded as assets/..., not as this machine's path
            spec["model"] = str("assets" / Path(spec["model"]).relative_to(T.ASSETS))
        (Path(out) / f"load-{drafter}.json").write_text(json.dumps({"drafter": spec, **summary}, indent=1))
