"""float32 folds' operators traced again on float64, for both CPU backends.

A fold of float32 values under a user's operator (or *, or a record monoid) that rounds every combine to
float32 drifts with the number of combines on each result's path: a float32 product of 10^5 factors near 1,
or an affine scan's (a, b) pairs, came out hundreds of ulp from the exact fold on the numpy backend's tree
of float32 combines (the rounding errors of n - 1 combines add up in any order). The numba backend's
kernels and the numpy backend's trees instead carry such folds in float64 through `widened_operator` and
round each result to float32 once, so both are within float32 rounding of the exact fold.
"""

from __future__ import annotations

import weakref

import numpy as np

import fold
from fold.errors import FoldError
from fold.ir import Lit, Program
from fold.primitives import Elementwise
from fold.recognize import recognize_binary_op
from fold.tracing import Tracer, bind

WIDE = np.dtype(np.float64)

# Recognised operators that return one of their operands: carried as they are, there is nothing to round.
SELECTING = ("maximum", "minimum")


def carry_for(op: str | None, dtypes) -> tuple[np.dtype, ...] | None:
    """The dtypes a fold of leaves of these dtypes carries under this operator (recognised name, or None for
    a user's): float64 for each float32 leaf, unless the operator selects; None when nothing widens."""
    if op in SELECTING or not any(np.dtype(d) == np.float32 for d in dtypes):
        return None
    return tuple(WIDE if np.dtype(d) == np.float32 else np.dtype(d) for d in dtypes)


def carried_operator(body: Program, num_consts: int, dtypes) -> tuple[Program, tuple[np.dtype, ...] | None]:
    """(the operator a fold of leaves of these dtypes (scalar components) runs, the dtypes it carries):
    widened for float32 leaves (carry_for, widened_operator), else `body` as it is and None."""
    carry = carry_for(recognize_binary_op(body, num_consts), dtypes)
    wide = None if carry is None else widened_operator(body)
    return (body, None) if wide is None else (wide, carry)


def widened_operator(body: Program) -> Program | None:
    """`body` traced again on float64 where it had float32 inputs, so that a kernel's running values stay
    float64 through it: float32 literals become float64, and an elementwise operation meeting float32 and
    float64 operands (a value the user converted to float32 explicitly) computes in float64. None for a body
    it cannot replay so (a nested fold, traced for float32 elements): the kernel then carries float32. One
    answer per body, as widened_last_output."""
    if body not in _WIDENED_OPERATORS:
        examples = [np.zeros(v.aval.shape, WIDE if v.aval.dtype == np.float32 else v.aval.dtype) for v in body.inputs]
        try:
            _WIDENED_OPERATORS[body] = fold.trace(lambda *xs: _replay_widened(body, xs), *examples)
        except FoldError:
            _WIDENED_OPERATORS[body] = None
    return _WIDENED_OPERATORS[body]


def _replay_widened(body: Program, args) -> list:
    env = dict(zip(body.inputs, args, strict=True))

    def read(atom):
        if isinstance(atom, Lit):
            return atom.value.astype(WIDE) if atom.value.dtype == np.float32 else atom.value
        return env[atom]

    for stmt in body.stmts:
        operands = [read(a) for a in stmt.args]
        if isinstance(stmt.prim, Elementwise):
            operands = _promoted(stmt.prim, operands)
        env.update(zip(stmt.outs, bind(stmt.prim, *operands), strict=True))
    return [read(a) for a in body.outputs]


def _promoted(prim: Elementwise, operands: list) -> list:
    """The float operands of an elementwise operation in float64 if any of them is (a select's condition aside)."""
    first = 1 if prim.scalar.kind == "select" else 0
    dtypes = [_dtype(x) for x in operands[first:]]
    if WIDE not in dtypes or np.dtype(np.float32) not in dtypes:
        return operands
    return operands[:first] + [fold.convert(x, "float64") if d == np.float32 else x
                               for x, d in zip(operands[first:], dtypes, strict=True)]


def _dtype(x) -> np.dtype:
    return x.var.aval.dtype if isinstance(x, Tracer) else np.asarray(x).dtype


_WIDENED_OPERATORS: "weakref.WeakKeyDictionary[Program, Program | None]" = weakref.WeakKeyDictionary()
