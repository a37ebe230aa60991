"""float32 sums accumulated in float64 by the numba backend's kernels.

A kernel folds each thread's (or row's) share in one running total. In float32 that total's rounding error
grows with the number of terms: a row of 10^6 values of 0.8153 summed to 813516 against 815300, a relative
error of 2.2e-3, where NumPy's pairwise summation (the numpy backend) gives 1.5e-8. So where a kernel sums
float32 values (a fused map and sum, a fused run's row sums, `fold.sum` of a matrix's rows), the values are
converted to float64 as they are produced, summed in float64, and the total rounded to float32 once: as
accurate as NumPy's pairwise sum or more, and the kernel still reads float32 from memory.

Column sums (`fold.sum(x, 0)`) need nothing here: kernels.cpu.column_sums keeps float64 partial sums itself
(NumPy adds a C-contiguous matrix's rows one at a time in float32, and drifts as far).
"""

from __future__ import annotations

import weakref
from typing import Callable

import numpy as np

import fold
from fold.dtypes import ShapedArray
from fold.ir import Let, Program, Var
from fold.primitives import Convert
from fold.recognize import recognize_binary_op

from .codegen import compile_scalar_program

WIDE = np.dtype(np.float64)


def widens(op: str | None, dtype: np.dtype) -> bool:
    """Whether a fold with this recognised operator over this dtype accumulates in float64 instead."""
    return op == "add" and dtype == np.float32


def reduce_widens(reduce_prim) -> bool:
    """widens() for a Reduce statement: its recognised operator and its (one) leaf's dtype."""
    leaves = reduce_prim.body.inputs[reduce_prim.num_consts:]
    return len(leaves) == 2 and widens(recognize_binary_op(reduce_prim.body, reduce_prim.num_consts), leaves[0].aval.dtype)


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
