"""The plugin entry point, its idempotence, the version gate, and the patch manifest."""

from importlib.metadata import entry_points

import pytest

import vllm_specx
from vllm_specx import _vllm_compat
from vllm_specx._vllm_compat import MANIFEST, check_version


def test_entry_point_is_registered_with_vllm():
    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("specx") == "vllm_specx:register"


def test_register_is_idempotent_and_every_patch_took_effect():
    vllm_specx.register()
    first = [_vllm_compat._resolve(p.target)[2] for p in MANIFEST]
    vllm_specx._registered = False  # force a second full install in this process
    vllm_specx.register()
    second = [_vllm_compat._resolve(p.target)[2] for p in MANIFEST]
    assert first == second  # not wrapped twice
    assert all(getattr(fn, _vllm_compat._MARK) for fn in second)
    from vllm import ModelRegistry
    assert {"SpecxDSparkModel", "DFlashSpecxDSparkModel"} <= set(ModelRegistry.get_supported_archs())


def test_every_patch_says_why_and_when_to_remove():
    for p in MANIFEST:
        assert p.why and p.remove_when and ":" in p.target


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "1.0.0"])
def test_unsupported_vllm_version_fails_loudly(version):
    with pytest.raises(RuntimeError, match=f"found vLLM {version}"):
        check_version(version)


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.32.3"])
def test_supported_vllm_versions(version):
    check_version(version)
