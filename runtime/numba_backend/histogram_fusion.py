"""A map whose only use is the values of a reduce_by_index, as one histogram kernel with the map's body as its
mapper: the mapped values are never stored.

`fuse_histograms(program)` rewrites the top level of a program; `FusedMapHistogram` is internal to the
backend (its numpy implementation runs the two statements it replaced, so declining is always possible). A
reduce of a map is a loop nest on this backend (runtime/loops).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fold.ir import Let, Primitive, Program, Var, use_counts
from fold.primitives import Map, ReduceByIndex

from ..interpreter import numpy_impls
from .codegen import compile_problem, compile_scalar_program, is_scalar_program
from .lowering import _element_shapes, _joined, _operator_and_identity, _split, decline, numba_impls, run_kernel, worth_compiling


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


def _histogram_fusable(map_stmt: Let, rbi_stmt: Let) -> bool:
    """A map of one result, capturing nothing, that compiles, into a one-leaf reduce_by_index whose operator
    captures nothing (the histogram kernel's forms)."""
    rbi, body = rbi_stmt.prim, map_stmt.prim.body
    return (rbi.num_consts == 0 and rbi.num_leaves == 1 and len(map_stmt.outs) == 1
            and map_stmt.prim.num_consts == 0 and compile_problem(body) is None and compile_problem(rbi.body) is None)


def fuse_histograms(program: Program) -> Program:
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
        stmts.append(stmt)
    if not fused_maps:
        return program
    stmts = [s for s in stmts if id(s) not in fused_maps]
    return Program(program.inputs, tuple(stmts), program.outputs, program.in_tree, program.out_tree, dict(program.meta))


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
