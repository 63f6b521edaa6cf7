"""vllm-specx: better speculative drafts for vLLM, as a plugin.

`register()` is the `vllm.general_plugins` entry point. vLLM calls it once in every process
(API server, EngineCore, workers); it is idempotent and imports nothing from vLLM until called,
so `import vllm_specx` stays cheap for the kernels and tools that run without vLLM.
"""

__version__ = "0.1.0"

_registered = False


def register() -> None:
    """Register vllm-specx's methods' draft architectures and install its vLLM patches (idempotent)."""
    global _registered
    if _registered:
        return
    from vllm_specx import _vllm_compat

    _vllm_compat.install()
    _registered = True
