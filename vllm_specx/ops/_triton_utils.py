"""Small helpers shared by the op dispatchers and Triton launchers.

Nothing here imports Triton at module level, so the dispatchers (and the references) import on
machines without Triton. It is not a kernel library: kernels live in each op's `kernel.py`.
"""

import importlib.util
import os

import torch

IMPLS = ("auto", "triton", "reference")


def interpreter_mode() -> bool:
    """True when Triton kernels run in the CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def resolve_impl(
    impl: str,
    device: torch.device,
    impls: tuple[str, ...] = IMPLS,
    cpu_default: str = "reference",
) -> str:
    """Map `impl` (one of `impls`) to the implementation to run on `device`.

    `auto` picks Triton on CUDA (when Triton is installed) and `cpu_default` elsewhere; the
    interpreter is opt-in through `impl="triton"` because it is orders of magnitude slower. Every
    op dispatcher calls this: topk and the DSA indexer with the defaults, the acceptance sampler
    with its extra `"torch"` path as the CPU default.
    """
    if impl not in impls:
        raise ValueError(f"impl must be one of {impls}, got {impl!r}")
    if impl == "auto":
        return "triton" if device.type == "cuda" and triton_available() else cpu_default
    if impl == "triton" and device.type != "cuda" and not interpreter_mode():
        raise ValueError(
            f"impl='triton' on device {device} needs TRITON_INTERPRET=1 "
            "(set before the kernels are imported)"
        )
    return impl


def check_tensor(
    name: str,
    t: torch.Tensor,
    *,
    ndim: int,
    dtypes: tuple[torch.dtype, ...],
    device: torch.device | None = None,
    contiguous: bool = True,
) -> None:
    """Raise ValueError naming `name` unless `t` has the given rank, dtype, device and layout."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} dtype must be one of {dtypes}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def interpreter_compat() -> None:
    """Let Triton's CPU interpreter take scalars from numpy >= 2.4 on every Triton we allow.

    In interpreter mode a scalar (a program id, a loaded length, a loop bound derived from them)
    is a one-element array, and a data-dependent `range(...)` bound calls its `__index__`. Triton
    3.6's interpreter defines that as `int(data)`, which numpy 2.4 refuses for an array of one or
    more dimensions ("only 0-dimensional arrays can be converted to Python scalars"), as does
    Triton 3.4's (the `triton>=` floor, whose patch takes no scope); Triton 3.9's is
    `int(data.squeeze())`. Where the installed interpreter lacks the squeeze, its tensor patch
    is wrapped to define `__index__` that way (nothing changes on a GPU: only the interpreter is
    touched). Called by each kernel module when `interpreter_mode()`; idempotent.
    """
    import inspect

    from triton.runtime import interpreter

    patch = interpreter._patch_lang_tensor
    if getattr(patch, "_specx_squeezes", False) or "squeeze" in inspect.getsource(patch):
        return

    def patched(tensor, *scope):  # Triton 3.6 passes a patch scope; 3.4 sets attributes directly
        patch(tensor, *scope)
        index = lambda self: int(self.handle.data.squeeze())  # noqa: E731
        if scope:
            scope[0].set_attr(tensor, "__index__", index)
        else:
            tensor.__index__ = index

    patched._specx_squeezes = True
    interpreter._patch_lang_tensor = patched
