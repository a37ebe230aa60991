"""Monoids: an associative operator with an identity, optionally commutative, optionally with the D of Theorem 2.1.

A monoid's elements are pytrees (a scalar, or a record such as logwsum's {"z", "v"}); each leaf of the
identity is a scalar or array broadcast to the element's shape, so one monoid serves vectors of any size D.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .dtypes import ShapedArray
from .errors import FoldTypeError, ShapeError, StructureError
from .pytree import TreeDef, leaf_paths, tree_flatten


class Monoid:
    """An associative `op` with an `identity`; `commutative` and `d` enable the Theorem 2.1 gradient shortcut.

    `d(c, a, g)`, if given, is the vector-Jacobian form of D: the cotangent of a part `a` of a fold whose
    total is `c`, given the cotangent `g` of `c`. All three are pytrees shaped like one element.
    `domain`, if given, maps an arbitrary element into the monoid's domain (weights made non-negative, say);
    `fold.check_monoid` uses it to draw valid random elements.

    >>> import fold
    >>> mul = fold.Monoid(lambda a, b: a * b, 1.0, commutative=True, name="mul")
    """

    def __init__(
        self,
        op: Callable[[Any, Any], Any],
        identity: Any,
        *,
        commutative: bool = False,
        d: Callable[[Any, Any, Any], Any] | None = None,
        name: str | None = None,
        domain: Callable[[Any], Any] | None = None,
    ):
        if not callable(op):
            raise FoldTypeError(f"Monoid: op must be callable, got {type(op).__name__}")
        if d is not None and not callable(d):
            raise FoldTypeError(f"Monoid: d must be callable or None, got {type(d).__name__}")
        self.op = op
        self.identity = identity
        self.commutative = bool(commutative)
        self.d = d
        self.name = name or getattr(op, "__name__", "monoid")
        self.domain = domain

    def __call__(self, a: Any, b: Any) -> Any:
        return self.op(a, b)

    def __repr__(self) -> str:
        flags = ", commutative" if self.commutative else ""
        flags += ", with d" if self.d is not None else ""
        return f"Monoid({self.name}{flags})"


def identity_leaves(where: str, identity: Any, treedef: TreeDef, elems: list[ShapedArray]) -> list[np.ndarray]:
    """The identity as one array per element leaf, cast to the leaf's dtype and broadcast to its shape.

    +-inf in an integer identity means the dtype's largest or smallest value (so min and max work on ints).
    """
    id_leaves, id_def = tree_flatten(identity)
    if id_def != treedef:
        raise StructureError(f"{where}: the identity has structure {id_def} but the elements have {treedef}")
    out = []
    for path, value, elem in zip(leaf_paths(treedef), id_leaves, elems, strict=True):
        if hasattr(value, "aval") and not isinstance(value, np.ndarray):
            raise FoldTypeError(f"{where}: the identity (leaf {path}) must be a constant, not a traced value")
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise FoldTypeError(f"{where}: identity leaf {path} is {array.dtype.name}, not a number")
        array = _cast(array, elem.dtype, where, path)
        try:
            array = np.broadcast_to(array, elem.shape)
        except ValueError:
            raise ShapeError(f"{where}: identity leaf {path} has shape {array.shape}, which does not fit elements of shape {elem.shape}") from None
        out.append(np.array(array, order="C"))
    return out


def _cast(array: np.ndarray, dtype: np.dtype, where: str, path: str) -> np.ndarray:
    """The identity leaf in the element dtype; a finite value that the cast would change (0.9 for an int,
    1e20 for an int32, 1e300 for a float32, 2 for a bool) or a NaN for a non-float dtype is an error, not a
    different identity."""
    with np.errstate(all="ignore"):
        cast = _cast_special(array, dtype, where, path)
        finite = np.isfinite(array) if array.dtype.kind == "f" else np.ones(array.shape, bool)
        changed = ~np.isfinite(cast) if dtype.kind == "f" else cast != array
        nan_lost = np.isnan(array) if array.dtype.kind == "f" and dtype.kind != "f" else False
    if np.any((finite & changed) | nan_lost):
        raise FoldTypeError(f"{where}: identity leaf {path} = {array} does not fit the element dtype {dtype.name} "
                            f"(the cast gives {cast})")
    return cast


def _cast_special(array: np.ndarray, dtype: np.dtype, where: str, path: str) -> np.ndarray:
    if dtype.kind == "f" or array.dtype.kind != "f" or np.all(np.isfinite(array)):
        return array.astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        # select in the integer dtype: int64's max is not exact in float64, and would wrap to its min
        finite = np.where(np.isfinite(array), array, 0).astype(dtype)
        return np.where(array == np.inf, info.max, np.where(array == -np.inf, info.min, finite)).astype(dtype)
    if dtype == np.dtype(bool):
        return (array > 0).astype(dtype)
    raise FoldTypeError(f"{where}: identity leaf {path} ({array}) cannot be cast to {dtype.name}")
