"""`ops._triton_utils.interpreter_compat`: Triton 3.6's interpreter takes a scalar's index with
`int(data)` on a one-element array, which numpy >= 2.4 refuses; the compat defines it on the
squeezed array, as Triton 3.9's interpreter does. (`scripts/check_triton.sh` runs tests/ops on
Triton 3.6 with the newest numpy: 193 passed with it, the first topk test failed without it;
Triton 3.4, the `triton>=` floor, patches without a scope argument.)"""

import operator
import types
import warnings

import numpy as np
import pytest

from vllm_specx.ops import _triton_utils

triton_interpreter = pytest.importorskip("triton.runtime.interpreter")


class _Scope:  # the interpreter's _LangPatchScope, as far as a tensor patch uses it
    def set_attr(self, obj, name, value):
        setattr(obj, name, value)


def _triton36_patch(tensor, scope):  # Triton 3.6's definition
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))


def _triton34_patch(tensor):  # Triton 3.4's definition: no scope, attributes set directly
    tensor.__index__ = lambda self: int(self.handle.data)


def _scalar_class():
    class Scalar:  # a scalar in interpreter mode: its data a one-element, one-dimensional array
        handle = types.SimpleNamespace(data=np.array([7]))
    return Scalar


def test_a_scalars_index_is_taken_from_the_squeezed_array(monkeypatch):
    monkeypatch.setattr(triton_interpreter, "_patch_lang_tensor", _triton36_patch)
    _triton_utils.interpreter_compat()
    _triton_utils.interpreter_compat()  # idempotent: wraps once
    assert triton_interpreter._patch_lang_tensor._specx_squeezes
    cls = _scalar_class()
    triton_interpreter._patch_lang_tensor(cls, _Scope())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy < 2.4 only warns where 2.4 raises
        assert operator.index(cls()) == 7


def test_triton34s_patch_without_a_scope_is_wrapped_too(monkeypatch):
    monkeypatch.setattr(triton_interpreter, "_patch_lang_tensor", _triton34_patch)
    _triton_utils.interpreter_compat()
    cls = _scalar_class()
    triton_interpreter._patch_lang_tensor(cls)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert operator.index(cls()) == 7


def test_without_the_compat_such_an_index_fails_on_new_numpy(monkeypatch):
    """Negative control: Triton 3.6's own definition warns (numpy < 2.4) or raises (>= 2.4)."""
    cls = _scalar_class()
    _triton36_patch(cls, _Scope())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises((DeprecationWarning, TypeError)):
            operator.index(cls())


def test_an_interpreter_that_squeezes_is_left_alone(monkeypatch):
    def squeezing(tensor, scope):
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    monkeypatch.setattr(triton_interpreter, "_patch_lang_tensor", squeezing)
    _triton_utils.interpreter_compat()
    assert triton_interpreter._patch_lang_tensor is squeezing
