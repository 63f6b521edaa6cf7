"""End-to-end speculative decoding in vLLM: the benchmark suite (`vllm_specx.bench.e2e`, also
`vllm-specx bench`), with the same flags. For example

    python benchmarks/bench_e2e.py --target smollm2 --prompts humaneval --out benchmarks/results/e2e-smollm2-humaneval
    python benchmarks/bench_e2e.py --target ref --prompts code --limit 32 --draft assets/drafts/ref-dspark --out runs/bench

See `python benchmarks/bench_e2e.py --help` and the README's Results section.
"""

import sys

from vllm_specx.bench.e2e import main

if __name__ == "__main__":
    main(sys.argv[1:])
