"""A sum over a map's rows of the scatter-adds its body makes, written as one scatter-add of every row's values.

The vjp of a gather is a scatter-add (`reduce_by_index` with +) of the cotangents at the indices the gather
read. A map whose body gathers from a captured array (a 1-d convolution reading each window as
`x[j + iota(k)]`, an embedding lookup per token) therefore makes, per row, a scatter-add as long as the whole
captured array, and the map's vjp adds those rows up for the captured array's cotangent: a (rows, n) array
for an (n,) result, 3.6 TiB for a million windows over a million samples. A sum with + of histograms with
+ is the histogram of all their values: `scatter_sums(program)` has the map give each row's indices and
values (k per row) instead, and replaces the sum by one `reduce_by_index` of them all, flattened, in row
order. Nothing of size rows x n is made, on any backend; a loop nest bins the rows as the map makes them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .ir import Let, Lit, Program, Var
from .primitives import Map, ReduceByIndex, Reshape, SumAxes
from .pytree import tree_flatten
from .recognize import recognize_binary_op


def scatter_sums(program: Program) -> Program:
    """`program`, at every depth, with each sum over a map's axis of a scatter-add its body returns made one
    scatter-add of the rows' indices and values (see the module's docstring); the program itself where there
    is none."""
    stmts = [_in_bodies(s) for s in program.stmts]
    readers: dict[Var, list[Let]] = {}
    for stmt in stmts:
        for a in stmt.args:
            if isinstance(a, Var):
                readers.setdefault(a, []).append(stmt)
    outputs = {o for o in program.outputs if isinstance(o, Var)}
    replaced: dict[int, list[Let]] = {}
    for stmt in stmts:
        if isinstance(stmt.prim, Map) and id(stmt) not in replaced:
            rewritten = _rewritten(stmt, readers, outputs)
            if rewritten is not None:
                new_map, sums = rewritten
                replaced[id(stmt)] = [new_map]
                replaced.update(sums)
    if not replaced and all(a is b for a, b in zip(stmts, program.stmts)):
        return program
    out = tuple(made for s in stmts for made in replaced.get(id(s), [s]))
    return dataclasses.replace(program, stmts=out, meta=dict(program.meta))


def _in_bodies(stmt: Let) -> Let:
    prim = stmt.prim
    if not prim.body_fields:
        return stmt
    bodies = {f: scatter_sums(getattr(prim, f)) for f in prim.body_fields}
    if all(bodies[f] is getattr(prim, f) for f in prim.body_fields):
        return stmt
    return Let(stmt.outs, dataclasses.replace(prim, **bodies), stmt.args)


def _scatter_add(body: Program, out: object) -> Let | None:
    """The statement of `body` making `out` where it is a scatter-add with + into zeros (one leaf, no captured
    values) that the body reads nowhere else."""
    if not isinstance(out, Var) or sum(o is out for o in body.outputs if isinstance(o, Var)) != 1:
        return None
    if any(out in s.args for s in body.stmts):
        return None
    stmt = next((s for s in body.stmts if out in s.outs), None)
    if stmt is None or not isinstance(stmt.prim, ReduceByIndex):
        return None
    prim = stmt.prim
    identity, indices, values = stmt.args[prim.num_consts:]
    if not (isinstance(indices, Var) and isinstance(values, Var)):
        return None
    zero = isinstance(identity, Lit) and not np.any(identity.value)
    if prim.num_consts or prim.num_leaves != 1 or not zero or recognize_binary_op(prim.body, 0) != "add":
        return None
    return stmt


def _rewritten(stmt: Let, readers: dict[Var, list[Let]], outputs: set[Var]):
    """(the map giving indices and values where it gave scatter-adds that only a sum over its axis reads,
    {id(sum): the statements replacing it}), or None where no result qualifies."""
    prim: Map = stmt.prim
    body = prim.body
    rows = stmt.outs[0].aval.shape[0]
    kept_outs, kept_results, added_outs, added_results = [], [], [], []
    sums: dict[int, list[Let]] = {}
    for top, result in zip(stmt.outs, body.outputs, strict=True):
        scatter = _scatter_add(body, result)
        reader = readers.get(top, [])
        summed = (scatter is not None and top not in outputs and len(reader) == 1
                  and isinstance(reader[0].prim, SumAxes) and tuple(reader[0].prim.axes) == (0,))
        if not summed:
            kept_outs.append(top)
            kept_results.append(result)
            continue
        rbi = scatter.prim
        identity, indices, values = scatter.args
        index_rows, value_rows = (Var(a.aval.update(shape=(rows,) + a.aval.shape)) for a in (indices, values))
        added_outs += [index_rows, value_rows]
        added_results += [indices, values]
        count = rows * indices.aval.shape[0]
        flat_indices = Var(indices.aval.update(shape=(count,)))
        flat_values = Var(values.aval.update(shape=(count,) + values.aval.shape[1:]))
        (total,) = reader[0].outs
        sums[id(reader[0])] = [
            Let((flat_indices,), Reshape((count,)), (index_rows,)),
            Let((flat_values,), Reshape(flat_values.aval.shape), (value_rows,)),
            Let((total,), rbi, (identity, flat_indices, flat_values))]
    if not sums:
        return None
    results = tuple(kept_results + added_results)
    _, out_tree = tree_flatten(tuple(range(len(results))))
    new_body = Program(body.inputs, body.stmts, results, body.in_tree, out_tree, dict(body.meta))
    return Let(tuple(kept_outs + added_outs), Map(new_body, prim.num_consts), stmt.args), sums
