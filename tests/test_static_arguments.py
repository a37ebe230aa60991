"""Static (trace-time) arguments: sizes, shapes, axes and counts are ints or NumPy integers, nothing else.

A float would be truncated (2.9 -> 2) and a bool counted as 0 or 1, both silently; a negative size or a repeated
axis would only fail when the program runs, if at all. Each is refused while tracing, with a fold error naming the
function, the parameter and the bad value. Every bad case is checked both inside `fold.trace` (so it cannot
surface later as a FoldRuntimeError) and on NumPy arrays outside a trace. The good forms, NumPy integers among
them, still give NumPy's results.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np
import pytest
from helpers import assert_close, run_checked

import fold

X4 = np.arange(4.0)
X3 = np.arange(3.0)
A23 = np.arange(6.0).reshape(2, 3)


def _refused(call: Callable[[Any], Any], arg: Any, mode: str, exc: type, function: str, param: str, value: str) -> None:
    """`call(arg)` raises `exc` at trace time (or eagerly), and the message names `function`, `param` and `value`."""
    assert issubclass(exc, fold.FoldError)
    pattern = re.escape(f"fold.{function}:") + ".*" + re.escape(param) + ".*" + re.escape(value)
    with pytest.raises(exc, match=pattern):
        if mode == "trace":
            fold.trace(call, arg)
        else:
            call(arg)


MODES = pytest.mark.parametrize("mode", ["trace", "eager"])


# ------------------------------------------------------------------------------------------------ reshape


@MODES
@pytest.mark.parametrize("shape, exc, value", [
    ((2.9, 2), fold.FoldTypeError, "2.9 in (2.9, 2)"),
    ((2.0, 2), fold.FoldTypeError, "2.0 in (2.0, 2)"),
    ((np.float64(4.0),), fold.FoldTypeError, "4.0"),
    (4.0, fold.FoldTypeError, "4.0"),
    ((True, 4), fold.FoldTypeError, "True in (True, 4)"),
    (None, fold.FoldTypeError, "None"),
    ((2, "2"), fold.FoldTypeError, "'2' in (2, '2')"),
    ((-2, -2), fold.ShapeError, "-2 in (-2, -2)"),
    ((-1, -2), fold.ShapeError, "-2 in (-1, -2)"),
    ((-1, -1, 4), fold.ShapeError, "(-1, -1, 4) has more than one -1"),
], ids=repr)
def test_reshape_refuses(shape: Any, exc: type, value: str, mode: str) -> None:
    _refused(lambda a: fold.reshape(a, shape), X4, mode, exc, "reshape", "shape", value)


def test_reshape_method_refuses_a_float() -> None:
    with pytest.raises(fold.FoldTypeError, match=re.escape("got 2.5 in (2.5, 2)")):
        fold.trace(lambda a: a.reshape(2.5, 2), X4)


@pytest.mark.parametrize("shape", [
    (np.int64(2), 2), [2, np.int32(2)], np.array([4, 1]), np.int64(4), (-1,), -1, (2, -1), (-1, 2), (1, -1, 1),
    (np.int64(-1), 4),
], ids=repr)
def test_reshape_good_forms_match_numpy(shape: Any) -> None:
    assert_close(run_checked(lambda a: fold.reshape(a, shape), X4), X4.reshape(shape), dtype="float64")
    assert_close(fold.reshape(X4, shape), X4.reshape(shape), dtype="float64")


def test_reshape_method_with_one_inferred_dimension() -> None:
    x = np.arange(12.0)
    assert_close(run_checked(lambda a: a.reshape(np.int64(3), -1), x), x.reshape(3, -1))
    assert fold.trace(lambda a: a.reshape(-1, 4), x).out_avals[0].shape == (3, 4)


# ---------------------------------------------------------------------------------------------- replicate


@MODES
@pytest.mark.parametrize("n, exc, value", [
    (2.7, fold.FoldTypeError, "2.7"),
    (2.0, fold.FoldTypeError, "2.0"),
    (np.float32(2), fold.FoldTypeError, "2.0"),
    (True, fold.FoldTypeError, "True"),
    (np.bool_(True), fold.FoldTypeError, "True"),
    (None, fold.FoldTypeError, "None"),
    (-1, fold.ShapeError, "-1"),
], ids=repr)
def test_replicate_refuses(n: Any, exc: type, value: str, mode: str) -> None:
    _refused(lambda a: fold.replicate(n, a), X4, mode, exc, "replicate", "n", value)


@pytest.mark.parametrize("n", [3, np.int64(3), np.int32(0)], ids=repr)
def test_replicate_good_forms_match_numpy(n: Any) -> None:
    expected = np.stack([X4] * int(n)) if n else np.zeros((0, 4))
    assert_close(run_checked(lambda a: fold.replicate(n, a), X4), expected, dtype="float64")


# --------------------------------------------------------------------------------------------------- iota


@MODES
@pytest.mark.parametrize("n, dtype, exc, param, value", [
    (True, "int64", fold.FoldTypeError, "n", "True"),
    (np.bool_(False), "int64", fold.FoldTypeError, "n", "False"),
    (2.5, "int64", fold.FoldTypeError, "n", "2.5"),
    (3.0, "int64", fold.FoldTypeError, "n", "3.0"),
    ("3", "int64", fold.FoldTypeError, "n", "'3'"),
    (-1, "int64", fold.ShapeError, "n", "-1"),
    (3, bool, fold.FoldTypeError, "dtype", "bool"),
    (2, "bool", fold.FoldTypeError, "dtype", "bool"),
], ids=repr)
def test_iota_refuses(n: Any, dtype: Any, exc: type, param: str, value: str, mode: str) -> None:
    _refused(lambda a: fold.iota(n, dtype) + a, 0.0, mode, exc, "iota", param, value)


@pytest.mark.parametrize("n, dtype", [(np.int64(4), "int64"), (np.int32(3), "float32"), (0, "int32")], ids=repr)
def test_iota_good_forms_match_numpy(n: Any, dtype: str) -> None:
    assert_close(run_checked(lambda: fold.iota(n, dtype)), np.arange(n, dtype=dtype), dtype=dtype)


# ------------------------------------------------------------------------------------------- broadcast_to


@MODES
@pytest.mark.parametrize("shape, exc, value", [
    ((-1, 3), fold.ShapeError, "-1 in (-1, 3)"),
    ((-2, 3), fold.ShapeError, "-2 in (-2, 3)"),
    ((2.0, 3), fold.FoldTypeError, "2.0 in (2.0, 3)"),
    ((True, 3), fold.FoldTypeError, "True in (True, 3)"),
    (None, fold.FoldTypeError, "None"),
], ids=repr)
def test_broadcast_to_refuses(shape: Any, exc: type, value: str, mode: str) -> None:
    _refused(lambda a: fold.broadcast_to(a, shape), X3, mode, exc, "broadcast_to", "shape", value)


@pytest.mark.parametrize("shape", [(2, 3), (np.int64(2), np.int32(3)), np.array([0, 3]), [1, 3]], ids=repr)
def test_broadcast_to_good_forms_match_numpy(shape: Any) -> None:
    expected = np.broadcast_to(X3, tuple(shape))
    assert_close(run_checked(lambda a: fold.broadcast_to(a, shape), X3), expected, dtype="float64")


# ---------------------------------------------------------------------------------------------------- sum


@MODES
@pytest.mark.parametrize("call, exc, value", [
    (lambda a: fold.sum(a, axis=(1, 1)), fold.ShapeError, "1 appears more than once in (1, 1)"),
    (lambda a: fold.sum(a, axis=(0, -2)), fold.ShapeError, "0 appears more than once in (0, -2)"),
    (lambda a: fold.sum(a, axis=1.0), fold.FoldTypeError, "1.0"),
    (lambda a: fold.sum(a, axis=True), fold.FoldTypeError, "True"),
    (lambda a: fold.sum(a, axis=(0, 1.5)), fold.FoldTypeError, "1.5 in (0, 1.5)"),
    (lambda a: fold.sum(a, axis=np.float64(0)), fold.FoldTypeError, "0.0"),
    (lambda a: fold.sum(a, axis=np.int64(2)), fold.ShapeError, "2 is out of range"),
], ids=["repeated", "repeated-negative", "float", "bool", "float-in-tuple", "np.float64", "np.int64-out-of-range"])
def test_sum_refuses(call: Callable[[Any], Any], exc: type, value: str, mode: str) -> None:
    _refused(call, A23, mode, exc, "sum", "axis", value)


def test_sum_method_refuses_a_float_axis() -> None:
    """x.sum is NumPy's method (axis, keepdims), so its errors say np.sum."""
    with pytest.raises(fold.FoldTypeError, match=re.escape("np.sum: axis must be an integer, got 0.0")):
        fold.trace(lambda a: a.sum(axis=0.0), A23)


