"""Fusion for the numba backend: a map whose only use is a reduce, or the values of a reduce_by_index, becomes
one kernel with no array between.

`fuse(program)` rewrites the top level of a program; `FusedMapReduce` and `FusedMapHistogram` are internal to
the backend (their numpy implementations run the two statements they replaced, so declining is always
possible).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from fold.ir import Let, Primitive, Program, Var, use_counts
from fold.primitives import Map, Reduce, ReduceByIndex

from ..interpreter import numpy_impls
from .codegen import compile_problem, compile_scalar_program, is_scalar_program
from .lowering import (_element_shapes, _identity, _joined, _operator_and_identity, _split, decline, fold_options,
                       map_inputs, numba_impls, per_statement, run_kernel, worth_compiling)
from .wide_folds import WIDE, fused_fold, widened_last_output


@dataclass(frozen=True)
class FusedMapReduce(Primitive):
    """reduce(op, map(f, xs)): args are the map's (consts, xs) then the reduce's identity."""

    map: Map
    reduce: Reduce
    name = "map_reduce"
    backend_internal = True
    num_consts = 0  # for the printer: the bodies are shown with all their inputs as parameters

    def bodies(self) -> list[Program]:
        return [self.map.body, self.reduce.body]


@dataclass(frozen=True)
class FusedMapHistogram(Primitive):
    """reduce_by_index(op, n, indices, map(f, xs)): args are the identity, the indices, then the map's xs."""

    map: Map
    reduce_by_index: ReduceByIndex
    name = "map_histogram"
    backend_internal = True
    num_consts = 0

    def bodies(self) -> list[Program]:
        return [self.map.body, self.reduce_by_index.body]


def _fusable(map_stmt: Let, reduce_stmt: Let) -> bool:
    red = reduce_stmt.prim
    return (red.num_consts == 0 and red.num_leaves == 1 and len(map_stmt.outs) == 1
            and is_scalar_program(map_stmt.prim.body) and is_scalar_program(red.body)
            and all(a.aval.ndim == 1 for a in map_stmt.args[map_stmt.prim.num_consts:]))


def _histogram_fusable(map_stmt: Let, rbi_stmt: Let) -> bool:
    """A map of one result, capturing nothing, that compiles, into a one-leaf reduce_by_index whose operator
    captures nothing (the histogram kernel's forms)."""
    rbi, body = rbi_stmt.prim, map_stmt.prim.body
    return (rbi.num_consts == 0 and rbi.num_leaves == 1 and len(map_stmt.outs) == 1
            and map_stmt.prim.num_consts == 0 and compile_problem(body) is None and compile_problem(rbi.body) is None)


def fuse(program: Program) -> Program:
    uses = use_counts(program)
    producer = {v: s for s in program.stmts for v in s.outs}
    fused_maps: set[int] = set()
    stmts: list[Let] = []
    for stmt in program.stmts:
        if isinstance(stmt.prim, ReduceByIndex):
            values = stmt.args[-1]
            source = producer.get(values) if isinstance(values, Var) else None
            if (source is not None and isinstance(source.prim, Map) and uses[values] == 1
                    and _histogram_fusable(source, stmt)):
                fused_maps.add(id(source))
                identity, indices = stmt.args[0], stmt.args[1]
                stmts.append(Let(stmt.outs, FusedMapHistogram(source.prim, stmt.prim),
                                 (identity, indices) + tuple(source.args)))
                continue
        if isinstance(stmt.prim, Reduce):
            xs = stmt.args[-1]
            source = producer.get(xs) if isinstance(xs, Var) else None
            if source is not None and isinstance(source.prim, Map) and uses[xs] == 1 and _fusable(source, stmt):
                fused_maps.add(id(source))
                identity = stmt.args[stmt.prim.num_consts: stmt.prim.num_consts + 1]
                stmts.append(Let(stmt.outs, FusedMapReduce(source.prim, stmt.prim), tuple(source.args) + tuple(identity)))
                continue
        stmts.append(stmt)
    if not fused_maps:
        return program
    stmts = [s for s in stmts if id(s) not in fused_maps]
    return Program(program.inputs, tuple(stmts), program.outputs, program.in_tree, program.out_tree, dict(program.meta))


