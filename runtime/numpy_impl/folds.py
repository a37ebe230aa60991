"""reduce, scan and reduce_by_index on batched arrays, for any associative operator.

A user operator is a body evaluated on whole batches of pairs at once, one map deeper. reduce is a
pairwise tree (ceil(log2 n) vectorised steps); scan is the work-efficient two-sweep scan (about 2 log2 n
steps, O(n) work); reduce_by_index sorts by bin and runs a segmented scan. Every variant keeps the order
of the operands, so non-commutative operators are correct. Operators recognised as +, *, max, min or
logaddexp use NumPy's own reductions instead.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from fold.primitives import Reduce, ReduceByIndex, Scan
from fold.recognize import recognize_binary_op

from ..interpreter import eval_program, numpy_impls
from ..wide_operators import WIDE, carried_operator
from .accumulation import chain_dtype, reduce_dtype
from .batching import concat_broadcast, expand_for_body, fit_axis, take_axis

Leaves = list[np.ndarray]
Combine = Callable[[Leaves, Leaves], Leaves]

_UFUNCS = {"add": np.add, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum, "logaddexp": np.logaddexp}

# Switched off by benchmarks and tests that exercise the generic tree algorithms.
USE_UFUNC_FAST_PATHS = True


def _fast_ufunc(prim) -> np.ufunc | None:
    if not USE_UFUNC_FAST_PATHS:
        return None
    op = recognize_binary_op(prim.body, prim.num_consts)
    return _UFUNCS.get(op) if op else None


def _combiner(prim, consts: Leaves, axis: int, body=None) -> Combine:
    """The operator (`body`, default the fold's own) as a function of two lists of leaves batched along
    `axis` (= the depth)."""
    body_consts = [expand_for_body(c, axis) for c in consts]
    body = prim.body if body is None else body

    def combine(a: Leaves, b: Leaves) -> Leaves:
        size = a[0].shape[axis]
        outs = eval_program(body, body_consts + a + b, depth=axis + 1)
        return [fit_axis(o, axis, size) for o in outs]

    return combine


def _carried(prim, consts: Leaves, identity: Leaves, xs: Leaves):
    """(the operator traced again on float64, consts, identity, xs with float32 in float64) for a fold of
    float32 leaves under an operator not recognised as +, *, max, min or logaddexp (those take NumPy's own
    folds; see accumulation.py), or None: other dtypes, a selecting operator (max, min: nothing to round),
    or an operator that cannot be traced again (one holding a fold.map), which folds in float32.

    Each combine of the tree rounded to float32 before: a float32 product of 10^5 factors near 1, or an
    affine scan's pairs, came out hundreds of ulp from the exact fold, and a * b + b 4 ulp, where the
    numba backend (which carries these folds in float64, runtime/numba_backend/wide_folds.py) was within
    half an ulp. Carried in float64 and rounded once, both are (tests/test_float32_accuracy.py)."""
    body, carry = carried_operator(prim.body, prim.num_consts, [np.asarray(x).dtype for x in xs])
    if carry is None:
        return None
    wide = lambda vs: [v.astype(WIDE) if np.asarray(v).dtype == np.float32 else v for v in map(np.asarray, vs)]  # noqa: E731
    return body, wide(consts), wide(identity), wide(xs)


def _rounded(outs: Leaves, like: Leaves) -> Leaves:
    """Results carried in float64 rounded once to their leaves' dtypes."""
    return [o.astype(x.dtype, copy=False) for o, x in zip(outs, like, strict=True)]


def _split(prim, args: list) -> tuple[Leaves, Leaves, Leaves]:
    k = prim.num_leaves
    return args[: prim.num_consts], args[prim.num_consts: prim.num_consts + k], args[prim.num_consts + k:]


def tree_reduce(xs: Leaves, axis: int, combine: Combine) -> Leaves:
    """Combine adjacent pairs until one element is left; an odd element out is carried to the next level."""
    n = xs[0].shape[axis]
    while n > 1:
        m = n // 2
        pairs = combine([take_axis(x, axis, slice(0, 2 * m, 2)) for x in xs],
                        [take_axis(x, axis, slice(1, 2 * m, 2)) for x in xs])
        if n % 2:
            pairs = [concat_broadcast([p, take_axis(x, axis, slice(n - 1, n))], axis) for p, x in zip(pairs, xs, strict=True)]
        xs, n = pairs, m + n % 2
    return [take_axis(x, axis, 0) for x in xs]


def inclusive_scan(xs: Leaves, axis: int, combine: Combine) -> Leaves:
    """Work-efficient scan: scan the pairwise combinations, then fill in the even positions."""
    n = xs[0].shape[axis]
    if n <= 1:
        return xs
    m = n // 2
    pair_sums = combine([take_axis(x, axis, slice(0, 2 * m, 2)) for x in xs],
                        [take_axis(x, axis, slice(1, 2 * m, 2)) for x in xs])
    odd = inclusive_scan(pair_sums, axis, combine)  # odd[i] = x_0 . ... . x_{2i+1}
    n_even = (n + 1) // 2
    if n_even > 1:
        later = combine([take_axis(o, axis, slice(0, n_even - 1)) for o in odd],
                        [take_axis(x, axis, slice(2, n, 2)) for x in xs])
        even = [concat_broadcast([take_axis(x, axis, slice(0, 1)), e], axis) for x, e in zip(xs, later, strict=True)]
    else:
        even = [take_axis(x, axis, slice(0, 1)) for x in xs]
    out = []
    for e, o in zip(even, odd, strict=True):
        shape = np.broadcast_shapes(e.shape[:axis] + (1,) + e.shape[axis + 1:], o.shape[:axis] + (1,) + o.shape[axis + 1:])
        result = np.empty(shape[:axis] + (n,) + shape[axis + 1:], dtype=e.dtype)
        result[(slice(None),) * axis + (slice(0, n, 2),)] = e
        result[(slice(None),) * axis + (slice(1, n, 2),)] = o
        out.append(result)
    return out


def _flip(xs: Leaves, axis: int) -> Leaves:
    return [np.flip(x, axis) for x in xs]


def scan_leaves(xs: Leaves, identity: Leaves, axis: int, combine: Combine, exclusive: bool, reverse: bool) -> Leaves:
    if reverse:
        flipped: Combine = lambda a, b: combine(b, a)  # noqa: E731
        return _flip(scan_leaves(_flip(xs, axis), identity, axis, flipped, exclusive, False), axis)
    out = inclusive_scan(xs, axis, combine)
    return shift_exclusive(out, identity, axis) if exclusive else out


def shift_exclusive(inclusive: Leaves, identity: Leaves, axis: int) -> Leaves:
    """[e, y_0, ..., y_{n-2}]: the exclusive scan from the inclusive one."""
    n = inclusive[0].shape[axis]
    return [concat_broadcast([np.expand_dims(e, axis), take_axis(o, axis, slice(0, n - 1))], axis)
            for e, o in zip(identity, inclusive, strict=True)]


@numpy_impls.register(Reduce)
def _reduce(prim: Reduce, args: list, depth: int) -> list:
    consts, identity, xs = _split(prim, args)
    if xs[0].shape[depth] == 0:
        return identity
    ufunc = _fast_ufunc(prim)
    if ufunc is np.logaddexp:
        return [_logsumexp(xs[0], depth)]
    if ufunc is not None:  # float32 in float64 where NumPy would chain float32 (accumulation.py)
        x = xs[0]
        return [ufunc.reduce(x, axis=depth, dtype=reduce_dtype(ufunc, x, (depth,))).astype(x.dtype, copy=False)]
    carried = _carried(prim, consts, identity, xs)
    if carried is not None:
        body, wide_consts, _, wide_xs = carried
        return _rounded(tree_reduce(wide_xs, depth, _combiner(prim, wide_consts, depth, body)), xs)
    return tree_reduce(xs, depth, _combiner(prim, consts, depth))


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    """logaddexp.reduce, computed as max + log(sum(exp(x - max))): several times faster than NumPy's
    element-by-element logaddexp.reduce. -inf everywhere gives -inf, +inf gives +inf, NaN propagates."""
    top = np.max(x, axis=axis, keepdims=True)
    shift = np.where(np.isfinite(top), top, 0.0).astype(x.dtype, copy=False)
    terms = np.exp(x - shift)
    total = np.sum(terms, axis=axis, keepdims=True, dtype=reduce_dtype(np.add, terms, (axis,))).astype(x.dtype, copy=False)
    total = np.log(total) + shift
    return np.squeeze(total, axis=axis).astype(x.dtype, copy=False)


@numpy_impls.register(Scan)
def _scan(prim: Scan, args: list, depth: int) -> list:
    consts, identity, xs = _split(prim, args)
    if xs[0].shape[depth] == 0:
        return [np.array(x) for x in xs]
    ufunc = _fast_ufunc(prim)
    if ufunc is not None:
        accumulate: Combine = lambda a, b: [ufunc(a[0], b[0])]  # noqa: E731 (only used for the flips)
        wide = chain_dtype(ufunc, xs[0].dtype)  # float32 accumulated in float64 (accumulation.py)
        inclusive = lambda x: [ufunc.accumulate(x[0], axis=depth, dtype=wide).astype(x[0].dtype, copy=False)]  # noqa: E731
        if prim.exclusive:
            out = _exclusive_accumulate(ufunc, np.flip(xs[0], depth) if prim.reverse else xs[0], identity[0], depth)
            if out is not None:
                return [np.flip(out, depth) if prim.reverse else out]
        return _scan_with(inclusive, xs, identity, depth, accumulate, prim.exclusive, prim.reverse)
    carried = _carried(prim, consts, identity, xs)
    if carried is not None:
        body, wide_consts, wide_identity, wide_xs = carried
        return _rounded(scan_leaves(wide_xs, wide_identity, depth, _combiner(prim, wide_consts, depth, body),
                                    prim.exclusive, prim.reverse), xs)
    return scan_leaves(xs, identity, depth, _combiner(prim, consts, depth), prim.exclusive, prim.reverse)


def _exclusive_accumulate(ufunc: np.ufunc, x: np.ndarray, identity: np.ndarray, axis: int) -> np.ndarray | None:
    """identity, x0, x0.x1, ...: accumulated straight into the result, with no concatenation afterwards.

    None where the general path is needed: not a float array, or an identity that would change x's dtype or shape.
    """
    identity = np.expand_dims(np.asarray(identity), axis)
    n = x.shape[axis]
    row = x.shape[:axis] + (1,) + x.shape[axis + 1:]
    if (x.dtype.kind not in "fc" or identity.dtype != x.dtype or identity.ndim != x.ndim
            or np.broadcast_shapes(identity.shape, row) != row):
        return None
    out = np.empty(x.shape, dtype=x.dtype)
    take_axis(out, axis, slice(0, 1))[...] = identity
    if n > 1:
        ufunc.accumulate(take_axis(x, axis, slice(0, n - 1)), axis=axis, out=take_axis(out, axis, slice(1, n)),
                         dtype=chain_dtype(ufunc, x.dtype))
    return out


def _scan_with(inclusive, xs, identity, axis, combine, exclusive, reverse):
    if reverse:
        return _flip(_scan_with(inclusive, _flip(xs, axis), identity, axis, combine, exclusive, False), axis)
    out = inclusive(xs)
    return shift_exclusive(out, identity, axis) if exclusive else out


@numpy_impls.register(ReduceByIndex)
def _reduce_by_index(prim: ReduceByIndex, args: list, depth: int) -> list:
    k = prim.num_leaves
    consts, identity = args[: prim.num_consts], args[prim.num_consts: prim.num_consts + k]
    indices, values = args[prim.num_consts + k], args[prim.num_consts + k + 1:]
    batch = np.broadcast_shapes(*[a.shape[:depth] for a in args]) if depth else ()
    nb, m = int(np.prod(batch, dtype=np.int64)), indices.shape[depth]
    idx = np.broadcast_to(indices, batch + (m,)).reshape(nb, m)
    vals = [np.broadcast_to(v, batch + v.shape[depth:]).reshape((nb,) + v.shape[depth:]) for v in values]
    valid = (idx >= 0) & (idx < prim.n)  # out-of-range indices are ignored, as in Futhark
    keys = (np.arange(nb)[:, None] * prim.n + idx)[valid]
    rows = np.broadcast_to(np.arange(nb)[:, None], (nb, m))[valid]
    vals = [v[valid] for v in vals]
    out = [np.array(np.broadcast_to(e, batch + e.shape[depth:]).reshape((nb,) + e.shape[depth:]))[:, None].repeat(prim.n, axis=1)
           .reshape((nb * prim.n,) + e.shape[depth:]) for e in identity]
    ufunc = _fast_ufunc(prim)
    if ufunc is not None:  # float32 bins accumulated in float64 (accumulation.py)
        wide = chain_dtype(ufunc, out[0].dtype)
        bins = out[0] if wide is None else out[0].astype(wide)
        ufunc.at(bins, keys, vals[0] if wide is None else vals[0].astype(wide))
        out[0] = bins.astype(out[0].dtype, copy=False)
    elif keys.size:
        carried = _carried(prim, consts, identity, vals)
        if carried is None:
            _segmented_reduce(prim, prim.body, consts, depth, batch, keys, rows, vals, out)
        else:  # float32 bins folded in float64, rounded once as they are written
            _segmented_reduce(prim, carried[0], carried[1], depth, batch, keys, rows, carried[3], out)
    return [o.reshape(batch + (prim.n,) + o.shape[1:]) for o in out]


def _segmented_reduce(prim, body, consts, depth, batch, keys, rows, vals, out) -> None:
    """Combine the values of each bin in their original order with the operator `body`: stable sort by bin,
    then a segmented scan."""
    order = np.argsort(keys, kind="stable")
    keys, rows, vals = keys[order], rows[order], [v[order] for v in vals]
    starts = np.ones(keys.shape, dtype=bool)
    starts[1:] = keys[1:] != keys[:-1]
    nb = int(np.prod(batch, dtype=np.int64))
    per_element_consts = [np.broadcast_to(c, batch + c.shape[depth:]).reshape((nb,) + c.shape[depth:])[rows] for c in consts]
    nc = len(consts)

    def combine(a: Leaves, b: Leaves) -> Leaves:
        # leaves: [segment-start flag, consts of the element..., values...]
        fa, fb = a[0], b[0]
        combined = eval_program(body, b[1: 1 + nc] + a[1 + nc:] + b[1 + nc:], depth=1)
        picked = [np.where(fb.reshape(fb.shape + (1,) * (c.ndim - 1)), vb, c)
                  for vb, c in zip(b[1 + nc:], combined, strict=True)]
        return [fa | fb] + b[1: 1 + nc] + picked

    scanned = inclusive_scan([starts] + per_element_consts + vals, 0, combine)
    ends = np.ones(keys.shape, dtype=bool)
    ends[:-1] = keys[1:] != keys[:-1]
    for o, s in zip(out, scanned[1 + nc:], strict=True):
        o[keys[ends]] = s[ends]
