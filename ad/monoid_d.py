"""Calling a monoid's `d` (Theorem 2.1's D(c, a, ybar)), and the check every use makes of what it returned.

`d` is user code: a d that returns a cotangent of another shape or structure than the element would
otherwise give a gradient of the wrong shape or dtype without any error. One difference is not an error: a
floating-point leaf wider than the element's (float64 for a float32 field) is rounded to the element's
dtype. In a record of float32 and float64 fields (attention with float32 scores and float64 values) NumPy
promotion makes the float32 field's D float64, and a cotangent takes its primal's dtype, as the generic
rule gives it. A narrower one (a D computed in float32 for a float64 element) stays an error: it would lose
precision unseen.
"""

from __future__ import annotations

from typing import Any, Sequence

from fold import ops
from fold.dtypes import ShapedArray
from fold.errors import StructureError
from fold.pytree import TreeDef, leaf_paths, tree_flatten

from .zeros import aval_of


def check_d_result(monoid_name: str, got_tree: TreeDef, got: Sequence[ShapedArray], want_tree: TreeDef,
                   want: Sequence[ShapedArray]) -> None:
    """Raise StructureError unless d's results (structure `got_tree`, leaves `got`) are like the elements
    (`want_tree`, `want`): the same structure, and each leaf the same shape and dtype."""
    if got_tree != want_tree:
        raise StructureError(f"monoid {monoid_name}: d returned structure {got_tree}, but the elements have structure "
                             f"{want_tree}")
    paths = leaf_paths(want_tree, "element")
    diffs = [f"{path} is {w}, d gave {g}" for path, w, g in zip(paths, want, got, strict=True) if w != g]
    if diffs:
        raise StructureError(f"monoid {monoid_name}: d must return a cotangent shaped like the element, with its "
                             f"dtype, but {'; '.join(diffs)}")


def call_d(monoid, c: Any, a: Any, g: Any) -> Any:
    """monoid.d(c, a, g), each leaf of a wider float dtype than the element's leaf rounded to the element's."""
    result = monoid.d(c, a, g)
    got, got_tree = tree_flatten(result)
    want, want_tree = tree_flatten(a)
    if got_tree != want_tree:
        return result  # check_d_result names the difference
    return got_tree.unflatten([float_as(x, aval_of(w).dtype) for x, w in zip(got, want, strict=True)])


def float_as(x, dtype):
    """A cotangent `x` rounded to its primal's float `dtype` where it is of a wider float dtype."""
    current = aval_of(x).dtype
    return ops.convert(x, dtype) if current.kind == "f" == dtype.kind and current.itemsize > dtype.itemsize else x


def row_aval(x) -> ShapedArray:
    """The aval of one row of x (its element, where x holds one per row)."""
    aval = aval_of(x)
    return aval.update(shape=aval.shape[1:])
