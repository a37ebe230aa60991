"""The vjp of scan: the specialised rule for +, then the generic rule for any associative operator.

Every scan is first brought to an inclusive, left-to-right scan: an exclusive scan is the inclusive scan
shifted by one (so its cotangent shifts the other way), and a reverse scan is a forward scan of the
reversed array with the flipped operator.
"""

from __future__ import annotations

import numpy as np

from fold import ops
from fold.combinators import map as fold_map
from fold.combinators import scan as fold_scan
from fold.inline import inline_program
from fold.ir import reorder_inputs
from fold.primitives import Scan
from fold.recognize import recognize_binary_op
from fold.tracing import bind

from .fn_vjp import active_captures, vjp_of_application, vjp_of_function
from .vjp import arg_activity, current_reduce_rule, vjp_rules
from .zeros import Zero, aval_of, instantiate


def _shift_left(x, fill):
    """[x_1, ..., x_{n-1}, fill]"""
    n = aval_of(x).shape[0]
    fill_row = ops.reshape(ops.broadcast_to(fill, aval_of(x).shape[1:]), (1,) + aval_of(x).shape[1:])
    return ops.concatenate([x[1:n], fill_row.astype(aval_of(x).dtype)], axis=0)


def _flip(x):
    return x[::-1]


def _flipped_body(prim: Scan):
    nc, k = prim.num_consts, prim.num_leaves
    order = list(range(nc)) + list(range(nc + k, nc + 2 * k)) + list(range(nc, nc + k))
    return reorder_inputs(prim.body, order)


# y_i = sum_{j <= i} a_j  =>  abar_j = sum_{i >= j} ybar_i: the same scan of the cotangents, the other way
def _add_scan_vjp(prim, consts, identity, xs, ys, cts):
    flipped = Scan(prim.body, prim.num_consts, prim.monoid, prim.exclusive, not prim.reverse)
    return bind(flipped, *consts, *identity, *cts)


def _inclusive_generic_vjp(body, nc: int, consts, xs, prevs, cts, wanted: tuple = (), identity: tuple = ()):
    """Inclusive forward scan y_i = y_{i-1} . a_i. The cotangent c_i reaching y_i solves the linear recurrence

        c_{n-1} = ybar_{n-1},   c_i = ybar_i + d_{i+1},   d_i = J_i^T c_i,   J_i = d(y . a_i)/dy at y_{i-1},

    so d_i = J_i^T ybar_i + J_i^T d_{i+1}: an affine map (J_i^T, J_i^T ybar_i) of d_{i+1} made from the values
    at i alone. The exclusive reverse scan of those maps, composed associatively, gives d_{i+1} at i, so no
    array is shifted; `prevs` are the exclusive primal values y_{i-1}, which the last step needs too: abar_i
    is the vjp of (a -> y_{i-1} . a) at a_i on c_i. The Jacobians come from the operator's own vjp on basis
    vectors. The operator is applied once per element (y_i = y_{i-1} . a_i), so the cotangent of a value t
    it captures (the consts at positions `wanted`) is the sum over i of the vjp of (t' -> y_{i-1} .' a_i) on
    c_i. Returns (abar, [tbar for each wanted const]).
    """
    k = len(xs)
    elem_avals = [aval_of(x).update(shape=aval_of(x).shape[1:]) for x in xs]
    sizes = [int(np.prod(a.shape, dtype=np.int64)) for a in elem_avals]
    s = sum(sizes)
    dtype = elem_avals[0].dtype

    def op(a, b):
        return inline_program(body, list(consts) + list(a) + list(b))

    def flatten(leaves):
        return ops.concatenate([ops.reshape(ops.convert(x, dtype), (-1,)) for x in leaves], axis=0) if len(leaves) > 1 else ops.reshape(leaves[0], (-1,))

    def unflatten(vec):
        out, start = [], 0
        for aval, size in zip(elem_avals, sizes, strict=True):
            out.append(ops.reshape(vec[start: start + size], aval.shape).astype(aval.dtype))
            start += size
        return out

    def jacobian_t(prev, a):
        """The s x s matrix J^T of y -> y . a at y = prev, as a map over basis cotangents."""
        def column(e):
            cts_leaves = unflatten(e)
            return flatten([instantiate(c, av) for c, av in zip(vjp_of_function(lambda *y: op(list(y), a), prev, cts_leaves), elem_avals, strict=True)])

        basis = (ops.reshape(ops.iota(s), (s, 1)) == ops.reshape(ops.iota(s), (1, s))).astype(dtype)
        return ops.transpose(fold_map(column, basis))  # row k of the map is J^T e_k, a column of J^T

    def affine_map(*leaves):
        prev, a, ct = list(leaves[:k]), list(leaves[k: 2 * k]), list(leaves[2 * k:])
        m = jacobian_t(prev, a)
        return m, ops.matmul(m, flatten(ct))

    def compose(f, g):
        (m1, v1), (m2, v2) = f, g
        return ops.matmul(m1, m2), v1 + ops.matmul(m1, v2)

    ms, vs = fold_map(affine_map, *prevs, *xs, *cts)
    eye = np.eye(s, dtype=dtype)
    _, ds = fold_scan(compose, (ms, vs), identity=(eye, np.zeros(s, dtype)), reverse=True, exclusive=True)

    def element_ct(*leaves):
        prev, a, ct, d = list(leaves[:k]), list(leaves[k: 2 * k]), list(leaves[2 * k: 3 * k]), leaves[3 * k]
        if not wanted:
            a_cts = vjp_of_function(lambda *a_: op(prev, list(a_)), a, unflatten(flatten(ct) + d))
            return [instantiate(c, av) for c, av in zip(a_cts, elem_avals, strict=True)]
        a_cts, t_cts = vjp_of_application(body, consts, wanted, prev, a, unflatten(flatten(ct) + d), identity)
        return a_cts + t_cts

    out = list(fold_map(element_ct, *prevs, *xs, *cts, ds))
    if not wanted:
        return out, []
    return out[:k], [ops.sum(t, axis=0) for t in out[k:]]


