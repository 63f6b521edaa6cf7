"""Benchmark, load and evaluation tooling (not the serving path; training does not import it).

    e2e.py      the end-to-end benchmark suite (`vllm-specx bench`): providers as plot lines
                (no-spec, n-gram, suffix, EAGLE-3, our drafts, `+adaptive`), JSON + table + PNG
    eval.py     tau, per-position acceptance and tokens/s of one speculative config (the demo,
                the benchmark, the trained-head tests)
    loadgen.py  load against `vllm serve` (concurrent streams, aborts, health checks)
    load.py     the load benchmark (`vllm-specx load`)
"""
