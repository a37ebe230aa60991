"""Which matrix products of a map's body read an operand that is zero but at one index along an axis.

A min/max gradient's cotangent in a map's body is one value scattered into zeros (ad's extremum rule), and
what the gradient multiplies it by is a product with a one-hot operand: `C^T @ onehot` (the row's cotangent)
and `onehot (K, 1) @ x (1, d)` (its share of the captured C's cotangent, an outer product summed over the
map). The nest writes such a product as the one term at the index (build.py, facts.py): a vector's work per
row, not a product's. The fusion pass reads this to tell a body whose products are cheap in the nest (k-means'
matrix form's gradient) from one whose dense products BLAS runs faster batched over rows (a layer's
gradient).

This follows the nest's facts on the program's statements, before any nest is built: the scatter of one
value and the mask `where(iota == s, x, 0)` a user writes (or ad's rule over an array's first axis), then
negation, conversion, products with them, reshapes, transposes and broadcasts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from fold.ir import Let, Lit, Program, Var
from fold.primitives import BroadcastTo, Convert, Elementwise, Iota, MatMul, ReduceByIndex, Reshape, Transpose
from fold.recognize import recognize_binary_op


def one_hot_products(body: Program) -> set[int]:
    """The ids of the matrix products at `body`'s top level that contract a one-hot operand along the shared
    axis, or multiply it as an outer product (a shared axis of one): each costs one row of its other operand."""
    return _followed(body)[1]


def one_hot_values(body: Program) -> dict[Var, int]:
    """{a value of `body`'s top level that is zero but at one index along an axis: that axis}."""
    return _followed(body)[0].hot


def _followed(body: Program) -> tuple["_Facts", set[int]]:
    facts = _Facts()
    cheap: set[int] = set()
    for stmt in body.stmts:
        rule = _RULES.get(type(stmt.prim))
        if rule is not None:
            rule(stmt, facts)
        if isinstance(stmt.prim, MatMul) and _reads_one_term(stmt, facts.hot):
            cheap.add(id(stmt))
    return facts, cheap


@dataclass
class _Facts:
    """What is known of the body's values so far, as facts.py knows it of the nest's (axes by value)."""

    hot: dict[Var, int] = field(default_factory=dict)  # zero but at one index along the axis
    index_axis: dict[Var, int] = field(default_factory=dict)  # the element at idx is idx[axis] (an iota)
    splat: set[Var] = field(default_factory=set)  # every element is one scalar
    equals: dict[Var, int] = field(default_factory=dict)  # idx[axis] == one scalar


def _axis(a, known: dict[Var, int]) -> int | None:
    return known.get(a) if isinstance(a, Var) else None


def _reads_one_term(stmt: Let, hot: dict[Var, int]) -> bool:
    a, b = stmt.args
    if a.aval.ndim != 2 or b.aval.ndim != 2:
        return False
    outer = a.aval.shape[1] == 1
    return (_axis(a, hot) == 1 or _axis(b, hot) == 0
            or (outer and (_axis(a, hot) is not None or _axis(b, hot) is not None)))


def scatters_one_value(stmt: Let) -> bool:
    """Whether the histogram `stmt` adds one value into zeros at one index (reduce_by_index of one entry, +,
    a zero identity), as ad's min/max rule and `zeros.at[i].add(v)` make: an array one-hot at that index."""
    prim, out = stmt.prim, stmt.outs[0]
    identity, indices = stmt.args[0], stmt.args[1]
    return ((prim.num_leaves, prim.num_consts, out.aval.ndim) == (1, 0, 1) and indices.aval.shape == (1,)
            and is_zero_literal(identity) and recognize_binary_op(prim.body, 0) == "add")


def is_zero_literal(a) -> bool:
    """Whether `a` is a constant all of whose elements are zero."""
    return isinstance(a, Lit) and bool(np.all(a.value == 0))


def _scattered_one(stmt: Let, facts: _Facts) -> None:
    if scatters_one_value(stmt):
        facts.hot[stmt.outs[0]] = 0


def _elementwise(stmt: Let, facts: _Facts) -> None:
    op, args, out = stmt.prim.op, stmt.args, stmt.outs[0]
    hot = facts.hot
    if op in ("neg", "mul"):
        axis = next((_axis(a, hot) for a in args if _axis(a, hot) is not None), None)
    elif op == "where" and is_zero_literal(args[2]):
        mask = _axis(args[0], facts.equals)
        axis = mask if mask is not None else _axis(args[1], hot)
    else:
        axis = None
        if op == "eq":
            for x, y in (args, args[::-1]):
                splat = (isinstance(y, Var) and y in facts.splat) or (isinstance(y, Lit) and y.aval.ndim == 0)
                if isinstance(x, Var) and x in facts.index_axis and splat:
                    facts.equals[out] = facts.index_axis[x]
    if axis is not None:
        hot[out] = axis


def _iota(stmt: Let, facts: _Facts) -> None:
    facts.index_axis[stmt.outs[0]] = 0


def _moved(stmt: Let, facts: _Facts, where: Callable[[int], int | None], only_hot: bool = False) -> None:
    """The axis facts of the statement's argument, each at the axis `where` moves it to (None: lost)."""
    x, out = stmt.args[0], stmt.outs[0]
    for known in (facts.hot,) if only_hot else (facts.hot, facts.index_axis, facts.equals):
        axis = known.get(x) if isinstance(x, Var) else None
        moved = None if axis is None else where(axis)
        if moved is not None:
            known[out] = moved


def _reshape(stmt: Let, facts: _Facts) -> None:
    """A reshape adding or dropping axes of one element keeps the axes, renumbered."""
    old, new = stmt.args[0].aval.shape, tuple(stmt.prim.shape)
    if [n for n in old if n != 1] != [n for n in new if n != 1]:
        return
    kept_old = [j for j, n in enumerate(old) if n != 1]
    kept_new = [j for j, n in enumerate(new) if n != 1]
    _moved(stmt, facts, lambda axis: kept_new[kept_old.index(axis)] if axis in kept_old else None)


def _transpose(stmt: Let, facts: _Facts) -> None:
    _moved(stmt, facts, lambda axis: list(stmt.prim.perm).index(axis))


def _broadcast(stmt: Let, facts: _Facts) -> None:
    """Axes in front are added; an axis of one element that is stretched no longer holds one index apart;
    a scalar becomes a splat."""
    x, out = stmt.args[0], stmt.outs[0]
    if x.aval.ndim == 0:
        facts.splat.add(out)
        return
    lead = out.aval.ndim - x.aval.ndim
    _moved(stmt, facts, lambda axis: None if x.aval.shape[axis] == 1 else axis + lead)


def _matmul(stmt: Let, facts: _Facts) -> None:
    """A one-hot row of the left operand is a one-hot row of the product; a column of the right, a column."""
    a, b = stmt.args
    if _axis(a, facts.hot) == 0:
        facts.hot[stmt.outs[0]] = 0
    elif _axis(b, facts.hot) == 1:
        facts.hot[stmt.outs[0]] = 1


_RULES: dict[type, Callable[[Let, _Facts], None]] = {
    ReduceByIndex: _scattered_one,
    Elementwise: _elementwise,
    Iota: _iota,
    Convert: lambda stmt, facts: _moved(stmt, facts, lambda axis: axis, only_hot=True),  # as facts.py's _KEEPS
    Reshape: _reshape,
    Transpose: _transpose,
    BroadcastTo: _broadcast,
    MatMul: _matmul,
}
