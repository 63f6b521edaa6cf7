"""A real `vllm serve` with the plugin: completions work and /metrics carries spec-decode counters."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ..helpers import REF_TARGET, load_prompts, load_target, random_draft, write

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout=10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def _post(url: str, body: dict, timeout=120) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    draft = write(random_draft(load_target(REF_TARGET)), tmp / "draft")
    port, log = _free_port(), tmp / "serve.log"
    vllm_cli = str(Path(sys.executable).with_name("vllm"))
    cmd = [vllm_cli, "serve", str(REF_TARGET), "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
           "--gpu-memory-utilization", "0.2", "--served-model-name", "ref",
           "--speculative-config", json.dumps({"method": "dspark", "model": draft,
                                               "num_speculative_tokens": 7})]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                _get(base + "/health", timeout=2)
                break
            except OSError:
                if time.time() > deadline:
                    pytest.fail(f"vllm serve not healthy after 300 s:\n{log.read_text()[-3000:]}")
                time.sleep(2)
        yield base, log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


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
