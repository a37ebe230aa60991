"""The vjp of reduce: an ordered list of rules, special cases first, the generic rule last.

`reduce_rule="auto"` takes the first rule that applies; "generic" and "monoid" force one (an error naming
the operator if the monoid rule does not qualify). `fold.compare_rules` runs every rule that applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from fold import ops
from fold.combinators import map as fold_map
from fold.errors import FoldError
from fold.inline import inline_program
from fold.primitives import Reduce, Scan
from fold.recognize import recognize_binary_op
from fold.tracing import bind

from .fn_vjp import active_captures, vjp_of_application, vjp_of_function
from .monoid_d import call_d, check_d_result, row_aval
from .vjp import arg_activity, current_reduce_rule, vjp_rules, within_a_map
from .zeros import Zero, aval_of


@dataclass(frozen=True)
class ReduceRule:
    name: str
    applies: Callable[[Reduce], bool]
    vjp: Callable  # (prim, consts, identity, xs, ys, cts) -> cotangents of xs


def _recognised(*ops_names: str) -> Callable[[Reduce], bool]:
    return lambda prim: recognize_binary_op(prim.body, prim.num_consts) in ops_names


def _n(xs) -> int:
    return aval_of(xs[0]).shape[0]


# y = sum_i a_i:  abar_i = ybar
def _sum_vjp(prim, consts, identity, xs, ys, cts):
    (ct,) = cts
    return [ops.broadcast_to(ops.reshape(ct, (1,) + aval_of(ct).shape), aval_of(xs[0]).shape)]


# y = prod_i a_i:  abar_i = ybar * prod_{j != i} a_j, without dividing by zero:
#   no zero: y / a_i;  one zero at k: the product of the others at k, 0 elsewhere;  two or more: 0
def _prod_vjp(prim, consts, identity, xs, ys, cts):
    (x,), (ct,) = xs, cts
    is_zero = x == 0
    nonzero_prod = bind(prim, *consts, *identity, ops.where(is_zero, 1.0, x).astype(x.dtype))[0]
    zero_count = ops.sum(is_zero.astype("int64"), axis=0)
    no_zeros = nonzero_prod / ops.where(is_zero, 1.0, x).astype(x.dtype)
    one_zero = ops.where(is_zero, nonzero_prod, 0.0).astype(x.dtype)
    others = ops.where(zero_count == 0, no_zeros, ops.where(zero_count == 1, one_zero, 0.0).astype(x.dtype))
    return [others * ct]


# y = max_i a_i (min alike):  abar_i = ybar at the lowest index i with a_i == y, 0 elsewhere. The first index
#   is one fold (given y). In a map's body, a row's cotangent is one value scattered into zeros there, which
#   a backend reads as (index, value) instead of a row of mostly zeros. A whole program's array (and one
#   reduced along its first axis, an extremum per column) gets a mask: elementwise, it joins the gradient's
#   other elementwise work over the array (a logsumexp's softmax), where a scatter would be one pass more
def _extremum_vjp(prim, consts, identity, xs, ys, cts):
    (x,), (y,), (ct,) = xs, ys, cts
    n = aval_of(x).shape[0]
    positions = ops.broadcast_to(ops.reshape(ops.iota(n), (n,) + (1,) * (x.ndim - 1)), aval_of(x).shape)
    candidates = ops.where(x == y, positions, n)
    from fold import monoids
    from fold.combinators import reduce as fold_reduce, reduce_by_index

    first = fold_reduce(monoids.min, candidates)
    if x.ndim == 1 and within_a_map():
        return [reduce_by_index(monoids.sum, n, ops.reshape(first, (1,)), ops.reshape(ct, (1,)).astype(x.dtype))]
    return [ops.where(positions == first, ct, 0.0).astype(x.dtype)]


def monoid_qualifies(prim) -> bool:
    """A commutative monoid with d, whose operator captures no traced value: d is called in the gradient's
    own trace, where a value its closure holds from the function's trace would have escaped."""
    m = prim.monoid
    return m is not None and m.d is not None and m.commutative and prim.num_consts == 0


def element_tree(prim):
    """The structure of one element (and of the state) of a reduce's operator, as the user wrote it."""
    return prim.body.in_tree.children[0] if prim.body.in_tree.kind == "tuple" else prim.body.out_tree


# Theorem 2.1: abar_i = D(y, a_i, ybar) for a commutative monoid with d: one map, no scans
def _monoid_vjp(prim, consts, identity, xs, ys, cts):
    elem = element_tree(prim)
    c, g = elem.unflatten(list(ys)), elem.unflatten(list(cts))
    result = fold_map(lambda a: call_d(prim.monoid, c, a, g), elem.unflatten(list(xs)))
    from fold.pytree import tree_flatten

    leaves, got = tree_flatten(result)
    check_d_result(prim.monoid.name, got, [row_aval(v) for v in leaves], elem, [row_aval(x) for x in xs])
    return leaves


