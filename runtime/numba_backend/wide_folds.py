"""float32 folds carried in float64 by the numba backend's kernels.

A kernel folds each thread's (or row's, or bin's) share in one running value. In float32 that value's
rounding error grows with the number of terms: a row of 10^6 values of 0.8153 summed to 813516 against
815300, a relative error of 2.2e-3, and a scan's last element of 10^6 values near 0.8 under a user's
a + b came out 1.1e-3 off; the numpy backend's tree of combines (NumPy's pairwise summation for +)
stays near 1e-7. So the kernels keep float32 running values in float64 and round each result once,
while still reading float32 from memory:

- sums (a fused map and sum, a fused run's row sums, `fold.sum` of a matrix's rows): the summed value is
  converted to float64 as it is produced (`widened_last_output`) and added in float64 (`wide_add`);
- every other fold of float32 leaves (user operators, *, the record monoids; reduce, scan, reduce by index,
  per-row folds, a fused map and fold, the generic gradient's two scans): the operator is traced again on
  float64 running values (`widened_operator`) and the kernel carries those (`carry_for`, the kernels'
  `carry` argument). Maximum and minimum pick one of their operands and round nothing, so they stay float32.

Column sums (`fold.sum(x, 0)`) need nothing here: kernels.cpu.column_sums keeps float64 partial sums itself
(NumPy adds a C-contiguous matrix's rows one at a time in float32, and drifts as far).
"""

from __future__ import annotations

import weakref
from typing import Callable

import numpy as np

import fold
from fold.dtypes import ShapedArray
from fold.inline import inline_program
from fold.ir import Let, Program, Var
from fold.primitives import Convert
from fold.recognize import recognize_binary_op

from .codegen import compile_scalar_program
from ..wide_operators import WIDE, carried_operator


def widens(op: str | None, dtype: np.dtype) -> bool:
    """Whether a fold with this recognised operator over this dtype accumulates in float64 instead."""
    return op == "add" and dtype == np.float32


def reduce_widens(reduce_prim) -> bool:
    """widens() for a Reduce statement: its recognised operator and its (one) leaf's dtype."""
    leaves = reduce_prim.body.inputs[reduce_prim.num_consts:]
    return len(leaves) == 2 and widens(recognize_binary_op(reduce_prim.body, reduce_prim.num_consts), leaves[0].aval.dtype)


def fused_fold(reduce_prim, dtype: np.dtype) -> tuple[Callable, bool, tuple[np.dtype, ...] | None]:
    """How a kernel fusing a map into this Reduce (one leaf of `dtype`) folds: (its compiled combine, whether
    it sums float64 values (a float32 sum: the map's value widened by widened_last_output, the identity
    float64), its `carry` (another float32 fold, see carried_operator))."""
    if reduce_widens(reduce_prim):
        return wide_add(), True, None
    operator, carry = carried_operator(reduce_prim.body, reduce_prim.num_consts, [dtype])
    return compile_scalar_program(operator), False, carry


def rounding_inputs(body: Program, positions: range) -> Program:
    """`body` taking float64 for its float32 inputs at `positions` (running values a kernel carries in float64)
    and rounding them to float32 first: a function reading a carried scan (a map after it, a gradient's
    mapper) computes in the dtypes it was written for, and its results keep theirs."""
    per_body = _ROUNDING.setdefault(body, {})
    found = per_body.get(positions)
    if found is None:
        rounds = [j in positions and v.aval.dtype == np.float32 for j, v in enumerate(body.inputs)]
        examples = [np.zeros(v.aval.shape, WIDE if r else v.aval.dtype) for v, r in zip(body.inputs, rounds, strict=True)]
        found = per_body[positions] = fold.trace(
            lambda *xs: inline_program(body, [fold.convert(x, "float32") if r else x for x, r in zip(xs, rounds, strict=True)]),
            *examples)
    return found


_ROUNDING: "weakref.WeakKeyDictionary[Program, dict[range, Program]]" = weakref.WeakKeyDictionary()


def widened_last_output(body: Program) -> Program:
    """`body` with its last output converted to float64 (the value a kernel sums); one Program per body, so
    that compile_scalar_program's memo finds it on every call."""
    found = _WIDENED.get(body)
    if found is None:
        last = body.outputs[-1]
        wide = Var(ShapedArray(last.aval.shape, WIDE))
        stmts = body.stmts + (Let((wide,), Convert(WIDE), (last,)),)
        found = _WIDENED[body] = Program(body.inputs, stmts, body.outputs[:-1] + (wide,), body.in_tree,
                                         body.out_tree, dict(body.meta))
    return found


_WIDENED: "weakref.WeakKeyDictionary[Program, Program]" = weakref.WeakKeyDictionary()


def wide_add() -> Callable:
    """The float64 + as a kernel's combine."""
    return _compiled("add", lambda: fold.trace(lambda a, b: a + b, np.zeros((), WIDE), np.zeros((), WIDE)))


def widen(dtype: np.dtype) -> Callable:
    """x -> float64(x) for scalars of `dtype`, as a kernel's mapper."""
    return _compiled(("widen", dtype), lambda: fold.trace(lambda x: fold.convert(x, "float64"), np.zeros((), dtype)))


_PROGRAMS: dict = {}


def _compiled(key, trace: Callable[[], Program]) -> Callable:
    if key not in _PROGRAMS:
        _PROGRAMS[key] = trace()
    return compile_scalar_program(_PROGRAMS[key])
