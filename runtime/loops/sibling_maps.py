"""Sibling nests joined: two loop nests over the same rows, the later reading nothing the earlier one (or
anything after it) makes, run as one nest whose map computes both bodies, each value once.

A gradient with respect to several arguments sums one map over the points per argument (a mixture's
means, its variances, their tangents in a Hessian-vector product), and each map computes the same
per-point forward values again: each is its own pass over the points, with its own copy of that work.
XLA calls this sibling (multi-output) fusion; Futhark fuses SOACs horizontally. The joined body is cleaned
by common-subexpression elimination, so what both bodies compute from the same inputs is computed once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from fold.cse import cse_body
from fold.ir import Let, Program, Var
from fold.primitives import SumAxes
from fold.pytree import tree_flatten


@dataclass
class Group:
    """A nest as the fusion pass built it: its map and the statements folding its rows, the map's results
    it keeps, the iotas it makes itself, and where it stands among the program's statements."""

    statements: list[Let]
    kept: list[Var]
    iotas: list[Let]
    at: int
    nest: Let

    @property
    def joinable(self) -> bool:
        """Whether the nest builder folds this nest's map beside another's: it writes any number of sums over
        the map's axis (or none), where a reduce or a histogram is the one fold of its nest."""
        return all(isinstance(s.prim, SumAxes) for s in self.statements[1:])

    @property
    def rows(self) -> int:
        return self.statements[0].outs[0].aval.shape[0]

    def kept_results(self) -> list[Var]:
        """What the nest gives besides its folds: a map folded by nothing gives all its results."""
        return list(self.kept) if len(self.statements) > 1 else list(self.statements[0].outs)


def join_siblings(stmts: list[Let], groups: list[Group], build: Callable[..., Let | None]) -> list[Let]:
    """`stmts` with each nest of `groups` joined into the earliest earlier nest over the same rows whose
    position already has everything it reads (`build(statements, kept, iotas)` makes the joined nest, or None
    where it cannot be built)."""
    if len(groups) < 2:
        return stmts
    made_at = {v: k for k, s in enumerate(stmts) for v in s.outs}
    result: list[Let | None] = list(stmts)
    alive: list[Group] = []
    for later in sorted((g for g in groups if g.joinable), key=lambda g: g.at):
        for earlier in alive:
            if earlier.rows != later.rows or any(made_at.get(a, -1) >= earlier.at
                                                for a in later.nest.args if isinstance(a, Var)):
                continue
            joined = _joined(earlier, later, build)
            if joined is not None:
                result[earlier.at], result[later.at] = joined.nest, None
                alive[alive.index(earlier)] = joined
                break
        else:
            alive.append(later)
    return [s for s in result if s is not None] if any(s is None for s in result) else stmts


def _joined(a: Group, b: Group, build: Callable[..., Let | None]) -> Group | None:
    joined_map = joined_maps(a.statements[0], b.statements[0])
    statements = [joined_map] + a.statements[1:] + b.statements[1:]
    kept = a.kept_results() + b.kept_results() if len(statements) > 1 else []
    iotas = list({id(s): s for s in a.iotas + b.iotas}.values())
    nest = build(statements, kept, iotas)
    return None if nest is None else Group(statements, kept, iotas, a.at, nest)


def joined_maps(a: Let, b: Let) -> Let:
    """One map over the rows of the maps `a` and `b` giving both their results (a's, then b's): a value both
    read is read once, and what both bodies compute from it is computed once."""
    pa, pb = a.prim, b.prim
    body_a, body_b = pa.body, _fresh(pb.body)
    rename: dict[Var, Var] = {}
    consts, xs = list(a.args[: pa.num_consts]), list(a.args[pa.num_consts:])
    const_inputs, x_inputs = list(body_a.inputs[: pa.num_consts]), list(body_a.inputs[pa.num_consts:])
    for outer, inner, (args, inputs) in zip(b.args, body_b.inputs,
                                            [(consts, const_inputs)] * pb.num_consts + [(xs, x_inputs)] * (len(b.args) - pb.num_consts),
                                            strict=True):
        same = next((k for k, o in enumerate(args) if isinstance(outer, Var) and o is outer), None)
        if same is None:
            args.append(outer)
            inputs.append(inner)
        else:
            rename[inner] = inputs[same]

    def sub(atom):
        return rename.get(atom, atom) if isinstance(atom, Var) else atom

    stmts = tuple(body_a.stmts) + tuple(Let(s.outs, s.prim, tuple(sub(x) for x in s.args)) for s in body_b.stmts)
    outputs = tuple(body_a.outputs) + tuple(sub(o) for o in body_b.outputs)
    inputs = tuple(const_inputs + x_inputs)
    _, in_tree = tree_flatten(tuple(range(len(inputs))))
    _, out_tree = tree_flatten(tuple(range(len(outputs))))
    body = cse_body(Program(inputs, stmts, outputs, in_tree, out_tree, {}))
    return Let(tuple(a.outs) + tuple(b.outs), dataclasses.replace(pa, body=body, num_consts=len(consts)),
               tuple(consts + xs))


def _fresh(body: Program) -> Program:
    """`body` with new variables for its inputs and statements' results (two maps may share one body)."""
    new: dict[Var, Var] = {v: Var(v.aval) for v in body.inputs}
    stmts = []
    for s in body.stmts:
        args = tuple(new.get(x, x) if isinstance(x, Var) else x for x in s.args)
        outs = tuple(Var(v.aval) for v in s.outs)
        new.update(zip(s.outs, outs, strict=True))
        stmts.append(Let(outs, s.prim, args))
    outputs = tuple(new.get(o, o) if isinstance(o, Var) else o for o in body.outputs)
    return Program(tuple(new[v] for v in body.inputs), tuple(stmts), outputs, body.in_tree, body.out_tree, dict(body.meta))
