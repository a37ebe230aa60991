"""The check every use of a monoid's `d` (Theorem 2.1's D(c, a, ybar)) makes of what it returned.

`d` is user code: a d that returns a cotangent of another shape or dtype than the element would otherwise
give a gradient of the wrong shape or dtype without any error.
"""

from __future__ import annotations

from typing import Sequence

from fold.dtypes import ShapedArray
from fold.errors import StructureError
from fold.pytree import TreeDef, leaf_paths

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


def row_aval(x) -> ShapedArray:
    """The aval of one row of x (its element, where x holds one per row)."""
    aval = aval_of(x)
    return aval.update(shape=aval.shape[1:])
