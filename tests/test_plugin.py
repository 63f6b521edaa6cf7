"""The plugin entry point, its idempotence, the version gate, the patch manifest, and the
install check: each patch's probe exercises its effect, and fails when the patch is broken."""

import functools
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
    first = [_vllm_compat.resolve(p.target)[2] for p in MANIFEST]
    vllm_specx._registered = False  # force a second full install in this process
    vllm_specx.register()
    second = [_vllm_compat.resolve(p.target)[2] for p in MANIFEST]
    assert first == second  # not wrapped twice
    assert all(getattr(fn, _vllm_compat._MARK) for fn in second)
    from vllm import ModelRegistry
    assert {"SpecxDSparkModel", "DFlashSpecxDSparkModel"} <= set(ModelRegistry.get_supported_archs())


def test_every_patch_says_why_and_when_to_remove():
    for p in MANIFEST:
        assert p.why and p.remove_when and ":" in p.target


def test_every_patch_declares_a_probe_and_the_installed_patches_pass_it():
    vllm_specx.register()
    assert all(p.probe is not None for p in MANIFEST), [p.key for p in MANIFEST if p.probe is None]
    _vllm_compat.check()
    for p in MANIFEST:
        if p.wrap:
            assert _vllm_compat.resolve(p.target)[2].__wrapped__ is _vllm_compat.original(p.key)


def _marked(fn):
    setattr(fn, _vllm_compat._MARK, True)  # what HEAD's install() read to decide "took effect"
    return fn


BROKEN = {
    # the target is vLLM's original again, carrying our marker
    "original": lambda orig: _marked(functools.wraps(orig)(lambda *a, **k: orig(*a, **k))),
    # the target does nothing, carrying our marker
    "noop": lambda orig: _marked(functools.wraps(orig)(lambda *a, **k: None)),
}


@pytest.mark.parametrize("how", list(BROKEN))
@pytest.mark.parametrize("key", [p.key for p in MANIFEST])
def test_install_check_fails_when_a_patch_is_broken(monkeypatch, key, how):
    """The check runs each patch's effect, so a target that only carries the marker fails it
    (HEAD re-read the marker it had just set and passed)."""
    vllm_specx.register()
    p = _vllm_compat.get_patch(key)
    owner, name, _ = _vllm_compat.resolve(p.target)
    monkeypatch.setattr(owner, name, BROKEN[how](_vllm_compat.original(key)))
    with pytest.raises(RuntimeError, match=f"patch '{key}' of {p.target} did not take effect"):
        _vllm_compat.install()


@pytest.mark.parametrize("version", ["0.31.2", "0.34.0", "1.0.0"])
def test_unsupported_vllm_version_fails_loudly(version):
    with pytest.raises(RuntimeError, match=f"found vLLM {version}"):
        check_version(version)


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.32.3", "0.33.0", "0.33.2"])
def test_supported_vllm_versions(version):
    check_version(version)
