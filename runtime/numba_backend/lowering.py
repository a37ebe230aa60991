"""Which statements the numba backend runs as compiled kernels, and how (kernels/cpu does the work).

A rule returns the statement's outputs, or None to decline — then the numpy implementation runs. Rules
decline, silently, where NumPy already has the fast path (a recognised + reduction, a BLAS product, ...).
Where a kernel was the plan but the statement cannot be compiled (elements that are not scalars, an operator
that captures values, a typing failure), the rule declines with one warning naming the primitive and why.
"""

from __future__ import annotations

import warnings

import numpy as np

from fold.primitives import Map, Reduce, ReduceByIndex, Scan
from fold.recognize import recognize_binary_op
from fold.rules import RuleTable

from .codegen import compile_scalar_program, is_scalar_program

numba_impls = RuleTable("numba backend")
_warned: set[tuple[str, str]] = set()


def decline(prim, reason: str) -> None:
    key = (prim.name, reason)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"numba backend: {prim.name} runs on the numpy backend ({reason})", stacklevel=2)
    return None


def _scalar_operator(prim):
    """The operator compiled as a scalar function, or the reason it cannot be."""
    if prim.num_consts:
        return None, "its operator captures values"
    if not is_scalar_program(prim.body):
        return None, "its elements are not scalars"
    try:
        return compile_scalar_program(prim.body), None
    except Exception as err:  # noqa: BLE001 - any compile failure means: use the reference implementation
        return None, f"its operator does not compile: {type(err).__name__}"


def _identity(identity: list[np.ndarray]) -> tuple | None:
    if any(e.size != 1 for e in identity):
        return None
    return tuple(e.reshape(()).item() for e in identity)


def _contiguous(xs) -> list[np.ndarray]:
    return [np.ascontiguousarray(x) for x in xs]


def _kernels():
    import kernels.cpu

    return kernels.cpu


def _operator_and_identity(prim, args: list):
    """(compiled operator, identity scalars), or None after declining (with a warning if a kernel was the plan)."""
    combine, why = _scalar_operator(prim)
    if combine is None:
        return decline(prim, why)
    ident = _identity(args[prim.num_consts: prim.num_consts + prim.num_leaves])
    return None if ident is None else (combine, ident)


@numba_impls.register(Reduce)
def _reduce(prim: Reduce, args: list, depth: int):
    if recognize_binary_op(prim.body, prim.num_consts) is not None or depth > 1:
        return None  # NumPy's own reduction is the fast path
    setup = _operator_and_identity(prim, args)
    if setup is None:
        return None
    combine, ident = setup
    k = prim.num_leaves
    xs = args[prim.num_consts + k:]
    if depth == 0:
        return [np.asarray(v) for v in _kernels().reduce(combine, k, ident, _contiguous(xs))]
    rows = np.broadcast_shapes(*[x.shape[:1] for x in xs])[0]  # a reduce inside a map: one fold per row
    full = _contiguous(np.broadcast_to(x, (rows,) + x.shape[1:]) for x in xs)
    return list(_kernels().segmented_reduce(None, combine, k, ident, full))


@numba_impls.register(Scan)
def _scan(prim: Scan, args: list, depth: int):
    if recognize_binary_op(prim.body, prim.num_consts) == "add" or depth:
        return None
    setup = _operator_and_identity(prim, args)
    if setup is None:
        return None
    combine, ident = setup
    xs = args[prim.num_consts + prim.num_leaves:]
    return list(_kernels().scan(combine, prim.num_leaves, ident, _contiguous(xs), exclusive=prim.exclusive, reverse=prim.reverse))


@numba_impls.register(ReduceByIndex)
def _reduce_by_index(prim: ReduceByIndex, args: list, depth: int):
    setup = None if depth else _operator_and_identity(prim, args)
    if setup is None:
        return None
    combine, ident = setup
    k = prim.num_leaves
    indices = np.ascontiguousarray(args[prim.num_consts + k], dtype=np.int64)
    values = args[prim.num_consts + k + 1:]
    return list(_kernels().histogram(combine, k, ident, prim.n, indices, _contiguous(values)))


def map_inputs(prim: Map, args: list) -> list[np.ndarray] | None:
    """The map's operands as 1-d contiguous arrays (captured scalars repeated), or None if it is no 1-d map."""
    consts, xs = args[: prim.num_consts], args[prim.num_consts:]
    if any(x.ndim != 1 for x in xs) or any(c.size != 1 for c in consts):
        return None
    n = xs[0].shape[0]
    return [np.full(n, c.reshape(()), dtype=c.dtype) for c in consts] + _contiguous(xs)


@numba_impls.register(Map)
def _map(prim: Map, args: list, depth: int):
    if depth or not is_scalar_program(prim.body):
        return None  # the batched NumPy evaluation of a vector body is already vectorised
    inputs = map_inputs(prim, args)
    if inputs is None or inputs[0].shape[0] == 0:
        return None
    try:
        mapper = compile_scalar_program(prim.body)
        return list(_kernels().map(mapper, len(inputs), len(prim.body.outputs), inputs))
    except Exception as err:  # noqa: BLE001
        return decline(prim, f"its body does not compile: {type(err).__name__}")
