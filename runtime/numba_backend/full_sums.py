"""A sum over every axis of an elementwise expression, computed over the expression's operands as vectors.

`fold.sum(fold.maximum(S, 0.0) ** 2)` of a matrix (a NumPy-style loss) is a run of elementwise statements over
two axes, then a sum over both. The elementwise kernels fold a run into a sum over a vector only, so the
run wrote its (n, m) result and a second pass read it back to sum it (4096 x 2048 float32: 7.1 ms, where a
pass reading the matrix once takes 3). The sum of every element does not depend on the shape they are laid
out in: `flat_full_sums(program)` writes such a run over its operands reshaped to vectors (views of
contiguous arrays: nothing is copied) and the sum as the vector's, which elementwise fusion then folds into
the run.

It applies to runs of at least FLAT_FROM elements, to the statements that only the sum reads, through one
another, whose operands are arrays of the run's shape or scalars, none of them a view the backend makes of
another array (a broadcast, a transpose, a slice), which the run reads in place where a vector of it would
be a copy. A matrix's run that reads such a view (the softplus of an outer product, a Gaussian kernel's
exp(-(|a|^2 + |b|^2 - 2 a.b)) of broadcast row and column norms) is summed by rows instead, then the rows'
sums: elementwise fusion takes a row sum into the run's pass (kernels.cpu.map_with_row_sums), and the
matrix is never written.
"""

from __future__ import annotations

import math

import numpy as np

from fold.dtypes import ShapedArray
from fold.ir import Let, Lit, Program, Var, use_counts, with_statements_spliced
from fold.primitives import BroadcastTo, Reshape, StaticIndex, SumAxes, Transpose

from .elementwise_fusion import ELEMENTWISE


# the fewest elements of a run worth flattening: below, the second pass costs microseconds (attention's
# (2048, 64) output summed as squares: 0.11 ms either way), and the NumPy-style attention timed 1.2-1.4x slower
# with its output's run flattened in fresh processes alternately (bench_ab, 7 rounds), though not in one process
FLAT_FROM = 1 << 20

# statements whose result the backend makes as a view of another array, not as an array of its own
_VIEWS = (BroadcastTo, StaticIndex, Transpose)


def flat_full_sums(program: Program) -> Program:
    """`program` with each sum over every axis of an elementwise run (module docstring) over vectors."""
    uses = use_counts(program)
    producer = {v: s for s in program.stmts for v in s.outs}
    position = {id(s): k for k, s in enumerate(program.stmts)}
    rewritten: dict[int, list[Let]] = {}
    moved: set[int] = set()
    for stmt in program.stmts:
        run = _summed_run(stmt, producer, uses)
        if run is None:
            continue
        if _reads_views(run, producer):
            if len(stmt.args[0].aval.shape) == 2:
                rewritten[id(stmt)] = _by_rows(stmt)
            continue
        rewritten[id(stmt)] = _over_vectors(sorted(run, key=lambda s: position[id(s)]), stmt)
        moved |= {id(s) for s in run}
    return with_statements_spliced(program, rewritten, moved)


def _summed_run(stmt: Let, producer: dict, uses) -> list[Let] | None:
    """The elementwise statements that the sum `stmt` alone reads, through one another,
    where it sums every axis (two or more) of their result; else None."""
    if not isinstance(stmt.prim, SumAxes) or not isinstance(stmt.args[0], Var):
        return None
    x = stmt.args[0]
    shape = x.aval.shape
    if (len(shape) < 2 or math.prod(shape) < FLAT_FROM
            or sorted(a % len(shape) for a in stmt.prim.axes) != list(range(len(shape)))):
        return None
    run, todo = [], [x]
    while todo:
        v = todo.pop()
        made = producer.get(v)
        if made is None or not isinstance(made.prim, ELEMENTWISE) or uses[v] != 1 or made.outs[0].aval.shape != shape:
            continue  # an operand of the run
        run.append(made)
        todo += [a for a in made.args if isinstance(a, Var)]
    operands = {a for s in run for a in s.args} - {s.outs[0] for s in run}
    if not run or any(a.aval.shape not in (shape, ()) for a in operands):
        return None
    return run


def _reads_views(run: list[Let], producer: dict) -> bool:
    """Whether an operand of the run is a view of another array: a vector of it would be a copy, where the
    run reads the view in place."""
    operands = {a for s in run for a in s.args} - {s.outs[0] for s in run}
    return any(isinstance(getattr(producer.get(a), "prim", None), _VIEWS) for a in operands)


def _by_rows(total: Let) -> list[Let]:
    """The sum of every element of a matrix as the sum of its rows' sums."""
    x = total.args[0]
    rows = Var(ShapedArray(x.aval.shape[:1], x.aval.dtype))
    return [Let((rows,), SumAxes((1,)), (x,)), Let(total.outs, SumAxes((0,)), (rows,))]


def _over_vectors(run: list[Let], total: Let) -> list[Let]:
    """The reshapes of the run's array operands to vectors, the run (in program order) over them, and the sum
    of the vector."""
    shape = total.args[0].aval.shape
    flat = (math.prod(shape),)
    renamed: dict = {}
    stmts: list[Let] = []

    def vector(a):
        if a in renamed:
            return renamed[a]
        if a.aval.shape == ():
            return a
        if isinstance(a, Lit):
            return Lit(np.asarray(a.value).reshape(flat))
        renamed[a] = Var(ShapedArray(flat, a.aval.dtype))
        stmts.append(Let((renamed[a],), Reshape(flat), (a,)))
        return renamed[a]

    for s in run:
        args = tuple(vector(a) for a in s.args)
        out = Var(ShapedArray(flat, s.outs[0].aval.dtype))
        renamed[s.outs[0]] = out
        stmts.append(Let((out,), s.prim, args))
    stmts.append(Let(total.outs, SumAxes((0,)), (renamed[total.args[0]],)))
    return stmts
