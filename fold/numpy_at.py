"""JAX's index updates on traced arrays: `x.at[i].set(v)`, `.add(v)`, `.multiply(v)`, `.min(v)`, `.max(v)`,
`.get()`. A traced array is never written in place, so each returns a new array, as in JAX.

The update is lowered to a histogram over the flat positions of `x`: `positions` is `x[index]` taken of
the array 0 .. x.size-1 (NumPy's own indexing when the index is static, fold's gather when it is traced),
the values are broadcast to its shape, and `fold.reduce_by_index` folds them into one bin per element of
`x` with the update's monoid, which then meets `x`:

    add:      x + hist_sum        multiply: x * hist_prod
    min:      minimum(x, hist_min)   max: maximum(x, hist_max)   (bins no index names hold the identity)

So repeated indices accumulate (`x.at[[0, 0]].add(1.0)` adds 2), as in JAX and NumPy's `np.add.at`.
`set` keeps the last value written to each element, as NumPy's `x[i] = v` does: a max-histogram of the
update numbers finds, per element, the last update that names it, and a gather reads its value (computed
with NumPy at trace time when the index is static). Everything is a differentiable primitive already, so
grad, vjp and jvp need no rule here.

A traced boolean mask (`x.at[x > 0].set(0.0)`) takes one value for every selected element (a scalar, or a
row for a mask over leading axes): `fold.where(mask, combine(x, v), x)`.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import monoids, ops
from .combinators import reduce_by_index
from .errors import FoldIndexError, FoldTypeError, ShapeError
from .monoid import Monoid
from .tracing import Tracer

# update name -> (the monoid that folds values meeting in one element, how the folded values meet x)
UPDATES: dict[str, tuple[Monoid, Callable[[Any, Any], Any]]] = {
    "add": (monoids.sum, ops.add),
    "multiply": (monoids.prod, ops.multiply),
    "min": (monoids.min, ops.minimum),
    "max": (monoids.max, ops.maximum),
}


def _is_traced(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, Tracer) for p in parts)


def _traced_mask(index: Any) -> bool:
    return isinstance(index, Tracer) and index.dtype == np.dtype(bool)


def _static_positions(shape: tuple[int, ...], index: Any, where: str) -> np.ndarray:
    """The flat positions of the elements x[index] names, by NumPy's own indexing."""
    table = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)
    try:
        return np.asarray(table[index])
    except (IndexError, TypeError, ValueError) as err:
        raise FoldIndexError(f"{where}: the index {index!r:.80} does not fit an array of shape {shape}: {err}") from None


def _values(values: Any, dtype: np.dtype, shape: tuple[int, ...], where: str) -> Any:
    """The update values cast to the array's dtype (as JAX) and broadcast to the shape of x[index]."""
    values = ops.convert(ops.as_value(values, where), dtype)
    try:
        return ops.broadcast_to(values, shape)
    except ShapeError:
        raise ShapeError(f"{where}: values of shape {ops.shape_of(values)} do not broadcast to the shape {shape} of "
                         f"the elements the index selects") from None


class IndexUpdate:
    """`x.at[index]`: the updates of the elements `x[index]` selects; each method returns a new array."""

    def __init__(self, array: Tracer, index: Any):
        self.array, self.index = array, index

    def _where(self, name: str) -> str:
        return f"x.at[{self.index!r:.60}].{name}"

    def get(self) -> Any:
        """x[index]."""
        return ops.getitem(self.array, self.index)

    def set(self, values: Any, **options: Any) -> Any:
        """x with x[index] replaced by `values` (broadcast); of repeated indices the last value wins."""
        return self._update("set", values, options)

    def add(self, values: Any, **options: Any) -> Any:
        """x with `values` added at x[index]; repeated indices add up (np.add.at)."""
        return self._update("add", values, options)

    def multiply(self, values: Any, **options: Any) -> Any:
        """x with x[index] multiplied by `values`; repeated indices multiply up."""
        return self._update("multiply", values, options)

    def min(self, values: Any, **options: Any) -> Any:  # noqa: A003
        """x with x[index] lowered to `values` where they are smaller."""
        return self._update("min", values, options)

    def max(self, values: Any, **options: Any) -> Any:  # noqa: A003
        """x with x[index] raised to `values` where they are larger."""
        return self._update("max", values, options)

    def _update(self, name: str, values: Any, options: dict[str, Any]) -> Any:
        where = self._where(name)
        _check_options(options, where)
        if _traced_mask(self.index):
            return _masked_update(name, self.array, self.index, values, where)
        return _scatter(name, self.array, self.index, values, where)


