"""Which statements the cuda backend runs as CUDA kernels (kernels.cuda does the work).

Lowered here, with any associative operator whose elements are scalars or small arrays: reduce and scan at
the top level of a program and one map deep (a fold per row: the segmented kernels), reduce_by_index at the
top level, and top-level maps whose body is written as a scalar function. An operator capturing a few
scalars, the same for every fold, carries them as element fields (runtime/numba_backend/captured_operands.py).

A rule returns the statement's outputs, or None, and the numpy implementation then runs, on the host: after
one warning naming the primitive and why where a fold cannot be lowered; silently where a map's body is not
a scalar function (it runs batched, as elementwise code does, with its folds lowered where they can be).
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from fold.primitives import Map, Reduce, ReduceByIndex, Scan
from fold.recognize import recognize_binary_op
from fold.rules import RuleTable
from fold.runtime.numba_backend.captured_operands import capture_problem
from fold.runtime.numba_backend.lowering import _element_shapes, _identity, _join, _split, decline, with_captures_as_operands

from .device_functions import device_function

cuda_impls = RuleTable("cuda backend")


def _decline(prim, reason: str) -> None:
    return decline(prim, reason, backend="cuda")


def _run(prim, kernel: str, *args, **kwargs) -> Any:
    """fold.kernels.cuda.<kernel>(*args, **kwargs), or None after declining if it does not compile or run."""
    from fold.kernels import cuda

    try:
        return getattr(cuda, kernel)(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - a kernel that does not compile or run: the reference implementation runs
        message = _SIMULATED_THREAD.sub("", str(err)).splitlines()[0][:200] if str(err) else ""
        return _decline(prim, f"its kernel failed: {type(err).__name__}: {message}")


# the simulator prefixes an error raised in a kernel with the thread's and block's indices, which would make
# each thread's failure a warning of its own
_SIMULATED_THREAD = re.compile(r"^tid=\[[^]]*\] ctaid=\[[^]]*\]: ")


def _fold_setup(prim, args: list, depth: int, deepest: int = 0) -> tuple[Callable, tuple] | None:
    """(the operator as a device function, the identity's scalars), or None after declining; `deepest`: how
    many maps deep the fold may be."""
    if depth > deepest:
        return _decline(prim, "this fold inside a map is not lowered to CUDA yet")
    if prim.num_consts:  # more than with_captures_as_operands carries as element fields
        return _decline(prim, capture_problem(prim) or "its operator captures values")
    combine, problem = device_function(prim.body)
    if combine is None:
        return _decline(prim, f"its operator cannot be compiled: {problem}")
    ident = _identity(args[prim.num_consts: prim.num_consts + prim.num_leaves], _element_shapes(prim))
    if ident is None:
        return _decline(prim, "its identity differs from row to row")
    if not ident:
        return _decline(prim, "its elements have no scalars")
    return combine, ident


def _fold(prim, args: list, depth: int, kernel: str, **options):
    """A reduce or scan as kernels.cuda.<kernel> at the top level, or one map deep (a fold per row) as
    segmented_<kernel>; the results joined back into the elements' shapes."""
    setup = _fold_setup(prim, args, depth, deepest=1)
    if setup is None:
        return None
    combine, ident = setup
    shapes, xs = _element_shapes(prim), args[prim.num_consts + prim.num_leaves:]
    if depth:
        rows = np.broadcast_shapes(*[x.shape[:1] for x in xs])[0]
        xs, kernel = [np.broadcast_to(x, (rows,) + x.shape[1:]) for x in xs], f"segmented_{kernel}"
    parts = _run(prim, kernel, combine, len(ident), ident, _split(xs, shapes, depth + 1), **options)
    return None if parts is None else _join(list(parts), shapes)


@cuda_impls.register(Reduce)
@with_captures_as_operands(deepest=1, backend="cuda")
def _reduce(prim: Reduce, args: list, depth: int):
    return _fold(prim, args, depth, "reduce")


@cuda_impls.register(Scan)
@with_captures_as_operands(deepest=1, backend="cuda")
def _scan(prim: Scan, args: list, depth: int):
    return _fold(prim, args, depth, "scan", exclusive=prim.exclusive, reverse=prim.reverse)


@cuda_impls.register(ReduceByIndex)
@with_captures_as_operands(deepest=0, backend="cuda")
def _reduce_by_index(prim: ReduceByIndex, args: list, depth: int):
    """The histogram kernel, at the top level: a recognised + of scalars adds atomically."""
    setup = _fold_setup(prim, args, depth)
    if setup is None:
        return None
    combine, ident = setup
    shapes, k = _element_shapes(prim), prim.num_leaves
    indices = np.ascontiguousarray(args[prim.num_consts + k], dtype=np.int64)
    operator = recognize_binary_op(prim.body, prim.num_consts)
    parts = _run(prim, "histogram", combine, len(ident), ident, prim.n, indices,
                 _split(args[prim.num_consts + k + 1:], shapes, 1), operator=operator)
    return None if parts is None else _join(list(parts), shapes)


@cuda_impls.register(Map)
def _map(prim: Map, args: list, depth: int):
    """A map at the top level whose body is written as a scalar function: one thread per row, captured
    values passed to every thread as scalars. Another body runs batched (silently, as elementwise code does)."""
    consts, xs = args[: prim.num_consts], args[prim.num_consts:]
    if depth or not xs or not prim.body.stmts:
        return None  # a map inside a map runs batched, as a whole; a body without statements only passes values on
    mapper, _ = device_function(prim.body)
    if mapper is None:
        return None  # the body runs batched, as on numpy, with the folds inside it lowered where they can be
    shapes = [v.aval.shape for v in prim.body.inputs[prim.num_consts:]]
    inputs = _split(xs, shapes, 1)
    out_avals = list(prim.body.out_avals)
    out_dtypes = [a.dtype for a in out_avals for _ in range(a.size)]
    if not inputs or not out_dtypes:
        return None  # rows or results of no scalars: nothing to compute
    scalars = [v for c in consts for v in np.asarray(c).reshape(-1)]
    columns = _run(prim, "map", mapper, inputs, out_dtypes, consts=scalars)
    return None if columns is None else _join(list(columns), [a.shape for a in out_avals])
