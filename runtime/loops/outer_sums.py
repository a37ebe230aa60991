"""A matrix product that contracts over a map's axis, written as the sum over the map of its rows' outer products.

The gradient of a map whose body multiplies a captured matrix by its row (`C @ p` for each point p: k-means'
matrix form, a layer applied to each example) gets the matrix's cotangent as one product over all rows:

    H: (n, K, 1) and P: (n, 1, d) results of the map;   dC = reshape(transpose(H), (K, n)) @ reshape(P, (n, d))

which stores both (n, .) arrays to multiply them at the end. The same value is the sum over the map of each
row's outer product, `dC = sum_p h_p p^T`: `outer_products_as_sums(program)` writes it so (the outer product a
result of the map's body, the sum over the map's axis its consumer), and the loop nest folds it into a (K, d)
state as the map computes the rows (fusion.py), storing neither array.

It applies to `A @ B` where A's column p is row p of a result (or mapped input) of a map, flattened, and B's
row p the same of another (transposes and reshapes between them that keep each row's elements in order), and
where the product's K x d values fit the fold's state (`MAX_OUTER_SUM`): a large product is BLAS's work.
Where the column is one-hot in the map's body (a min/max gradient's cotangent: one_hot_products.py), each
row's outer product adds one row of d values to the state (the nest writes it so), where BLAS would multiply
K x d values per row, mostly zeros: such a product is a sum up to `MAX_ONE_HOT_OUTER_SUM` values, the most a
fold's state holds per chunk. The fusion pass keeps the rewrite only where the map becomes a loop nest.
"""

from __future__ import annotations

from dataclasses import dataclass

from fold.dce import dce
from fold.ir import Let, Program, Var, flat_program
from fold.primitives import Map, MatMul, Reshape, SumAxes, Transpose

from .one_hot_products import one_hot_values

MAX_OUTER_SUM = 4096  # K x d values: a state of 32 KiB in float64, which each chunk of the fold keeps in cache
MAX_ONE_HOT_OUTER_SUM = 1 << 18  # K x d values: 2 MiB in float64 per chunk, where each row adds to one of K rows


@dataclass(frozen=True)
class _RowSource:
    """A value whose row p (flattened) is row p of `value`, a result or mapped input of the map `map_stmt`."""

    map_stmt: Let
    value: Var


def outer_products_as_sums(program: Program) -> tuple[Program, set[Var]]:
    """`program` with each matrix product that qualifies (the module's docstring) written as the sum over its
    map of the rows' outer products, and the results of the maps it changed."""
    produced_by = {v: s for s in program.stmts for v in s.outs}
    mapped = _mapped_inputs(program)
    found: dict[int, list[tuple[Let, Var, Var]]] = {}  # id(map statement) -> (product, column source, row source)
    hot = _OneHots()
    for stmt in program.stmts:
        if not isinstance(stmt.prim, MatMul):
            continue
        left, right = stmt.args
        columns = _source(left, produced_by, mapped, columns=True)
        rows = _source(right, produced_by, mapped, columns=False)
        if columns is None or rows is None or columns.map_stmt is not rows.map_stmt:
            continue
        k, d = stmt.outs[0].aval.shape
        if k * d > (MAX_ONE_HOT_OUTER_SUM if _one_hot_column(columns, hot) else MAX_OUTER_SUM):
            continue
        found.setdefault(id(columns.map_stmt), []).append((stmt, columns.value, rows.value))
    if not found:
        return program, set()
    stmts, maps = [], set()
    replaced: dict[int, Let] = {}
    for stmt in program.stmts:
        if id(stmt) in found:
            rewritten, sums = _with_outer_products(stmt, found[id(stmt)])
            stmts.append(rewritten)
            maps.update(rewritten.outs)
            replaced.update(sums)
        else:
            stmts.append(replaced.get(id(stmt), stmt))
    lifted = Program(program.inputs, tuple(stmts), program.outputs, program.in_tree, program.out_tree,
                     dict(program.meta))
    return dce(lifted), maps


class _OneHots:
    """{a map's result: the axis along which its body makes each row one-hot}, found once per map."""

    def __init__(self) -> None:
        self._by_map: dict[int, dict[Var, int]] = {}

    def axis(self, map_stmt: Let, value: Var) -> int | None:
        found = self._by_map.get(id(map_stmt))
        if found is None:
            body = map_stmt.prim.body
            facts = one_hot_values(body)
            found = self._by_map[id(map_stmt)] = {out: facts[row] for out, row in zip(map_stmt.outs, body.outputs)
                                                  if isinstance(row, Var) and row in facts}
        return found.get(value)


