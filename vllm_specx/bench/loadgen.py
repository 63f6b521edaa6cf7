"""Load against a real `vllm serve`: many concurrent streaming completions with mixed sampling
parameters, some aborted mid-stream by closing the connection; then the server's health checks.

Used by the reliability tests (`tests/e2e/test_load.py`, small counts in CI) and by the load
benchmark (`vllm-specx load`, sustained traffic on a real target, JSON + PNG). Loopback only.

Request mix (`make_requests`, deterministic in `seed`): temperature 0 / 0.7 / 1, top_p 1 / 0.9,
top_k -1 / 20, half with a `seed`, max_tokens 8..64, n 1 or 2 (one in eight when sampling), `ignore_eos` so a
completed request has exactly `n * max_tokens` tokens; a fraction is aborted after a few stream
chunks. `check_server` then asserts what vLLM promises after load: every request not aborted
finished with `finish_reason == "length"` and its token count, the server still answers, KV-cache
usage is back to idle, no request is left running or waiting, and the spec-decode counters are
consistent (accepted <= drafted, accepted per position non-increasing in the position).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


@dataclasses.dataclass
class Request:
    prompt: str | list[int]  # text or token ids (OpenAI completions take either)
    params: dict  # OpenAI completion fields: max_tokens, temperature, top_p, top_k, seed, n
    abort_after: int | None = None  # close the connection after this many stream chunks
    delay: float = 0.0  # seconds after the start of the load at which the request is sent
    alone: bool = False  # sent after every other request finished, one at a time (a quiet server)


@dataclasses.dataclass
class Result:
    request: Request
    tokens: int = 0  # completion tokens the server reported (usage), or counted from the stream
    finish: list = dataclasses.field(default_factory=list)  # finish_reason per choice
    aborted: bool = False
    error: str | None = None
    ttft: float | None = None  # seconds to the first streamed token
    itl: list = dataclasses.field(default_factory=list)  # seconds between streamed chunks
    latency: float = 0.0
    start: float = 0.0

    @property
    def expected_tokens(self) -> int:
        return self.request.params["max_tokens"] * self.request.params.get("n", 1)


def make_requests(prompts: list[str], count: int, abort_fraction: float = 0.25, seed: int = 0,
                  max_tokens: tuple[int, int] = (8, 64), mix: bool = True,
                  arrival_rate: float | None = None, alone: int = 0, ignore_eos: bool = True) -> list[Request]:
    """`count` requests over `prompts` (cycled); `mix=False` gives greedy n=1 requests only.
    `arrival_rate` (requests/s): Poisson arrivals instead of all at once. The last `alone`
    requests are sent one at a time once the others are done: a request starting on an idle
    engine has a step without drafts of its own, which a busy batch hides (with `mix`, the first
    of them samples with top_k and no top_p)."""
    rng = random.Random(seed)
    out = []
    n_abort = round(count * abort_fraction)
    abort = set(rng.sample(range(count), n_abort))
    for i in range(count):
        params = {"max_tokens": rng.randint(*max_tokens), "ignore_eos": ignore_eos}
        if mix:
            params["temperature"] = rng.choice([0.0, 0.7, 1.0])
            if params["temperature"] > 0:
                params["top_p"] = rng.choice([1.0, 0.9])
                params["top_k"] = rng.choice([-1, 20])
            if rng.random() < 0.5:
                params["seed"] = rng.randrange(1 << 30)
            if rng.random() < 0.125 and params["temperature"] > 0:  # vLLM refuses n > 1 when greedy
                params["n"] = 2
        else:
            params["temperature"] = 0.0
        out.append(Request(prompts[i % len(prompts)], params, rng.randint(1, 3) if i in abort else None))
    for r in out[count - alone:]:
        r.alone = True
    if mix and alone:  # the first lone request samples with top_k only
        out[count - alone].params.update(temperature=0.7, top_p=1.0, top_k=20)
        out[count - alone].abort_after = None
    if arrival_rate:
        t = 0.0
        for r in out:
            r.delay = t
            t += rng.expovariate(arrival_rate)
    return out


async def _one(session, base: str, model: str, req: Request, t0: float) -> Result:
    import aiohttp

    res = Result(req, start=time.perf_counter() - t0)
    body = {"model": model, "prompt": req.prompt, "stream": True,
            "stream_options": {"include_usage": True}, **req.params}
    start = last = time.perf_counter()
    chunks, counted = 0, 0
    finish: dict[int, str] = {}
    try:
        async with session.post(base + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return res
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                msg = json.loads(data)
                if "error" in msg:
                    res.error = str(msg["error"])[:300]
                    return res
                if msg.get("usage"):
                    res.tokens = msg["usage"]["completion_tokens"]
                for ch in msg.get("choices", []):
                    if ch.get("text"):
                        now = time.perf_counter()
                        if res.ttft is None:
                            res.ttft = now - start
                        else:
                            res.itl.append(now - last)
                        last = now
                        counted += 1
                    if ch.get("finish_reason"):
                        finish[ch["index"]] = ch["finish_reason"]
                if msg.get("choices"):
                    chunks += 1
                if req.abort_after is not None and chunks >= req.abort_after:
                    res.aborted = True
                    resp.close()  # closing the connection aborts the request in vLLM
                    return res
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        res.error = f"{type(e).__name__}: {e}"
    res.finish = [finish.get(i) for i in range(req.params.get("n", 1))]
    res.latency = time.perf_counter() - start
    return res


async def _run(base: str, model: str, requests: list[Request], concurrency: int, timeout: float) -> list[Result]:
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    t0 = time.perf_counter()

    async def guarded(session, req):
        await asyncio.sleep(max(0.0, req.delay - (time.perf_counter() - t0)))
        async with sem:
            return await _one(session, base, model, req, t0)

    conn = aiohttp.TCPConnector(limit=concurrency, force_close=True)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout)) as s:
        results = dict(zip((i for i, r in enumerate(requests) if not r.alone),
                           await asyncio.gather(*(guarded(s, r) for r in requests if not r.alone))))
        for i, r in enumerate(requests):
            if r.alone:
                results[i] = await _one(s, base, model, r, t0)
    return [results[i] for i in range(len(requests))]


def run_load(base: str, model: str, requests: list[Request], concurrency: int = 64,
             timeout: float = 600) -> list[Result]:
    """Send `requests` with at most `concurrency` in flight; one Result per request, in order."""
    return asyncio.run(_run(base, model, requests, concurrency, timeout))


# -- the server's state ----------------------------------------------------------------------

def http_get(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def http_post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def metric(text: str, name: str, **labels) -> float:
    """Sum of the samples of `name` (with every given label equal) in Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        if any(f'{k}="{v}"' not in line for k, v in labels.items()):
            continue
        total += float(line.rsplit(" ", 1)[1])
    return total


