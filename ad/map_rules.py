"""jvp and vjp of map.

The jvp of a map is a map of the body's jvp. The vjp of a map is a map of the body's vjp — which first
re-executes the body's primal for its row, so no per-row intermediate is kept between the sweeps — and the
cotangents of captured values (a weight vector used by every row) are summed over the mapped axis.
"""

from __future__ import annotations

from fold import ops
from fold.ir import Program
from fold.primitives import Map
from fold.tracing import bind

from .jvp import jvp_program, jvp_rules
from .vjp import vjp_program, vjp_rules
from .zeros import Zero, aval_of, is_zero


def reorder_inputs(program: Program, order: list[int]) -> Program:
    return Program(tuple(program.inputs[i] for i in order), program.stmts, program.outputs,
                   program.in_tree, program.out_tree, dict(program.meta))


def split_by_mask(values: list, mask: list[bool], avals: list) -> list:
    """Put the non-zero `values` back where `mask` is True, Zero elsewhere."""
    values = list(values)
    return [values.pop(0) if m else Zero(aval) for m, aval in zip(mask, avals, strict=True)]


@jvp_rules.register(Map)
def _map_jvp(prim: Map, primals, tangents):
    nc, n_in = prim.num_consts, len(primals)
    mask = [not is_zero(t) for t in tangents]
    body, out_mask = jvp_program(prim.body, mask)
    # body inputs: primals..., tangents of masked inputs...; the map wants consts (and their tangents) first
    tangent_pos = {i: n_in + k for k, i in enumerate(i for i in range(n_in) if mask[i])}
    const_t = [tangent_pos[i] for i in range(nc) if mask[i]]
    xs_t = [tangent_pos[i] for i in range(nc, n_in) if mask[i]]
    order = list(range(nc)) + const_t + list(range(nc, n_in)) + xs_t
    mapped = Map(reorder_inputs(body, order), nc + len(const_t))
    live_tangents = [t for t in tangents if not is_zero(t)]
    outs = bind(mapped, *primals[:nc], *live_tangents[: len(const_t)], *primals[nc:], *live_tangents[len(const_t):])
    k = len(prim.body.outputs)
    out_avals = [o.aval for o in outs[:k]]
    return outs[:k], split_by_mask(outs[k:], out_mask, out_avals)


@vjp_rules.register(Map)
def _map_vjp(prim: Map, args, outs, residual, cts):
    nc = prim.num_consts
    ct_mask = [not is_zero(c) for c in cts]
    body, in_mask = vjp_program(prim.body, ct_mask)
    results = bind(Map(body, nc), *args, *[c for c in cts if not is_zero(c)])
    arg_cts = split_by_mask(results, in_mask, [aval_of(a) for a in args])
    # a captured value's cotangent is the sum of its per-row contributions
    return [ops.sum(ct, axis=0) if i < nc and not is_zero(ct) else ct for i, ct in enumerate(arg_cts)]