@pytest.mark.parametrize("axis", [np.int64(1), np.int32(-1), np.int64(0), (np.int64(0), 1), (1, 0), (), None],
                         ids=repr)
def test_sum_good_axes_match_numpy(axis: Any) -> None:
    expected = np.sum(A23, axis=axis)
    assert_close(run_checked(lambda a: fold.sum(a, axis=axis), A23), expected, dtype="float64")
    assert_close(run_checked(lambda a: a.sum(axis=axis), A23), expected, dtype="float64")
    assert_close(fold.sum(A23, axis=axis), expected, dtype="float64")


# -------------------------------------------------------------------------------------------- concatenate


@MODES
@pytest.mark.parametrize("axis, exc, value", [
    (0.5, fold.FoldTypeError, "0.5"),
    (0.0, fold.FoldTypeError, "0.0"),
    (True, fold.FoldTypeError, "True"),
    (None, fold.FoldTypeError, "None"),
    (1, fold.ShapeError, "1 is out of range"),
    (np.int64(-2), fold.ShapeError, "-2 is out of range"),
], ids=repr)
def test_concatenate_refuses(axis: Any, exc: type, value: str, mode: str) -> None:
    _refused(lambda a: fold.concatenate([a, a], axis=axis), X3, mode, exc, "concatenate", "axis", value)


