"""Recognising well-known operators in a traced lambda, so rules and backends can specialise.

`lambda a, b: a * b` and `fold.monoids.prod` trace to the same one-statement body; both are "mul".
"""

from __future__ import annotations

import weakref

from .ir import Program, Var
from .primitives import Elementwise

KNOWN_BINARY_OPS = ("add", "mul", "maximum", "minimum", "logaddexp")
# Their identities (-inf/inf: an integer dtype's least/greatest value, as fold.reduce's identity= reads them)
KNOWN_IDENTITIES = {"add": 0, "mul": 1, "maximum": -float("inf"), "minimum": float("inf"), "logaddexp": -float("inf")}


_recognized: "weakref.WeakKeyDictionary[Program, dict[int, str | None]]" = weakref.WeakKeyDictionary()


def recognize_binary_op(body: Program, num_consts: int = 0) -> str | None:
    """The name of the elementwise op the body applies to its two (single-leaf) arguments, if that is all it does.
    Memoised per body: backends ask on every call of a fold."""
    per_body = _recognized.get(body)
    if per_body is None:
        per_body = _recognized[body] = {}
    if num_consts not in per_body:
        per_body[num_consts] = _recognize(body, num_consts)
    return per_body[num_consts]


def commutative_fold(prim) -> bool:
    """Whether a fold (reduce, scan, reduce_by_index) may combine its elements in any order: its monoid says
    so, or, without one, its operator is one of the known ops, all commutative (a user's `lambda a, b:
    fold.minimum(a, b)`; jvp's pair of a reduce and its tangent, once the tangent is dropped)."""
    if prim.monoid is not None:
        return prim.monoid.commutative
    return recognize_binary_op(prim.body, prim.num_consts) is not None


def _recognize(body: Program, num_consts: int) -> str | None:
    if num_consts or len(body.inputs) != 2 or len(body.outputs) != 1 or len(body.stmts) != 1:
        return None
    (stmt,) = body.stmts
    a, b = body.inputs
    if not isinstance(stmt.prim, Elementwise) or stmt.prim.op not in KNOWN_BINARY_OPS:
        return None
    args = stmt.args
    if len(args) != 2 or not all(isinstance(x, Var) for x in args) or {id(x) for x in args} != {id(a), id(b)}:
        return None
    if body.outputs[0] is not stmt.outs[0]:
        return None
    return stmt.prim.op
