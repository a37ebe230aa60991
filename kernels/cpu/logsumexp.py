"""log(sum(exp(x))) of a 1-D float array in two parallel passes: the maximum m, then m + log(sum(exp(x - m))).

The reduction of x by logaddexp, computed the way that costs one exp per element instead of an exp and a
log1p (and never overflows). Each pass splits [0, n) into T contiguous chunks (prange) and combines the
T partials in chunk order. -inf everywhere gives -inf, a +inf gives +inf, a NaN gives NaN, n == 0 gives
-inf (logaddexp's identity). The exps are computed four at a time with kernels.cpu.vector_math where it is
AVAILABLE (four partial sums per chunk, added at the chunk's end).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from . import host, vector_math
from .vector_math import vexp


def _chunk_max(x, lo, hi):
    top = -np.inf
    for i in range(lo, hi):
        v = x[i]
        if v > top or v != v:  # a NaN wins, so that it propagates
            top = v
            if v != v:
                break
    return top


def _chunk_sum_exp(x, lo, hi, shift):
    total = 0.0
    for i in range(lo, hi):
        total += math.exp(x[i] - shift)
    return total


def _chunk_sum_exp_lanes(x, lo, hi, shift):
    s0 = s1 = s2 = s3 = 0.0
    quads = (hi - lo) // 4
    for b in range(quads):
        i = lo + 4 * b
        e0, e1, e2, e3 = vexp(x[i] - shift, x[i + 1] - shift, x[i + 2] - shift, x[i + 3] - shift)
        s0 += e0
        s1 += e1
        s2 += e2
        s3 += e3
    total = (s0 + s1) + (s2 + s3)
    for i in range(lo + 4 * quads, hi):
        total += math.exp(x[i] - shift)
    return total


def _kernel_source(T, x, tops, sums, lanes):
    n = x.shape[0]
    for t in prange(T):
        tops[t] = _chunk_max(x, t * n // T, (t + 1) * n // T)
    top = tops[0]
    for t in range(1, T):
        if tops[t] > top or tops[t] != tops[t]:
            top = tops[t]
    if top != top or math.isinf(top):
        return top
    for t in prange(T):
        if lanes:
            sums[t] = _chunk_sum_exp_lanes(x, t * n // T, (t + 1) * n // T, top)
        else:
            sums[t] = _chunk_sum_exp(x, t * n // T, (t + 1) * n // T, top)
    total = 0.0
    for t in range(T):
        total += sums[t]
    return top + math.log(total)


_chunk_max = njit(inline="always")(_chunk_max)
_chunk_sum_exp = njit(inline="always")(_chunk_sum_exp)
_chunk_sum_exp_lanes = njit(inline="always")(_chunk_sum_exp_lanes)
_KERNELS = {parallel: njit(parallel=parallel, cache=True, error_model="numpy")(_kernel_source) for parallel in (False, True)}


def logsumexp(x: np.ndarray, *, chunks: int | None = None) -> np.floating:
    """log(sum(exp(x))) of a 1-D float32 or float64 array (any stride), as a NumPy scalar of x's dtype."""
    (x,) = host.check_arrays([x], 1, 1, "x")
    if x.dtype.kind != "f":
        raise TypeError(f"x must be a float array, got dtype {x.dtype}")
    if x.shape[0] == 0:
        return x.dtype.type(-np.inf)
    T = host.num_chunks(x.shape[0], chunks)
    scratch = np.empty(T, np.float64)
    return x.dtype.type(_KERNELS[T > 1](T, x, scratch, scratch.copy(), vector_math.AVAILABLE))
