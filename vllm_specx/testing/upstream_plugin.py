"""TEST HARNESS: a pytest plugin for running vLLM 0.34's own tests with vllm-specx installed.

`scripts/vllm034_upstream_tests.sh` runs vLLM's `tests/v1/spec_decode/test_custom_speculator.py`
and `tests/v1/e2e/test_cpu_spec_decode.py` (from vLLM's sdist) with `-p
vllm_specx.testing.upstream_plugin`. The plugin

- loads vLLM's general plugins before any test (what every vLLM process does), so vllm-specx's
  methods are registered with vLLM's speculator API while vLLM's tests run, and fails the session
  if they are not (the run would otherwise not test "with our plugin installed");
- with `--specx-local-model DIR`, points `test_cpu_spec_decode.MODEL` (a hub model id,
  `Qwen/Qwen3-0.6B`) at a local model directory: the package index is the only network here;
- with `--specx-smoke-draft ID=METHOD:DIR:K` (repeatable), runs that module's
  `test_speculator_smoke` (vLLM's acceptance floor, 1.5 tokens a pass) config ID on the local model
  with our draft DIR served by METHOD in place of its hub pair (the script passes our SmolLM2
  drafts; in the control run, without our plugin, only vLLM's own EAGLE-3); configs given no draft
  are skipped;
- with `--specx-engine-arg KEY=JSON` (repeatable), builds that module's engines with these
  arguments over its own: `dtype="float32"` (Triton's interpreter, this machine's stand-in for
  triton-cpu, `triton_harness`, computes NaN in vLLM's bfloat16 sampling kernels, "All-NaN slice
  encountered", with or without vllm-specx) and `enforce_eager=true` (the test compiles the model
  with torch.compile otherwise: over 25 min on 2 cores before the first token).

With VLLM_PLUGINS=none (the control run) vLLM loads no plugin and this one only does the two
substitutions above, so a failure seen both ways is vLLM's (or the harness's), not vllm-specx's.
"""

from __future__ import annotations

import pytest

# vLLM internals this module uses (the layout test's manifest; they exist in vLLM 0.34)
VLLM_INTERNALS_V2 = ("vllm.plugins:load_general_plugins", "vllm.v1.worker.gpu.spec_decode:speculator_config")


def pytest_addoption(parser):
    parser.addoption("--specx-local-model", default=None,
                     help="local model directory for vLLM tests that name a hub model (test_cpu_spec_decode.MODEL)")
    parser.addoption("--specx-smoke-draft", action="append", default=[],
                     help="ID=METHOD:DIR:K: test_speculator_smoke's config ID run with this draft on the local model")
    parser.addoption("--specx-engine-arg", action="append", default=[],
                     help="KEY=JSON: an engine argument of test_cpu_spec_decode's engines over its own")


def pytest_configure(config):
    import os

    if os.environ.get("VLLM_PLUGINS") == "none":  # the control run: vLLM without vllm-specx's plugin
        config._specx_registered = ["none (VLLM_PLUGINS=none: the control run)"]
        return
    from vllm.plugins import load_general_plugins
    from vllm.v1.worker.gpu.spec_decode import speculator_config

    from vllm_specx import speculator_api

    load_general_plugins()
    registered = set(speculator_config._CUSTOM_CONFIGS)
    want = set(speculator_api.method_names())
    if not want or not want <= registered:
        raise pytest.UsageError(f"vllm-specx's plugin did not register {sorted(want - registered)} "
                                f"(registered: {sorted(registered)}): is vllm-specx installed in this venv?")
    config._specx_registered = sorted(want)


def pytest_report_header(config):
    return f"vllm-specx plugin loaded: {', '.join(getattr(config, '_specx_registered', []))} registered"


def pytest_collection_modifyitems(config, items):
    import json

    from pathlib import Path

    local = config.getoption("--specx-local-model")
    smoke = {i: tuple(v.split(":")) for i, _, v in (a.partition("=") for a in config.getoption("--specx-smoke-draft"))}
    engine = {k: json.loads(v) for k, _, v in (a.partition("=") for a in config.getoption("--specx-engine-arg"))}
    done = set()
    for item in items:
        module = getattr(item, "module", None)
        if module is None or not module.__name__.endswith("test_cpu_spec_decode"):
            continue
        if smoke and local and item.originalname == "test_speculator_smoke":
            method, draft, k = smoke.get(item.callspec.id, (None, None, None))
            if method is None:
                item.add_marker(pytest.mark.skip(reason="no local draft given (--specx-smoke-draft)"))
            else:
                item._specx_smoke = {"model": local, "speculative_config": {
                    "method": method, "model": str(Path(draft)), "num_speculative_tokens": int(k)}}
        if module in done:
            continue
        done.add(module)
        if smoke and hasattr(module, "compute_acceptance_len"):
            module.compute_acceptance_len = _reported(module.compute_acceptance_len)
        if local:
            module.MODEL = local
        if engine:
            make = module._make_llm
            module._make_llm = lambda _make=make, **overrides: _make(**{**engine, **overrides})


def _reported(compute):
    """vLLM's acceptance-length helper, its value also written to the terminal (sys.__stderr__: past
    pytest's capture when it captures at the sys level, `--capture=sys`, as the script runs it)."""
    import sys

    def wrapped(*args, **kwargs):
        value = compute(*args, **kwargs)
        print(f"specx: acceptance length {value:.3f}", file=sys.__stderr__, flush=True)
        return value
    return wrapped


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """test_speculator_smoke called with our local target and draft in place of its hub pair."""
    args = getattr(pyfuncitem, "_specx_smoke", None)
    if args is None:
        return None
    import sys

    print(f"specx: {pyfuncitem.callspec.id} -> {args}", file=sys.__stderr__, flush=True)
    pyfuncitem.obj(**args)
    return True
