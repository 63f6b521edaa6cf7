"""EAGLE-3, the baseline: trained by vllm-specx's trainer on the same on-policy data and budget as
our drafts, written in the format vLLM's built-in `eagle3` method loads, and served by vLLM
itself (`--speculative-config '{"method": "eagle3", "model": <dir>, ...}'`); routing never takes
it over. It exists so the claim "better drafts than vLLM's EAGLE-3" is measured against an
EAGLE-3 that saw exactly our data.

    config.py      Eagle3Config (vLLM's llama_eagle3 fields), checked in __post_init__
    model.py       the PyTorch reference / trainer model (vLLM's math, the drafting chain unrolled)
    checkpoint.py  vLLM-native save / load
    train.py       trainer hooks

Simplifications against published EAGLE-3 (said in the README): the draft scores the target's
full vocabulary with the target's own lm_head (no reduced draft vocabulary, no separate head).

Before vLLM serves a local EAGLE-3 draft, vllm-specx checks it (`checkpoint.check_vllm_draft`,
run by the route while the speculative config is built): taps the target can capture, its hidden
size, floating-point finite tensors; for drafts this trainer wrote, also the exact tensor set.
"""

from vllm_specx import registry
from vllm_specx.methods.eagle3.checkpoint import check_vllm_draft

BASELINE = registry.register_baseline(registry.Baseline(
    name="eagle3", vllm_method="eagle3", trainer="vllm_specx.methods.eagle3.train",
    check_draft=check_vllm_draft,
    description="EAGLE-3 baseline (one fused-tap Llama layer, training-time test), served by vLLM's built-in eagle3"))
