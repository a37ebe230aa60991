"""One-hot vectors in map bodies, read as (index, value) pairs instead of K mostly-zero values.

The gradient of a min or max reduction inside a map puts the cotangent at one index (the first where the
row attains its extremum) and zeros elsewhere. k-means' gradient, for each point p:

    h = reduce_by_index(+, K, [i], [v])     (i the nearest centroid; ad/reduce_rules.py: one value
                                              scattered into zeros; a user's where(iota(K) == i, v, 0) alike)
    dp   = C^T reshape(-2 h, (K, 1)) + ...                                   (a matrix-vector product)
    outputs -2 h and h: (points, K) arrays that the top level sums over the points, and multiplies by
    the points ((K, points) @ (points, d))

so a gradient of 10^6 points wrote and read two 512 MB arrays of zeros and ran two BLAS products over
them. `sparse_one_hots(program)` tracks such vectors through the body (negation, scaling by a scalar,
reshapes to a column or a row) as their index and value, and rewrites what reads them:

- in the body, sum(h) is the value, and A @ column(h) is row i of A^T times the value (a gather);
- a map output of one-hots gets two more outputs, the indices and the values, and at the top level
  sum(H, axes=(0,)) becomes reduce_by_index(+, K, indices, values), and
  matmul(reshape(transpose(H)), X) becomes reduce_by_index(+, K, indices, values * X's rows): the
  scatter-add that the product over zeros computes.

An output every reader of which is rewritten is dropped, with the body statements only it needed. Indices
outside [0, K) make an all-zero vector: its value is taken as 0 (reduce_by_index ignores such indices too),
and the gather reads a clamped row. One difference remains, with non-finite values in A: the dense product adds 0 * inf
(NaN) where the gather reads only row i, as the derivative's structure says. The numpy backend keeps the
dense program (the reference the tests compare with).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import fold
from fold.inline import spliced
from fold.ir import Let, Program, Var, flat_program
from fold.primitives import BroadcastTo, Elementwise, Iota, Map, MatMul, ReduceByIndex, Reshape, SumAxes, Transpose
from fold.runtime.loops.one_hot_products import is_zero_literal, scatters_one_value


@dataclass(frozen=True)
class OneHot:
    """A value of `shape` (K,), (K, 1) or (1, K) that is `value` at `index` along its K-long axis, else 0."""

    index: Any
    value: Any
    size: int
    shape: tuple[int, ...]


def _renaming(rename: dict[Var, Any]) -> Callable[[Any], Any]:
    """atom -> what `rename` says it became (following chains of renames), or the atom itself."""
    def sub(a):
        while isinstance(a, Var) and a in rename:
            a = rename[a]
        return a

    return sub


def _reading(stmt: Let, sub: Callable[[Any], Any]) -> Let:
    return Let(stmt.outs, stmt.prim, tuple(sub(a) for a in stmt.args))


def _scalar(a) -> bool:
    return a.aval.shape == ()


def _body_rewrite(body: Program) -> tuple[list[Let], dict[Var, Any], dict[Var, OneHot]]:
    """The body's statements with one-hot readers rewritten, the values those readers made (renamed to what
    replaces them), and the one-hots found."""
    iotas: dict[Var, int] = {}
    scalars: dict[Var, Any] = {}  # broadcasts of a scalar
    masks: dict[Var, tuple[Any, int]] = {}
    units: dict[Var, Any] = {}  # (1,)-shaped reshapes of a scalar
    hots: dict[Var, OneHot] = {}
    rename: dict[Var, Any] = {}
    sub = _renaming(rename)
    stmts: list[Let] = []
    for stmt in body.stmts:
        stmt = _reading(stmt, sub)
        prim, args, out = stmt.prim, stmt.args, stmt.outs[0]
        stmts.append(stmt)
        if isinstance(prim, Iota) and out.aval.ndim == 1:
            iotas[out] = out.aval.shape[0]
        elif isinstance(prim, BroadcastTo) and _scalar(args[0]) and out.aval.ndim == 1:
            scalars[out] = args[0]
        elif isinstance(prim, Elementwise) and prim.op == "eq":
            a, b = args
            for iota, other in ((a, b), (b, a)):
                if iota in iotas and other in scalars and scalars[other].aval.dtype.kind in "iu":
                    masks[out] = (scalars[other], iotas[iota])
        elif isinstance(prim, Reshape) and _scalar(args[0]) and out.aval.shape == (1,):
            units[out] = args[0]
        elif isinstance(prim, ReduceByIndex) and _one_entry(stmt, units):
            hots[out] = _in_range(stmts, units[args[1]], units[args[2]], out.aval.shape[0], out.aval.shape)
        elif isinstance(prim, Elementwise) and prim.op == "where" and args[0] in masks and is_zero_literal(args[2]):
            value = scalars.get(args[1]) if isinstance(args[1], Var) else (args[1] if _scalar(args[1]) else None)
            if value is not None and out.aval.dtype.kind == "f" and value.aval.dtype == out.aval.dtype:
                index, size = masks[args[0]]
                hots[out] = _in_range(stmts, index, value, size, out.aval.shape)
        elif isinstance(prim, Elementwise) and prim.op == "neg" and args[0] in hots:
            hot = hots[args[0]]
            made, (value,) = spliced(lambda v: -v, [hot.value])
            stmts += made
            hots[out] = OneHot(hot.index, value, hot.size, hot.shape)
        elif isinstance(prim, Elementwise) and prim.op == "mul" and any(a in hots for a in args if isinstance(a, Var)):
            hot_arg = next(a for a in args if isinstance(a, Var) and a in hots)
            other = args[1] if args[0] is hot_arg else args[0]
            factor = scalars.get(other) if isinstance(other, Var) else (other if _scalar(other) else None)
            if factor is not None:
                hot = hots[hot_arg]
                made, (value,) = spliced(lambda v, s: v * s, [hot.value, factor])
                if value.aval.dtype == out.aval.dtype:
                    stmts += made
                    hots[out] = OneHot(hot.index, value, hot.size, hot.shape)
        elif isinstance(prim, Reshape) and args[0] in hots and out.aval.shape in _shapes(hots[args[0]].size):
            hot = hots[args[0]]
            hots[out] = OneHot(hot.index, hot.value, hot.size, out.aval.shape)
        elif isinstance(prim, SumAxes) and args[0] in hots and out.aval.shape == ():
            stmts.pop()
            rename[out] = hots[args[0]].value
        elif isinstance(prim, MatMul) and any(isinstance(a, Var) and a in hots for a in args):
            replaced = _product(stmt, hots)
            if replaced is not None:
                stmts.pop()
                made, (value,) = replaced
                stmts += made
                rename[out] = value
    return stmts, rename, hots


def _in_range(stmts: list[Let], index, value, size: int, shape: tuple[int, ...]) -> OneHot:
    """The one-hot at `index` with `value`, its value taken as 0 where the index lies outside [0, size) (an
    all-zero vector, as both the mask and reduce_by_index make); the statements computing it appended."""
    made, (value,) = spliced(lambda i, v: fold.where((i >= 0) & (i < size), v, 0.0), [index, value])
    stmts += made
    return OneHot(index, value, size, shape)


def _one_entry(stmt: Let, units: dict[Var, Any]) -> bool:
    """Whether the histogram adds one scalar into zeros at one scalar index (a scatter of one element), of
    a float value at an integer index."""
    out = stmt.outs[0]
    if not scatters_one_value(stmt):
        return False
    index, value = (units.get(a) if isinstance(a, Var) else None for a in stmt.args[1:3])
    return (index is not None and value is not None and index.aval.dtype.kind in "iu"
            and value.aval.dtype == out.aval.dtype and out.aval.dtype.kind == "f")


def _shapes(size: int) -> tuple[tuple[int, ...], ...]:
    return (size,), (size, 1), (1, size)


def _product(stmt: Let, hots: dict[Var, OneHot]):
    """A @ column(h) = row i of A^T times v; row(h) @ B = row i of B times v (an index outside [0, K): zero)."""
    left, right = stmt.args
    out_shape = stmt.outs[0].aval.shape
    if isinstance(right, Var) and right in hots and hots[right].shape == (hots[right].size, 1):
        hot, matrix, transpose = hots[right], left, True
    elif isinstance(left, Var) and left in hots and hots[left].shape == (1, hots[left].size):
        hot, matrix, transpose = hots[left], right, False
    else:
        return None
    size = hot.size

    def gathered(m, i, v):  # v is 0 where i is outside [0, K): read a row that exists
        rows = m.T if transpose else m
        return fold.reshape(rows[fold.minimum(fold.maximum(i, 0), size - 1)] * v, out_shape)

    return spliced(gathered, [matrix, hot.index, hot.value])


def _live(stmts: list[Let], outputs: list) -> list[Let]:
    """The statements the outputs need (statements are pure: the rest are dropped)."""
    needed = {o for o in outputs if isinstance(o, Var)}
    kept = []
    for stmt in reversed(stmts):
        if any(o in needed for o in stmt.outs):
            kept.append(stmt)
            needed.update(a for a in stmt.args if isinstance(a, Var))
    return kept[::-1]


def sparse_one_hots(program: Program) -> Program:
    """The program with the one-hot values of its top-level maps' bodies read as (index, value) pairs (see
    the module docstring); the program itself where there are none."""
    changed = False
    readers: dict[Var, list[Let]] = {}
    for stmt in program.stmts:
        for a in stmt.args:
            if isinstance(a, Var):
                readers.setdefault(a, []).append(stmt)
    replaced: dict[int, list[Let]] = {}  # id of a top-level statement -> what runs instead
    rename: dict[Var, Any] = {}
    for stmt in program.stmts:
        if not isinstance(stmt.prim, Map):
            continue
        try:
            rewrite = _map_rewrite(stmt, readers, program.outputs)
        except Exception as err:  # noqa: BLE001 (an optimisation: the dense program is always right)
            warnings.warn(f"numba backend: one-hot values of a map left dense ({type(err).__name__}: {err})",
                          stacklevel=2)
            continue
        if rewrite is not None:
            changed = True
            new_map, extra, renamed = rewrite
            replaced[id(stmt)] = [new_map]
            for reader_id, made in extra.items():
                replaced[reader_id] = made
            rename.update(renamed)
    if not changed:
        return program
    sub = _renaming(rename)
    stmts = [_reading(made, sub) for stmt in program.stmts for made in replaced.get(id(stmt), [stmt])]
    outputs = tuple(sub(o) for o in program.outputs)
    return Program(program.inputs, tuple(_live(stmts, list(outputs))), outputs, program.in_tree, program.out_tree,
                   dict(program.meta))


def _map_rewrite(stmt: Let, readers: dict[Var, list[Let]], program_outputs):
    prim: Map = stmt.prim
    body_stmts, body_rename, hots = _body_rewrite(prim.body)
    if not hots:
        return None
    body_outputs = [_renaming(body_rename)(o) for o in prim.body.outputs]
    n = stmt.outs[0].aval.shape[0]
    extra: dict[int, list[Let]] = {}
    renamed: dict[Var, Any] = {}
    new_outputs, new_outs, added = [], [], []  # added: (index var, value var) per one-hot output, made lazily

    def pair_for(hot: OneHot) -> tuple[Var, Var]:
        key = (id(hot.index), id(hot.value))
        for (idx_out, val_out), h in added:
            if (id(h.index), id(h.value)) == key:
                return idx_out, val_out
        idx_out = Var(hot.index.aval.update(shape=(n,)))
        val_out = Var(hot.value.aval.update(shape=(n,)))
        added.append(((idx_out, val_out), hot))
        return idx_out, val_out

    body_changed = bool(body_rename)  # a reader in the body rewritten
    for body_out, top_out in zip(body_outputs, stmt.outs, strict=True):
        hot = hots.get(body_out) if isinstance(body_out, Var) else None
        rewritten = None
        if hot is not None and top_out not in program_outputs:
            rewritten = _top_level_readers(top_out, hot, readers, pair_for, program_outputs)
        if rewritten is None:
            new_outputs.append(body_out)
            new_outs.append(top_out)
            continue
        body_changed = True
        for reader_id, made in rewritten[0].items():
            extra[reader_id] = made
        renamed.update(rewritten[1])
    if not body_changed:
        return None
    for (idx_out, val_out), hot in added:
        new_outputs += [hot.index, hot.value]
        new_outs += [idx_out, val_out]
    body = flat_program(Program(prim.body.inputs, tuple(_live(body_stmts, new_outputs)), tuple(new_outputs)))
    return Let(tuple(new_outs), Map(body, prim.num_consts), stmt.args), extra, renamed


def _top_level_readers(top: Var, hot: OneHot, readers: dict[Var, list[Let]], pair_for, program_outputs):
    """The statements replacing every reader of the stacked one-hots `top` ({id(reader): statements}, and
    renames), or None where one reader is not a sum over the map's axis or a product of their transpose."""
    made: dict[int, list[Let]] = {}
    renames: dict[Var, Any] = {}
    size = hot.size
    for reader in readers.get(top, []):
        out = reader.outs[0]
        if isinstance(reader.prim, SumAxes) and reader.prim.axes == (0,) and reader.args == (top,):
            index, value = pair_for(hot)
            stmts, (total,) = spliced(lambda i, v: fold.reshape(fold.reduce_by_index(fold.monoids.sum, size, i, v),
                                                                  out.aval.shape), [index, value])
            made[id(reader)] = stmts
            renames[out] = total
            continue
        chain = _transposed_product(reader, readers, top, hot, program_outputs)
        if chain is None:
            return None
        ids, product = chain
        other = product.args[1]
        index, value = pair_for(hot)
        stmts, (total,) = spliced(
            lambda i, v, x: fold.reduce_by_index(fold.monoids.sum, size, i, fold.map(lambda vi, xi: vi * xi, v, x)),
            [index, value, other])
        for reader_id in ids:
            made[reader_id] = []
        made[id(product)] = stmts
        renames[product.outs[0]] = total
    return made, renames


def _transposed_product(first: Let, readers: dict[Var, list[Let]], top: Var, hot: OneHot, program_outputs):
    """(ids of the statements, the product) for transpose(top) [-> reshape to (K, n)] -> matmul(., X), with
    `top` stacked columns or vectors (not rows) and the values between read by nothing else."""
    if hot.shape == (1, hot.size) or not isinstance(first.prim, Transpose) or first.prim.perm[:2] != (1, 0) or list(first.prim.perm[2:]) != list(
            range(2, top.aval.ndim)):
        return None
    ids, value, stmt = [id(first)], first.outs[0], first
    next_readers = readers.get(value, [])
    if value in program_outputs:
        return None
    if len(next_readers) == 1 and isinstance(next_readers[0].prim, Reshape):
        stmt = next_readers[0]
        ids.append(id(stmt))
        value = stmt.outs[0]
        next_readers = readers.get(value, [])
    if value.aval.shape != (hot.size, top.aval.shape[0]) or len(next_readers) != 1 or value in program_outputs:
        return None
    product = next_readers[0]
    if not isinstance(product.prim, MatMul) or product.args[0] is not value or product.args[1] is value:
        return None
    if product.args[1].aval.ndim != 2:
        return None
    return ids, product
