"""NumPy's reductions and cumulative functions on traced arrays, lowered to fold's monoids and scans.

`np.max(x, axis=1)` inside a traced function becomes a `fold.reduce` with `fold.monoids.max`: over trailing
axes a map of each row's reduce, over others a reduce over the axes moved to the front (the other axes are
the elements' fields), so it is differentiated by the reduce rules
(ties: the lowest index, as for every min/max). `np.cumsum` is a `fold.scan`. `where=` masks elements
through `fold.where` (the masked ones become the monoid's identity). Registered into the table of
fold/numpy_functions.py; ndarray-style methods (`x.max()`) are the same functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import monoids, ops
from .combinators import map as fold_map, reduce as fold_reduce, scan as fold_scan
from .errors import FoldTypeError, ShapeError
from .numpy_functions import _axes, _handles, _keep_dims, _mean, _sum, _where_mask
from .tracing import Tracer


def _value(a: Any, where: str) -> Any:
    return ops.as_value(a, where)


def _dtype(a: Any) -> np.dtype:
    return np.result_type(ops._dtype_key(a))


def _to_front(a: Any, axes: tuple[int, ...]) -> Any:
    """`a` with `axes` moved to the front and merged into one: (prod of those sizes, *the other axes)."""
    shape = ops.shape_of(a)
    rest = tuple(i for i in range(len(shape)) if i not in axes)
    if axes != tuple(range(len(axes))):
        a = ops.transpose(a, axes + rest)
    return ops.reshape(a, (int(np.prod([shape[i] for i in axes], dtype=np.int64)), *[shape[i] for i in rest]))


def _masked(a: Any, mask: Any, fill: Any, where: str) -> Any:
    return _where_mask(a, mask, fill)


def _monoid_reduce(name: str, monoid: Any, a: Any, axis: Any, keepdims: bool, where: Any = None,
                   initial: Any = None) -> Any:
    """The reduction np.<name> means: the masked elements and `initial` folded with `monoid`."""
    a = _value(a, f"np.{name}")
    shape = ops.shape_of(a)
    axes = _axes(axis, shape, f"np.{name}")
    if name in ("max", "min") and where is not None and initial is None:
        raise FoldTypeError(f"np.{name} with where= needs initial= (as NumPy: a fully masked row has no {name})")
    count = int(np.prod([shape[i] for i in axes], dtype=np.int64))
    if count == 0 and initial is None and name in ("max", "min"):
        raise ShapeError(f"np.{name} of an empty selection: shape {shape}, axes {axes} (NumPy has no identity for "
                         f"it; pass initial=)")
    identity = monoid.identity if initial is None else initial
    a = _masked(a, where, identity, f"np.{name}")
    result = _reduced(monoid, a, shape, axes) if axes else a
    if initial is not None:
        result = monoid.op(result, ops.convert(initial, _dtype(result)))
    return _keep_dims(result, shape, axes) if keepdims else result


def _reduced(monoid: Any, a: Any, shape: tuple[int, ...], axes: tuple[int, ...]) -> Any:
    """`a` folded with `monoid` over `axes`. Over trailing axes (a matrix's rows: `np.max(S, axis=1)`), a map
    over the kept leading axes of a reduce of each row, as the loop nest and its gradient fold a row; over
    others, a reduce over those axes moved to the front, whose elements are the remaining axes' arrays.
    Moving trailing axes to the front made a transposed copy, and the gradient's one-hot cotangent was built
    on the transposed array and transposed back."""
    kept = len(shape) - len(axes)
    if not kept or axes != tuple(range(kept, len(shape))):
        return fold_reduce(monoid, _to_front(a, axes))
    rows = ops.reshape(a, (int(np.prod(shape[:kept], dtype=np.int64)), int(np.prod(shape[kept:], dtype=np.int64))))
    return ops.reshape(fold_map(lambda row: fold_reduce(monoid, row), rows), shape[:kept])


@_handles(np.max, np.amax)
def _max(a, axis=None, out=None, keepdims=False, initial=None, where=None):
    _no_out(out, "max")
    return _monoid_reduce("max", monoids.max, a, axis, keepdims, where, initial)


@_handles(np.min, np.amin)
def _min(a, axis=None, out=None, keepdims=False, initial=None, where=None):
    _no_out(out, "min")
    return _monoid_reduce("min", monoids.min, a, axis, keepdims, where, initial)


@_handles(np.prod)
def _prod(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
    _no_out(out, "prod")
    a = _value(a, "np.prod")
    if dtype is not None or _dtype(a) in (np.int32, np.bool_):
        a = ops.convert(a, dtype or "int64")
    return _monoid_reduce("prod", monoids.prod, a, axis, keepdims, where, initial)


def _no_out(out: Any, name: str) -> None:
    if out is not None:
        raise FoldTypeError(f"np.{name}(..., out=...) on a traced array: fold values are never written in place; "
                            f"use the returned value")


@_handles(np.var)
def _var(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=None):
    _no_out(out, "var")
    a = _value(a, "np.var")
    if dtype is not None or _dtype(a).kind != "f":
        a = ops.convert(a, dtype or "float64")
    shape = ops.shape_of(a)
    axes = _axes(axis, shape, "np.var")
    count = int(np.prod([shape[i] for i in axes], dtype=np.int64))
    if count - ddof <= 0:
        raise ShapeError(f"np.var: {count} elements with ddof={ddof} (shape {shape}, axes {axes}) leave no degrees "
                         f"of freedom")
    centred = a - _mean(a, axis=axes, keepdims=True, where=where)
    if where is not None and where is not True:  # over the chosen elements, as many as `where` holds
        chosen = _sum(ops.broadcast_to(where, shape), axis=axes)
        result = _sum(centred * centred, axis=axes, where=where) / (chosen - ddof)
        return _keep_dims(result, shape, axes) if keepdims else result
    result = ops.sum(centred * centred, axes) / (count - ddof)
    return _keep_dims(result, shape, axes) if keepdims else result


@_handles(np.std)
def _std(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=None):
    return ops.sqrt(_var(a, axis, dtype, out, ddof, keepdims, where=where))


@_handles(np.any)
def _any(a, axis=None, out=None, keepdims=False, *, where=None):
    _no_out(out, "any")
    nonzero = ops.convert(ops.not_equal(_value(a, "np.any"), 0), "int64")
    return ops.greater(_sum(_masked(nonzero, where, 0, "np.any"), axis=axis, keepdims=keepdims), 0)


@_handles(np.all)
def _all(a, axis=None, out=None, keepdims=False, *, where=None):
    _no_out(out, "all")
    zero = ops.convert(ops.equal(_value(a, "np.all"), 0), "int64")
    return ops.equal(_sum(_masked(zero, where, 0, "np.all"), axis=axis, keepdims=keepdims), 0)


@_handles(np.count_nonzero)
def _count_nonzero(a, axis=None, *, keepdims=False):
    """The number of nonzero (True) elements: how many a traced boolean mask selects, as an int64 value."""
    return _sum(ops.not_equal(_value(a, "np.count_nonzero"), 0), axis=axis, keepdims=keepdims)


def _arg_extreme(name: str, a: Any, axis: Any, keepdims: bool) -> Any:
    """The index of the first largest (smallest) element: a reduce over (value, index) pairs."""
    a = _value(a, f"np.{name}")
    shape = ops.shape_of(a)
    if axis is None:
        a, axes, shape_for_keep = ops.reshape(a, (-1,)), (0,), shape
    else:
        axes = (ops._static_axis(axis, shape, f"np.{name}"),)
        shape_for_keep = shape
    if ops.shape_of(a)[axes[0]] == 0:
        raise ShapeError(f"np.{name} of an empty sequence (shape {shape})")
    values = _to_front(a, axes)
    n = ops.shape_of(values)[0]
    index = ops.broadcast_to(ops.reshape(ops.iota(n), (n,) + (1,) * (len(ops.shape_of(values)) - 1)), ops.shape_of(values))
    better = ops.greater if name == "argmax" else ops.less

    def keep(p: Any, q: Any) -> Any:
        take_q = ops.logical_or(better(q[0], p[0]), ops.logical_and(ops.equal(q[0], p[0]), ops.less(q[1], p[1])))
        return ops.where(take_q, q[0], p[0]), ops.where(take_q, q[1], p[1])

    kind = _dtype(a)
    low = -np.inf if kind.kind == "f" else np.iinfo(kind).min if kind.kind in "iu" else False
    high = np.inf if kind.kind == "f" else np.iinfo(kind).max if kind.kind in "iu" else True
    identity = (np.asarray(low if name == "argmax" else high, kind), np.iinfo(np.int64).max)
    _, result = fold_reduce(keep, (values, index), identity=identity)
    if not keepdims:
        return result
    if axis is None:
        return ops.reshape(result, (1,) * len(shape_for_keep))
    return _keep_dims(result, shape_for_keep, axes)


@_handles(np.argmax)
def _argmax(a, axis=None, out=None, *, keepdims=False):
    _no_out(out, "argmax")
    return _arg_extreme("argmax", a, axis, keepdims)


@_handles(np.argmin)
def _argmin(a, axis=None, out=None, *, keepdims=False):
    _no_out(out, "argmin")
    return _arg_extreme("argmin", a, axis, keepdims)


def _cumulative(name: str, monoid: Any, a: Any, axis: Any, dtype: Any) -> Any:
    a = _value(a, f"np.{name}")
    if dtype is not None or _dtype(a) in (np.int32, np.bool_):
        a = ops.convert(a, dtype or "int64")
    if axis is None:
        a, axis = ops.reshape(a, (-1,)), 0
    shape = ops.shape_of(a)
    axis = ops._static_axis(axis, shape, f"np.{name}")
    if axis == 0:
        return fold_scan(monoid, a)
    order = (axis, *[i for i in range(len(shape)) if i != axis])
    back = tuple(int(np.argsort(order)[i]) for i in range(len(shape)))
    return ops.transpose(fold_scan(monoid, ops.transpose(a, order)), back)


@_handles(np.cumsum)
def _cumsum(a, axis=None, dtype=None, out=None):
    _no_out(out, "cumsum")
    return _cumulative("cumsum", monoids.sum, a, axis, dtype)


@_handles(np.cumprod)
def _cumprod(a, axis=None, dtype=None, out=None):
    _no_out(out, "cumprod")
    return _cumulative("cumprod", monoids.prod, a, axis, dtype)


@_handles(np.linalg.norm)
def _norm(x, ord=None, axis=None, keepdims=False):  # noqa: A002
    """Vector norms (ord None, 2, 1, inf, -inf, or p) and the Frobenius norm; not the matrix 2-norm (an SVD)."""
    x = _value(x, "np.linalg.norm")
    if _dtype(x).kind != "f":
        x = ops.convert(x, "float64")
    shape = ops.shape_of(x)
    matrix = (axis is None and len(shape) == 2) or (isinstance(axis, (tuple, list)) and len(axis) == 2)
    if matrix and ord not in (None, "fro"):
        raise FoldTypeError(f"np.linalg.norm on a traced matrix: ord={ord!r} is not supported (only 'fro' and None); "
                            f"vector norms take any ord")
    if not matrix and ord == "fro":
        raise FoldTypeError("np.linalg.norm: ord='fro' is for matrices (two axes)")
    if ord in (None, "fro", 2):
        return ops.sqrt(_sum(x * x, axis=axis, keepdims=keepdims))
    if ord == np.inf:
        return _max(ops.abs(x), axis=axis, keepdims=keepdims)
    if ord == -np.inf:
        return _min(ops.abs(x), axis=axis, keepdims=keepdims)
    if ord == 1:
        return _sum(ops.abs(x), axis=axis, keepdims=keepdims)
    if isinstance(ord, (int, float)) and ord != 0:
        return _sum(ops.abs(x) ** ord, axis=axis, keepdims=keepdims) ** (1.0 / ord)
    raise FoldTypeError(f"np.linalg.norm on a traced array: ord={ord!r} is not supported")


METHODS = {"max": _max, "min": _min, "prod": _prod, "std": _std, "any": _any, "all": _all,
           "argmax": _argmax, "argmin": _argmin, "cumsum": _cumsum, "cumprod": _cumprod}


# (x.var() is not among them: a Tracer's `var` is its variable in the program; np.var(x) works)
for _name, _method in METHODS.items():
    setattr(Tracer, _name, _method)
