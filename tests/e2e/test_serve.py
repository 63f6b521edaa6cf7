"""A real `vllm serve` with the plugin: completions work and /metrics carries spec-decode counters."""

import json

import pytest

from ..helpers import REF_TARGET, load_prompts, load_target, random_draft, write
from .serving import get as _get
from .serving import post as _post
from .serving import vllm_serve

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    draft = write(random_draft(load_target(REF_TARGET)), tmp / "draft")
    log = tmp / "serve.log"
    args = ["--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
            "--gpu-memory-utilization", "0.2", "--served-model-name", "ref",
            "--speculative-config", json.dumps({"method": "dspark", "model": draft,
                                                "num_speculative_tokens": 7})]
    with vllm_serve(REF_TARGET, args, log) as base:
        yield base, log


def _counter(metrics: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_serve_completions_and_spec_decode_metrics(server):
    base, log = server
    prompts = load_prompts("code", limit=2)
    res = _post(base + "/v1/completions", {"model": "ref", "prompt": prompts, "max_tokens": 32,
                                           "temperature": 0, "ignore_eos": True})
    assert [c["index"] for c in res["choices"]] == [0, 1]
    assert res["usage"]["completion_tokens"] == 64
    metrics = _get(base + "/metrics")
    drafts = _counter(metrics, "vllm:spec_decode_num_drafts_total")
    assert drafts > 0
    assert _counter(metrics, "vllm:spec_decode_num_draft_tokens_total") == 7 * drafts
    assert _counter(metrics, "vllm:spec_decode_num_accepted_tokens_total") >= 0
    assert "DSparkProposer active" in log.read_text()  # logged by our proposer in the worker


@pytest.mark.full  # the CLI route is CI's with DSpark; MTP's routing and parity are CI's offline
def test_serve_runs_our_mtp_proposer(tmp_path, nospec_tokens):
    """`vllm serve <ref target> --speculative-config '{"method": "mtp", "model": <committed MTP>}'`:
    our MTPProposer runs in the worker, vLLM counts its drafts, and the greedy tokens equal those
    without speculation (the session's no-spec engine, `nospec_tokens` of conftest.py: the engine
    settings of this server; the DSpark server above is another engine)."""
    from ..helpers import ASSETS

    prompts = load_prompts("code", limit=2)
    want = nospec_tokens(2, 32)
    log = tmp_path / "serve.log"
    args = ["--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
            "--gpu-memory-utilization", "0.2", "--served-model-name", "ref",
            "--speculative-config", json.dumps({"method": "mtp", "model": str(ASSETS / "drafts" / "ref-mtp"),
                                                "num_speculative_tokens": 7})]
    with vllm_serve(REF_TARGET, args, log) as base:
        res = _post(base + "/v1/completions", {"model": "ref", "prompt": prompts, "max_tokens": 32,
                                               "temperature": 0, "ignore_eos": True, "return_token_ids": True})
        metrics = _get(base + "/metrics")
    got = [c["token_ids"] for c in sorted(res["choices"], key=lambda c: c["index"])]
    assert got == want
    drafts = _counter(metrics, "vllm:spec_decode_num_drafts_total")
    assert drafts > 0 and _counter(metrics, "vllm:spec_decode_num_accepted_tokens_total") > drafts / 2  # tau > 1.5
    assert "MTPProposer active" in log.read_text()