def _check_options(options: dict[str, Any], where: str) -> None:
    """JAX's hints (indices_are_sorted, unique_indices) change nothing here; `mode` other than None is refused:
    an index out of range is an error, as in x[index]."""
    unknown = sorted(set(options) - {"indices_are_sorted", "unique_indices", "mode"})
    if unknown or options.get("mode") is not None:
        got = ", ".join(f"{k}={v!r}" for k, v in sorted(options.items()))
        raise FoldTypeError(f"{where}: fold takes indices_are_sorted= and unique_indices= (hints, ignored) and no "
                            f"mode= (an index out of range is an error, as in x[index]); got {got}")


def _scatter(name: str, x: Tracer, index: Any, values: Any, where: str) -> Any:
    shape, n = x.shape, x.size
    positions = (ops.getitem(ops.reshape(ops.iota(n), shape), index) if _is_traced(index)
                 else _static_positions(shape, index, where))
    v = ops.reshape(_values(values, x.dtype, ops.shape_of(positions), where), (-1,))
    flat_positions, flat_x = ops.reshape(positions, (-1,)), ops.reshape(x, (-1,))
    if ops.shape_of(flat_positions)[0] == 0:
        return x
    if name == "set":
        return ops.reshape(_set_last(flat_x, flat_positions, v), shape)
    monoid, meet = UPDATES[name]
    return ops.reshape(meet(flat_x, reduce_by_index(monoid, n, flat_positions, v)), shape)


def _set_last(flat_x: Any, positions: Any, v: Any) -> Any:
    """flat_x with flat_x[positions[j]] = v[j], the last j winning where positions repeat."""
    n, m = ops.shape_of(flat_x)[0], ops.shape_of(positions)[0]
    if isinstance(positions, Tracer):
        last = reduce_by_index(monoids.max, n, positions, ops.iota(m))  # the dtype's least where none names it
        written, read = ops.greater_equal(last, 0), ops.maximum(last, 0)
    else:  # known while tracing: found with NumPy
        last = np.full(n, -1, np.int64)
        np.maximum.at(last, positions, np.arange(m, dtype=np.int64))
        written, read = last >= 0, np.maximum(last, 0)
    return ops.where(written, ops.getitem(v, read), flat_x)


def _masked_update(name: str, x: Tracer, mask: Tracer, values: Any, where: str) -> Any:
    """x.at[mask]: one value (or one row) for every selected element, whatever their number."""
    k = mask.ndim
    if mask.shape != x.shape[:k]:
        raise FoldIndexError(f"{where}: a boolean mask of shape {mask.shape} does not match the leading axes of the "
                             f"array's shape {x.shape}")
    row = x.shape[k:]
    v = ops.convert(ops.as_value(values, where), x.dtype)
    if ops.shape_of(v) != () and ops.shape_of(v) != row[len(row) - len(ops.shape_of(v)):]:
        raise ShapeError(f"{where}: with a traced boolean mask the values must be a scalar or broadcast to one "
                         f"selected row {row}, got shape {ops.shape_of(v)}: the number of selected elements is "
                         f"not known while tracing (write fold.where(mask, values, x) with values of x's shape)")
    chosen = ops.broadcast_to(ops.reshape(mask, mask.shape + (1,) * len(row)), x.shape)
    new = ops.broadcast_to(v, x.shape) if name == "set" else UPDATES[name][1](x, v)
    return ops.where(chosen, new, x)


class IndexUpdates:
    """`x.at[i].set(v)` (also `.add`, `.multiply`, `.min`, `.max`, `.get`): a new array with the elements `x[i]`
    selects updated, as in JAX."""

    def __init__(self, array: Tracer):
        self.array = array

    def __getitem__(self, index: Any) -> IndexUpdate:
        return IndexUpdate(self.array, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        raise FoldTypeError(f"x.at[{index!r:.60}] = v does not change a traced array ({self.array.aval}): write "
                            f"x = x.at[{index!r:.60}].set(v)")


Tracer.at = property(IndexUpdates)
