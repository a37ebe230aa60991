"""A sum over a map's rows of the scatter-adds its body makes, written as one scatter-add of every row's values.

The vjp of a gather is a scatter-add (`reduce_by_index` with +) of the cotangents at the indices the gather
read. A map whose body gathers from a captured array (a 1-d convolution reading each window as
`x[j + iota(k)]`, an embedding lookup per token, a stencil reading `X[i + 1][j]`) therefore makes, per row, a
scatter-add as large as the whole captured array, and the map's vjp adds those rows up for the captured
array's cotangent: a (rows, n) array for an (n,) result, 3.6 TiB for a million windows over a million
samples. A sum with + of scatter-adds with + is the scatter-add of all their values.

`scatter_sums(program)` follows, in each map body, the values that are scatter-adds into zeros: a
`reduce_by_index` with + (of values that are themselves scatter-adds, as a gather of a gathered row makes, or
dense), reshapes of those, and sums of two over the same shape. Each is kept as entries: flat positions in
the value and the values added there (a position outside the value for an index `reduce_by_index` would
ignore). Where such a body result is read only by a sum over the map's axis, the map gives its entries
instead, and the sum becomes one `reduce_by_index` of all the rows' entries, flattened in row order, reshaped
to the value's shape. Nothing of size rows x n is made, on any backend; a loop nest bins the rows as the map
makes them. Innermost maps first, so the entries rise through every map that sums them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .inline import spliced
from .ir import Let, Lit, Program, Var, with_bodies
from .primitives import Elementwise, Map, ReduceByIndex, Reshape, SumAxes
from .pytree import tree_flatten
from .recognize import recognize_binary_op


@dataclass(frozen=True)
class Scattered:
    """A value of `shape` that is zero but for `entries`: (flat positions (k,), values (k,)) pairs, each value
    added at its position; a position outside [0, size) adds nothing."""

    shape: tuple[int, ...]
    entries: tuple[tuple[Var, Var], ...]


def scatter_sums(program: Program) -> Program:
    """`program`, at every depth, with each sum over a map's axis of scatter-adds its body returns made one
    scatter-add of the rows' entries (see the module's docstring); the program itself where there is none."""
    stmts = [with_bodies(s, scatter_sums) for s in program.stmts]
    readers: dict[Var, list[Let]] = {}
    for stmt in stmts:
        for a in stmt.args:
            if isinstance(a, Var):
                readers.setdefault(a, []).append(stmt)
    outputs = {o for o in program.outputs if isinstance(o, Var)}
    replaced: dict[int, list[Let]] = {}
    for stmt in stmts:
        if isinstance(stmt.prim, Map):
            rewritten = _rewritten(stmt, readers, outputs)
            if rewritten is not None:
                new_map, sums = rewritten
                replaced[id(stmt)] = [new_map]
                replaced.update(sums)
    if not replaced and all(a is b for a, b in zip(stmts, program.stmts)):
        return program
    out = tuple(made for s in stmts for made in replaced.get(id(s), [s]))
    return dataclasses.replace(program, stmts=out, meta=dict(program.meta))


def _zero(atom: Any) -> bool:
    return isinstance(atom, Lit) and not np.any(atom.value)


def _scatter_add(stmt: Let) -> bool:
    """Whether `stmt` is a scatter-add with + into zeros: one leaf, no captured values."""
    prim = stmt.prim
    return (isinstance(prim, ReduceByIndex) and not prim.num_consts and prim.num_leaves == 1
            and _zero(stmt.args[0]) and recognize_binary_op(prim.body, 0) == "add")


def _scattered_values(body: Program) -> tuple[list[Let], dict[Var, Scattered]]:
    """The body's statements with those that compute the entries of its scatter-adds added, and the values
    that are scatter-adds, as entries."""
    stmts: list[Let] = []
    forms: dict[Var, Scattered] = {}
    for stmt in body.stmts:
        stmts.append(stmt)
        made = _form_of(stmt, forms)
        if made is not None:
            extra, form = made
            stmts += extra
            forms[stmt.outs[0]] = form
    return stmts, forms


def _form_of(stmt: Let, forms: dict[Var, Scattered]) -> tuple[list[Let], Scattered] | None:
    prim, args, (out,) = stmt.prim, stmt.args, stmt.outs[:1]
    shape = tuple(out.aval.shape)
    if _scatter_add(stmt):
        return _binned(stmt, forms)
    if isinstance(prim, Reshape) and isinstance(args[0], Var) and args[0] in forms:
        return [], Scattered(shape, forms[args[0]].entries)
    if (isinstance(prim, Elementwise) and prim.op == "add" and all(isinstance(a, Var) and a in forms for a in args)
            and all(forms[a].shape == shape for a in args)):
        return [], Scattered(shape, forms[args[0]].entries + forms[args[1]].entries)
    return None


def _binned(stmt: Let, forms: dict[Var, Scattered]) -> tuple[list[Let], Scattered] | None:
    """The entries of reduce_by_index(+, n, indices, values) into zeros: each value's entries (or, where the
    values are dense, every element) moved to its bin's row of the result."""
    n = stmt.prim.n
    _, indices, values = stmt.args
    if not isinstance(indices, Var) or not isinstance(values, Var):
        return None
    out_shape = tuple(stmt.outs[0].aval.shape)
    width = math.prod(values.aval.shape[1:])  # elements per bin
    if values in forms:  # each entry's position within the values: its element's bin, then its place in it
        made, entries = [], []
        count = values.aval.shape[0] * width
        for position, value in forms[values].entries:
            def moved(i, p, width=width, count=count):
                import fold

                inside = (p >= 0) & (p < count)  # a position outside the values is no entry: read no index for it
                bin_ = i[fold.minimum(fold.maximum(p // width, 0), i.shape[0] - 1)]  # clamped: a read in range
                return fold.where(inside & (bin_ >= 0) & (bin_ < n), bin_ * width + p % width, -1)

            extra, (flat,) = spliced(moved, [indices, position])
            made += extra
            entries.append((flat, value))
        return made, Scattered(out_shape, tuple(entries))
    if width == 1:  # a vector's values, at their bins (reduce_by_index ignores the bins out of range, as any)
        count = values.aval.shape[0]
        extra, (flat,) = spliced(lambda v: v.reshape((count,)), [values])
        return extra, Scattered(out_shape, ((indices, flat),))

    def spread(i, v):
        import fold

        positions = fold.where(((i >= 0) & (i < n))[:, None], i[:, None] * width + fold.iota(width)[None, :], -1)
        return positions.reshape((-1,)), v.reshape((-1,))

    extra, (flat, flat_values) = spliced(spread, [indices, values])
    return extra, Scattered(out_shape, ((flat, flat_values),))


def _rewritten(stmt: Let, readers: dict[Var, list[Let]], outputs: set[Var]):
    """(the map giving entries where it gave scatter-adds that only a sum over its axis reads,
    {id(sum): the statements replacing it}), or None where no result qualifies."""
    prim: Map = stmt.prim
    body = prim.body
    rows = stmt.outs[0].aval.shape[0]
    body_stmts, forms = _scattered_values(body)
    kept_outs, kept_results, added_outs, added_results = [], [], [], []
    sums: dict[int, list[Let]] = {}
    for top, result in zip(stmt.outs, body.outputs, strict=True):
        reader = readers.get(top, [])
        summed = (isinstance(result, Var) and result in forms and top not in outputs and len(reader) == 1
                  and isinstance(reader[0].prim, SumAxes) and tuple(reader[0].prim.axes) == (0,))
        if not summed:
            kept_outs.append(top)
            kept_results.append(result)
            continue
        form = forms[result]
        stacked = []
        for position, value in form.entries:
            rows_of = [Var(a.aval.update(shape=(rows,) + a.aval.shape)) for a in (position, value)]
            added_outs += rows_of
            added_results += [position, value]
            stacked.append(rows_of)
        (total,) = reader[0].outs
        size = math.prod(form.shape)

        def scatter(*stacked_rows, size=size, shape=form.shape):
            import fold

            positions = fold.concatenate([p.reshape((-1,)) for p in stacked_rows[0::2]])
            values = fold.concatenate([v.reshape((-1,)) for v in stacked_rows[1::2]])
            return fold.reduce_by_index(fold.monoids.sum, size, positions, values).reshape(shape)

        made, (result_var,) = spliced(scatter, [a for pair in stacked for a in pair])
        if made and made[-1].outs == (result_var,):  # the sum's result is made by the last statement itself
            made[-1] = Let((total,), made[-1].prim, made[-1].args)
        else:
            made.append(Let((total,), Reshape(tuple(total.aval.shape)), (result_var,)))
        sums[id(reader[0])] = made
    if not sums:
        return None
    results = tuple(kept_results + added_results)
    _, out_tree = tree_flatten(tuple(range(len(results))))
    new_body = Program(body.inputs, tuple(body_stmts), results, body.in_tree, out_tree, dict(body.meta))
    return Let(tuple(kept_outs + added_outs), Map(new_body, prim.num_consts), stmt.args), sums
