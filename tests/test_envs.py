"""Every `VLLM_SPECX_*` switch is in `vllm_specx.envs.ENVS`, read through `envs.get` only, and
listed in docs/envs.md; a value a switch does not take is refused naming the variable."""

import re
from pathlib import Path

import pytest

from vllm_specx import envs, registry

registry.methods()  # the methods register their own switches on import

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "vllm_specx"


def test_every_switch_named_in_the_package_is_in_the_table():
    named = {m for src in PKG.rglob("*.py") for m in re.findall(r"VLLM_SPECX_[A-Z0-9_]+", src.read_text())}
    assert named, "the scan found nothing: it cannot fail"
    assert named <= set(envs.ENVS), f"not in vllm_specx.envs.ENVS: {sorted(named - set(envs.ENVS))}"


def _direct_reads(text: str) -> list[str]:
    """`os.environ` reads of a VLLM_SPECX_* name, given literally or by a constant of the file."""
    names = ["\"VLLM_SPECX_"] + re.findall(r"^(\w+) = \"VLLM_SPECX_\w+\"", text, re.M)
    return [n for n in names if re.search(r"os\.(environ\.get\(|environ\[|getenv\()\s*" + re.escape(n), text)]


def test_switches_are_read_through_envs_only():
    direct = [f"{src.relative_to(ROOT)}" for src in PKG.rglob("*.py") if src.name != "envs.py" and _direct_reads(src.read_text())]
    assert not direct, f"read VLLM_SPECX_* switches through vllm_specx.envs.get: {direct}"
    # negative control: the scan sees a direct read
    assert _direct_reads('X_ENV = "VLLM_SPECX_X"\nv = os.environ.get(X_ENV, "1")\n')


def test_docs_list_every_switch():
    doc = (ROOT / "docs" / "envs.md").read_text()
    assert envs.table() in doc, "docs/envs.md: paste vllm_specx.envs.table() (python -c 'from vllm_specx import envs; print(envs.table())')"


def test_a_value_a_switch_does_not_take_is_refused(monkeypatch):
    monkeypatch.setenv("VLLM_SPECX_SAMPLER", "fast")
    with pytest.raises(ValueError, match=r"VLLM_SPECX_SAMPLER='fast': expected specx or vllm"):
        envs.get("VLLM_SPECX_SAMPLER")
    monkeypatch.delenv("VLLM_SPECX_SAMPLER")
    assert envs.get("VLLM_SPECX_SAMPLER") == "specx"  # the default
    with pytest.raises(KeyError):
        envs.get("VLLM_SPECX_NOT_A_SWITCH")