# generic, any associative operator:  y = l_i . a_i . r_i  with
#   l = exclusive scan(.)  and  r = reverse exclusive scan(.),  abar_i = vjp of (a -> l_i . a . r_i) at a_i on ybar
def _generic_vjp(prim, consts, identity, xs, ys, cts):
    nc, k = prim.num_consts, prim.num_leaves
    ls = bind(Scan(prim.body, nc, prim.monoid, True, False), *consts, *identity, *xs)
    rs = bind(Scan(prim.body, nc, prim.monoid, True, True), *consts, *identity, *xs)

    def op(a, b):
        return inline_program(prim.body, list(consts) + list(a) + list(b))

    def per_element(l_a_r):
        l_, a_, r_ = l_a_r[:k], l_a_r[k: 2 * k], l_a_r[2 * k:]
        return vjp_of_function(lambda *a: op(op(l_, list(a)), r_), a_, cts)

    abar = fold_map(lambda *leaves: [_dense(c, aval_of(a)) for c, a in zip(per_element(list(leaves)), leaves[k: 2 * k], strict=True)],
                    *ls, *xs, *rs)
    return list(abar)


# the same with the captured values' cotangents: the left fold applies the operator once per element,
#   y = (...((e . a_0) . a_1) ...) . a_{n-1}, so tbar = sum_i vjp of (t' -> (l_i .' a_i) . r_i) at t on ybar,
#   where .' is the operator with t' in place of t (its other applications keep t)
def _generic_vjp_through_consts(prim, consts, wanted, identity, xs, cts):
    nc, k = prim.num_consts, prim.num_leaves
    ls = bind(Scan(prim.body, nc, prim.monoid, True, False), *consts, *identity, *xs)
    rs = bind(Scan(prim.body, nc, prim.monoid, True, True), *consts, *identity, *xs)

    def per_element(*leaves):
        l_, a_, r_ = list(leaves[:k]), list(leaves[k: 2 * k]), list(leaves[2 * k:])
        a_cts, t_cts = vjp_of_application(prim.body, consts, wanted, l_, a_, cts, identity,
                                          then=lambda y: inline_program(prim.body, list(consts) + list(y) + r_))
        return a_cts + t_cts

    out = fold_map(per_element, *ls, *xs, *rs)
    consts_cts = [Zero(aval_of(c)) for c in consts]
    for i, summed in zip(wanted, out[k:], strict=True):
        consts_cts[i] = ops.sum(summed, axis=0)
    return consts_cts, list(out[:k])


def _dense(ct, aval):
    return ops.broadcast_to(np.zeros((), aval.dtype), aval.shape) if isinstance(ct, Zero) else ct


REDUCE_VJP_RULES: list[ReduceRule] = [
    ReduceRule("add", _recognised("add"), _sum_vjp),
    ReduceRule("mul", _recognised("mul"), _prod_vjp),
    ReduceRule("min/max", _recognised("maximum", "minimum"), _extremum_vjp),
    ReduceRule("monoid", monoid_qualifies, _monoid_vjp),
    ReduceRule("generic", lambda prim: True, _generic_vjp),
]
_BY_NAME = {rule.name: rule for rule in REDUCE_VJP_RULES}


def applicable_rules(prim: Reduce) -> list[str]:
    return [rule.name for rule in REDUCE_VJP_RULES if rule.applies(prim)]


def choose_rule(prim, setting: str) -> ReduceRule:
    if setting == "auto":
        return next(rule for rule in REDUCE_VJP_RULES if rule.applies(prim))
    if setting == "monoid" and not monoid_qualifies(prim):
        what = prim.monoid.name if prim.monoid is not None else _operator_name(prim)
        why = ("it is a plain operator, not a fold.Monoid" if prim.monoid is None
               else "it has no d" if prim.monoid.d is None else "it is not commutative" if not prim.monoid.commutative
               else "its operator captures traced values, which its d cannot be given")
        raise FoldError(f"reduce_rule='monoid' cannot differentiate the {prim.name} with operator {what}: {why}")
    return _BY_NAME[setting]


def refuse_monoid_rule_for_captures(prim, captured: list) -> None:
    raise FoldError(f"reduce_rule='monoid' cannot differentiate the {prim.name} with respect to values its "
                    f"operator captures ({', '.join(str(aval_of(c)) for c in captured)}): D(c, a) knows only the "
                    f"elements; use reduce_rule='generic' or 'auto'")


def _operator_name(prim) -> str:
    """The operator's name from its trace label ("fold.reduce operator <lambda>" -> "<lambda>")."""
    return prim.body.meta.get("label", "operator").rpartition(" operator ")[2]


@vjp_rules.register(Reduce)
def _reduce_vjp(prim: Reduce, args, outs, residual, cts):
    nc, k = prim.num_consts, prim.num_leaves
    consts, identity, xs = args[:nc], args[nc: nc + k], args[nc + k:]
    dense_cts = [_dense(c, aval_of(o)) for c, o in zip(cts, outs, strict=True)]
    wanted = active_captures(consts, arg_activity(len(args)))
    if wanted:  # only the generic rule differentiates through the operator's captured values
        if current_reduce_rule() == "monoid":
            refuse_monoid_rule_for_captures(prim, [consts[i] for i in wanted])
        consts_cts, xs_cts = _generic_vjp_through_consts(prim, consts, wanted, identity, xs, dense_cts)
        return consts_cts + [Zero(aval_of(a)) for a in identity] + xs_cts
    rule = choose_rule(prim, current_reduce_rule())
    xs_cts = rule.vjp(prim, consts, identity, xs, outs, dense_cts)
    return [Zero(aval_of(a)) for a in consts + identity] + list(xs_cts)
