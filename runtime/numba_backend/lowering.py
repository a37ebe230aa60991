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

from .codegen import compile_problem, compile_scalar_program, is_scalar_program

numba_impls = RuleTable("numba backend")
_warned: set[tuple[str, str]] = set()


def decline(prim, reason: str) -> None:
    key = (prim.name, reason)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"numba backend: {prim.name} runs on the numpy backend ({reason})", stacklevel=2)
    return None


def _scalar_operator(prim):
    """The operator compiled as a function of its elements' scalar components, or the reason it cannot be."""
    if prim.num_consts:
        return None, "its operator captures values"
    problem = compile_problem(prim.body)
    if problem is not None:
        return None, f"its operator cannot be compiled: {problem}"
    try:
        return compile_scalar_program(prim.body), None
    except Exception as err:  # noqa: BLE001 - any compile failure means: use the reference implementation
        return None, f"its operator does not compile: {type(err).__name__}"


def _element_shapes(prim) -> list[tuple[int, ...]]:
    return [v.aval.shape for v in prim.body.inputs[: prim.num_leaves]]


def _identity(identity: list[np.ndarray], shapes: list[tuple]) -> tuple | None:
    """The identity's scalar components, or None if it differs from row to row (an identity inside a map)."""
    parts = []
    for e, shape in zip(identity, shapes, strict=True):
        batch = e.shape[: e.ndim - len(shape)]
        if any(b != 1 for b in batch):
            return None
        parts += [c.item() for c in e.reshape(-1)]
    return tuple(parts)


def _split(leaves: list[np.ndarray], shapes: list[tuple], lead: int) -> list[np.ndarray]:
    """Each leaf (lead dims + element shape) as its element's scalar components, contiguous arrays of the lead dims."""
    out = []
    for x, shape in zip(leaves, shapes, strict=True):
        if shape == ():
            out.append(np.ascontiguousarray(x))
            continue
        flat = x.reshape(x.shape[:lead] + (components_of(shape),))  # explicit: the lead dims may be empty
        out += [np.ascontiguousarray(flat[..., c]) for c in range(flat.shape[-1])]
    return out


def _join(parts: list, shapes: list[tuple]) -> list[np.ndarray]:
    """The inverse of `_split` on results: component arrays (or scalars) back into leaves of the element shapes."""
    out, pos = [], 0
    for shape in shapes:
        c = components_of(shape)
        group = [np.asarray(v) for v in parts[pos: pos + c]]
        pos += c
        out.append(group[0] if shape == () else np.stack(group, axis=-1).reshape(group[0].shape + shape))
    return out


def _joined(parts, shapes: list[tuple]) -> list[np.ndarray] | None:
    return None if parts is None else _join(list(parts), shapes)


def components_of(shape: tuple) -> int:
    return int(np.prod(shape, dtype=np.int64))


def run_kernel(prim, kernel: str, *args, **kwargs):
    """kernels.cpu.<kernel>(*args), or None after declining with a warning if Numba cannot compile it."""
    try:
        return getattr(_kernels(), kernel)(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - a kernel that does not compile: the reference implementation runs
        return decline(prim, f"its kernel does not compile: {type(err).__name__}: {str(err).splitlines()[0][:200]}")


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
    ident = _identity(args[prim.num_consts: prim.num_consts + prim.num_leaves], _element_shapes(prim))
    return None if ident is None else (combine, ident)


@numba_impls.register(Reduce)
def _reduce(prim: Reduce, args: list, depth: int):
    if recognize_binary_op(prim.body, prim.num_consts) is not None or depth > 1:
        return None  # NumPy's own reduction is the fast path
    setup = _operator_and_identity(prim, args)
    if setup is None:
        return None
    combine, ident = setup
    shapes, k = _element_shapes(prim), len(ident)
    xs = args[prim.num_consts + prim.num_leaves:]
    if depth == 0:
        return _joined(run_kernel(prim, "reduce", combine, k, ident, _split(xs, shapes, 1)), shapes)
    rows = np.broadcast_shapes(*[x.shape[:1] for x in xs])[0]  # a reduce inside a map: one fold per row
    full = [np.broadcast_to(x, (rows,) + x.shape[1:]) for x in xs]
    return _joined(run_kernel(prim, "segmented_reduce", None, combine, k, ident, _split(full, shapes, 2)), shapes)


@numba_impls.register(Scan)
def _scan(prim: Scan, args: list, depth: int):
    if recognize_binary_op(prim.body, prim.num_consts) == "add" or depth:
        return None
    setup = _operator_and_identity(prim, args)
    if setup is None:
        return None
    combine, ident = setup
    shapes = _element_shapes(prim)
    xs = _split(args[prim.num_consts + prim.num_leaves:], shapes, 1)
    return _joined(run_kernel(prim, "scan", combine, len(ident), ident, xs, exclusive=prim.exclusive, reverse=prim.reverse), shapes)


@numba_impls.register(ReduceByIndex)
def _reduce_by_index(prim: ReduceByIndex, args: list, depth: int):
    setup = None if depth else _operator_and_identity(prim, args)
    if setup is None:
        return None
    combine, ident = setup
    shapes, k = _element_shapes(prim), prim.num_leaves
    indices = np.ascontiguousarray(args[prim.num_consts + k], dtype=np.int64)
    values = _split(args[prim.num_consts + k + 1:], shapes, 1)
    return _joined(run_kernel(prim, "histogram", combine, len(ident), ident, prim.n, indices, values), shapes)


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
    except Exception as err:  # noqa: BLE001
        return decline(prim, f"its body does not compile: {type(err).__name__}")
    outs = run_kernel(prim, "map", mapper, len(inputs), len(prim.body.outputs), inputs)
    return None if outs is None else list(outs)
