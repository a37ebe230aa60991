"""Which statements the cuda backend runs as CUDA kernels (kernels.cuda does the work).

Lowered here, with any associative operator whose elements are scalars or small arrays: reduce and scan at
the top level of a program and one map deep (a fold per row: the segmented kernels), reduce_by_index at the
top level, and top-level maps whose body is written as a scalar function. An operator capturing a few
scalars, the same for every fold, carries them as element fields (runtime/numba_backend/captured_operands.py).

Values may be device arrays (the top level of a program, residency.py) or NumPy arrays (the bodies that the
numpy implementation runs batched): a rule copies host elements to the device (counted, device.py), runs
its kernel on device arrays, and leaves the results where the elements were. The small arguments a kernel
takes as scalars (identities, captured values) are read on the host, copied (counted) if on the device.

A rule returns the statement's outputs, or None, and residency.py then runs the numpy implementation on
the host: after one warning naming the primitive and why where a fold cannot be lowered; silently where a
map's body is not a scalar function (it runs batched, as elementwise code does, with its folds lowered
where they can be).
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from fold.primitives import Iota, Map, Reduce, ReduceByIndex, Scan
from fold.recognize import recognize_binary_op
from fold.rules import RuleTable
from fold.runtime.numba_backend.captured_operands import capture_problem
from fold.runtime.numba_backend.lowering import (_element_shapes, _identity, components_of, decline, is_commutative,
                                                 with_captures_as_operands)

from . import device
from .device_functions import device_function
from .residency import resident, small_arguments_on_host

cuda_impls = RuleTable("cuda backend", default=resident(None))
# A map's scalar kernel takes its captured values as scalar arguments: of those on the device (read on the
# host, counted), at most this many; a block of a gemm's column data is not copied back to be scalars
CAPTURED_SCALARS = 8


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
    segmented_<kernel>; the results joined back into the elements' shapes, where the elements were."""
    setup = _fold_setup(prim, args, depth, deepest=1)
    if setup is None:
        return None
    combine, ident = setup
    shapes, xs = _element_shapes(prim), args[prim.num_consts + prim.num_leaves:]
    stays = any(device.is_device(x) for x in xs)
    xs = device.on_device(xs)
    if depth:
        rows = np.broadcast_shapes(*[tuple(x.shape[:1]) for x in xs])[0]
        xs, kernel = [device.broadcast_to(x, (rows,) + tuple(x.shape[1:])) for x in xs], f"segmented_{kernel}"
    elif kernel == "reduce":
        options.update(keep_on_device=True, commutative=is_commutative(prim))
    parts = _run(prim, kernel, combine, len(ident), ident, _columns(xs, shapes, depth + 1), **options)
    if parts is None:
        return None
    parts = [device.adopt(p) for p in parts]
    if kernel == "reduce":
        parts = [device.reshape(p, ()) for p in parts]
    return _placed(_leaves(parts, shapes), stays)


def _columns(leaves: list, shapes: list[tuple], lead: int) -> list:
    """Each device leaf (lead dims + element shape) as its element's scalar components: strided views,
    which the kernels read in place, as Numba arrays."""
    out = []
    for x, shape in zip(leaves, shapes, strict=True):
        if shape == ():
            out.append(device.for_kernel(x))
            continue
        flat = device.reshape(x, tuple(x.shape[:lead]) + (components_of(shape),))
        out += [device.for_kernel(flat[..., c]) for c in range(components_of(shape))]
    return out


def _leaves(parts: list, shapes: list[tuple]) -> list:
    """The inverse of `_columns` on device results: component arrays back into leaves of the element shapes."""
    out, pos = [], 0
    for shape in shapes:
        c = components_of(shape)
        group = parts[pos: pos + c]
        pos += c
        out.append(group[0] if shape == () else
                   device.reshape(device.stack_last(group), tuple(group[0].shape) + tuple(shape)))
    return out


