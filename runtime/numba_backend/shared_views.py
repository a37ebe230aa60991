"""One variable per view: repeated broadcasts and reshapes of a value merged, identity ones dropped.

A reshape of a reshape reads the first one's operand (the same view: reshapes keep the C order), so a
round trip such as (16,) -> (16, 1) -> (16,) is dropped too. The one-hot rewrite leaves those between
two elementwise statements, and there they split a run of elementwise fusion.

Rewrites that each write their own operands (unnest.py gives every nested map its own per-row and
per-column broadcasts) leave several variables for one view of one value. Elementwise fusion then passes
each as a separate kernel input, and a kernel of many inputs loses its lane form (codegen's
MAX_LANE_PARAMETERS): gemm_map_reduce's backward, whose fields and cotangents broadcast the same row
and column data, ran its exponentials one lane at a time. Views are free to merge: they copy nothing.
"""

from __future__ import annotations

from fold.ir import Let, Program, Var
from fold.primitives import BroadcastTo, Reshape

VIEWS = (BroadcastTo, Reshape)


def share_views(program: Program) -> Program:
    """The program with each view statement that repeats an earlier one (same primitive, same operand), or
    leaves its operand's shape as it is, replaced by that earlier result or by the operand; a reshape of a
    reshape reads the first one's operand."""
    rename: dict[Var, Var] = {}
    seen: dict[tuple, Var] = {}
    reshaped_from: dict[Var, Var] = {}  # a reshape's result -> what it reshapes
    stmts: list[Let] = []
    changed = False
    for stmt in program.stmts:
        args = tuple(rename.get(a, a) if isinstance(a, Var) else a for a in stmt.args)
        if isinstance(stmt.prim, Reshape) and isinstance(args[0], Var) and args[0] in reshaped_from:
            args = (reshaped_from[args[0]], *args[1:])
            changed = True
        if isinstance(stmt.prim, VIEWS) and isinstance(args[0], Var):
            (out,) = stmt.outs
            source = args[0]
            if isinstance(stmt.prim, Reshape):
                reshaped_from[out] = source
            if source.aval == out.aval:
                rename[out] = source
                continue
            key = (stmt.prim, source)
            if key in seen:
                rename[out] = seen[key]
                continue
            seen[key] = out
        stmts.append(stmt if all(a is b for a, b in zip(args, stmt.args)) else Let(stmt.outs, stmt.prim, args))
    if not rename and not changed:
        return program
    outputs = tuple(rename.get(o, o) if isinstance(o, Var) else o for o in program.outputs)
    return Program(program.inputs, _without_dead_views(stmts, outputs), outputs, program.in_tree, program.out_tree,
                   dict(program.meta))


def _without_dead_views(stmts: list[Let], outputs: tuple) -> tuple[Let, ...]:
    """The statements less the views nothing reads any more: a reshape whose reader now reads its operand
    would otherwise keep that operand stored by an elementwise run that need not store it."""
    needed = {o for o in outputs if isinstance(o, Var)}
    kept: list[Let] = []
    for stmt in reversed(stmts):
        if isinstance(stmt.prim, VIEWS) and stmt.outs[0] not in needed:
            continue
        kept.append(stmt)
        needed.update(a for a in stmt.args if isinstance(a, Var))
    return tuple(reversed(kept))
