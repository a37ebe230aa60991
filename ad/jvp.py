"""Forward mode: `jvp_program` transforms a Program into one that also computes output tangents.

Each statement is replaced by its jvp rule, which emits the primal statement and the statements of its
tangent. A rule has the form `rule(prim, primals, tangents) -> (outs, out_tangents)`; tangents may be
`Zero`, and a statement whose tangents are all zero is copied unchanged.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

from fold.dce import dce
from fold.ir import Lit, Program, flat_program
from fold.rules import RuleTable
from fold.tracing import bind, trace_body

from .vjp import current_reduce_rule
from .zeros import Zero, differentiable, is_zero

jvp_rules = RuleTable("jvp")


def jvp_inline(program: Program, primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[list, list]:
    """Emit, in the current trace, `program`'s statements and their tangents; returns (outs, out_tangents)."""
    env: dict = dict(zip(program.inputs, primals, strict=True))
    tenv: dict = {v: (t if differentiable(v.aval) else Zero(v.aval)) for v, t in zip(program.inputs, tangents, strict=True)}

    def read(atom):
        return atom.value if isinstance(atom, Lit) else env[atom]

    def read_tangent(atom):
        return Zero(atom.aval) if isinstance(atom, Lit) else tenv[atom]

    for stmt in program.stmts:
        args = [read(a) for a in stmt.args]
        targs = [read_tangent(a) for a in stmt.args]
        if all(is_zero(t) for t in targs):
            outs, touts = bind(stmt.prim, *args), [Zero(v.aval) for v in stmt.outs]
        else:
            outs, touts = jvp_rules.lookup(stmt.prim)(stmt.prim, args, targs)
        for var, out, tout in zip(stmt.outs, outs, touts, strict=True):
            env[var] = out
            tenv[var] = tout if differentiable(var.aval) and not is_zero(tout) else Zero(var.aval)
    return [read(a) for a in program.outputs], [read_tangent(a) for a in program.outputs]


_cache: "weakref.WeakKeyDictionary[Program, dict]" = weakref.WeakKeyDictionary()


def jvp_program(program: Program, tangent_mask: Sequence[bool] | None = None) -> tuple[Program, list[bool]]:
    """The jvp of a closed `program`.

    Inputs: the primal inputs, then one tangent per input whose `tangent_mask` entry is True (default: every
    float input). Outputs: the primal outputs, then the output tangents that are not symbolically zero;
    the returned mask says which outputs have one.
    """
    if tangent_mask is None:
        tangent_mask = [differentiable(v.aval) for v in program.inputs]
    tangent_mask = tuple(bool(m) and differentiable(v.aval) for m, v in zip(tangent_mask, program.inputs, strict=True))
    key = (tangent_mask, current_reduce_rule())  # reductions' tangents follow the reduce rule in force
    per_program = _cache.setdefault(program, {})
    if key in per_program:
        return per_program[key]
    n = len(program.inputs)
    out_mask: list[bool] = []

    def fn(*flat):
        primals, rest = list(flat[:n]), list(flat[n:])
        tangents = [rest.pop(0) if m else Zero(v.aval) for m, v in zip(tangent_mask, program.inputs, strict=True)]
        outs, touts = jvp_inline(program, primals, tangents)
        out_mask.extend(not is_zero(t) for t in touts)
        return list(outs) + [t for t in touts if not is_zero(t)]

    avals = [v.aval for v in program.inputs] + [v.aval for m, v in zip(tangent_mask, program.inputs, strict=True) if m]
    traced = trace_body(fn, avals, "jvp")
    assert not traced.consts
    result = (dce(flat_program(traced.program)), out_mask)
    per_program[key] = result
    return result



def jvp_of(prim, primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[list, list]:
    """The jvp rule of `prim` applied (for rules that delegate to another primitive's rule)."""
    if all(is_zero(t) for t in tangents):
        outs = bind(prim, *primals)
        return outs, [Zero(getattr(o, "aval", None)) for o in outs]
    return jvp_rules.lookup(prim)(prim, primals, tangents)
