"""jvp and vjp of map.

The jvp of a map is a map of the body's jvp. The vjp of a map is a map of the body's vjp — which first
re-executes the body's primal for its row, so no per-row intermediate is kept between the sweeps — and the
cotangents of captured values (a weight vector used by every row) are summed over the mapped axis.
"""

from __future__ import annotations

from collections import Counter

from fold import ops
from fold.dce import dce
from fold.ir import Program, Var, reorder_inputs
from fold.primitives import Map, MatMul
from fold.pytree import LEAF, TreeDef
from fold.tracing import bind

from .jvp import jvp_program, jvp_rules
from .vjp import arg_activity, rows_of_a_map, vjp_program, vjp_rules
from .zeros import Zero, aval_of, is_zero


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
    with rows_of_a_map():
        body, in_mask = vjp_program(prim.body, ct_mask, wrt=arg_activity(len(args)))
    owners = [i for i, m in enumerate(in_mask) if m]  # the body's output j is the cotangent of args[owners[j]]
    body, products = _defer_row_products(body, [j for j, i in enumerate(owners) if i < nc])
    results = bind(Map(body, nc), *args, *[c for c in cts if not is_zero(c)])
    summed = {j: _sum_of_products(results[j], results[extra]) for j, extra in products.items()}
    results = [summed.get(j, r) for j, r in enumerate(results[: len(owners)])]
    arg_cts = split_by_mask(results, in_mask, [aval_of(a) for a in args])
    # a captured value's cotangent is the sum of its per-row contributions (already summed for products)
    done = {owners[j] for j in summed}
    return [ops.sum(ct, axis=0) if i < nc and i not in done and not is_zero(ct) else ct for i, ct in enumerate(arg_cts)]


def _defer_row_products(body: Program, const_outputs: list[int]) -> tuple[Program, dict[int, int]]:
    """Where a captured value's per-row cotangent is a matrix product A_r @ B_r (a weight matrix used by a
    matmul), output A_r in its place and B_r at the end, so that the sum over rows is one matmul after the
    map instead of n products materialised and then summed. Returns the body and {output: B's output}."""
    uses = Counter(a for s in body.stmts for a in s.args if isinstance(a, Var))
    uses.update(a for a in body.outputs if isinstance(a, Var))
    defs = {v: s for s in body.stmts for v in s.outs}
    outputs, products = list(body.outputs), {}
    for j in const_outputs:
        stmt = defs.get(outputs[j]) if isinstance(outputs[j], Var) else None
        if (stmt is not None and isinstance(stmt.prim, MatMul) and uses[outputs[j]] == 1
                and all(isinstance(a, Var) for a in stmt.args)):
            outputs[j] = stmt.args[0]
            products[j] = len(outputs)
            outputs.append(stmt.args[1])
    if not products:
        return body, {}
    flat_out = TreeDef("list", None, (LEAF,) * len(outputs))
    return dce(Program(body.inputs, body.stmts, tuple(outputs), body.in_tree, flat_out, dict(body.meta))), products


def _sum_of_products(a, b):
    """sum_r a[r] @ b[r] for a: (n, p, k), b: (n, k, q), as one (p, n*k) @ (n*k, q) product."""
    n, p, k = aval_of(a).shape
    q = aval_of(b).shape[2]
    return ops.matmul(ops.reshape(ops.transpose(a, (1, 0, 2)), (p, n * k)), ops.reshape(b, (n * k, q)))
