"""jvp and vjp of elementwise operations, both from the one table of partials (ad/partials.py)."""

from __future__ import annotations

from fold import ops
from fold.primitives import Elementwise
from fold.tracing import bind

from .jvp import jvp_rules
from .partials import PARTIALS, ZERO_DERIVATIVE_OPS, apply_partial
from .vjp import vjp_rules
from .zeros import Zero, add_any, aval_of, instantiate, is_zero


def _partials(prim: Elementwise, args, out, wanted):
    return PARTIALS[prim.op](args, out, wanted)


@jvp_rules.register(Elementwise)
def _elementwise_jvp(prim: Elementwise, primals, tangents):
    (out,) = bind(prim, *primals)
    if prim.op in ZERO_DERIVATIVE_OPS:
        return [out], [Zero(out.aval)]
    if prim.op == "where":
        cond, a, b = primals
        _, ta, tb = tangents
        if is_zero(ta) and is_zero(tb):
            return [out], [Zero(out.aval)]
        return [out], [ops.where(cond, instantiate(ta, out.aval), instantiate(tb, out.aval))]
    wanted = [not is_zero(t) for t in tangents]
    tangent = None
    for partial, t in zip(_partials(prim, primals, out, wanted), tangents, strict=True):
        if not is_zero(t) and partial is not None:
            tangent = add_any(tangent, apply_partial(partial, t))
    return [out], [Zero(out.aval) if tangent is None else tangent]


def _fit(ct, aval):
    """A cotangent as the argument's shape (0-d literal arguments stand for a broadcast scalar)."""
    if aval.shape == tuple(ct.shape):
        return ct
    return ops.sum(ct)


@vjp_rules.register(Elementwise)
def _elementwise_vjp(prim: Elementwise, args, outs, residual, cts):
    (ct,) = cts
    if prim.op in ZERO_DERIVATIVE_OPS:
        return [Zero(aval_of(a)) for a in args]
    if prim.op == "where":
        cond = args[0]
        zero = 0.0
        return [Zero(aval_of(cond)), ops.where(cond, ct, zero), ops.where(cond, zero, ct)]
    if prim.op == "mul" and args[0] is args[1] and hasattr(args[0], "aval"):
        # x * x: x*ct once, doubled, instead of ct*x + ct*x (the same sum, one pass fewer)
        half = apply_partial(args[0], ct)
        return [_fit(half + half, aval_of(args[0])), Zero(aval_of(args[1]))]
    wanted = [hasattr(a, "aval") for a in args]  # only traced arguments need a cotangent
    out_cts = []
    for a, partial, want in zip(args, _partials(prim, args, outs[0], wanted), wanted, strict=True):
        if not want or partial is None:
            out_cts.append(Zero(aval_of(a)))
        else:
            out_cts.append(_fit(apply_partial(partial, ct), aval_of(a)))
    return out_cts
