"""vllm-specx: better speculative drafts for vLLM, as a plugin.

`register()` is the `vllm.general_plugins` entry point. vLLM calls it once in every process
(API server, EngineCore, workers); it is idempotent and imports nothing from vLLM until called,
so `import vllm_specx` stays cheap for the kernels and tools that run without vLLM.
"""

__version__ = "0.1.0"

_registered = False


def register() -> None:
    """Make vllm-specx's methods servable by the installed vLLM (idempotent).

    vLLM 0.32 / 0.33: register the draft architectures and install the V1-runner patches
    (`vllm_specx._vllm_compat`). vLLM 0.34: register the methods through vLLM's speculator API
    (`vllm_specx.speculator_api`), patching nothing. Any other version: RuntimeError naming the
    supported range (`vllm_specx.vllm_versions`).
    """
    global _registered
    if _registered:
        return
    import vllm

    from vllm_specx.vllm_versions import serving_path

    if serving_path(vllm.__version__) == "v2":
        from vllm_specx import speculator_api

        speculator_api.register()
    else:
        from vllm_specx import _vllm_compat

        _vllm_compat.install()
    _registered = True
