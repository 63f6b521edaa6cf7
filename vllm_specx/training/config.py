"""A training run's arguments: the `vllm-specx train` flags (`parser`, `parse_args`, `--config`
re-running a recorded run), the typed config the stages take (`TrainConfig`), the method's trainer
hooks by name (`hooks`), the file names a run writes, and the flags that re-run a run
(`command_flags`) or that a `--resume` must repeat (`run_args`)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from pathlib import Path

from vllm_specx import registry
from vllm_specx.training.losses import CONFIDENCE_LABELS, CONFIDENCE_SLOTS, LOSSES

# `vllm-specx train --help`'s description (the first line of `vllm_specx.training.trainer`'s docstring).
DESCRIPTION = "One training loop for every trainable method and baseline in the registry; it never names a method."
STATE_FILE = "trainer_state.pt"
RECORD_FILE = "training.json"
# `--train-only` parts: the parameters (by name prefix) that stay trainable.
TRAIN_ONLY = {"confidence": "confidence_head."}


def hooks(method_name: str):
    return importlib.import_module(registry.trainers()[method_name])



@dataclasses.dataclass
class TrainConfig:
    """A training run's arguments, typed and checked (`__post_init__`: errors name the flag).

    The fields are the trainer's own flags (their defaults are the parser's); the method's flags
    (its hooks' `add_args`) are in `method_args` and read as attributes too, so the config is the
    `args` the hooks take. `as_dict()` is what the record stores under "args": the parsed
    namespace's keys, in its order."""

    method: str
    target: str
    data: str
    out: str
    config: str | None = None
    steps: int = 600
    batch: int = 8
    loss: str = "ce"
    lr: float = 2e-3
    gamma: float = 4.0
    ce_weight: float = 0.0
    confidence_weight: float = 0.0
    confidence_label: str = "greedy"
    confidence_slots: str = "reached"
    train_only: str | None = None
    unseen_by: str | None = None
    train_samples: int | None = None
    eval_data: list[str] = dataclasses.field(default_factory=list)
    eval_max_tokens: int | None = None
    eval_drafts: int | None = None
    val_samples: int = 32
    val_every: int = 100
    save_every: int = 200
    resume: bool = False
    seed: int = 0
    threads: int = 2
    device: str = "cpu"
    dtype: str = "float32"
    save_dtype: str = "float32"
    quiet: bool = False
    method_args: dict = dataclasses.field(default_factory=dict)
    keys: tuple[str, ...] = dataclasses.field(default=(), repr=False, compare=False)  # as_dict's order

    def __post_init__(self):
        def need(ok: bool, flag: str, why: str):
            if not ok:
                raise SystemExit(f"--{flag.replace('_', '-')} {getattr(self, flag)}: {why}")

        need(self.method in registry.trainers(), "method", f"not a trainable method ({', '.join(sorted(registry.trainers()))})")
        need(self.steps >= 0, "steps", "must be >= 0")
        need(self.batch >= 1, "batch", "must be >= 1")
        need(self.loss in LOSSES, "loss", f"not a loss ({', '.join(sorted(LOSSES))})")
        need(self.confidence_label in CONFIDENCE_LABELS, "confidence_label", f"one of {CONFIDENCE_LABELS}")
        need(self.confidence_slots in CONFIDENCE_SLOTS, "confidence_slots", f"one of {CONFIDENCE_SLOTS}")
        need(self.train_only is None or self.train_only in TRAIN_ONLY, "train_only", f"one of {sorted(TRAIN_ONLY)}")
        need(self.train_samples is None or self.train_samples >= 1, "train_samples", "must be >= 1")
        need(0 <= self.ce_weight <= 1, "ce_weight", "must be in [0, 1]")
        need(self.confidence_weight >= 0, "confidence_weight", "must be >= 0")
        need(self.eval_max_tokens is None or self.eval_max_tokens >= 1, "eval_max_tokens", "must be >= 1")
        need(self.eval_drafts is None or self.eval_drafts >= 1, "eval_drafts", "must be >= 1")
        need(self.val_samples >= 1, "val_samples", "must be >= 1 (validation is what the log reports)")
        need(self.val_every >= 1, "val_every", "must be >= 1")
        need(self.save_every >= 1, "save_every", "must be >= 1")
        need(self.threads >= 1, "threads", "must be >= 1")
        need(self.dtype in ("float32", "bfloat16"), "dtype", "float32 or bfloat16")
        need(self.save_dtype in ("float32", "bfloat16"), "save_dtype", "float32 or bfloat16")
        clash = set(self.method_args) & {f.name for f in dataclasses.fields(self)}
        if clash:
            raise ValueError(f"method flags {sorted(clash)} shadow the trainer's own")

    def __getattr__(self, name: str):  # the method's flags, as the hooks read them (args.seq_len)
        if name.startswith("__") or name == "method_args":
            raise AttributeError(name)
        try:
            return self.__dict__["method_args"][name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no flag {name!r}") from None

    @classmethod
    def from_args(cls, args: argparse.Namespace | dict) -> TrainConfig:
        """The config of parsed arguments (`parse_args`); the keys the trainer does not own are
        the method's flags."""
        items = dict(vars(args) if isinstance(args, argparse.Namespace) else args)
        own = {f.name for f in dataclasses.fields(cls)} - {"method_args", "keys"}
        return cls(**{k: v for k, v in items.items() if k in own},
                   method_args={k: v for k, v in items.items() if k not in own}, keys=tuple(items))

    def as_dict(self) -> dict:
        """The arguments as `vars(parse_args(...))` has them (the record's "args")."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("method_args", "keys")}
        both = {**own, **self.method_args}
        return {k: both[k] for k in (self.keys or both) if k in both}



_DEFAULTS = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
             for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING
             or f.default_factory is not dataclasses.MISSING}



def parser(method_name: str | None = None) -> argparse.ArgumentParser:
    names = sorted(registry.trainers())
    ap = argparse.ArgumentParser(prog="vllm-specx train", description=DESCRIPTION)
    ap.add_argument("--config", help=f"a {RECORD_FILE}: its arguments are the defaults")
    ap.add_argument("--method", required=True, choices=names)
    ap.add_argument("--target", required=True, help="a target name (e.g. smollm2) or a model directory")
    ap.add_argument("--data", required=True, help="output folder of `vllm-specx gen-data`")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=_DEFAULTS["steps"],
                    help="optimizer steps; 0 with --init-from writes that draft as this run builds it "
                         "(e.g. restricted to a --draft-vocab) after validating it")
    ap.add_argument("--batch", type=int, default=_DEFAULTS["batch"])
    ap.add_argument("--loss", default=_DEFAULTS["loss"], choices=sorted(LOSSES))
    ap.add_argument("--lr", type=float, default=_DEFAULTS["lr"])
    ap.add_argument("--gamma", type=float, default=_DEFAULTS["gamma"], help="position weight exp(-k / gamma)")
    ap.add_argument("--ce-weight", type=float, default=_DEFAULTS["ce_weight"],
                    help="mix in cross-entropy: (1 - w) * loss + w * CE (TV-type losses from scratch need it)")
    ap.add_argument("--confidence-weight", type=float, default=_DEFAULTS["confidence_weight"],
                    help="add W * BCE of the draft's confidence head (its per-slot acceptance "
                         "probability) to the loss")
    ap.add_argument("--confidence-label", default=_DEFAULTS["confidence_label"], choices=CONFIDENCE_LABELS,
                    help="the head's label: greedy (draft == the target's argmax, teacher-forced) or "
                         "soft (sum_v min(p, q), needs the data's top-k)")
    ap.add_argument("--confidence-slots", default=_DEFAULTS["confidence_slots"], choices=CONFIDENCE_SLOTS,
                    help="slots the head learns from: reached (slot k only where drafts < k were "
                         "accepted: p_k is then the conditional acceptance serving multiplies) or all")
    ap.add_argument("--train-only", default=_DEFAULTS["train_only"], choices=sorted(TRAIN_ONLY),
                    help="freeze all but this part: confidence (the confidence head, on its BCE alone; "
                         "the draft's other tensors are saved unchanged)")
    ap.add_argument("--unseen-by", default=_DEFAULTS["unseen_by"],
                    help="a trained draft: train and validate only on samples whose prompts its training "
                         "data did not hold (a head added to that draft then learns how it does on new prompts)")
    ap.add_argument("--train-samples", type=int, default=_DEFAULTS["train_samples"],
                    help="split in the data's order: the first --val-samples samples validate, the "
                         "next N train (a learning curve's sizes are nested; default: a seeded "
                         "shuffle of all samples)")
    ap.add_argument("--eval-data", action="append", default=list(_DEFAULTS["eval_data"]),
                    help="a `gen-data --for-eval` folder (repeatable): after training, the draft's "
                         "teacher-forced greedy tau and per-position acceptance on all its samples "
                         "are recorded under 'eval' in training.json")
    ap.add_argument("--eval-max-tokens", type=int, default=None,
                    help="--eval-data's served tau counts passes as if serving stopped after N generated "
                         "tokens (vLLM's max_tokens), the stored answers' tokens past that checking the last "
                         "pass, as vLLM counts it (answers longer than N; default: the whole answers)")
    ap.add_argument("--eval-drafts", type=int, default=_DEFAULTS["eval_drafts"],
                    help="--eval-data measures the first K draft positions (the K drafts a pass "
                         "serves, e.g. 7 for a block of 8); default: every trained position")
    ap.add_argument("--val-samples", type=int, default=_DEFAULTS["val_samples"])
    ap.add_argument("--val-every", type=int, default=_DEFAULTS["val_every"])
    ap.add_argument("--save-every", type=int, default=_DEFAULTS["save_every"], help=f"steps between {STATE_FILE} writes")
    ap.add_argument("--resume", action="store_true", help=f"continue from <out>/{STATE_FILE}")
    ap.add_argument("--seed", type=int, default=_DEFAULTS["seed"])
    ap.add_argument("--threads", type=int, default=_DEFAULTS["threads"])
    ap.add_argument("--device", default=_DEFAULTS["device"], help="cpu, cuda, cuda:1, ...")
    ap.add_argument("--dtype", default=_DEFAULTS["dtype"], choices=["float32", "bfloat16"],
                    help="autocast dtype of forward/backward (parameters stay float32)")
    ap.add_argument("--save-dtype", default=_DEFAULTS["save_dtype"], choices=["float32", "bfloat16"],
                    help="dtype of the saved checkpoint tensors")
    ap.add_argument("--quiet", action="store_true",
                    help="no progress bar (the validation lines and the closing summary stay); in a log "
                         "(stderr not a terminal) the bar is a line each tenth of the steps")
    if method_name in names:
        hooks(method_name).add_args(ap)
    return ap



def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else list(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--method")
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    defaults = {}
    if known.config:
        file = Path(known.config)
        try:
            defaults = json.loads(file.read_text())["args"]
        except (OSError, ValueError, KeyError) as e:
            raise SystemExit(f"--config {file}: not a {RECORD_FILE} with an 'args' object ({e})") from None
    method = known.method or defaults.get("method")
    ap = parser(method)
    if known.config and method in registry.trainers():  # what an older record meant by a missing key
        defaults = {**getattr(hooks(method), "RECORD_DEFAULTS", {}), **defaults}
    known_dests = {a.dest for a in ap._actions}
    unknown = sorted(set(defaults) - known_dests)
    if unknown:
        raise SystemExit(f"--config {known.config}: unknown argument(s) {unknown}")
    ap.set_defaults(**{k: v for k, v in defaults.items() if k != "config"})
    for a in ap._actions:  # recorded values satisfy required flags
        if a.dest in defaults:
            a.required = False
        # a repeatable option given on the command line replaces the recorded values (not extends)
        if isinstance(a, argparse._AppendAction) and any(x in a.option_strings or x.split("=")[0] in a.option_strings
                                                         for x in argv):
            ap.set_defaults(**{a.dest: []})
    args = ap.parse_args(argv)
    args.config = None
    # paths as a record writes them portably (~/.cache/...) work as given
    args.data, args.out = str(Path(args.data).expanduser()), str(Path(args.out).expanduser())
    args.eval_data = [str(Path(d).expanduser()) for d in args.eval_data]
    return args



RESUME_MAY_CHANGE = ("out", "resume", "config", "threads", "device", "val_every", "save_every", "quiet")



def _items(args: argparse.Namespace | TrainConfig) -> dict:
    return args.as_dict() if isinstance(args, TrainConfig) else vars(args)



def run_args(args: argparse.Namespace | TrainConfig) -> dict:
    """The arguments a `--resume` must repeat: all but where it runs and how often it reports."""
    return {k: v for k, v in _items(args).items() if k not in RESUME_MAY_CHANGE}



def command_flags(args: argparse.Namespace | TrainConfig) -> str:
    """The flags that re-run `args` (switches only when set, `--no-X` for a switch that is on by
    default and was turned off; a repeatable option once per value; unset and empty options left
    out)."""
    on_by_default = {a.dest for a in parser(getattr(args, "method", None))._actions
                     if isinstance(a, argparse.BooleanOptionalAction) and a.default is True}
    out = []
    for k, v in _items(args).items():
        if k in ("config", "resume"):
            continue
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        elif v is False and k in on_by_default:
            out.append("--no-" + k.replace("_", "-"))
        elif isinstance(v, (list, tuple)):  # a repeatable option: once per value
            out += [f"{flag} {x}" for x in v]
        elif v is not None and v is not False and v != "":
            out.append(f"{flag} {v}")
    return " ".join(out)

