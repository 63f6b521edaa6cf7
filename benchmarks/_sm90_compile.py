"""Compile recorded Triton launches for a real GPU target on any machine (no GPU needed).

The interpreter cannot see what only the compiler does (loop-carried types, layouts, register
pressure, fp64 lowering). `record_launches()` makes every `kernel[grid](...)` call record its
arguments instead of running; `compile_launches()` then compiles each distinct specialisation
with `triton.compile` for `cuda:<arch>` and runs ptxas on it. Shared by the kernel benchmarks'
`--compile-only` modes.
"""

import os
import re
import subprocess
import tempfile
import time

import torch

_TYPES = {torch.float32: "fp32", torch.float64: "fp64", torch.bfloat16: "bf16", torch.float16: "fp16",
          torch.int32: "i32", torch.int64: "i64", torch.bool: "i1", torch.uint8: "u8",
          torch.float8_e4m3fn: "fp8e4nv"}


def record_launches() -> list:
    """From now on, `kernel[grid](*a, **kw)` appends `(kernel, a, kw)` to the returned list."""
    from triton.runtime.jit import JITFunction

    launches = []
    JITFunction.__getitem__ = lambda self, grid: lambda *a, **kw: launches.append((self, a, kw))
    return launches


def ptxas_path(arch: int) -> str:
    """Triton's bundled ptxas for sm_<arch> (Triton 3.4's `get_ptxas` takes no arch)."""
    from triton.backends.nvidia.compiler import get_ptxas

    try:
        return get_ptxas(arch).path
    except TypeError:
        return get_ptxas().path


def compile_launches(launches: list, arch: int, option_keys: tuple[str, ...]):
    """Yield one dict per distinct specialisation: kernel, constexprs, ptx, registers,
    spill_store_bytes, shared_bytes, compile_s."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target, ptxas, seen = GPUTarget("cuda", arch, 32), ptxas_path(arch), set()
    for fn, a, kw in launches:
        sig, consts = {}, {}
        for i, p in enumerate(fn.params):
            v = kw[p.name] if p.name in kw else a[i]
            if p.is_constexpr:
                sig[p.name], consts[p.name] = "constexpr", v
            else:
                sig[p.name] = "*" + _TYPES[v.dtype] if isinstance(v, torch.Tensor) else "i32"
        opts = {o: kw[o] for o in option_keys if o in kw}  # part of the key: 4 and 8 warps differ
        key = (fn.__name__, tuple(sorted(sig.items())), tuple(sorted(consts.items())),
               tuple(sorted(opts.items())))
        if key in seen:
            continue
        seen.add(key)
        t0 = time.perf_counter()
        compiled = triton.compile(ASTSource(fn, sig, consts), target=target, options=opts)
        seconds = time.perf_counter() - t0
        ptx = compiled.asm["ptx"]
        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
            f.write(ptx)
            f.flush()
            cmd = [ptxas, "-v", f"--gpu-name=sm_{arch}a", f.name, "-o", os.devnull]
            log = subprocess.run(cmd, capture_output=True, text=True).stderr
        regs = re.search(r"Used (\d+) registers", log)
        spill = re.search(r"(\d+) bytes spill stores", log)
        yield {"kernel": fn.__name__, "options": opts, "constexprs": {k: str(v) for k, v in consts.items()},
               "consts": consts, "ptx": ptx,
               "registers": int(regs.group(1)) if regs else None,
               "spill_store_bytes": int(spill.group(1)) if spill else None,
               "shared_bytes": compiled.metadata.shared, "compile_s": round(seconds, 1)}
