"""`vllm serve` on vLLM 0.34 (V2 model runner, CPU) with our committed drafts, through the
OpenAI-compatible API: streamed greedy output identical to no-spec and vLLM's /metrics counters
showing accepted drafts; 64 concurrent streams with mixed sampling (temperature, top-p, top-k,
seeds, n = 2), a quarter closed mid-stream, finishing with 0 errors and the server alive, its KV
cache released and its counters consistent (`vllm_specx.bench.loadgen.check_server`); a malformed
draft makes `vllm serve` exit at start-up naming the field, not serve.

The engine core runs in its own process here (vLLM's default for `vllm serve`), which gets the
Triton interpreter harness from the venv's .pth (SPECX_TRITON_INTERPRETER=1, set by the
conftest's `triton_harness.install()` and inherited).
"""

import json

import pytest

from vllm_specx.bench import loadgen

from .. import helpers as T
from ..e2e.serving import expect_exit, vllm_serve
from .conftest import MAX_TOKENS, spec

pytestmark = pytest.mark.e2e034
ARGS = ["--dtype", "float32", "--max-model-len", "1024", "--enforce-eager", "--gpu-memory-utilization", "0.2",
        "--served-model-name", "m"]


def _stream(base: str, prompt, max_tokens: int) -> tuple[list[int], str]:
    """One streamed greedy completion of `prompt` (a string or token ids) with the OpenAI client:
    (the token ids vLLM returned, the text)."""
    from openai import OpenAI

    client = OpenAI(base_url=base + "/v1", api_key="none")
    ids, text = [], ""
    stream = client.completions.create(model="m", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True, "return_token_ids": True})
    for chunk in stream:
        choice = chunk.choices[0]
        text += choice.text
        ids += getattr(choice, "token_ids", None) or (choice.model_extra or {}).get("token_ids") or []
    return ids, text


@pytest.mark.parametrize("method", [pytest.param("dspark", marks=pytest.mark.e2e034_ci), "mtp"])
def test_serve_streams_greedy_identical_with_counters(tmp_path, target_dir, prompts, nospec, method):
    want = nospec("smollm2")
    args = [*ARGS, "--speculative-config", json.dumps(spec("smollm2", method))]
    with vllm_serve(target_dir("smollm2"), args, tmp_path / "serve.log") as base:
        got = [_stream(base, p["prompt_token_ids"], MAX_TOKENS) for p in prompts("smollm2")]
        counters = loadgen.spec_counters(loadgen.http_get(base + "/metrics"))
    assert [ids for ids, _ in got] == want
    assert counters["drafts"] > 0 and counters["accepted_tokens"] > 0, counters
    assert not loadgen.counter_problems(counters), counters


@pytest.mark.parametrize("method", ["dspark", "mtp"])
def test_64_streams_with_aborts_and_seeds(tmp_path, target_dir, method):
    count = 64
    args = [*ARGS, "--max-num-batched-tokens", "128", "--speculative-config", json.dumps(spec("ref", method))]
    requests = loadgen.make_requests(T.load_prompts("code", limit=16), count, abort_fraction=0.25, seed=13,
                                     max_tokens=(8, 32), alone=4)
    log = tmp_path / "serve.log"
    with vllm_serve(target_dir("ref"), args, log) as base:
        results = loadgen.run_load(base, "m", requests, concurrency=count, timeout=900)
        summary = loadgen.check_server(base, "m", results, idle_timeout=120)  # raises naming each failure
        text = log.read_text()
    assert "EngineDeadError" not in text and "Traceback" not in text, text[-3000:]
    assert summary["aborted"] == sum(r.abort_after is not None for r in requests) > 0 and summary["lost"] == 0
    assert summary["completed"] == count - summary["aborted"]
    assert summary["seeded"] > 0
    assert any(r.params.get("top_k", -1) > 0 for r in requests) and any(r.params.get("top_p", 1) < 1 for r in requests)
    assert summary["spec"]["drafts"] > 0 and summary["spec"]["accepted_tokens"] > 0


@pytest.mark.e2e034_ci
def test_serve_refuses_a_malformed_draft_naming_the_field(tmp_path, target_dir):
    import shutil

    draft = tmp_path / "draft"
    shutil.copytree(T.ASSETS / "drafts" / "ref-dspark", draft)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["specx"]["target_layer_ids"] = [1, 4, 8]
    (draft / "config.json").write_text(json.dumps(cfg))
    args = [*ARGS, "--speculative-config", json.dumps({"method": "dspark", "model": str(draft),
                                                       "num_speculative_tokens": 7})]
    log = tmp_path / "serve.log"
    proc, base = loadgen.spawn_vllm_serve(target_dir("ref"), args, log)
    code, out = expect_exit(proc, base, log, timeout=180)
    assert code != 0
    assert "vllm-specx:" in out and "target_layer_ids [1, 4, 8]: layer(s) [8] outside the target's 8 layers" in out