@pytest.mark.parametrize("axis", [0, 1, np.int64(1), np.int32(-2), -1], ids=repr)
def test_concatenate_good_axes_match_numpy(axis: Any) -> None:
    b = A23 + 10
    expected = np.concatenate([A23, b], axis=axis)
    assert_close(run_checked(lambda x, y: fold.concatenate([x, y], axis=axis), A23, b), expected, dtype="float64")


# ---------------------------------------------------------------------------------------------- transpose


@MODES
@pytest.mark.parametrize("axes, exc, param, value", [
    ((0.5, 1), fold.FoldTypeError, "axis", "0.5 in (0.5, 1)"),
    ((1.0, 0), fold.FoldTypeError, "axis", "1.0 in (1.0, 0)"),
    ((True, 0), fold.FoldTypeError, "axis", "True in (True, 0)"),
    ((1, 1), fold.ShapeError, "axis", "1 appears more than once in (1, 1)"),
    ((0, -2), fold.ShapeError, "axis", "0 appears more than once in (0, -2)"),
    ((0, 2), fold.ShapeError, "axis", "2 is out of range"),
    ((0,), fold.ShapeError, "axes", "(0,) are not a permutation"),
    ((0, 1, 2), fold.ShapeError, "axis", "2 is out of range"),
], ids=repr)
def test_transpose_refuses(axes: Any, exc: type, param: str, value: str, mode: str) -> None:
    _refused(lambda a: fold.transpose(a, axes), A23, mode, exc, "transpose", param, value)


def test_transpose_method_refuses_a_float() -> None:
    with pytest.raises(fold.FoldTypeError, match=re.escape("got 1.0 in (1.0, 0)")):
        fold.trace(lambda a: a.transpose(1.0, 0), A23)


@pytest.mark.parametrize("axes", [(1, 0), (np.int64(1), np.int32(0)), (-1, 0), np.array([1, 0]), [0, 1], None],
                         ids=repr)
def test_transpose_good_axes_match_numpy(axes: Any) -> None:
    expected = np.transpose(A23, None if axes is None else tuple(axes))
    assert_close(run_checked(lambda a: fold.transpose(a, axes), A23), expected, dtype="float64")
