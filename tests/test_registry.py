"""The method registry: a toy method registered here alone (no shared module edited) is routed,
checked and listed by vllm-specx; built-in methods register themselves."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from vllm_specx import cli, registry
from vllm_specx.checkpoint import read_config_json, save_tensors
from vllm_specx.training import trainer

from .helpers import REF_TARGET, load_target, random_draft, write

TOY_ARCH = "ToySpecxModel"


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    source_format: str
    hidden_size: int
    drafts: int

    def __post_init__(self):
        if self.drafts < 1:
            raise ValueError(f"toy draft config: drafts must be >= 1, got {self.drafts}")

    @property
    def max_drafts(self) -> int:
        return self.drafts

    def check_target(self, target, num_speculative_tokens):
        if self.hidden_size != target["hidden_size"]:
            raise ValueError(f"toy draft hidden_size {self.hidden_size} != target {target['hidden_size']}")

    def expected_tensors(self):
        return {"toy.weight": (self.hidden_size,)}

    def to_dict(self):
        return dataclasses.asdict(self)

    def summary(self):
        return f"toy draft, {self.drafts} drafts"


def _toy_read(raw, where):
    toy = raw["toy"]
    if "drafts" not in toy:
        raise ValueError(f"{where}: missing required field 'toy.drafts'")
    return ToyConfig("toy", raw["hidden_size"], toy["drafts"])


def _toy_finish(hf, cfg):
    hf.toy_finished = cfg.drafts  # the method's own HF-config mirroring runs


TOY = registry.Method(
    name="toy", config_cls=ToyConfig, detect=lambda raw: "toy" if "toy" in raw else None,
    read_config=_toy_read, internal_method="dflash", arch=TOY_ARCH,
    vllm_archs=("DFlash" + TOY_ARCH,),  # vLLM's DFlash plumbing looks archs up with this prefix
    model_cls="vllm_specx.methods.dspark.vllm_model:SpecxDSparkForCausalLM",
    proposer_cls="vllm_specx.methods.dspark.proposer:DSparkProposer", finish_hf=_toy_finish,
    description="a method that exists only in this test")


@pytest.fixture
def toy():
    registry.register(TOY)
    yield TOY
    registry.unregister(TOY.name)


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory):
    """A draft directory that only the toy method claims: a Qwen3 layer config (so vLLM can build
    a draft model config from it) with a `toy` block instead of DSpark's `specx` block."""
    root = tmp_path_factory.mktemp("toy")
    dspark = write(random_draft(load_target(REF_TARGET)), root / "dspark")
    raw = read_config_json(dspark)
    raw.pop("specx")
    raw.update(architectures=[TOY_ARCH], toy={"drafts": 3})
    path = root / "toy"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(raw))
    save_tensors(path, {"toy.weight": torch.ones(raw["hidden_size"])})
    return path


def test_builtin_methods_register_themselves():
    known = registry.methods()
    assert "dspark" in known
    assert known["dspark"].proposer_cls.endswith("DSparkProposer")
    with pytest.raises(ValueError, match="unknown vllm-specx method 'nope'"):
        registry.get("nope")


def test_a_name_or_architecture_cannot_be_taken_twice(toy):
    with pytest.raises(ValueError, match="already registered"):
        registry.register(dataclasses.replace(TOY, description="another"))
    with pytest.raises(ValueError, match="reuses architecture"):
        registry.register(dataclasses.replace(TOY, name="toy2", vllm_archs=()))


def test_toy_method_is_routed(toy, toy_dir):
    method, cfg = registry.choose("toy", str(toy_dir), v2_would_run=False)
    assert method is TOY and cfg == ToyConfig("toy", 256, 3)
    assert registry.choose(None, str(toy_dir), v2_would_run=True)[0] is TOY  # detected from the checkpoint
    assert registry.choose("dspark", str(toy_dir), v2_would_run=False) is None  # not a DSpark draft


