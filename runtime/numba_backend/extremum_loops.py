"""Loops that fold a minimum or maximum, handed to LLVM's loop vectoriser.

A row's minimum (k-means' nearest centroid, the smallest of a point's distances) is a fold LLVM keeps serial
under NumPy's semantics: `a if a <= b or a != a else b` is a chain of compares and selects, and LLVM
vectorises a floating-point min reduction only under fast-math flags that assume no NaN. Its own
NaN-propagating llvm.minimum and llvm.maximum it vectorises as they are. So a loop of at least
VECTORISED_EXTENT steps whose folds are all minima and maxima, and whose body LLVM can vectorise
(straight-line arithmetic, comparisons, selections and loads: no calls, no inner loops), calls those
(scalar_helpers._vector_minimum), keeps one accumulator (nest_lanes' copy per lane is straight-line code,
which Numba's LLVM does not vectorise), and gets a trip count LLVM cannot see (scalar_helpers._unseen),
without which it unrolls the loop into scalars before the vectoriser runs. Minima of rows of 64, 2 x 10^7
elements in all, on the 2-core VM: float32 5.9 ms in four lanes of selects, 3.9 vectorised (float64 6.5
against 4.6).

An integer fold (the first index holding the minimum) is a select on the comparison either way, which LLVM
recognises; it gains the unseen trip count. Results are NumPy's but for zeros' signs: LLVM orders -0.0
below +0.0, and the vectorised fold takes its elements in another order.
"""

from __future__ import annotations

import re

from fold.runtime.loops.nest import Assign, If, LaneFold, Loop, Node, Store


# a fold's merge, one statement: the minimum or maximum of its two states (as the scalar language writes
# it, possibly cast), or a copy
_EXTREMUM_MERGE = re.compile(r"(np\.\w+\()?_(minimum|maximum)\(\w+, \w+\)\)?|\w+")
_CALL = re.compile(r"([\w.]+)\(")
# the calls a loop LLVM vectorises may make: casts and the helpers rewritten here
_VECTORISED_CALLS = frozenset({"np.float32", "np.float64", "np.int64", "np.int32", "np.uint64", "np.bool_",
                               "_minimum", "_maximum"})
_VECTOR_FORMS = {"_minimum(": "_vector_minimum(", "_maximum(": "_vector_maximum("}
# the fewest steps of a loop handed to the vectoriser: it folds 32 float32 per iteration (four AVX2 registers),
# then the registers' lanes one by one, and on shorter rows the four lanes of selects (nest_lanes) were faster:
# a GMM's maximum over 32 components 1.33x the time vectorised, a row of 16 1.2x; rows of 64, 0.64x
VECTORISED_EXTENT = 64


def vectorised_extrema(nodes: tuple) -> tuple:
    """`nodes` with each loop that folds only minima and maxima, and that LLVM can vectorise, written so
    that it does; other loops' bodies searched likewise."""
    return tuple(_rewritten(node) for node in nodes)


def _rewritten(node: Node) -> Node:
    if isinstance(node, If):
        return If(node.cond, vectorised_extrema(node.body))
    if not isinstance(node, Loop):
        return node
    long = not isinstance(node.extent, str) and node.extent >= VECTORISED_EXTENT
    if long and node.folds and all(map(_extremum, node.folds)) and _vectorisable(node.body):
        return Loop(node.index, f"_unseen({node.extent})", tuple(_vector_form(n) for n in node.body), node.folds)
    return Loop(node.index, node.extent, vectorised_extrema(node.body), node.folds)


def _extremum(fold: LaneFold) -> bool:
    return all(isinstance(n, Assign) and _EXTREMUM_MERGE.fullmatch(n.expr) for n in fold.merge)


def _vectorisable(body: tuple) -> bool:
    return all(isinstance(n, (Assign, Store)) and set(_CALL.findall(n.expr)) <= _VECTORISED_CALLS for n in body)


def _vector_form(node: Assign | Store) -> Assign | Store:
    expr = node.expr
    for scalar, vector in _VECTOR_FORMS.items():
        expr = expr.replace(scalar, vector)
    return Assign(node.target, expr) if isinstance(node, Assign) else Store(node.target, node.index, expr)