def _generic_scan_vjp(prim, consts, identity, xs, ys, cts, wanted: tuple = ()):
    """(the cotangents of xs, those of the consts at positions `wanted`)."""
    nc = prim.num_consts
    if prim.reverse:
        body = _flipped_body(prim)
        forward = Scan(body, nc, None, prim.exclusive, False)
        flipped_ys = [_flip(y) for y in ys]
        xs_cts, consts_cts = _forward_generic(forward, consts, identity, [_flip(x) for x in xs], flipped_ys,
                                              [_flip(c) for c in cts], wanted)
        return [_flip(c) for c in xs_cts], consts_cts
    return _forward_generic(prim, consts, identity, xs, ys, cts, wanted)


def _forward_generic(prim, consts, identity, xs, ys, cts, wanted: tuple = ()):
    """The rule needs the exclusive values y_{i-1}: an exclusive scan's own results (its cotangents then
    shift to the inclusive positions), or, for an inclusive scan, the exclusive scan run again — not its
    results shifted: a gradient alone then never runs the inclusive scan (dead code), and a shifted copy
    costs as much as a scan pass on the numba backend."""
    if prim.exclusive:
        shifted_cts = [_shift_left(c, np.zeros((), aval_of(c).dtype)) for c in cts]
        return _inclusive_generic_vjp(prim.body, prim.num_consts, consts, xs, ys, shifted_cts, wanted, tuple(identity))
    prevs = bind(Scan(prim.body, prim.num_consts, None, True, False), *consts, *identity, *xs)
    return _inclusive_generic_vjp(prim.body, prim.num_consts, consts, xs, prevs, cts, wanted, tuple(identity))


@vjp_rules.register(Scan)
def _scan_vjp(prim: Scan, args, outs, residual, cts):
    nc, k = prim.num_consts, prim.num_leaves
    consts, identity, xs = args[:nc], args[nc: nc + k], args[nc + k:]
    dense = [instantiate(c, aval_of(o)) for c, o in zip(cts, outs, strict=True)]
    if aval_of(xs[0]).shape[0] == 0:
        return [Zero(aval_of(a)) for a in args]
    wanted = active_captures(consts, arg_activity(len(args)))  # no monoid rule for scans: reduce_rule aside
    consts_cts: list = [Zero(aval_of(c)) for c in consts]
    if not wanted and current_reduce_rule() != "generic" and recognize_binary_op(prim.body, nc) == "add":
        xs_cts = _add_scan_vjp(prim, consts, identity, xs, outs, dense)
    else:  # the generic rule, also the one to give the cotangents of captured values
        xs_cts, wanted_cts = _generic_scan_vjp(prim, consts, identity, xs, outs, dense, wanted)
        for i, t in zip(wanted, wanted_cts, strict=True):
            consts_cts[i] = t
    return consts_cts + [Zero(aval_of(a)) for a in identity] + list(xs_cts)
