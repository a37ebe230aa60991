"""Dead-code elimination: drop statements whose results nothing uses (bodies are cleaned recursively)."""

from __future__ import annotations

import dataclasses

from .ir import Let, Program, Var


def dce(program: Program) -> Program:
    """`program` without the statements that do not contribute to its outputs. Inputs are kept as they are."""
    needed = {a for a in program.outputs if isinstance(a, Var)}
    kept: list[Let] = []
    for stmt in reversed(program.stmts):
        if not any(v in needed for v in stmt.outs):
            continue
        prim = stmt.prim
        if prim.body_fields:
            prim = dataclasses.replace(prim, **{f: dce(getattr(prim, f)) for f in prim.body_fields})
            stmt = Let(stmt.outs, prim, stmt.args)
        kept.append(stmt)
        needed.update(a for a in stmt.args if isinstance(a, Var))
    return Program(program.inputs, tuple(reversed(kept)), program.outputs, program.in_tree, program.out_tree, dict(program.meta))
