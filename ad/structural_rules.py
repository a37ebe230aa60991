"""jvp and vjp of the structural primitives. Most are linear: the jvp applies the primitive to the tangent,
and the vjp applies its transpose."""

from __future__ import annotations

import numpy as np

from fold import monoids, ops
from fold.primitives import (
    BroadcastTo,
    Concatenate,
    Convert,
    Gather,
    IndexTranspose,
    Iota,
    MatMul,
    Reshape,
    StaticIndex,
    StopGradient,
    SumAxes,
    Transpose,
)
from fold.tracing import bind

from .jvp import jvp_rules
from .vjp import vjp_rules
from .zeros import Zero, aval_of, differentiable, instantiate, is_zero


@jvp_rules.register(BroadcastTo, Reshape, Transpose, StaticIndex, IndexTranspose, SumAxes, Iota)
def linear_jvp(prim, primals, tangents):
    """For primitives linear in their (only) argument: the tangent goes through the same primitive."""
    outs = bind(prim, *primals)
    (t,) = tangents
    return outs, bind(prim, instantiate(t, aval_of(primals[0])))


@jvp_rules.register(Convert)
def _convert_jvp(prim, primals, tangents):
    (out,) = bind(prim, *primals)
    if not differentiable(out.aval):
        return [out], [Zero(out.aval)]
    return [out], [ops.convert(tangents[0], prim.dtype)]


@jvp_rules.register(Gather)
def _gather_jvp(prim, primals, tangents):
    x, idx = primals
    outs = bind(prim, x, idx)
    return outs, bind(prim, instantiate(tangents[0], aval_of(x)), idx)


@jvp_rules.register(Concatenate)
def _concat_jvp(prim, primals, tangents):
    outs = bind(prim, *primals)
    return outs, bind(prim, *[instantiate(t, aval_of(p)) for p, t in zip(primals, tangents, strict=True)])


@jvp_rules.register(MatMul)
def _matmul_jvp(prim, primals, tangents):
    a, b = primals
    ta, tb = tangents
    (out,) = bind(prim, a, b)
    tangent = None
    if not is_zero(ta):
        tangent = ops.matmul(ta, b)
    if not is_zero(tb):
        part = ops.matmul(a, tb)
        tangent = part if tangent is None else tangent + part
    return [out], [tangent]


@vjp_rules.register(BroadcastTo)
def _broadcast_vjp(prim, args, outs, residual, cts):
    (x,) = args
    (ct,) = cts
    shape = aval_of(x).shape
    lead = len(prim.shape) - len(shape)
    stretched = tuple(lead + i for i, s in enumerate(shape) if s == 1 and prim.shape[lead + i] != 1)
    summed = ops.sum(ct, axis=tuple(range(lead)) + stretched) if lead or stretched else ct
    return [ops.reshape(summed, shape)]


@vjp_rules.register(Reshape)
def _reshape_vjp(prim, args, outs, residual, cts):
    return [ops.reshape(cts[0], aval_of(args[0]).shape)]


@vjp_rules.register(Transpose)
def _transpose_vjp(prim, args, outs, residual, cts):
    return [ops.transpose(cts[0], tuple(np.argsort(prim.perm)))]


@vjp_rules.register(StaticIndex)
def _static_index_vjp(prim, args, outs, residual, cts):
    return bind(IndexTranspose(prim.index, aval_of(args[0]).shape), cts[0])


@vjp_rules.register(IndexTranspose)
def _index_transpose_vjp(prim, args, outs, residual, cts):
    return bind(StaticIndex(prim.index), cts[0])


@vjp_rules.register(SumAxes)
def _sum_vjp(prim, args, outs, residual, cts):
    shape = aval_of(args[0]).shape
    kept = tuple(1 if i in prim.axes else s for i, s in enumerate(shape))
    return [ops.broadcast_to(ops.reshape(cts[0], kept), shape)]


@vjp_rules.register(Convert)
def _convert_vjp(prim, args, outs, residual, cts):
    aval = aval_of(args[0])
    if not (differentiable(aval) and differentiable(aval_of(outs[0]))):
        return [Zero(aval)]
    return [ops.convert(cts[0], aval.dtype)]


@vjp_rules.register(Gather)
def _gather_vjp(prim, args, outs, residual, cts):
    """The transpose of a gather is a scatter-add: a reduce_by_index with +, at the positions the gather
    read. They are read from an iota by a gather at the same indices: a negative index becomes its position
    from the end, and one outside [-n, n) raises as the forward gather does, where reduce_by_index would
    ignore it (a gradient whose forward gather is dead code returned a gradient for a program that raises)."""
    x, idx = args
    aval = aval_of(x)
    if isinstance(idx, np.ndarray):  # a constant index, checked when the gather was traced
        idx = np.where(idx < 0, idx + aval.shape[0], idx)
    else:
        idx = bind(Gather(), ops.iota(aval.shape[0]), idx)[0]
    flat_idx = ops.reshape(idx, (-1,))
    flat_ct = ops.reshape(cts[0], (-1,) + aval.shape[1:])
    from fold.combinators import reduce_by_index

    return [reduce_by_index(monoids.sum, aval.shape[0], flat_idx, flat_ct), Zero(aval_of(idx))]


@vjp_rules.register(Concatenate)
def _concat_vjp(prim, args, outs, residual, cts):
    (ct,) = cts
    pieces, start = [], 0
    for a in args:
        size = aval_of(a).shape[prim.axis]
        index = tuple((0, s, 1) for s in aval_of(a).shape[: prim.axis]) + ((start, start + size, 1),)
        pieces.append(bind(StaticIndex(index), ct)[0])
        start += size
    return pieces


@vjp_rules.register(MatMul)
def _matmul_vjp(prim, args, outs, residual, cts):
    a, b = args
    (ct,) = cts
    ct_a = ops.matmul(ct, ops.transpose(b)) if hasattr(a, "aval") else Zero(aval_of(a))
    ct_b = ops.matmul(ops.transpose(a), ct) if hasattr(b, "aval") else Zero(aval_of(b))
    return [ct_a, ct_b]


@vjp_rules.register(Iota)
def _iota_vjp(prim, args, outs, residual, cts):
    return []


@jvp_rules.register(StopGradient)
def _stop_gradient_jvp(prim, primals, tangents):
    outs = bind(prim, *primals)
    return outs, [Zero(o.aval) for o in outs]


@vjp_rules.register(StopGradient)
def _stop_gradient_vjp(prim, args, outs, residual, cts):
    return [Zero(aval_of(args[0]))]
