"""`x[mask]` with a traced boolean mask: a selection whose number of elements is known only when the program
runs, which no traced array can have. So `x[mask]` is a `Selection`, not an array: it remembers `x` and
`mask`, and a reduction of it is the masked reduction NumPy's `where=` means —
`np.sum(x[mask])` is `np.sum(x, where=mask)`, `np.max(x[mask], initial=m)` is `np.max(x, where=mask,
initial=m)` — so NumPy code that selects and then reduces traces as written. Elementwise functions of
selections with the same mask, and of numbers, stay selections (`np.sum(x[m] ** 2 * y[m])`). Anything that
needs the selection as an array (its length, a matmul, a sort) is an error naming the replacement:
`np.where(mask, x, 0)`, or `where=` in the reduction.

Derivatives: the elements `mask` leaves out are held at 1 (`where(mask, f(x), 1)` after every function),
so that no derivative is taken at a point where it is infinite (log at 0), which would turn the zero
cotangent of a left-out element into NaN (the "double where" of JAX's FAQ).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from . import ops
from .errors import FoldIndexError, FoldTypeError
from .ir import Atom, Let, Lit, Var
from .numpy_functions import _HANDLERS
from .tracing import Scope, Tracer

REPLACEMENT = ("a traced boolean mask selects a number of elements known only when the program runs: reduce the "
               "selection (np.sum(x[mask]), np.mean, np.max(..., initial=), ...), or write np.where(mask, x, 0) "
               "or a reduction's where=mask (np.sum(x, where=mask))")

# the reductions of a selection: each becomes the same NumPy function on the whole array with where=mask
REDUCTIONS = (np.sum, np.mean, np.prod, np.max, np.amax, np.min, np.amin, np.any, np.all, np.var, np.std)
METHODS = {"sum": np.sum, "mean": np.mean, "prod": np.prod, "max": np.max, "min": np.min, "any": np.any,
           "all": np.all, "std": np.std}


class Selection:
    """`x[mask]` for a traced boolean `mask` over the leading axes of `x`: its elements in `values` (x's shape,
    the left-out ones held at 1), to be reduced."""

    __array_priority__ = 2000  # above a Tracer's: NumPy asks a Selection first
    __fold_defer__ = True  # a Tracer's operators leave a Selection operand to it (fold/ops.py)

    def __init__(self, values: Any, mask: Tracer):
        self.mask = mask
        self.values = _held(values, mask)

    @property
    def _row(self) -> tuple[int, ...]:
        return ops.shape_of(self.values)[self.mask.ndim:]

    def _broadcast_mask(self) -> Any:
        row = self._row
        return ops.broadcast_to(ops.reshape(self.mask, self.mask.shape + (1,) * len(row)), ops.shape_of(self.values))

    def __repr__(self) -> str:
        return f"Selection<{ops.shape_of(self.values)}[mask {self.mask.aval}]>"

    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        if func not in REDUCTIONS or not args or args[0] is not self:
            name = getattr(func, "__name__", repr(func))
            raise FoldTypeError(f"np.{name} of x[mask]: {REPLACEMENT}")
        return self._reduce(func, *args[1:], **kwargs)

    def _reduce(self, func: Any, axis: Any = None, *rest: Any, **kwargs: Any) -> Any:
        """func over the selection: its first axis (the selected elements) masked, the row axes as they are."""
        name = func.__name__
        if "where" in kwargs:
            raise FoldTypeError(f"np.{name}(x[mask], where=...): combine the masks instead, np.{name}(x, where=mask & w)")
        if func in (np.max, np.amax, np.min, np.amin) and kwargs.get("initial") is None:
            raise FoldTypeError(f"np.{name} of x[mask] needs initial=: the selection may be empty, which is not known "
                                f"while tracing (np.{name}(x[mask], initial=-np.inf))")
        k, ndim = self.mask.ndim, 1 + len(self._row)
        axes = tuple(range(ndim)) if axis is None else tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
        axes = ops._static_axes(axes, (0,) * ndim, f"np.{name} of x[mask]")
        if 0 not in axes:  # the row axes alone: still one result per selected element
            inner = tuple(a + k - 1 for a in axes)
            return Selection(_HANDLERS[func](self.values, inner, *rest, **kwargs), self.mask)
        inner = tuple(range(k)) + tuple(a + k - 1 for a in axes if a)
        result = _HANDLERS[func](self.values, inner, *rest, where=self._broadcast_mask(), **kwargs)
        if kwargs.get("keepdims"):  # the k mask axes kept as 1s stand for the one selection axis
            result = ops.reshape(result, ops.shape_of(result)[k - 1:])
        return result

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if method != "__call__" or kwargs:
            raise FoldTypeError(f"np.{ufunc.__name__}.{method} of x[mask]: {REPLACEMENT}")
        return Selection(ufunc(*[self._operand(x) for x in inputs]), self.mask)

    def _operand(self, x: Any) -> Any:
        """An operand of an elementwise function with this selection: a selection by the same mask, or a
        scalar (a number, or a 0-d array, traced or not)."""
        if isinstance(x, Selection):
            if not same_mask(x.mask, self.mask):
                raise FoldIndexError("an elementwise function of two selections x[m1], y[m2] needs one mask, made "
                                     "once (m = ...; x[m] * y[m]) or by the same expression: the selections of two "
                                     "different traced masks cannot be matched while tracing")
            return x.values
        if ops.shape_of(ops.as_value(x, "x[mask]")) != ():
            raise FoldTypeError(f"an elementwise function of x[mask] and an array of shape {ops.shape_of(x)}: the "
                                f"selection has no known shape to broadcast against; {REPLACEMENT}")
        return x

    def __getattr__(self, name: str) -> Any:
        if name in METHODS:
            return partial(self._reduce, METHODS[name])
        if name.startswith("__"):
            raise AttributeError(name)
        raise FoldTypeError(f"x[mask].{name}: {REPLACEMENT}")

    def __len__(self) -> int:
        raise FoldTypeError(f"len(x[mask]): the count is a traced value, np.count_nonzero(mask); {REPLACEMENT}")

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise FoldTypeError(f"x[mask] as a NumPy array: {REPLACEMENT}")

    def __bool__(self) -> bool:
        raise FoldTypeError(f"bool(x[mask]): {REPLACEMENT}")

    def __matmul__(self, other: Any) -> Any:
        raise FoldTypeError(f"x[mask] @ y: {REPLACEMENT}")

    __rmatmul__ = __matmul__


def _defining(var: Var, scope: Scope) -> Let | None:
    return next((stmt for stmt in reversed(scope.stmts) if var in stmt.outs), None)


def _same_atom(a: Atom, b: Atom, scope: Scope, depth: int) -> bool:
    """Whether two atoms of `scope` are sure to hold one value: one variable, equal constants, or the results
    of equal statements on such atoms (`x > 0` written twice), looked at `depth` statements deep."""
    if a is b:
        return True
    if isinstance(a, Lit) and isinstance(b, Lit):
        return a.value.dtype == b.value.dtype and a.value.shape == b.value.shape and bool(np.all(a.value == b.value))
    if not (isinstance(a, Var) and isinstance(b, Var)) or depth == 0:
        return False
    sa, sb = _defining(a, scope), _defining(b, scope)
    return (sa is not None and sb is not None and sa.prim == sb.prim and sa.outs.index(a) == sb.outs.index(b)
            and len(sa.args) == len(sb.args)
            and all(_same_atom(x, y, scope, depth - 1) for x, y in zip(sa.args, sb.args, strict=True)))


def same_mask(a: Tracer, b: Tracer) -> bool:
    """Whether two traced masks are one: the same tracer, or made by the same expression in one scope."""
    return a is b or (a.scope is b.scope and _same_atom(a.var, b.var, a.scope, depth=8))


def _held(values: Any, mask: Tracer) -> Any:
    """`values` with the elements `mask` leaves out set to 1 (see the module's docstring)."""
    shape = ops.shape_of(values)
    if mask.shape != shape[:mask.ndim]:
        raise FoldIndexError(f"x[mask]: a boolean mask of shape {mask.shape} does not match the leading axes of the "
                             f"array's shape {shape}")
    one = np.ones((), np.result_type(ops._dtype_key(values)))
    chosen = ops.broadcast_to(ops.reshape(mask, mask.shape + (1,) * (len(shape) - mask.ndim)), shape)
    return ops.where(chosen, values, one)


def _binary(ufunc: np.ufunc, reflected: bool = False) -> Any:
    def method(self: Selection, other: Any) -> Selection:
        return self.__array_ufunc__(ufunc, "__call__", *((other, self) if reflected else (self, other)))
    return method


for _name, _ufunc in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.true_divide),
                      ("pow", np.power), ("mod", np.remainder), ("floordiv", np.floor_divide)]:
    setattr(Selection, f"__{_name}__", _binary(_ufunc))
    setattr(Selection, f"__r{_name}__", _binary(_ufunc, reflected=True))
for _name, _ufunc in [("lt", np.less), ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal),
                      ("and", np.logical_and), ("or", np.logical_or)]:
    setattr(Selection, f"__{_name}__", _binary(_ufunc))
Selection.__neg__ = lambda self: self.__array_ufunc__(np.negative, "__call__", self)
Selection.__abs__ = lambda self: self.__array_ufunc__(np.absolute, "__call__", self)


def select(x: Any, mask: Tracer) -> Selection:
    """x[mask] for a traced boolean mask (Tracer.__getitem__ sends it here)."""
    return Selection(ops.as_value(x, "x[mask]"), mask)


_plain_getitem = Tracer.__getitem__


def _getitem(self: Tracer, key: Any) -> Any:
    if isinstance(key, Tracer) and key.dtype == np.dtype(bool):
        return select(self, key)
    return _plain_getitem(self, key)


Tracer.__getitem__ = _getitem
