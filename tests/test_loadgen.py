"""The load client's own checks (`vllm_specx.bench.loadgen`), engine-free: each flags what it should
(negative controls for tests/e2e/test_load.py) and the request mix is what the test relies on."""

from vllm_specx.bench import loadgen

METRICS = """# HELP vllm:spec_decode_num_drafts_total x
vllm:spec_decode_num_drafts_total{engine="0",model_name="ref"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="ref"} 70.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="ref"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="ref",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="ref",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="ref",position="2"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="ref"} 0.0
"""


def test_counters_parse_and_pass():
    spec = loadgen.spec_counters(METRICS)
    assert spec == {"drafts": 10.0, "draft_tokens": 70.0, "accepted_tokens": 12.0,
                    "accepted_per_position": [7.0, 4.0, 1.0]}
    assert loadgen.counter_problems(spec) == []


def test_inconsistent_counters_are_flagged():
    spec = loadgen.spec_counters(METRICS)
    assert "not monotone" in loadgen.counter_problems({**spec, "accepted_per_position": [4.0, 7.0, 1.0]})[0]
    assert "> drafted" in loadgen.counter_problems({**spec, "draft_tokens": 5.0})[0]
    assert "sums to" in loadgen.counter_problems({**spec, "accepted_tokens": 13.0})[0]


def test_lost_requests_are_flagged_and_aborts_are_not():
    req = loadgen.Request("p", {"max_tokens": 8, "n": 2, "ignore_eos": True})
    ok = loadgen.Result(req, tokens=16, finish=["length", "length"])
    short = loadgen.Result(req, tokens=15, finish=["length", "length"])
    stopped = loadgen.Result(req, tokens=16, finish=["length", "stop"])
    failed = loadgen.Result(req, error="HTTP 500")
    aborted = loadgen.Result(req, tokens=3, aborted=True)
    assert loadgen.problems([ok, aborted]) == []
    assert len(loadgen.problems([short, stopped, failed])) == 3
    eos = loadgen.Request("p", {"max_tokens": 8, "ignore_eos": False})
    assert loadgen.problems([loadgen.Result(eos, tokens=5, finish=["stop"])]) == []
    assert len(loadgen.problems([loadgen.Result(eos, tokens=0, finish=["stop"])])) == 1


def test_request_mix():
    reqs = loadgen.make_requests(["a", "b"], 64, abort_fraction=0.25, seed=13, alone=8)
    assert reqs == loadgen.make_requests(["a", "b"], 64, abort_fraction=0.25, seed=13, alone=8)
    assert sum(r.abort_after is not None for r in reqs) in (15, 16)
    assert all(r.params.get("n", 1) == 1 or r.params["temperature"] > 0 for r in reqs)  # vLLM: n > 1 samples
    assert any("seed" in r.params for r in reqs) and any("seed" not in r.params for r in reqs)
    lone = [r for r in reqs if r.alone]
    assert len(lone) == 8 and lone[0].params["top_k"] == 20 and lone[0].params["top_p"] == 1.0
    greedy = loadgen.make_requests(["a"], 4, mix=False, arrival_rate=2.0)
    assert all(r.params["temperature"] == 0 for r in greedy) and greedy[0].delay == 0 < greedy[-1].delay
