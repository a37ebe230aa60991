"""Rows gathered from a small table are read in place by the elementwise run that uses them.

A k-means gradient gathers each point's nearest centroid, `centroids[nearest]` (10^6 x 16 values from a
64 x 16 table), only to combine it with the point elementwise. Gathered by NumPy the rows are written to
memory and read back by the run (the gather alone took 18-24 ms on the 2-core VM, single-threaded). Here a
gather whose result only one plain elementwise run reads (no fold or row sum in it), with a 2-D table and
one index per row of the run, becomes part of that run: the run's kernel takes the table and the indices and
reads row indices[i] of the table where it read row i of the gathered array (kernels.cpu.map's `rows`).
"""

from __future__ import annotations

from fold.ir import Let, Program, Var, use_counts
from fold.primitives import Gather

from .elementwise_fusion import FusedElementwise


def _absorbable(value, producer: dict, uses, run_shape: tuple) -> Let | None:
    """The gather making `value`, if the run may read its rows in place: it is read by the run alone, its
    table is a 2-D variable and its index a variable with one entry per row of the run."""
    stmt = producer.get(value) if isinstance(value, Var) else None
    if stmt is None or not isinstance(stmt.prim, Gather) or uses[value] != 1:
        return None
    table, idx = stmt.args
    ok = (isinstance(table, Var) and isinstance(idx, Var) and table.aval.ndim == 2 and idx.aval.dtype.kind in "iu"
          and value.aval.shape == run_shape and idx.aval.shape == run_shape[:-1])
    return stmt if ok else None


def _with_gathers(run: Let, gathers: list[tuple[int, Let]]) -> Let:
    """The run reading each gather's table (in the gathered value's place) and index (added if new)."""
    region = run.prim.region
    inputs, args = list(region.inputs), list(run.args)
    positions = []
    for p, stmt in gathers:
        table, idx = stmt.args
        inputs[p] = args[p] = table
        if idx not in inputs:
            inputs.append(idx)
            args.append(idx)
        positions.append((p, inputs.index(idx)))
    new_region = Program(tuple(inputs), tuple(s for _, s in gathers) + region.stmts, region.outputs)
    return Let(run.outs, FusedElementwise(new_region, tuple(positions)), tuple(args))


def absorb_gathers(program: Program, rows_ndim: int) -> Program:
    """The program with each gather that only one plain elementwise run of `rows_ndim` dimensions reads
    taken into that run (see the module docstring); the run must not read the table itself."""
    uses = use_counts(program)
    producer = {o: s for s in program.stmts for o in s.outs}
    absorbed: set[int] = set()
    stmts: list[Let] = []
    for stmt in program.stmts:
        prim = stmt.prim
        if isinstance(prim, FusedElementwise) and not prim.gathers and prim.reduce is None and prim.row_sum is None:
            run_shape = prim.run_shape
            found: list[tuple[int, Let]] = []
            for p, a in enumerate(stmt.args):
                g = _absorbable(a, producer, uses, run_shape) if len(run_shape) == rows_ndim else None
                if g is not None and g.args[0] not in stmt.args and all(g.args[0] is not f.args[0] for _, f in found):
                    found.append((p, g))  # one gather per table: a table is one argument of the kernel
            if found:
                absorbed.update(id(g) for _, g in found)
                stmt = _with_gathers(stmt, found)
        stmts.append(stmt)
    if not absorbed:
        return program
    kept = tuple(s for s in stmts if id(s) not in absorbed)
    return Program(program.inputs, kept, program.outputs, program.in_tree, program.out_tree, dict(program.meta))
