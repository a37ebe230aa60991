"""A map of a map with a scalar body, over a 2-D array, written as the elementwise statements it amounts to.

`map(lambda row: map(lambda v: f(v, ...), row), X)` over an (R, C) array with C larger than the codegen
unrolls (runtime/numba_backend/codegen.py, MAX_UNROLLED_ROWS) (gemm_map_reduce's per-pair map over a block, a user's map over the entries of a matrix) would run
as NumPy passes, one per operation. Its body is elementwise over (R, C): every operand is the (i, j) entry
of a 2-D array, a per-row value (broadcast along j), a per-column value (broadcast along i) or a captured
scalar. `unnest_maps(program)` writes such a map as those broadcasts and the body's statements on (R, C)
arrays, which elementwise fusion then runs as one kernel together with its neighbours.
"""

from __future__ import annotations

from fold.ir import Let, Lit, Program, Var
from fold.primitives import BroadcastTo, Map, Reshape

from .codegen import compile_problem
from .elementwise_fusion import ELEMENTWISE


def _inner_map(stmt: Let) -> Let | None:
    """The outer body's only statement, a map whose outputs are the outer body's outputs and whose body is
    elementwise on scalars."""
    body = stmt.prim.body
    if len(body.stmts) != 1 or not isinstance(body.stmts[0].prim, Map):
        return None
    inner = body.stmts[0]
    ib = inner.prim.body
    used = _used(ib)
    scalar = all(v.aval.shape == () for v in ib.inputs if v in used) and all(o.aval.shape == () for s in ib.stmts for o in s.outs)
    if not scalar or not all(isinstance(s.prim, ELEMENTWISE) for s in ib.stmts):
        return None
    known = {o for s in ib.stmts for o in s.outs} | set(ib.inputs)
    if tuple(body.outputs) != tuple(inner.outs) or not all(isinstance(o, Var) and o in known for o in ib.outputs):
        return None
    if len(set(ib.outputs)) != len(ib.outputs):
        return None
    return inner


def _used(body: Program) -> set[Var]:
    """The inner body's inputs and values that its statements read or that it returns."""
    return {a for s in body.stmts for a in s.args if isinstance(a, Var)} | {o for o in body.outputs if isinstance(o, Var)}


def _view(stmts: list[Let], value, shape: tuple[int, int], axis: int | None):
    """`value` as an (R, C) operand: as it is (axis None), or broadcast along `axis` (a per-row value is
    reshaped to (R, 1), a per-column value to (1, C), a scalar needs no reshape)."""
    if axis is None:
        return value
    if value.aval.ndim == 1:
        column = Var(value.aval.update(shape=(shape[0], 1) if axis == 1 else (1, shape[1])))
        stmts.append(Let((column,), Reshape(column.aval.shape), (value,)))
        value = column
    wide = Var(value.aval.update(shape=shape))
    stmts.append(Let((wide,), BroadcastTo(shape), (value,)))
    return wide


def _unnest(stmt: Let) -> list[Let] | None:
    inner = _inner_map(stmt)
    if inner is None:
        return None
    outer_body, nc = stmt.prim.body, stmt.prim.num_consts
    xs = stmt.args[nc:]
    if not xs or any(isinstance(x, Lit) for x in stmt.args):
        return None
    rows = xs[0].aval.shape[0]
    inner_xs = inner.args[inner.prim.num_consts:]
    if not inner_xs or isinstance(inner_xs[0], Lit):
        return None
    cols = inner_xs[0].aval.shape[0]
    shape = (rows, cols)
    # each outer-body input: the top-level value it comes from, and whether it is captured (whole) or a row
    source = {v: (a, i >= nc) for i, (v, a) in enumerate(zip(outer_body.inputs, stmt.args, strict=True))}
    used = _used(inner.prim.body)
    stmts: list[Let] = []
    operand = {}
    for k, (param, arg) in enumerate(zip(inner.prim.body.inputs, inner.args, strict=True)):
        if param not in used:
            continue
        if isinstance(arg, Lit) or arg not in source:
            return None
        value, is_row = source[arg]
        iterated = k >= inner.prim.num_consts
        if iterated and is_row and value.aval.shape == shape:
            operand[param] = value  # the (i, j) entry
        elif iterated and not is_row and value.aval.shape == (cols,):
            operand[param] = _view(stmts, value, shape, axis=0)  # per column, the same in every row
        elif not iterated and is_row and value.aval.shape == (rows,):
            operand[param] = _view(stmts, value, shape, axis=1)  # per row, the same in every column
        elif not iterated and not is_row and value.aval.shape == ():
            operand[param] = _view(stmts, value, shape, axis=0)  # a captured scalar
        else:
            return None
    final = dict(zip(inner.prim.body.outputs, stmt.outs, strict=True))
    for s in inner.prim.body.stmts:
        outs = tuple(final.get(o) or Var(o.aval.update(shape=shape), o.hint) for o in s.outs)
        operand.update(zip(s.outs, outs, strict=True))
        if any(isinstance(a, Var) for a in s.args):
            stmts.append(Let(outs, s.prim, tuple(a if isinstance(a, Lit) else operand[a] for a in s.args)))
            continue
        scalars = tuple(Var(o.aval, o.hint) for o in s.outs)  # literals alone (tanh 0.5): one value, broadcast
        stmts.append(Let(scalars, s.prim, s.args))
        stmts.extend(Let((o,), BroadcastTo(shape), (v,)) for o, v in zip(outs, scalars, strict=True))
    for param in (o for o in inner.prim.body.outputs if o in inner.prim.body.inputs):  # an operand returned as it is
        value = operand[param]
        stmts.append(Let((final[param],), BroadcastTo(shape), (value,)))
    return stmts


def unnest_maps(program: Program) -> Program:
    """The program with each map of a scalar map over a 2-D array written as elementwise statements."""
    stmts: list[Let] = []
    changed = False
    for stmt in program.stmts:
        # maps the codegen can write as one scalar function (inner rows it unrolls) stay one kernel
        nested = isinstance(stmt.prim, Map) and stmt.prim.body.stmts and compile_problem(stmt.prim.body) is not None
        written = _unnest(stmt) if nested else None
        if written is None:
            stmts.append(stmt)
        else:
            stmts.extend(written)
            changed = True
    if not changed:
        return program
    return Program(program.inputs, tuple(stmts), program.outputs, program.in_tree, program.out_tree, dict(program.meta))