@numpy_impls.register(FusedMapReduce)
def _fused_reference(prim: FusedMapReduce, args: list, depth: int) -> list:
    mapped = numpy_impls.lookup(prim.map)(prim.map, args[:-1], depth)
    return numpy_impls.lookup(prim.reduce)(prim.reduce, [args[-1]] + mapped, depth)


@numba_impls.register(FusedMapReduce)
def _fused(prim: FusedMapReduce, args: list, depth: int):
    if depth:
        return None
    inputs = map_inputs(prim.map, args[:-1])
    ident = _identity([args[-1]], [()])
    if inputs is None or ident is None or inputs[0].shape[0] == 0:
        return None
    try:
        fold, wide = _prepared(prim, tuple(a.dtype for a in inputs), ident[0].dtype)
        result = fold(inputs, (WIDE.type(ident[0]),) if wide else ident)
    except Exception as err:  # noqa: BLE001
        return decline(prim, f"it does not compile: {type(err).__name__}")
    return [np.asarray(result[0]).astype(prim.map.body.outputs[-1].aval.dtype, copy=False)]


# Per statement and input dtypes, the fold kernels.cpu runs: compiling the operators, choosing the kernel
# and checking their types is done once, not on every call (on a call of 100 elements it was half the time).
_PREPARED: "weakref.WeakKeyDictionary[FusedMapReduce, dict]" = weakref.WeakKeyDictionary()


def _prepared(prim: FusedMapReduce, input_dtypes: tuple, identity_dtype: np.dtype):
    """(the kernels.cpu.MapReduce that runs the statement, whether it folds widened float64 values: a float32
    sum, see wide_folds.py)."""
    per_dtypes = per_statement(_PREPARED, prim, lambda _: {})
    key = (input_dtypes, identity_dtype)
    found = per_dtypes.get(key)
    if found is None:
        from fold.kernels.cpu import MapReduce

        combine, wide, carry = fused_fold(prim.reduce, identity_dtype)
        mapper = compile_scalar_program(widened_last_output(prim.map.body) if wide else prim.map.body)
        found = per_dtypes[key] = (MapReduce(mapper, len(input_dtypes), combine, 1, input_dtypes, carry=carry,
                                             **fold_options(prim.reduce)), wide)
    return found


@numpy_impls.register(FusedMapHistogram)
def _fused_histogram_reference(prim: FusedMapHistogram, args: list, depth: int) -> list:
    mapped = numpy_impls.lookup(prim.map)(prim.map, args[2:], depth)
    return numpy_impls.lookup(prim.reduce_by_index)(prim.reduce_by_index, args[:2] + mapped, depth)


@numba_impls.register(FusedMapHistogram)
def _fused_histogram(prim: FusedMapHistogram, args: list, depth: int):
    """The histogram kernel with the map's body as its mapper, at the top level. Below the size worth compiling
    a vector body for, the map as NumPy runs it, then the histogram kernel; in a map body, the two statements
    as the numpy backend runs them."""
    indices, xs = args[1], args[2:]
    shapes = [v.aval.shape for v in prim.map.body.inputs]
    n = indices.shape[0] if indices.ndim == 1 else -1
    if depth or n <= 0 or any(x.shape != (n,) + s for x, s in zip(xs, shapes, strict=True)):
        return None
    rbi = prim.reduce_by_index
    if not (is_scalar_program(prim.map.body) or worth_compiling(n)):  # the map as NumPy runs it, then the histogram
        rest = args[:2] + numpy_impls.lookup(prim.map)(prim.map, list(xs), depth)
        return numba_impls.lookup(rbi)(rbi, rest, depth) or numpy_impls.lookup(rbi)(rbi, rest, depth)
    setup = _operator_and_identity(rbi, args[:1])
    if setup is None:
        return None
    combine, ident, carry = setup
    try:
        mapper = compile_scalar_program(prim.map.body)
    except Exception as err:  # noqa: BLE001
        return decline(prim, f"its map does not compile: {type(err).__name__}")
    inputs = _split(list(xs), shapes, 1)
    bins = run_kernel(prim, "map_histogram", mapper, len(inputs), combine, len(ident), ident, rbi.n,
                      np.ascontiguousarray(indices, dtype=np.int64), inputs, carry=carry)
    return _joined(bins, _element_shapes(rbi))
