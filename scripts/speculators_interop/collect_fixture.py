"""Copy a speculators checkpoint into a test fixture dir and write its provenance.

``copy``: copies only ``config.json`` and ``model.safetensors`` of the final epoch
``<save-path>/<epochs-1>/`` (no optimizer/scheduler state, no config.py) into
``tests/fixtures/speculators/<variant>/``.

``provenance``: writes ``<fixture>/provenance.json``: speculators / torch /
transformers versions, the exact training command (from speculators'
``train_command.txt``), epochs, val metrics (``val_metrics.json`` of that epoch),
the data recipe, the reference-dump metadata stored in ``<fixture>.reference.safetensors``,
sha256 and size of each fixture file, and the training wall time.

Commands (what run.sh runs):
    python collect_fixture.py copy --ckpt $WORK/ckpt/default --epochs 8 \
        --fixture tests/fixtures/speculators/default
    python collect_fixture.py provenance --ckpt $WORK/ckpt/default --epochs 8 \
        --fixture tests/fixtures/speculators/default --variant default \
        --train-wall-s 300 --data-recipe "$DATA_RECIPE"
"""

import argparse
import hashlib
import json
import shutil
from importlib.metadata import version
from pathlib import Path

from safetensors import safe_open


def final_dir(ckpt: str, epochs: int) -> Path:
    d = Path(ckpt) / str(epochs - 1)
    assert (d / "model.safetensors").is_file(), f"no final checkpoint in {d}"
    return d


def cmd_copy(args):
    src = final_dir(args.ckpt, args.epochs)
    dst = Path(args.fixture)
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(src / name, dst / name)
    print(f"copied {src} -> {dst}")


def cmd_provenance(args):
    src = final_dir(args.ckpt, args.epochs)
    dst = Path(args.fixture)
    cmd_lines = (Path(args.ckpt) / "train_command.txt").read_text().splitlines()
    command = " ".join(l for l in cmd_lines if l and not l.startswith("#"))
    command = command.replace(str(Path(__file__).resolve().parents[2]) + "/", "")  # repo-relative
    ref_file = dst.parent / (dst.name + ".reference.safetensors")  # beside the checkpoint dir
    with safe_open(str(ref_file), "pt") as f:
        ref_meta = f.metadata()
        ref_shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    ref_meta["meta"] = json.loads(ref_meta["meta"])
    files = {}
    for p in sorted([*dst.iterdir(), ref_file]):
        if p.name == "provenance.json":
            continue
        files[p.name] = {
            "bytes": p.stat().st_size,
            "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
        }
    prov = {
        "variant": args.variant,
        "description": args.description,
        "written_by": "speculators' own trainer (python -m speculators.train via "
        "scripts/speculators_interop/train_cpu.py, CPU) and "
        "scripts/speculators_interop/dump_reference.py",
        "versions": {
            p: version(p) for p in ("speculators", "torch", "transformers")
        },
        "train_command": command,
        "train_cwd": "a scratch dir with assets/ref-target -> <repo>/assets/ref-target "
        "(so config.json records the repo-relative verifier path)",
        "epochs": args.epochs,
        "checkpoint": f"<save-path>/{args.epochs - 1} (final epoch)",
        "train_wall_s": args.train_wall_s,
        "training_state": json.loads((src / "training_state.json").read_text()),
        "val_metrics": json.loads((src / "val_metrics.json").read_text()),
        "data_recipe": args.data_recipe,
        "reference": {"metadata": ref_meta, "tensors": ref_shapes},
        "files": files,
        "regenerate": args.regenerate,
    }
    (dst / "provenance.json").write_text(json.dumps(prov, indent=2) + "\n")
    print(f"wrote {dst / 'provenance.json'}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("copy", "provenance"):
        s = sub.add_parser(name)
        s.add_argument("--ckpt", required=True)
        s.add_argument("--epochs", type=int, required=True)
        s.add_argument("--fixture", required=True)
        if name == "provenance":
            s.add_argument("--variant", required=True)
            s.add_argument("--description", default="")
            s.add_argument("--train-wall-s", type=float, default=None)
            s.add_argument("--data-recipe", default="")
            s.add_argument("--regenerate", default="bash scripts/speculators_interop/run.sh")
    args = p.parse_args()
    {"copy": cmd_copy, "provenance": cmd_provenance}[args.cmd](args)


if __name__ == "__main__":
    main()