def test_toy_method_without_registration_is_left_to_vllm(toy_dir):
    assert registry.choose(None, str(toy_dir), v2_would_run=False) is None


def test_toy_method_routes_a_real_engine_config(toy, toy_dir):
    """vLLM's own SpeculativeConfig (method omitted: vLLM's Literal has no 'toy') goes through the
    route patch to the toy method, with its defaults, its HF mirroring and V1 kept."""
    from vllm.engine.arg_utils import EngineArgs

    cfg = EngineArgs(model=str(REF_TARGET), dtype="float32", max_model_len=512, enforce_eager=True,
                     speculative_config={"model": str(toy_dir)}).create_engine_config()
    hf = cfg.speculative_config.draft_model_config.hf_config
    assert hf.specx_route == "toy" and hf.specx_config == {"source_format": "toy", "hidden_size": 256,
                                                            "drafts": 3}
    assert hf.toy_finished == 3 and hf.architectures == [TOY_ARCH]
    assert cfg.speculative_config.num_speculative_tokens == 3  # the toy's max_drafts
    assert cfg.speculative_config.method == "dflash"  # the plumbing the toy reuses
    assert any("vllm-specx" in f for f in cfg._get_v2_model_runner_unsupported_features())
    assert registry.config_of(hf) == (TOY, ToyConfig("toy", 256, 3))


def test_toy_method_is_checked(toy, toy_dir, tmp_path, capsys):
    cli.main(["check", str(toy_dir), "--target", str(REF_TARGET)])
    assert "ok: method toy: toy draft, 3 drafts" in capsys.readouterr().out
    bad = tmp_path / "bad"
    bad.mkdir()
    raw = read_config_json(toy_dir)
    raw["toy"] = {}
    (bad / "config.json").write_text(json.dumps(raw))
    with pytest.raises(SystemExit, match="missing required field 'toy.drafts'"):
        cli.main(["check", str(bad), "--target", str(REF_TARGET)])
    raw["toy"] = {"drafts": 0}
    (bad / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="drafts must be >= 1"):
        registry.choose("toy", str(bad), v2_would_run=False)


def test_toy_method_is_listed(toy, capsys):
    cli.main(["methods"])
    out = capsys.readouterr().out
    assert "toy" in out and "a method that exists only in this test" in out and "dspark" in out
    assert "toy" not in registry.trainers()  # no trainer hooks: not offered by `train`
    assert "dspark" in registry.trainers() and "eagle3" in registry.trainers()


def test_unregistered_checkpoint_is_refused_by_check(toy_dir):
    with pytest.raises(SystemExit, match="not a checkpoint of any vllm-specx method"):
        cli.main(["check", str(toy_dir), "--target", str(REF_TARGET)])


def test_one_decoder_block_field_list():
    """The block fields a one-layer draft reads from its target are the ones its config.json
    writes (MTP and EAGLE-3 alike): one list, `checkpoint.DECODER_BLOCK_FIELDS`."""
    import json

    from vllm_specx.checkpoint import DECODER_BLOCK_FIELDS, decoder_block_fields
    from vllm_specx.methods.eagle3.config import Eagle3Config
    from vllm_specx.methods.mtp.checkpoint import config_json
    from vllm_specx.methods.mtp.config import MTPDraftConfig

    from .helpers import REF_TARGET

    target = json.loads((REF_TARGET / "config.json").read_text())
    read = decoder_block_fields(target)
    assert set(read) == set(DECODER_BLOCK_FIELDS) | {"target_hidden_size"}
    mtp = config_json(MTPDraftConfig.for_target(target))
    eagle = Eagle3Config.for_target(target, (1, 4, 6)).vllm_config_json()
    for written in (mtp, eagle):
        assert {f: written[f] for f in DECODER_BLOCK_FIELDS} == {f: read[f] for f in DECODER_BLOCK_FIELDS}
        assert written["num_hidden_layers"] == 1 and written["rope_parameters"]["rope_theta"] == read["rope_theta"]
