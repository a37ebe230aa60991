"""Which matrix products of a map's body read an operand that is zero but at one index along an axis.

A min/max gradient's cotangent in a map's body is one value scattered into zeros (ad's extremum rule), and
what the gradient multiplies it by is a product with a one-hot operand: `C^T @ onehot` (the row's cotangent)
and `onehot (K, 1) @ x (1, d)` (its share of the captured C's cotangent, an outer product summed over the
map). The nest writes such a product as the one term at the index (build.py, facts.py): a vector's work per
row, not a product's. The fusion pass reads this to tell a body whose products are cheap in the nest (k-means'
matrix form's gradient) from one whose dense products BLAS runs faster batched over rows (a layer's
gradient).

This follows the nest's facts on the program's statements, before any nest is built, for the forms ad emits:
the scatter of one value, then negation, conversion, products with it, reshapes, transposes and broadcasts.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from fold.ir import Let, Lit, Program, Var
from fold.primitives import BroadcastTo, Convert, Elementwise, MatMul, ReduceByIndex, Reshape, Transpose
from fold.recognize import recognize_binary_op


def one_hot_products(body: Program) -> set[int]:
    """The ids of the matrix products at `body`'s top level that contract a one-hot operand along the shared
    axis, or multiply it as an outer product (a shared axis of one): each costs one row of its other operand."""
    hot: dict[Var, int] = {}  # a value -> the axis along which it is zero but at one index
    cheap: set[int] = set()
    for stmt in body.stmts:
        rule = _RULES.get(type(stmt.prim))
        axis = rule(stmt, hot) if rule is not None else None
        if axis is not None:
            hot[stmt.outs[0]] = axis
        if isinstance(stmt.prim, MatMul) and _reads_one_term(stmt, hot):
            cheap.add(id(stmt))
    return cheap


def _axis(a, hot: dict[Var, int]) -> int | None:
    return hot.get(a) if isinstance(a, Var) else None


def _reads_one_term(stmt: Let, hot: dict[Var, int]) -> bool:
    a, b = stmt.args
    if a.aval.ndim != 2 or b.aval.ndim != 2:
        return False
    outer = a.aval.shape[1] == 1
    return (_axis(a, hot) == 1 or _axis(b, hot) == 0
            or (outer and (_axis(a, hot) is not None or _axis(b, hot) is not None)))


def _scattered_one(stmt: Let, hot: dict[Var, int]) -> int | None:
    """One value added into zeros at one index (reduce_by_index of one entry, +, a zero identity)."""
    prim, out = stmt.prim, stmt.outs[0]
    identity, indices = stmt.args[0], stmt.args[1]
    if (prim.num_leaves, prim.num_consts, out.aval.ndim) != (1, 0, 1) or indices.aval.shape != (1,):
        return None
    zero = isinstance(identity, Lit) and np.ndim(identity.value) == 0 and identity.value == 0
    return 0 if zero and recognize_binary_op(prim.body, 0) == "add" else None


def _elementwise(stmt: Let, hot: dict[Var, int]) -> int | None:
    op, args = stmt.prim.op, stmt.args
    if op == "neg":
        return _axis(args[0], hot)
    if op == "mul":
        return next((_axis(a, hot) for a in args if _axis(a, hot) is not None), None)
    if op == "where" and isinstance(args[2], Lit) and np.all(args[2].value == 0):
        return _axis(args[1], hot)
    return None


def _reshape(stmt: Let, hot: dict[Var, int]) -> int | None:
    """A reshape adding or dropping axes of one element keeps the axis, renumbered."""
    x, axis = stmt.args[0], _axis(stmt.args[0], hot)
    old, new = x.aval.shape, tuple(stmt.prim.shape)
    if axis is None or [n for n in old if n != 1] != [n for n in new if n != 1]:
        return None
    position = [j for j, n in enumerate(old) if n != 1].index(axis) if old[axis] != 1 else None
    return None if position is None else [j for j, n in enumerate(new) if n != 1][position]


def _transpose(stmt: Let, hot: dict[Var, int]) -> int | None:
    axis = _axis(stmt.args[0], hot)
    return None if axis is None else list(stmt.prim.perm).index(axis)


def _broadcast(stmt: Let, hot: dict[Var, int]) -> int | None:
    """Axes in front are added; an axis of one element that is stretched no longer holds one index apart."""
    x, axis = stmt.args[0], _axis(stmt.args[0], hot)
    if axis is None or x.aval.shape[axis] == 1:
        return None
    return axis + stmt.outs[0].aval.ndim - x.aval.ndim


def _matmul(stmt: Let, hot: dict[Var, int]) -> int | None:
    """A one-hot row of the left operand is a one-hot row of the product; a column of the right, a column."""
    a, b = stmt.args
    if _axis(a, hot) == 0:
        return 0
    return 1 if _axis(b, hot) == 1 else None


_RULES: dict[type, Callable[[Let, dict[Var, int]], int | None]] = {
    ReduceByIndex: _scattered_one,
    Elementwise: _elementwise,
    Convert: lambda stmt, hot: _axis(stmt.args[0], hot),
    Reshape: _reshape,
    Transpose: _transpose,
    BroadcastTo: _broadcast,
    MatMul: _matmul,
}
