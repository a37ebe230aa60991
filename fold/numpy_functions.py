"""NumPy's functions on traced arrays: `np.sum(x)`, `np.where(c, x, y)`, `np.dot(a, b)`, ... inside a traced
function record the fold operation they mean (NumPy's `__array_function__` protocol), so NumPy-style code
traces as it is written. A NumPy function with no fold meaning here, or an option fold does not have, raises
a FoldTypeError that names it, instead of NumPy's own error about converting a tracer.

Ufuncs (np.exp, np.add, np.matmul, ...) go through `__array_ufunc__` (fold/ops.py); this table holds the
other functions.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

import numpy as np

from . import ops
from .errors import FoldAttributeError, FoldTypeError, ShapeError
from .tracing import Tracer

_HANDLERS: dict[Callable, Callable] = {}


def _handles(*functions: Callable) -> Callable:
    def register(handler: Callable) -> Callable:
        for f in functions:
            _HANDLERS[f] = handler
        return handler
    return register


def _axes(axis: Any, shape: tuple[int, ...], where: str) -> tuple[int, ...]:
    """`axis` (None: all, an axis, or a sequence of them) of an array of `shape`, non-negative and sorted."""
    axes = tuple(range(len(shape))) if axis is None else tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(sorted(ops._static_axes(axes, shape, where))) if axes else ()


def _keep_dims(result: Any, shape: tuple[int, ...], axes: tuple[int, ...]) -> Any:
    return ops.reshape(result, tuple(1 if i in axes else s for i, s in enumerate(shape)))


def _where_mask(a: Any, where: Any, fill: Any) -> Any:
    """`a` with the elements `where` is False replaced by `fill` (a masked reduction's identity)."""
    if where is None or where is True:
        return a
    shape = ops.shape_of(a)
    return ops.where(ops.broadcast_to(where, shape), a, ops.broadcast_to(ops.convert(fill, np.result_type(ops._dtype_key(a))), shape))


@_handles(np.sum)
def _sum(a, axis=None, dtype=None, keepdims=False, *, where=None):
    a = ops.as_value(a, "np.sum")
    if dtype is not None:
        a = ops.convert(a, dtype)
    elif np.result_type(ops._dtype_key(a)) in (np.int32, np.bool_):
        a = ops.convert(a, "int64")  # NumPy sums smaller integers and bools in the platform's int64
    a = _where_mask(a, where, 0)
    shape = ops.shape_of(a)
    axes = _axes(axis, shape, "np.sum")
    result = ops.sum(a, axes)
    return _keep_dims(result, shape, axes) if keepdims else result


@_handles(np.mean)
def _mean(a, axis=None, dtype=None, keepdims=False, *, where=None):
    a = ops.as_value(a, "np.mean")
    shape = ops.shape_of(a)
    axes = _axes(axis, shape, "np.mean")
    count = int(np.prod([shape[i] for i in axes], dtype=np.int64))
    if count == 0:
        raise ShapeError(f"np.mean of an empty selection: shape {shape}, axes {axes}")
    if dtype is not None or np.result_type(ops._dtype_key(a)).kind != "f":
        a = ops.convert(a, dtype or "float64")
    if where is not None and where is not True:  # the mean of the selected elements: their sum over their count
        chosen = ops.convert(ops.broadcast_to(where, shape), np.result_type(ops._dtype_key(a)))
        result = ops.sum(_where_mask(a, where, 0), axes) / ops.sum(chosen, axes)
        return _keep_dims(result, shape, axes) if keepdims else result
    result = ops.sum(a, axes) / count
    return _keep_dims(result, shape, axes) if keepdims else result


@_handles(np.dot)
def _dot(a, b):
    ndims = (len(ops.shape_of(ops.as_value(a, "np.dot"))), len(ops.shape_of(ops.as_value(b, "np.dot"))))
    if 0 in ndims:
        return ops.multiply(a, b)  # NumPy's dot of a scalar is a product
    if max(ndims) > 2:
        raise ShapeError(f"np.dot on traced arrays takes 0-d, 1-d and 2-d operands, got {ndims[0]}-d and {ndims[1]}-d "
                         "(map over the batch axes instead)")
    return ops.matmul(a, b)


@_handles(np.outer)
def _outer(a, b):
    return ops.reshape(a, (-1, 1)) * ops.reshape(b, (1, -1))


@_handles(np.where)
def _where(condition, x=None, y=None):
    if x is None or y is None:
        raise FoldTypeError("np.where(condition) with one argument gives indices whose number depends on the data, "
                            "which a traced program cannot have; use np.where(condition, x, y)")
    condition = ops.as_value(condition, "np.where")
    if np.result_type(ops._dtype_key(condition)) != np.dtype(bool):
        condition = ops.not_equal(condition, 0)  # NumPy takes a number's truth: nonzero
    return ops.where(condition, x, y)


@_handles(np.clip)
def _clip(a, a_min=None, a_max=None, **bounds):
    """np.clip(a, a_min, a_max), or with NumPy 2.1's keywords min= and max=; a bound of None is none."""
    unknown = sorted(set(bounds) - {"min", "max"})
    if unknown:
        raise FoldTypeError(f"np.clip on a traced array takes (a, a_min, a_max) or min=, max=; got {', '.join(unknown)}")
    low = bounds.get("min", a_min)
    high = bounds.get("max", a_max)
    if low is not None:
        a = ops.maximum(a, low)
    return a if high is None else ops.minimum(a, high)


@_handles(np.reshape)
def _reshape(a, shape=None, order="C", *, newshape=None):
    if order != "C":
        raise FoldTypeError(f"np.reshape on a traced array: only order='C' is supported, got order={order!r}")
    if (shape is None) == (newshape is None):
        raise FoldTypeError("np.reshape on a traced array: give the new shape once (shape=...)")
    return ops.reshape(a, shape if newshape is None else newshape)


@_handles(np.transpose)
def _transpose(a, axes=None):
    return ops.transpose(a, axes)


@_handles(np.concatenate)
def _concatenate(arrays, axis=0):
    if axis is None:  # NumPy flattens first
        return ops.concatenate([ops.reshape(x, (-1,)) for x in arrays], 0)
    return ops.concatenate(list(arrays), axis)


@_handles(np.stack)
def _stack(arrays, axis=0):
    values = [ops.as_value(x, "np.stack") for x in arrays]
    if not values:
        raise ShapeError("np.stack: needs at least one array")
    shape = ops.shape_of(values[0])
    if any(ops.shape_of(v) != shape for v in values):
        raise ShapeError(f"np.stack: all arrays must have one shape, got {[ops.shape_of(v) for v in values]}")
    axis = ops._static_axis(axis, shape + (1,), "np.stack")
    return ops.concatenate([ops.reshape(v, shape[:axis] + (1,) + shape[axis:]) for v in values], axis)


@_handles(np.expand_dims)
def _expand_dims(a, axis):
    shape = ops.shape_of(ops.as_value(a, "np.expand_dims"))
    ndim = len(shape) + (len(axis) if isinstance(axis, (tuple, list)) else 1)
    try:  # positions in the result, as NumPy counts them
        new = _axes(axis, (1,) * ndim, "np.expand_dims")
    except ShapeError as err:
        raise ShapeError(f"np.expand_dims: axis {axis!r} does not name distinct axes of the result, which has {ndim} "
                         f"dimensions (array shape {shape})") from err
    rest = iter(shape)
    return ops.reshape(a, tuple(1 if i in new else next(rest) for i in range(ndim)))


@_handles(np.squeeze)
def _squeeze(a, axis=None):
    shape = ops.shape_of(ops.as_value(a, "np.squeeze"))
    axes = tuple(i for i, s in enumerate(shape) if s == 1) if axis is None else _axes(axis, shape, "np.squeeze")
    if any(shape[i] != 1 for i in axes):
        raise ShapeError(f"np.squeeze: axes {axes} of shape {shape} are not all of length 1")
    return ops.reshape(a, tuple(s for i, s in enumerate(shape) if i not in axes))


@_handles(np.broadcast_to)
def _broadcast_to(array, shape):
    return ops.broadcast_to(array, shape)


@_handles(np.shape)
def _shape(a):
    return ops.shape_of(a)


@_handles(np.ndim)
def _ndim(a):
    return len(ops.shape_of(a))


@_handles(np.size)
def _size(a, axis=None):
    shape = ops.shape_of(a)
    return int(np.prod([shape[i] for i in _axes(axis, shape, "np.size")], dtype=np.int64))


@_handles(np.zeros_like)
def _zeros_like(a, dtype=None, shape=None):
    return _full_like(a, 0, dtype, shape)


@_handles(np.ones_like)
def _ones_like(a, dtype=None, shape=None):
    return _full_like(a, 1, dtype, shape)


@_handles(np.full_like)
def _full_like(a, fill_value, dtype=None, shape=None):
    dtype = dtype or np.result_type(ops._dtype_key(a))
    shape = ops.shape_of(a) if shape is None else ops._static_shape(shape, "np.full_like")
    if isinstance(fill_value, Tracer):  # a traced fill: its value broadcast, not a constant
        return ops.broadcast_to(ops.convert(fill_value, dtype), shape)
    return np.full(shape, fill_value, dtype)


# NumPy functions people reach for that fold spells differently: said in the error
_INSTEAD = {
    np.copyto: "fold.broadcast_to(value, shape) (np.full_like(numpy_array, traced_value) copies a traced value "
               "into a NumPy array, which cannot hold one)",
}


def public_name(func: Callable) -> str:
    """NumPy's function as a user writes it after `np.`: "sum", "linalg.norm" (not "linalg._linalg.norm")."""
    public = [p for p in (getattr(func, "__module__", None) or "numpy").split(".")[1:] if not p.startswith("_")]
    return ".".join([*public, getattr(func, "__name__", repr(func))])


def array_function(self: Tracer, func: Callable, types: Sequence[type], args: tuple, kwargs: dict) -> Any:
    """Tracer.__array_function__: the fold operation NumPy's `func` means on these arguments."""
    handler = _HANDLERS.get(func)
    name = public_name(func)
    if handler is None:
        hint = _INSTEAD.get(func)
        supported = ", ".join(sorted(f"np.{public_name(f)}" for f in _HANDLERS))
        raise FoldTypeError(f"np.{name} is not supported on traced arrays"
                            + (f"; write {hint}" if hint else f"; the NumPy functions fold traces are {supported}, "
                               "and the ufuncs (np.exp, np.add, ...)"))
    try:
        inspect.signature(handler).bind(*args, **kwargs)
    except TypeError as err:
        parameters = ", ".join(inspect.signature(handler).parameters)
        raise FoldTypeError(f"np.{name} on a traced array takes ({parameters}): {err}") from None
    return handler(*args, **kwargs)


Tracer.__array_function__ = array_function


# ndarray methods a NumPy user writes on a traced array: the functions above, or what to write instead
def _flat(a):
    """The elements along one axis, in C order."""
    return ops.reshape(a, (-1,))


def _copy(a):
    """The same value: fold values are never written in place, so a copy is the array itself."""
    return a


_METHODS = {"sum": _sum, "mean": _mean, "dot": _dot, "squeeze": _squeeze, "ravel": _flat, "flatten": _flat,
            "copy": _copy}
def _missing_attribute(self: Tracer, name: str) -> Any:
    """Tracer.__getattr__ (only reached for names a Tracer lacks): an AttributeError that says what a traced
    array has, so that a NumPy habit gets a pointer rather than a bare error (hasattr still works)."""
    if name.startswith("__"):
        raise AttributeError(name)
    from .numpy_reductions import METHODS

    methods = ", ".join(sorted(["astype", "reshape", "transpose", "T", "at", "shape", "dtype", "ndim", "size", *_METHODS, *METHODS]))
    raise FoldAttributeError(f"a traced array ({self.aval}) has no attribute {name!r}: it has {methods}, the "
                             "operators, the NumPy functions and ufuncs fold traces (docs/language.md), and fold.* "
                             "for the rest")


for _name, _fn in _METHODS.items():
    setattr(Tracer, _name, _fn)
Tracer.__getattr__ = _missing_attribute
