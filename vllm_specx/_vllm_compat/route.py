"""Patch `route`: send speculative configs whose draft belongs to a registered method to that
method's plumbing, and check the draft against the target before any engine starts."""

from __future__ import annotations

from vllm_specx import registry
from vllm_specx._vllm_compat import logger, patch, register_archs


def v2_would_run() -> bool:
    """Whether vLLM would pick its V2 model runner for this process's engines."""
    import vllm.envs as envs
    from vllm.triton_utils import HAS_TRITON

    forced = envs.VLLM_USE_V2_MODEL_RUNNER
    return bool(forced) if forced is not None else bool(HAS_TRITON)


@patch("route", "vllm.config.speculative:SpeculativeConfig.__post_init__",
       why="route a speculative config whose draft checkpoint belongs to a registered vllm-specx "
           "method (`registry.choose`) to the vLLM plumbing that method reuses, with its "
           "architecture, and check the draft against the target before any engine starts; "
           "vLLM has no way to add a speculative method (a closed Literal) and would otherwise "
           "treat the draft as one of its own (and rewrite it to vLLM's architecture)",
       remove_when="vLLM has a registry for speculative methods / proposers")
def speculative_post_init(orig):
    def __post_init__(self):
        choice = registry.choose(self.method, self.model, v2_would_run())
        if choice is None:
            return orig(self)
        method, cfg = choice
        if self.num_speculative_tokens is None:
            self.num_speculative_tokens = cfg.max_drafts
        self.method = method.internal_method
        register_archs(method)  # before vLLM validates the draft's architecture (also for methods
        orig(self)              # registered after install())
        finish_route(self, method, cfg)

    return __post_init__


def finish_route(spec, method: registry.Method, cfg) -> None:
    """Check the draft, point the draft config at the method's architecture, let the method
    mirror its fields into the keys vLLM reads, and store the config for the workers."""
    target = spec.target_model_config.hf_config.get_text_config()
    registry.check_draft(method, cfg, spec.model, registry.target_dims(target), spec.num_speculative_tokens)
    hf = spec.draft_model_config.hf_config
    hf.architectures = [method.arch]
    method.finish_hf(hf, cfg)
    hf.specx_route = method.name
    hf.specx_config = cfg.to_dict()
    spec.update_arch_()
    logger.info("vllm-specx: method %r with draft %s -> %s (%s format, %d drafts per pass)",
                method.name, spec.model, method.proposer_cls, cfg.source_format,
                spec.num_speculative_tokens)
