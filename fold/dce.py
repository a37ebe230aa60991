"""Dead-code elimination: drop statements whose results nothing uses (bodies are cleaned recursively), the
results of a map that nothing reads (a jvp's primal beside the tangent wanted): its body stops computing
them, the values a map or loop captures that its body no longer reads, the saved states of a gradient's
forward loop that no reverse step reads (it becomes a plain loop), and the leaves of a reduce or scan that
neither the program nor the leaves it keeps read (a jvp's tangent of a min whose argmin alone is wanted)."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from .ir import Let, Program, Var
from .primitives import Loop, LoopSaving, Map, Reduce, Scan
from .pytree import tree_flatten


def dce(program: Program) -> Program:
    """`program` without the statements that do not contribute to its outputs. Inputs are kept as they are."""
    needed = {a for a in program.outputs if isinstance(a, Var)}
    kept: list[Let] = []
    for stmt in reversed(program.stmts):
        if not any(v in needed for v in stmt.outs):
            continue
        stmt = _needed_loop_states(_unsaved_states(_needed_map_results(stmt, needed), needed), needed)
        stmt = _needed_fold_leaves(stmt, needed)
        prim = stmt.prim
        if prim.body_fields:
            prim = dataclasses.replace(prim, **{f: dce(getattr(prim, f)) for f in prim.body_fields})
            stmt = _read_captures(Let(stmt.outs, prim, stmt.args))
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


def _read(program: Program) -> set[Var]:
    """The variables `program`'s statements and outputs read."""
    return {a for s in program.stmts for a in s.args if isinstance(a, Var)} | {
        o for o in program.outputs if isinstance(o, Var)}


def _unsaved_states(stmt: Let, needed: set) -> Let:
    """A LoopSaving none of whose stacks is read, as the Loop it stands for."""
    prim = stmt.prim
    if not isinstance(prim, LoopSaving):
        return stmt
    k = len(prim.body.outputs)
    if any(v in needed for v in stmt.outs[k:]):
        return stmt
    return Let(stmt.outs[:k], Loop(prim.body, prim.num_consts, prim.n), stmt.args)


def _needed_loop_states(stmt: Let, needed: set) -> Let:
    """A loop statement carrying only the state leaves that its needed results depend on (a gradient's
    reverse loop carries the cotangents of every input; most are not wanted)."""
    prim = stmt.prim
    if not isinstance(prim, Loop):
        return stmt
    body, nc = prim.body, prim.num_consts
    states = body.inputs[nc + 1:]
    keep = _leaves_read(body, {k for k, v in enumerate(stmt.outs) if v in needed}, [(v,) for v in states])
    if len(keep) == len(states):
        return stmt
    order = sorted(keep)
    inputs = tuple(body.inputs[: nc + 1]) + tuple(states[k] for k in order)
    _, in_tree = tree_flatten(tuple(range(len(inputs))))
    _, out_tree = tree_flatten(tuple(range(len(order))))
    body = Program(inputs, body.stmts, tuple(body.outputs[k] for k in order), in_tree, out_tree, dict(body.meta))
    args = tuple(stmt.args[: nc]) + tuple(stmt.args[nc + k] for k in order)
    return Let(tuple(stmt.outs[k] for k in order), dataclasses.replace(prim, body=body), args)


def _leaves_read(body: Program, keep: set[int], inputs_of: list[tuple[Var, ...]]) -> set[int]:
    """The leaves (positions of the body's outputs) that the `keep` outputs need: those, and each leaf whose
    inputs (`inputs_of[j]`: a loop state's, or a fold operator's two operands) they read, until none is added."""
    while True:
        read = _read(dce(Program(body.inputs, body.stmts, tuple(body.outputs[j] for j in sorted(keep)))))
        more = {j for j, inputs in enumerate(inputs_of) if any(v in read for v in inputs)} - keep
        if not more:
            return keep
        keep = keep | more


def _needed_fold_leaves(stmt: Let, needed: set) -> Let:
    """A reduce or scan folding only the leaves its needed results depend on, through the operator. The
    operator restricted to leaves that read no other leaf is still associative, with the identity's
    restriction as its identity; the monoid it came from no longer describes it, so it is dropped."""
    prim = stmt.prim
    if not isinstance(prim, (Reduce, Scan)):
        return stmt
    body, nc, k = prim.body, prim.num_consts, prim.num_leaves
    lefts, rights = body.inputs[nc: nc + k], body.inputs[nc + k:]
    keep = _leaves_read(body, {j for j, v in enumerate(stmt.outs) if v in needed}, list(zip(lefts, rights)))
    if len(keep) == k:
        return stmt
    order = sorted(keep)
    inputs = tuple(body.inputs[:nc]) + tuple(lefts[j] for j in order) + tuple(rights[j] for j in order)
    element = tuple(range(len(order)))
    _, in_tree = tree_flatten((element, element))
    _, out_tree = tree_flatten(element)
    body = Program(inputs, body.stmts, tuple(body.outputs[j] for j in order), in_tree, out_tree, dict(body.meta))
    args = tuple(stmt.args[:nc]) + tuple(stmt.args[nc + j] for j in order) + tuple(stmt.args[nc + k + j] for j in order)
    return Let(tuple(stmt.outs[j] for j in order), dataclasses.replace(prim, body=body, monoid=None), args)


# combinators whose captured values (the first num_consts arguments) only their body reads
_CAPTURES_READ_BY_BODY = (Map, Loop, LoopSaving)


def _read_captures(stmt: Let) -> Let:
    """The map or loop `stmt` without the captured values its (cleaned) body does not read."""
    prim = stmt.prim
    if not isinstance(prim, _CAPTURES_READ_BY_BODY):
        return stmt
    body, nc = prim.body, prim.num_consts
    read = _read(body)
    keep = [k for k in range(nc) if body.inputs[k] in read]
    if len(keep) == nc:
        return stmt
    inputs = tuple(body.inputs[k] for k in keep) + tuple(body.inputs[nc:])
    _, in_tree = tree_flatten(tuple(range(len(inputs))))
    body = Program(inputs, body.stmts, body.outputs, in_tree, body.out_tree, dict(body.meta))
    args = tuple(stmt.args[k] for k in keep) + tuple(stmt.args[nc:])
    return Let(stmt.outs, dataclasses.replace(prim, body=body, num_consts=len(keep)), args)


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
