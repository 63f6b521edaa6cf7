"""Malformed drafts and speculative configs fail at start-up, in one line naming the field or file.

Every case builds the engine config (`EngineArgs(...).create_engine_config()`: what `vllm serve`
and `LLM(...)` run before any engine process starts) for one broken input and expects an error
with exactly one line that starts "vllm-specx:" and matches the case's pattern, which names the
field, or the file (and tensor). No case may pass silently (that would be a fallback to
no-spec, or a draft served with broken weights), hang, or get as far as an engine.

Drafts: a random DSpark head for the reference target (most cases), and the committed MTP and
EAGLE-3 drafts (`assets/drafts/ref-mtp`, `ref-eagle3`). The negative controls show the unbroken
drafts pass. `tests/e2e/test_serve_refuses_bad_drafts.py` runs three of these through a real
`vllm serve`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vllm_specx import registry

from .helpers import ASSETS, REF_TARGET, load_target, random_draft, write

COMMITTED = {"mtp": ASSETS / "drafts" / "ref-mtp", "eagle3": ASSETS / "drafts" / "ref-eagle3"}
K = {"dspark": 7, "mtp": 3, "eagle3": 3}  # num_speculative_tokens of a case unless it sets its own


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    dspark = write(random_draft(load_target(REF_TARGET)), tmp_path_factory.mktemp("good") / "dspark")
    return {"dspark": Path(dspark), **COMMITTED}


def engine_config(method: str, model, **spec):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(REF_TARGET), dtype="float32", max_model_len=512, enforce_eager=True,
                      speculative_config={"method": method, "model": str(model), **spec}
                      ).create_engine_config()


def specx_line(exc: BaseException) -> str:
    """The one line of `exc`'s message that vllm-specx wrote (pydantic wraps errors raised in
    SpeculativeConfig's post-init as "Value error, <message> [type=value_error, ...]")."""
    lines = [line.strip() for line in str(exc).splitlines() if "vllm-specx:" in line]
    assert len(lines) == 1, f"expected one vllm-specx line in:\n{exc}"
    line = lines[0].removeprefix("Value error, ").split(" [type=value_error")[0]
    assert line.startswith("vllm-specx:"), line
    return line


# ---- mutations of a copied draft directory ------------------------------------------------------