def per_position(text: str, name: str = "vllm:spec_decode_num_accepted_tokens_per_pos_total") -> list[float]:
    pos: dict[int, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") and 'position="' in line:
            p = int(line.split('position="')[1].split('"')[0])
            pos[p] = pos.get(p, 0.0) + float(line.rsplit(" ", 1)[1])
    return [pos[p] for p in sorted(pos)]


def spec_counters(text: str) -> dict:
    return {"drafts": metric(text, "vllm:spec_decode_num_drafts_total"),
            "draft_tokens": metric(text, "vllm:spec_decode_num_draft_tokens_total"),
            "accepted_tokens": metric(text, "vllm:spec_decode_num_accepted_tokens_total"),
            "accepted_per_position": per_position(text)}


def counter_problems(spec: dict) -> list[str]:
    """Inconsistent spec-decode counters (`spec_counters`): more accepted than drafted tokens,
    accepted per position increasing with the position, or not summing to the accepted total."""
    fails = []
    if spec["accepted_tokens"] > spec["draft_tokens"]:
        fails.append(f"accepted {spec['accepted_tokens']} > drafted {spec['draft_tokens']} tokens")
    pos = spec["accepted_per_position"]
    if any(b > a for a, b in zip(pos, pos[1:])):
        fails.append(f"accepted per position not monotone: {pos}")
    if pos and abs(sum(pos) - spec["accepted_tokens"]) > 0.5:
        fails.append(f"accepted per position sums to {sum(pos)}, accepted total {spec['accepted_tokens']}")
    return fails


def wait_idle(base: str, timeout: float = 60) -> dict:
    """Poll /metrics until nothing runs or waits and KV-cache usage is 0; the last readings."""
    deadline = time.time() + timeout
    while True:
        text = http_get(base + "/metrics")
        state = {"running": metric(text, "vllm:num_requests_running"),
                 "waiting": metric(text, "vllm:num_requests_waiting"),
                 "kv_cache_usage": metric(text, "vllm:kv_cache_usage_perc")}
        if (state["running"] == 0 and state["waiting"] == 0 and state["kv_cache_usage"] == 0) \
                or time.time() > deadline:
            return {**state, "metrics": text}
        time.sleep(0.5)


def problems(results: list[Result]) -> list[str]:
    """What went wrong with the requests that were not aborted (empty when all is well)."""
    out = []
    for i, r in enumerate(results):
        if r.error:
            out.append(f"request {i} ({r.request.params}): {r.error}")
        elif r.aborted:
            continue
        elif r.request.params.get("ignore_eos", True):
            if r.tokens != r.expected_tokens or any(f != "length" for f in r.finish):
                out.append(f"request {i} ({r.request.params}): {r.tokens} tokens, finish {r.finish}; "
                           f"expected {r.expected_tokens} tokens, finish 'length'")
        elif not 0 < r.tokens <= r.expected_tokens or any(f not in ("length", "stop") for f in r.finish):
            out.append(f"request {i} ({r.request.params}): {r.tokens} tokens, finish {r.finish}; "
                       f"expected 1..{r.expected_tokens} tokens, finish 'length' or 'stop'")
    return out


def check_server(base: str, model: str, results: list[Result], idle_timeout: float = 60) -> dict:
    """After a load: the checks of this module's docstring. Returns a summary; raises
    AssertionError naming every failure."""
    fails = problems(results)
    idle = wait_idle(base, idle_timeout)
    if idle["running"] or idle["waiting"]:
        fails.append(f"requests left in the engine: {idle['running']} running, {idle['waiting']} waiting")
    if idle["kv_cache_usage"] != 0:
        fails.append(f"KV-cache usage {idle['kv_cache_usage']} after the load, expected 0 (leaked blocks)")
    spec = spec_counters(idle["metrics"])
    fails += counter_problems(spec)
    try:
        after = http_post(base + "/v1/completions", {"model": model, "prompt": "def add(a, b):",
                                                     "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        if after["usage"]["completion_tokens"] != 8:
            fails.append(f"a request after the load got {after['usage']['completion_tokens']} tokens, expected 8")
    except OSError as e:
        fails.append(f"the server did not answer after the load: {e}")
    summary = summarize(results)
    summary.update(spec={k: v for k, v in spec.items()}, idle={k: idle[k] for k in
                                                               ("running", "waiting", "kv_cache_usage")})
    if fails:
        raise AssertionError("\n".join(fails))
    return summary


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def summarize(results: list[Result], wall: float | None = None) -> dict:
    done = [r for r in results if not r.aborted and not r.error]
    ttft = [r.ttft for r in done if r.ttft is not None]
    itl = [x for r in done for x in r.itl]
    # time per output token after the first (a speculative chunk carries several tokens)
    tpot = [(r.latency - r.ttft) / (r.tokens - 1) for r in done if r.ttft is not None and r.tokens > 1]
    out = {"requests": len(results), "completed": len(done), "aborted": sum(r.aborted for r in results),
           "errors": sum(bool(r.error) for r in results), "lost": len(problems(results)),
           "seeded": sum("seed" in r.request.params for r in results),
           "completion_tokens": sum(r.tokens for r in done),
           "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
           "itl_p50_s": _pct(itl, 50), "itl_p99_s": _pct(itl, 99),
           "tpot_p50_s": _pct(tpot, 50), "tpot_p99_s": _pct(tpot, 99)}
    if wall:
        out["wall_s"] = wall
        out["output_tok_per_s"] = out["completion_tokens"] / wall
    return out


# -- a server ---------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerExited(RuntimeError):
    pass


def spawn_vllm_serve(model, args: list[str], log: Path, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """Start `vllm serve model *args` on a free loopback port (its own process group, output in
    `log`); returns (process, base URL) without waiting."""
    port = free_port()
    cmd = [str(Path(sys.executable).with_name("vllm")), "serve", str(model), "--host", "127.0.0.1",
           "--port", str(port), *args]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
    return proc, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def vllm_serve(model, args: list[str], log: Path, timeout: float = 300, env: dict | None = None):
    """`vllm serve model *args` on a free loopback port; yields (base URL, process) once /health
    answers. Raises ServerExited (with the log's tail) if it exits or is not healthy in time."""
    proc, base = spawn_vllm_serve(model, args, log, env)
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise ServerExited(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                http_get(base + "/health", timeout=2)
                break
            except OSError:
                if time.time() > deadline:
                    raise ServerExited(f"vllm serve not healthy after {timeout} s:\n{log.read_text()[-3000:]}")
                time.sleep(2)
        yield base, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
