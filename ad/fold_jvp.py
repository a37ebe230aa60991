"""jvp of reduce, scan and reduce_by_index: the same combinator over (value, tangent) pairs.

The operator is lifted to pairs by its own jvp: (a, ta) . (b, tb) = (a . b, jvp of . at (a, b) on (ta, tb)),
which is associative whenever . is. The identity is (e, 0). Recognised + needs no lifting: the tangent of a
sum is the sum of the tangents.

A reduce whose monoid qualifies for Theorem 2.1 (commutative, with d) has a cheaper tangent: d is the
row of the Jacobian in vector-Jacobian form, abar_i = D(y, a_i, ybar), so the tangent of state leaf j is
ydot_j = sum_i <D(y, a_i, e_j), adot_i>: the primal reduce, then a sum of independent terms (for logaddexp
sum_i exp(a_i - y) adot_i) instead of a fold whose lifted operator carries every exponential through its
state. It is taken for scalar float elements where vjp's "auto" would take the monoid rule, unless
reduce_rule="generic" is in force: so not for +, *, min and max, whose own rules come first (their d
counts tied extrema, or divides by a zero element; their lifted operators are cheap).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fold import monoids
from fold.combinators import map as fold_map
from fold.combinators import reduce as fold_reduce
from fold.primitives import Reduce, ReduceByIndex, Scan
from fold.pytree import tree_flatten
from fold.recognize import recognize_binary_op
from fold.tracing import bind, trace_body

from .jvp import jvp_inline, jvp_rules
from .monoid_d import call_d, check_d_result, row_aval
from .reduce_rules import choose_rule, element_tree
from .vjp import current_reduce_rule
from .zeros import Zero, aval_of, differentiable, instantiate, is_zero


def lifted_operator(prim, const_tangent_mask: list[bool]):
    """The operator body on (value, tangent) pairs; tangents only for float leaves.

    Inputs: consts, tangents of the masked consts, a leaves, a tangents, b leaves, b tangents.
    """
    body, nc, k = prim.body, prim.num_consts, prim.num_leaves
    const_avals = list(body.in_avals[:nc])
    elem_avals = list(body.in_avals[nc: nc + k])
    float_leaves = [differentiable(a) for a in elem_avals]
    tangent_avals = [a for a, f in zip(elem_avals, float_leaves, strict=True) if f]
    n_ct = sum(const_tangent_mask)

    def expand(tangents):
        tangents = list(tangents)
        return [tangents.pop(0) if f else Zero(a) for f, a in zip(float_leaves, elem_avals, strict=True)]

    def fn(*flat):
        flat = list(flat)
        consts, flat = flat[:nc], flat[nc:]
        const_t, flat = flat[:n_ct], flat[n_ct:]
        a, flat = flat[:k], flat[k:]
        ta, flat = flat[: len(tangent_avals)], flat[len(tangent_avals):]
        b, flat = flat[:k], flat[k:]
        tb = flat
        ct_iter = iter(const_t)
        const_tangents = [next(ct_iter) if m else Zero(av) for m, av in zip(const_tangent_mask, const_avals, strict=True)]
        outs, touts = jvp_inline(body, consts + a + b, const_tangents + expand(ta) + expand(tb))
        return list(outs) + [instantiate(t, av) for t, av, f in zip(touts, elem_avals, float_leaves, strict=True) if f]

    avals = (const_avals + [a for m, a in zip(const_tangent_mask, const_avals, strict=True) if m]
             + elem_avals + tangent_avals + elem_avals + tangent_avals)
    traced = trace_body(fn, avals, f"lifted {prim.name} operator")
    assert not traced.consts
    return traced.program, float_leaves


def _fold_jvp(prim, primals, tangents, operand_start: int, passthrough: int = 0):
    """Shared by reduce, scan and reduce_by_index. Layout: consts, identity, [indices,] xs."""
    nc, k = prim.num_consts, prim.num_leaves
    consts, identity = primals[:nc], primals[nc: nc + k]
    extra = primals[nc + k: nc + k + passthrough]
    xs, txs = primals[operand_start:], tangents[operand_start:]
    outs_primal = bind(prim, *primals)
    if all(is_zero(t) for t in tangents[:nc]) and recognize_binary_op(prim.body, nc) == "add":
        (tx,) = txs
        if is_zero(tx):
            return outs_primal, [Zero(o.aval) for o in outs_primal]
        zero_identity = np.zeros_like(np.asarray(identity[0])) if not hasattr(identity[0], "aval") else identity[0] * 0
        return outs_primal, bind(prim, *consts, zero_identity, *extra, tx)
    const_mask = [not is_zero(t) for t in tangents[:nc]]
    body, float_leaves = lifted_operator(prim, const_mask)
    lifted = dataclasses.replace(prim, body=body, num_consts=nc + sum(const_mask), monoid=None)
    tangent_identity = [np.zeros(aval_of(e).shape, aval_of(e).dtype) for e, f in zip(identity, float_leaves, strict=True) if f]
    tangent_xs = [instantiate(t, aval_of(x)) for x, t, f in zip(xs, txs, float_leaves, strict=True) if f]
    const_tangents = [t for t in tangents[:nc] if not is_zero(t)]
    outs = bind(lifted, *consts, *const_tangents, *identity, *tangent_identity, *extra, *xs, *tangent_xs)
    out_tangents = iter(outs[k:])
    return outs[:k], [next(out_tangents) if f else Zero(o.aval) for f, o in zip(float_leaves, outs[:k], strict=True)]


def _monoid_tangent_applies(prim, xs) -> bool:
    return (isinstance(prim, Reduce) and current_reduce_rule() != "generic"
            and all(aval_of(x).ndim == 1 and aval_of(x).dtype.kind == "f" for x in xs)
            and choose_rule(prim, "auto").name == "monoid")


def _monoid_jvp(prim, primals, tangents):
    """ydot_j = sum_i <D(y, a_i, e_j), adot_i> for each state leaf j (e_j: one at leaf j, zero elsewhere)."""
    k = prim.num_leaves
    xs, txs = primals[k:], tangents[k:]
    ys = bind(prim, *primals)
    if all(is_zero(t) for t in txs):
        return ys, [Zero(aval_of(y)) for y in ys]
    elem = element_tree(prim)
    c = elem.unflatten(list(ys))
    dtypes = [aval_of(y).dtype for y in ys]
    dense = [instantiate(t, aval_of(x)) for t, x in zip(txs, xs, strict=True)]

    def per_element(*leaves):
        a, da = list(leaves[:k]), leaves[k:]
        terms = []
        for j in range(k):
            basis = elem.unflatten([np.asarray(1 if i == j else 0, d) for i, d in enumerate(dtypes)])
            got, got_tree = tree_flatten(call_d(prim.monoid, c, elem.unflatten(a), basis))
            check_d_result(prim.monoid.name, got_tree, [aval_of(g) for g in got], elem, [row_aval(x) for x in xs])
            products = [g * t for g, t in zip(got, da, strict=True)]
            terms.append(sum(products[1:], products[0]).astype(dtypes[j]))
        return tuple(terms)

    terms = fold_map(per_element, *xs, *dense)
    return ys, [fold_reduce(monoids.sum, t) for t in terms]


@jvp_rules.register(Reduce, Scan)
def _reduce_scan_jvp(prim, primals, tangents):
    start = prim.num_consts + prim.num_leaves
    if _monoid_tangent_applies(prim, primals[start:]):
        return _monoid_jvp(prim, primals, tangents)
    return _fold_jvp(prim, primals, tangents, start)


@jvp_rules.register(ReduceByIndex)
def _rbi_jvp(prim, primals, tangents):
    return _fold_jvp(prim, primals, tangents, prim.num_consts + prim.num_leaves + 1, passthrough=1)