def edit_config(fn: Callable[[dict], None]):
    def mutate(d: Path):
        cfg = json.loads((d / "config.json").read_text())
        fn(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    return mutate


def specx(**fields):
    return edit_config(lambda c: c["specx"].update(fields))


def top(**fields):
    return edit_config(lambda c: c.update(fields))


def drop_specx(field):
    return edit_config(lambda c: c["specx"].pop(field))


def edit_tensors(fn: Callable[[dict[str, torch.Tensor]], None]):
    def mutate(d: Path):
        tensors = load_file(d / "model.safetensors")
        fn(tensors)
        save_file({k: v.contiguous() for k, v in tensors.items()}, d / "model.safetensors")
    return mutate


def poison(name: str, value: float, index=None):
    def fn(t):
        if index is None:
            t[name].fill_(value)
        else:
            t[name][index] = value
    return edit_tensors(fn)


def write_bytes(name: str, data: Callable[[bytes], bytes]):
    def mutate(d: Path):
        f = d / name
        f.write_bytes(data(f.read_bytes() if f.exists() else b""))
    return mutate


def unlink(name: str):
    return lambda d: (d / name).unlink()


def all_nan(t):
    for v in t.values():
        v.fill_(float("nan"))


def to_bf16_with_neg_inf(t):
    for k in t:
        t[k] = t[k].to(torch.bfloat16)
    t["layers.0.mlp.down_proj.weight"][1, 2] = float("-inf")


def second_file_with(name: str):
    def mutate(d: Path):
        save_file({name: load_file(d / "model.safetensors")[name]}, d / "extra.safetensors")
    return mutate


def config_json_folder(d: Path):
    (d / "config.json").unlink()
    (d / "config.json").mkdir()


@dataclass(frozen=True)
class Case:
    src: str                                     # dspark | mtp | eagle3
    pattern: str                                 # regex the vllm-specx line must match
    mutate: Callable[[Path], None] | None = None  # applied to a fresh copy of the draft
    spec: dict | None = None                     # speculative-config entries (default: K[src])
    model: Callable[[Path], Path] | None = None  # the `model` passed, from the copy's path
    unreadable: str | None = None                # chmod 000 this path (relative; "." = the folder)


SAFETENSORS = r"\S+/draft/model\.safetensors"
CASES: dict[str, Case] = {
    # -- the folder and config.json
    "missing-config-json": Case("dspark", r"draft checkpoint \S+/draft: no config\.json", unlink("config.json")),
    "path-does-not-exist": Case("dspark", r"speculative_config model '\S+/draft/no-such-draft': no such directory",
                                model=lambda d: d / "no-such-draft"),
    "file-instead-of-folder": Case("dspark", rf"speculative_config model '{SAFETENSORS}' is a file, not a directory",
                                   model=lambda d: d / "model.safetensors"),
    "config-json-is-a-folder": Case("dspark", r"draft checkpoint \S+/draft: no config\.json", config_json_folder),
    "config-invalid-json": Case("dspark", r"\S+/draft/config\.json: invalid JSON",
                                write_bytes("config.json", lambda b: b"{not json")),
    "config-not-an-object": Case("dspark", r"config\.json: invalid config \(a JSON object expected, got list\)",
                                 write_bytes("config.json", lambda b: b"[1, 2]")),
    "unreadable-folder": Case("dspark", r"draft checkpoint \S+/draft: permission denied", unreadable="."),
    "unreadable-config-json": Case("dspark", r"draft config \S+/draft/config\.json: permission denied",
                                   unreadable="config.json"),
    # -- the safetensors files
    "missing-safetensors": Case("dspark", r"draft checkpoint \S+/draft: no \*\.safetensors file",
                                unlink("model.safetensors")),
    "corrupt-safetensors": Case("dspark", rf"corrupt safetensors file {SAFETENSORS}: not a safetensors file",
                                write_bytes("model.safetensors", lambda b: b"\x08garbage")),
    "truncated-safetensors": Case("dspark", rf"corrupt safetensors file {SAFETENSORS}: truncated: \d+ bytes, "
                                            r"but its header declares \d+",
                                  write_bytes("model.safetensors", lambda b: b[:len(b) // 2])),
    "empty-safetensors": Case("dspark", rf"corrupt safetensors file {SAFETENSORS}: truncated: 0 bytes",
                              write_bytes("model.safetensors", lambda b: b"")),
    "unreadable-safetensors": Case("dspark", rf"safetensors file {SAFETENSORS}: permission denied",
                                   unreadable="model.safetensors"),
    "tensor-stored-twice": Case("dspark", r"tensor 'norm\.weight' is stored twice, in extra\.safetensors and "
                                          r"model\.safetensors", second_file_with("norm.weight")),
    # -- tensor names, shapes, dtypes
    "missing-tensor": Case("dspark", r"draft checkpoint \S+/draft: missing tensor\(s\) "
                                     r"\['markov_head\.markov_w2\.weight'\]",
                           edit_tensors(lambda t: t.pop("markov_head.markov_w2.weight"))),
    "extra-tensor": Case("dspark", r"unexpected tensor\(s\) \['extra_head\.weight'\] in model\.safetensors",
                         edit_tensors(lambda t: t.update({"extra_head.weight": torch.zeros(4, 256)}))),
    "wrong-tensor-shape": Case("dspark", r"tensor 'fc\.weight' has shape \[768, 256\], expected \[256, 768\]",
                               edit_tensors(lambda t: t.update({"fc.weight": t["fc.weight"].T}))),
    "shape-disagrees-with-config": Case("dspark", r"tensor 'layers\.0\.mlp\.gate_proj\.weight' has shape "
                                                  r"\[768, 256\], expected \[512, 256\]",
                                        top(intermediate_size=512)),
    "int-dtype": Case("dspark", r"tensor 'markov_head\.markov_w1\.weight' in model\.safetensors has dtype I32; "
                                r"draft weights must be floating point",
                      edit_tensors(lambda t: t.update({"markov_head.markov_w1.weight":
                                                       t["markov_head.markov_w1.weight"].to(torch.int32)}))),
    "float8-dtype": Case("dspark", r"tensor 'norm\.weight' in model\.safetensors has dtype F8_E4M3",
                         edit_tensors(lambda t: t.update({"norm.weight": t["norm.weight"].to(torch.float8_e4m3fn)}))),
    # -- values
    "all-nan-weights": Case("dspark", rf"tensor '[\w.]+' in {SAFETENSORS} has (\d+) NaN and 0 infinite value\(s\) "
                                      r"of \1; non-finite weights are refused at load", edit_tensors(all_nan)),
    "one-nan-weight": Case("dspark", rf"tensor 'norm\.weight' in {SAFETENSORS} has 1 NaN and 0 infinite "
                                     r"value\(s\) of 256", poison("norm.weight", float("nan"), 3)),
    "inf-weight": Case("dspark", r"tensor 'fc\.weight' in \S+ has 0 NaN and 1 infinite value\(s\) of 196608",
                       poison("fc.weight", float("inf"), (0, 0))),
    "neg-inf-weight-bf16": Case("dspark", r"tensor 'layers\.0\.mlp\.down_proj\.weight' in \S+ has 0 NaN and 1 "
                                          r"infinite", edit_tensors(to_bf16_with_neg_inf)),
    # -- the draft against the target
    "tap-outside-target": Case("dspark", r"target_layer_ids \[1, 4, 8\]: layer\(s\) \[8\] outside the target's 8 "
                                         r"layers", specx(target_layer_ids=[1, 4, 8])),
    "duplicate-taps": Case("dspark", r"config\.json: .*target_layer_ids \[1, 4, 4\] must be distinct",
                           specx(target_layer_ids=[1, 4, 4])),
    "negative-tap": Case("dspark", r"config\.json: .*target_layer_ids \[-1, 4, 6\] must be distinct, ascending "
                                   r"and >= 0", specx(target_layer_ids=[-1, 4, 6])),
    "hidden-mismatch": Case("dspark", r"target_hidden_size 128 != target hidden_size 256",
                            specx(target_hidden_size=128)),
    "vocab-mismatch": Case("dspark", r"vocab_size 5000 != target vocab_size 4096", top(vocab_size=5000)),
    # -- config fields
    "block-size-0": Case("dspark", r"config\.json: .*block_size must be positive, got 0", specx(block_size=0)),
    "block-size-1": Case("dspark", r"config\.json: .*block_size must be >= 2", specx(block_size=1)),
    "block-size-not-a-number": Case("dspark", r"config\.json: field 'block_size' must be an integer, got 'eight'",
                                    specx(block_size="eight")),
    "block-size-beyond-limit": Case("dspark", r"block_size 200 \(anchor layout\) gives 200 drafts per pass by "
                                              r"default, beyond vLLM's limit of 128", specx(block_size=200), spec={}),
    "missing-required-field": Case("dspark", r"config\.json: missing required field 'markov_rank'",
                                   drop_specx("markov_rank")),
    "unknown-specx-field": Case("dspark", r"config\.json: unknown field\(s\) \['specx\.bogus'\]", specx(bogus=1)),
    "future-format-version": Case("dspark", r"specx\.format_version 4 is not supported", specx(format_version=4)),
    "unknown-markov-head": Case("dspark", r"markov_head_type 'lstm' not one of", specx(markov_head_type="lstm")),
    "mask-token-outside-vocab": Case("dspark", r"mask_token_id 4096 outside vocab_size 4096",
                                     specx(mask_token_id=4096)),
    "sliding-window-0": Case("dspark", r"sliding_window must be a positive integer or null, got 0",
                             specx(sliding_window=0)),
    # -- the speculative config
    "k-zero": Case("dspark", r"method 'dspark': speculative_config option 'num_speculative_tokens' = 0: must be "
                             r"a positive integer", spec={"num_speculative_tokens": 0}),
    "k-negative": Case("dspark", r"'num_speculative_tokens' = -2: must be a positive integer",
                       spec={"num_speculative_tokens": -2}),
    "k-beyond-block": Case("dspark", r"num_speculative_tokens 9 exceeds this DSpark draft's block: block_size 8",
                           spec={"num_speculative_tokens": 9}),
    "k-beyond-vllm-limit": Case("dspark", r"num_speculative_tokens 129 is beyond vLLM's limit of 128",
                                specx(block_size=200), spec={"num_speculative_tokens": 129}),
    "unknown-option": Case("dspark", r"method 'dspark': speculative_config option\(s\) \['bogus_option'\] are "
                                     r"not options", spec={"num_speculative_tokens": 7, "bogus_option": 1}),
    "misspelled-option": Case("dspark", r"option\(s\) \['num_speculative_token'\] are not options",
                              spec={"num_speculative_token": 7}),
    "refused-option": Case("dspark", r"option 'quantization' \(= 'fp8'\) is not supported",
                           spec={"num_speculative_tokens": 7, "quantization": "fp8"}),
    # -- MTP drafts
    "mtp-missing-config-json": Case("mtp", r"draft checkpoint \S+/draft: no config\.json", unlink("config.json")),
    "mtp-nan-weights": Case("mtp", rf"tensor 'eh_proj\.weight' in {SAFETENSORS} has 131072 NaN",
                            poison("eh_proj.weight", float("nan"))),
    "mtp-extra-tensor": Case("mtp", r"unexpected tensor\(s\) \['mtp_block\.self_attn\.rotary_emb\.inv_freq'\]",
                             edit_tensors(lambda t: t.update({"mtp_block.self_attn.rotary_emb.inv_freq":
                                                              torch.ones(16)}))),
    "mtp-int-dtype": Case("mtp", r"tensor 'hnorm\.weight' in model\.safetensors has dtype I64",
                          edit_tensors(lambda t: t.update({"hnorm.weight": t["hnorm.weight"].long()}))),
    "mtp-truncated-safetensors": Case("mtp", rf"corrupt safetensors file {SAFETENSORS}: truncated",
                                      write_bytes("model.safetensors", lambda b: b[:-100])),
    "mtp-vocab-mismatch": Case("mtp", r"vocab_size = 5000 but the target's vocab_size is 4096", specx(vocab_size=5000)),
    "mtp-fusion-layers-outside-target": Case("mtp", r"fusion_layer_ids \[3, 9\] must be distinct ascending layers "
                                                    r"of the target \(0\.\.7\)", specx(fusion_layer_ids=[3, 9])),
    "mtp-max-drafts-beyond-limit": Case("mtp", r"specx\.max_drafts 200 gives 200 drafts per pass by default, beyond "
                                               r"vLLM's limit of 128", specx(max_drafts=200), spec={}),
    "mtp-k-zero": Case("mtp", r"method 'mtp': speculative_config option 'num_speculative_tokens' = 0",
                       spec={"num_speculative_tokens": 0}),
    "mtp-unknown-specx-field": Case("mtp", r"unknown field\(s\) \['specx\.index_share'\]", specx(index_share=True)),
    # -- EAGLE-3 drafts (served by vLLM's own eagle3; checked by vllm-specx first)
    "eagle3-missing-config-json": Case("eagle3", r"draft checkpoint \S+/draft: no config\.json", unlink("config.json")),
    "eagle3-file-instead-of-folder": Case("eagle3", r"'\S+/draft/config\.json' is a file, not a directory",
                                          model=lambda d: d / "config.json"),
    "eagle3-nan-weights": Case("eagle3", rf"tensor 'fc\.weight' in {SAFETENSORS} has 196608 NaN",
                               poison("fc.weight", float("nan"))),
    "eagle3-taps-outside-target": Case("eagle3", r"config\.json: eagle_aux_hidden_state_layer_ids \[2, 5, 12\]: "
                                                 r"id\(s\) \[12\] outside the target's 8 layers",
                                       top(eagle_aux_hidden_state_layer_ids=[2, 5, 12])),
    "eagle3-hidden-mismatch": Case("eagle3", r"config\.json: target_hidden_size 128 != target hidden_size 256",
                                   top(target_hidden_size=128)),
    "eagle3-vocab-mismatch": Case("eagle3", r"vocab_size 5000 != target vocab_size 4096",
                                  top(vocab_size=5000, draft_vocab_size=5000)),
    "eagle3-extra-tensor": Case("eagle3", r"unexpected tensor\(s\) \['midlayer\.self_attn\.rotary_emb\.inv_freq'\]",
                                edit_tensors(lambda t: t.update({"midlayer.self_attn.rotary_emb.inv_freq":
                                                                 torch.ones(16)}))),
    "eagle3-int-dtype": Case("eagle3", r"tensor 'norm\.weight' in model\.safetensors has dtype I64",
                             edit_tensors(lambda t: t.update({"norm.weight": t["norm.weight"].long()}))),
    "eagle3-truncated-safetensors": Case("eagle3", rf"corrupt safetensors file {SAFETENSORS}: truncated",
                                         write_bytes("model.safetensors", lambda b: b[:4096])),
    "eagle3-k-zero": Case("eagle3", r"method 'eagle3': speculative_config option 'num_speculative_tokens' = 0",
                          spec={"num_speculative_tokens": 0}),
}


def _access_as_non_root(real_access):
    """os.access as an unprivileged owner sees it: the owner's permission bits decide. Root
    bypasses them, so on a root test run chmod 000 alone would not make a file unreadable."""
    def access(path, mode, *args, **kwargs):
        try:
            bits = (os.stat(path).st_mode >> 6) & 7
        except OSError:
            return real_access(path, mode, *args, **kwargs)
        need = (4 if mode & os.R_OK else 0) | (2 if mode & os.W_OK else 0) | (1 if mode & os.X_OK else 0)
        return bits & need == need
    return access


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_draft_fails_at_startup_naming_the_field_or_file(tmp_path, sources, monkeypatch, case):
    c = CASES[case]
    draft = tmp_path / "draft"
    shutil.copytree(sources[c.src], draft)
    if c.mutate:
        c.mutate(draft)
    model = c.model(draft) if c.model else draft
    spec = {"num_speculative_tokens": K[c.src]} if c.spec is None else c.spec
    locked = None
    if c.unreadable:
        locked = draft / c.unreadable
        locked.chmod(0)
        if os.geteuid() == 0:  # root reads anything: simulate an unprivileged owner (os.access)
            monkeypatch.setattr(os, "access", _access_as_non_root(os.access))
    try:
        with pytest.raises(Exception) as info:
            engine_config(c.src, model, **spec)
    finally:
        if locked is not None:
            locked.chmod(stat.S_IRWXU)
    line = specx_line(info.value)
    assert re.search(c.pattern, line), f"{case}: {line!r} does not match {c.pattern!r}"


def test_at_least_thirty_cases_covering_every_method():
    assert len(CASES) >= 30
    assert {c.src for c in CASES.values()} == {"dspark", "mtp", "eagle3"}


@pytest.mark.parametrize("src", ["dspark", "mtp", "eagle3"])
def test_good_drafts_pass_and_keep_speculation(sources, src):
    """Negative controls: the unbroken drafts build an engine config with speculation on (a check
    that refused them, or a route that dropped them, would show here)."""
    cfg = engine_config(src, sources[src], num_speculative_tokens=K[src])
    spec = cfg.speculative_config
    assert spec is not None and spec.num_speculative_tokens == K[src]
    route = getattr(spec.draft_model_config.hf_config, "specx_route", None)
    assert route == (None if src == "eagle3" else src)
    if src == "eagle3":
        assert spec.method == "eagle3"


def test_max_drafts_per_pass_is_vllms_limit():
    from vllm.v1.sample.rejection_sampler import MAX_SPEC_LEN

    assert registry.MAX_DRAFTS_PER_PASS == MAX_SPEC_LEN


def test_a_nan_draft_is_refused_by_the_check_command_too(sources, tmp_path):
    """`vllm-specx check` and the benchmarks run the same checks (`registry.check_draft`)."""
    draft = tmp_path / "draft"
    shutil.copytree(sources["dspark"], draft)
    poison("hidden_norm.weight", float("nan"), 0)(draft)
    method, cfg = registry.read_checkpoint(draft)
    target = {"hidden_size": 256, "num_hidden_layers": 8, "vocab_size": 4096}
    with pytest.raises(ValueError, match=r"tensor 'hidden_norm\.weight' in \S+ has 1 NaN"):
        registry.check_draft(method, cfg, draft, target, 7)


def test_other_methods_keep_vllms_own_errors():
    """A config vllm-specx does not check (here ngram) keeps vLLM's report for a bad field."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="num_speculative_tokens"):
        engine_config("ngram", "", num_speculative_tokens=0, prompt_lookup_max=3)


_AS_NOBODY = """
import sys
from vllm_specx.checkpoint import check_draft_dir, check_tensors
for path in sys.argv[1:]:
    try:
        check_draft_dir(path)
        check_tensors(path, None)
        print("accepted", path)
    except ValueError as e:
        print(e)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="not root (the table above chmods for real) or no setpriv")
def test_unreadable_drafts_as_a_real_unprivileged_user(sources):
    """On a root run the table simulates an unprivileged owner; here the same checks run for real
    as uid 65534 (nobody) on chmod-000 copies."""
    import subprocess
    import sys
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="specx-perm-", dir="/tmp"))
    try:
        root.chmod(0o755)
        locked = {"folder": ".", "config": "config.json", "weights": "model.safetensors"}
        for name, rel in locked.items():
            shutil.copytree(COMMITTED["mtp"], root / name)
            for p in [root / name, *(root / name).iterdir()]:
                p.chmod(0o755 if p.is_dir() else 0o644)
            (root / name / rel).chmod(0)
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                              sys.executable, "-c", _AS_NOBODY, *(str(root / n) for n in locked)],
                             capture_output=True, text=True, timeout=120, env=env)
        if "Permission denied" in out.stderr and "vllm_specx" not in out.stdout + out.stderr:
            pytest.skip(f"uid 65534 cannot run this interpreter: {out.stderr[-300:]}")
        lines = out.stdout.splitlines()
        assert lines == [f"draft checkpoint {root}/folder: permission denied (this process cannot list it)",
                         f"draft config {root}/config/config.json: permission denied (this process cannot "
                         f"read it)",
                         f"safetensors file {root}/weights/model.safetensors: permission denied (this "
                         f"process cannot read it)"], out.stdout + out.stderr
    finally:
        for p in root.rglob("*"):
            p.chmod(0o755)
        (root / "folder").chmod(0o755)
        shutil.rmtree(root)
