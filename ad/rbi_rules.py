"""The vjp of reduce_by_index (a histogram): +, * and min/max specialised, the monoid shortcut, generic otherwise.

Values whose index is outside [0, n) were ignored by the primal and get a zero cotangent.
"""

from __future__ import annotations



from fold import monoids, ops
from fold.combinators import map as fold_map
from fold.combinators import reduce as fold_reduce
from fold.combinators import reduce_by_index as fold_rbi
from fold.inline import inline_program
from fold.primitives import ReduceByIndex
from fold.pytree import tree_flatten
from fold.recognize import recognize_binary_op
from fold.tracing import bind

from .fn_vjp import active_captures, substituted, vjp_of_function
from .monoid_d import call_d, check_d_result, row_aval
from .reduce_rules import choose_rule, monoid_qualifies, refuse_monoid_rule_for_captures
from .vjp import arg_activity, current_reduce_rule, vjp_rules
from .zeros import Zero, aval_of, instantiate


def _valid_and_safe(idx, n: int):
    valid = (idx >= 0) & (idx < n)
    return valid, ops.where(valid, idx, 0)


def _expand(mask, aval):
    """A per-value mask broadcast over the value's element dimensions."""
    return ops.broadcast_to(ops.reshape(mask, (aval.shape[0],) + (1,) * (len(aval.shape) - 1)), aval.shape)


# dest[b] = sum of values with index b:  vbar_i = ybar[idx_i]
def _add_vjp(prim, consts, identity, idx, values, outs, cts):
    valid, safe = _valid_and_safe(idx, prim.n)
    (v,), (ct,) = values, cts
    return [ops.where(_expand(valid, aval_of(v)), ct[safe], 0.0).astype(aval_of(v).dtype)]


# dest[b] = max of values with index b:  vbar_i = ybar[b] for the lowest i in bin b with v_i == dest[b]
def _extremum_vjp(prim, consts, identity, idx, values, outs, cts):
    valid, safe = _valid_and_safe(idx, prim.n)
    (v,), (y,), (ct,) = values, outs, cts
    aval = aval_of(v)
    m = aval.shape[0]
    positions = ops.broadcast_to(ops.reshape(ops.iota(m), (m,) + (1,) * (len(aval.shape) - 1)), aval.shape)
    hit = (v == y[safe]) & _expand(valid, aval)
    winner = fold_rbi(monoids.min, prim.n, idx, ops.where(hit, positions, m))
    return [ops.where(hit & (positions == winner[safe]), ct[safe], 0.0).astype(aval.dtype)]


# dest[b] = product of values with index b:  vbar_i = ybar[b] * (product of the other values in bin b), without
# dividing by zero (as the reduce's * rule): per bin the product of its nonzero values and its count of zeros
def _prod_vjp(prim, consts, identity, idx, values, outs, cts):
    valid, safe = _valid_and_safe(idx, prim.n)
    (v,), (ct,) = values, cts
    aval = aval_of(v)
    is_zero = v == 0
    nonzero = ops.where(is_zero, 1.0, v).astype(aval.dtype)
    bin_prod = bind(prim, *consts, *identity, idx, nonzero)[0][safe]
    bin_zeros = fold_rbi(monoids.sum, prim.n, idx, is_zero.astype("int64"))[safe]
    others = ops.where(bin_zeros == 0, bin_prod / nonzero,
                       ops.where((bin_zeros == 1) & is_zero, bin_prod, 0.0).astype(aval.dtype))
    return [ops.where(_expand(valid, aval), others * ct[safe], 0.0).astype(aval.dtype)]


# Theorem 2.1 per bin: vbar_i = D(dest[b], v_i, ybar[b]) with b = idx_i
def _monoid_vjp(prim, consts, identity, idx, values, outs, cts):
    valid, safe = _valid_and_safe(idx, prim.n)
    elem = prim.body.out_tree
    rows = [o[safe] for o in outs]
    grads = [c[safe] for c in cts]
    result = fold_map(lambda c, a, g: call_d(prim.monoid, c, a, g), elem.unflatten(rows), elem.unflatten(list(values)), elem.unflatten(grads))
    leaves, got = tree_flatten(result)
    check_d_result(prim.monoid.name, got, [row_aval(v) for v in leaves], elem, [row_aval(v) for v in values])
    return [ops.where(_expand(valid, aval_of(v)), leaf, 0.0).astype(aval_of(v).dtype) for v, leaf in zip(values, leaves, strict=True)]


# generic: bin b is reduce over all values of (idx_i == b ? v_i : e), differentiated with the generic reduce rule
# (which also gives the cotangents of the captured values at positions `wanted`).
# O(n * m) work: the price of an operator with no shortcut (no sort primitive in the language yet).
def _generic_vjp(prim, consts, identity, idx, values, outs, cts, wanted: tuple = ()):
    k = prim.num_leaves

    def masked_histogram(*flat):
        vals, cs = flat[:k], substituted(consts, wanted, flat[k:])

        def bin_total(b):
            hits = idx == b
            masked = [ops.where(_expand(hits, aval_of(v)), v, e) for v, e in zip(vals, identity, strict=True)]
            return fold_reduce(lambda a, c: inline_program(prim.body, cs + list(a) + list(c)), masked, identity=list(identity))

        return fold_map(bin_total, ops.iota(prim.n))

    primals = list(values) + [consts[i] for i in wanted]
    got = [instantiate(c, aval_of(p)) for c, p in zip(vjp_of_function(masked_histogram, primals, cts), primals, strict=True)]
    return got if wanted else got[:k]


@vjp_rules.register(ReduceByIndex)
def _rbi_vjp(prim: ReduceByIndex, args, outs, residual, cts):
    nc, k = prim.num_consts, prim.num_leaves
    consts, identity, idx, values = args[:nc], args[nc: nc + k], args[nc + k], args[nc + k + 1:]
    if prim.n == 0:  # no bins: every index is out of range, and its value gets no cotangent
        return [Zero(aval_of(a)) for a in args]
    dense = [instantiate(c, aval_of(o)) for c, o in zip(cts, outs, strict=True)]
    wanted = active_captures(consts, arg_activity(len(args)))
    if wanted:  # only the generic rule (per bin, the reduce's) differentiates through the captured values
        if current_reduce_rule() == "monoid":
            refuse_monoid_rule_for_captures(prim, [consts[i] for i in wanted])
        got = _generic_vjp(prim, consts, identity, idx, values, outs, dense, wanted)
        consts_cts = [Zero(aval_of(c)) for c in consts]
        for i, t in zip(wanted, got[k:], strict=True):
            consts_cts[i] = t
        return consts_cts + [Zero(aval_of(a)) for a in list(identity) + [idx]] + got[:k]
    setting = current_reduce_rule()
    op = recognize_binary_op(prim.body, nc)
    qualifies = monoid_qualifies(prim)
    if setting == "monoid" and not qualifies:
        choose_rule(prim, setting)  # raises, naming the operator and why, as for reduce
    if setting == "generic":
        rule = _generic_vjp
    elif setting == "monoid" and qualifies:
        rule = _monoid_vjp
    elif op == "add":
        rule = _add_vjp
    elif op in ("maximum", "minimum"):
        rule = _extremum_vjp
    elif op == "mul":
        rule = _prod_vjp
    elif qualifies:
        rule = _monoid_vjp
    else:
        rule = _generic_vjp
    values_cts = rule(prim, consts, identity, idx, values, outs, dense)
    return [Zero(aval_of(a)) for a in list(consts) + list(identity) + [idx]] + list(values_cts)