def _placed(leaves: list, on_device: bool) -> list:
    """The results on the device, or copied to the host (counted) where the statement's inputs were there."""
    return leaves if on_device else device.on_host(leaves)


@cuda_impls.register(Reduce)
@resident
@small_arguments_on_host(lambda prim: prim.num_consts + prim.num_leaves)
@with_captures_as_operands(deepest=1, backend="cuda")
def _reduce(prim: Reduce, args: list, depth: int):
    return _fold(prim, args, depth, "reduce")


@cuda_impls.register(Scan)
@resident
@small_arguments_on_host(lambda prim: prim.num_consts + prim.num_leaves)
@with_captures_as_operands(deepest=1, backend="cuda")
def _scan(prim: Scan, args: list, depth: int):
    return _fold(prim, args, depth, "scan", exclusive=prim.exclusive, reverse=prim.reverse)


@cuda_impls.register(ReduceByIndex)
@resident
@small_arguments_on_host(lambda prim: prim.num_consts + prim.num_leaves)
@with_captures_as_operands(deepest=0, backend="cuda")
def _reduce_by_index(prim: ReduceByIndex, args: list, depth: int):
    """The histogram kernel, at the top level: a recognised + of scalars adds atomically."""
    setup = _fold_setup(prim, args, depth)
    if setup is None:
        return None
    combine, ident = setup
    shapes, k = _element_shapes(prim), prim.num_leaves
    xs = args[prim.num_consts + k + 1:]
    stays = any(device.is_device(x) for x in xs)
    indices = device.astype(device.to_device(args[prim.num_consts + k]), np.int64)
    operator = recognize_binary_op(prim.body, prim.num_consts)
    parts = _run(prim, "histogram", combine, len(ident), ident, prim.n, device.for_kernel(indices),
                 _columns(device.on_device(xs), shapes, 1), operator=operator)
    return None if parts is None else _placed(_leaves([device.adopt(p) for p in parts], shapes), stays)


@cuda_impls.register(Map)
@resident
def _map(prim: Map, args: list, depth: int):
    """A map at the top level whose body is written as a scalar function: one thread per row, captured
    values passed to every thread as scalars (a few read from the device). Another body, or one capturing
    more device values, runs batched on the device values (silently, as elementwise code does)."""
    consts, xs = args[: prim.num_consts], args[prim.num_consts:]
    if depth or not xs or not prim.body.stmts:
        return None  # a map inside a map runs batched, as a whole; a body without statements only passes values on
    if sum(c.size for c in consts if device.is_device(c)) > CAPTURED_SCALARS:
        return None  # runs batched on the device: the kernel would take these as scalars, read on the host
    mapper, _ = device_function(prim.body)
    if mapper is None:
        return None  # the body runs batched, as on numpy, with the folds inside it lowered where they can be
    consts = device.on_host(consts)
    shapes = [v.aval.shape for v in prim.body.inputs[prim.num_consts:]]
    out_avals = list(prim.body.out_avals)
    out_dtypes = [a.dtype for a in out_avals for _ in range(a.size)]
    if not out_dtypes or not any(components_of(shape) for shape in shapes):
        return None  # rows or results of no scalars: nothing to compute
    stays = any(device.is_device(x) for x in xs)
    inputs = _columns(device.on_device(xs), shapes, 1)
    scalars = [v for c in consts for v in np.asarray(c).reshape(-1)]
    columns = _run(prim, "map", mapper, inputs, out_dtypes, consts=scalars)
    if columns is None:
        return None
    return _placed(_leaves([device.adopt(c) for c in columns], [a.shape for a in out_avals]), stays)


@cuda_impls.register(Iota)
def _iota(prim: Iota, args: list, depth: int) -> list:
    """0 .. n-1 made on the device, where the values it meets are (a gemm's column indices against targets):
    it has no operands to say where it runs."""
    return [device.reshape(device.arange(prim.n, prim.dtype), (1,) * depth + (prim.n,))]