def _one_hot_column(columns: _RowSource, hot: _OneHots) -> bool:
    """Whether each column of the product (a row of a map's result) is zero but at one index along its one
    axis of more than one element."""
    value = columns.value
    if value not in columns.map_stmt.outs:  # a mapped input: nothing known of its rows
        return False
    element = [a for a in range(1, value.aval.ndim) if value.aval.shape[a] != 1]
    axis = hot.axis(columns.map_stmt, value)
    return len(element) == 1 and axis is not None and axis + 1 == element[0]


def _mapped_inputs(program: Program) -> dict[Var, Let]:
    """{a top-level value a map maps over: that map} (the first map reading it)."""
    found: dict[Var, Let] = {}
    for s in program.stmts:
        if isinstance(s.prim, Map):
            for a in s.args[s.prim.num_consts:]:
                if isinstance(a, Var):
                    found.setdefault(a, s)
    return found


def _source(value: Var, produced_by: dict, mapped: dict, columns: bool) -> _RowSource | None:
    """Where `value` ((K, n) if `columns`, else (n, d)) holds, flattened, the rows of a map's result or mapped
    input as its columns (rows), through the transposes and reshapes that make it from them; None elsewhere."""
    chain = []
    while isinstance(value, Var) and value in produced_by and isinstance(produced_by[value].prim, (Transpose, Reshape)):
        chain.append(produced_by[value])
        value = produced_by[value].args[0]
    if not isinstance(value, Var) or value.aval.ndim == 0:
        return None
    stmt = produced_by.get(value)
    if stmt is not None and isinstance(stmt.prim, Map):
        map_stmt = stmt
    elif value in mapped:
        map_stmt = mapped[value]
    else:
        return None
    axes = _axes_after(value.aval.shape, reversed(chain))
    element = [a for a in range(1, value.aval.ndim) if value.aval.shape[a] != 1]
    want = [tuple(element), (0,)] if columns else [(0,), tuple(element)]
    if axes is None or [g for g in axes if g] != [g for g in want if g]:
        return None
    return _RowSource(map_stmt, value)


def _axes_after(shape: tuple[int, ...], chain) -> list[tuple[int, ...]] | None:
    """Each axis of the value the transposes and reshapes of `chain` make from one of `shape`, as the axes of
    that one it holds (in C order; () for an axis of one element); None where a reshape splits an axis."""
    axes = [(a,) if n != 1 else () for a, n in enumerate(shape)]
    sizes = list(shape)
    for stmt in chain:
        if isinstance(stmt.prim, Transpose):
            axes = [axes[i] for i in stmt.prim.perm]
            sizes = [sizes[i] for i in stmt.prim.perm]
            continue
        merged = _merged(list(zip(axes, sizes)), list(stmt.prim.shape))
        if merged is None:
            return None
        axes, sizes = merged, list(stmt.prim.shape)
    return axes


def _merged(current: list[tuple[tuple[int, ...], int]], new_shape: list[int]) -> list[tuple[int, ...]] | None:
    """The axes of a reshape to `new_shape` of axes `current` ((held axes, size) each), where each new axis
    merges consecutive current ones; None where it would split one."""
    pending = [(axes, n) for axes, n in current if n != 1]
    out = []
    for n in new_shape:
        if n == 1:
            out.append(())
            continue
        held, size = (), 1
        while pending and size < n:
            axes, m = pending.pop(0)
            held, size = held + axes, size * m
        if size != n:
            return None
        out.append(held)
    return out if not pending else None


def _with_outer_products(map_stmt: Let, products: list[tuple[Let, Var, Var]]) -> tuple[Let, dict[int, Let]]:
    """The map with one more result per product, the outer product of the two rows in its body, and the sums
    over the map's axis that replace the products ({id(product): the sum})."""
    prim: Map = map_stmt.prim
    body, nc = prim.body, prim.num_consts
    row_of = dict(zip(map_stmt.args[nc:], body.inputs[nc:], strict=True))
    row_of.update(zip(map_stmt.outs, body.outputs, strict=True))
    stmts, outputs, outs, sums = list(body.stmts), list(body.outputs), list(map_stmt.outs), {}
    for product, column, row in products:
        k, d = product.outs[0].aval.shape
        left, right = row_of[column], row_of[row]
        as_column = Var(left.aval.update(shape=(k, 1)))
        as_row = Var(right.aval.update(shape=(1, d)))
        outer = Var(product.outs[0].aval)
        stmts += [Let((as_column,), Reshape((k, 1)), (left,)), Let((as_row,), Reshape((1, d)), (right,)),
                  Let((outer,), MatMul(), (as_column, as_row))]
        outputs.append(outer)
        stacked = Var(outer.aval.update(shape=(map_stmt.outs[0].aval.shape[0], k, d)))
        outs.append(stacked)
        sums[id(product)] = Let(product.outs, SumAxes((0,)), (stacked,))
    new_body = flat_program(Program(body.inputs, tuple(stmts), tuple(outputs)))
    return Let(tuple(outs), Map(new_body, nc), map_stmt.args), sums
