"""Patch `keep-v1`: engines with vllm-specx drafts stay on vLLM's V1 model runner."""

from __future__ import annotations

from vllm_specx._vllm_compat import patch, route_of

UNSUPPORTED = "vllm-specx drafts (their proposers run on the V1 runner)"


@patch("keep-v1", "vllm.config.vllm:VllmConfig._get_v2_model_runner_unsupported_features",
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
