"""Patch `keep-v1`: engines with vllm-specx drafts stay on vLLM's V1 model runner."""

from __future__ import annotations

from vllm_specx import registry
from vllm_specx._vllm_compat.patching import Blank, patch, probe, resolve, route_of

UNSUPPORTED = "vllm-specx drafts (their proposers run on the V1 runner)"
TARGET = "vllm.config.vllm:VllmConfig._get_v2_model_runner_unsupported_features"


@patch("keep-v1", TARGET,
       why="keep engines with vllm-specx drafts on the V1 runner, where our proposers run; "
           "vLLM then logs 'Model Runner V2 does not yet support vllm-specx drafts'",
       remove_when="our proposers also implement the V2 speculator interface")
def v2_unsupported_features(orig):
    def _get_v2_model_runner_unsupported_features(self):
        unsupported = orig(self)
        if route_of(self) is not None:
            unsupported.append(UNSUPPORTED)
        return unsupported

    return _get_v2_model_runner_unsupported_features


def _fake_vllm_config(route: str | None):
    hf = Blank(specx_route=route) if route else Blank()
    return Blank(speculative_config=Blank(draft_model_config=Blank(hf_config=hf)))


@probe("keep-v1")
def _probe_keep_v1():
    """A (fake) config whose draft was routed gains our entry; one without a route does not."""
    fn = resolve(TARGET)[2]
    name = next(iter(registry.methods()))
    routed, plain = fn(_fake_vllm_config(name)), fn(_fake_vllm_config(None))
    if UNSUPPORTED not in (routed or []):
        raise RuntimeError(f"a routed config's V2-unsupported features are {routed!r}, without ours")
    if UNSUPPORTED in (plain or []):
        raise RuntimeError("a config without a vllm-specx draft was kept off V2 too")
