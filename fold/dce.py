"""Dead-code elimination: drop statements whose results nothing uses (bodies are cleaned recursively), and
the results of a map that nothing reads (a jvp's primal beside the tangent wanted): its body stops
computing them."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from .ir import Let, Program, Var
from .primitives import Map
from .pytree import tree_flatten


def dce(program: Program) -> Program:
    """`program` without the statements that do not contribute to its outputs. Inputs are kept as they are."""
    needed = {a for a in program.outputs if isinstance(a, Var)}
    kept: list[Let] = []
    for stmt in reversed(program.stmts):
        if not any(v in needed for v in stmt.outs):
            continue
        stmt = _needed_map_results(stmt, needed)
        prim = stmt.prim
        if prim.body_fields:
            prim = dataclasses.replace(prim, **{f: dce(getattr(prim, f)) for f in prim.body_fields})
            stmt = Let(stmt.outs, prim, stmt.args)
        kept.append(stmt)
        needed.update(a for a in stmt.args if isinstance(a, Var))
    return Program(program.inputs, tuple(reversed(kept)), program.outputs, program.in_tree, program.out_tree, dict(program.meta))


def _needed_map_results(stmt: Let, needed: set) -> Let:
    """A map statement with only the results in `needed` (at least one is)."""
    if not isinstance(stmt.prim, Map) or all(v in needed for v in stmt.outs):
        return stmt
    keep = [k for k, v in enumerate(stmt.outs) if v in needed]
    body = stmt.prim.body
    _, out_tree = tree_flatten(tuple(range(len(keep))))
    body = Program(body.inputs, body.stmts, tuple(body.outputs[k] for k in keep), body.in_tree, out_tree,
                   dict(body.meta))
    return Let(tuple(stmt.outs[k] for k in keep), dataclasses.replace(stmt.prim, body=body), stmt.args)


def with_producers(stmts: Sequence[Let], roots: Iterable[Let]) -> set[int]:
    """The ids of `roots` and of every statement among `stmts` whose results they read, directly or not."""
    produced = {v: s for s in stmts for v in s.outs}
    found: set[int] = set()
    todo = list(roots)
    while todo:
        stmt = todo.pop()
        if id(stmt) not in found:
            found.add(id(stmt))
            todo += [produced[a] for a in stmt.args if isinstance(a, Var) and a in produced]
    return found
