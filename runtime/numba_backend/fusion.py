"""Fusion for the numba backend: a map whose only use is a reduce becomes one kernel, with no array between.

`fuse(program)` rewrites the top level of a program; `FusedMapReduce` is internal to the backend (its numpy
implementation runs the two statements it replaced, so declining is always possible).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fold.ir import Let, Primitive, Program, Var, use_counts
from fold.primitives import Map, Reduce

from ..interpreter import numpy_impls
from .codegen import compile_scalar_program, is_scalar_program
from .lowering import _identity, decline, fold_options, map_inputs, numba_impls


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


def _fusable(map_stmt: Let, reduce_stmt: Let) -> bool:
    red = reduce_stmt.prim
    return (red.num_consts == 0 and red.num_leaves == 1 and len(map_stmt.outs) == 1
            and is_scalar_program(map_stmt.prim.body) and is_scalar_program(red.body)
            and all(a.aval.ndim == 1 for a in map_stmt.args[map_stmt.prim.num_consts:]))


def fuse(program: Program) -> Program:
    uses = use_counts(program)
    producer = {v: s for s in program.stmts for v in s.outs}
    fused_maps: set[int] = set()
    stmts: list[Let] = []
    for stmt in program.stmts:
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
    import kernels.cpu

    try:
        mapper = compile_scalar_program(prim.map.body)
        combine = compile_scalar_program(prim.reduce.body)
        result = kernels.cpu.map_reduce(mapper, len(inputs), combine, 1, ident, inputs,
                                         **fold_options(prim.reduce))
    except Exception as err:  # noqa: BLE001
        return decline(prim, f"it does not compile: {type(err).__name__}")
    return [np.asarray(result[0])]
