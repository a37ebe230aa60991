"""Histogram (reduce by index) of 1-D arrays of k-leaf elements into n_bins bins.

    histogram(combine, k, identity, n_bins, indices, leaves)
        out[b] = e . x_{i_1} . x_{i_2} . ...               over the i with indices[i] == b, in increasing i

(A histogram of a map's results, the mapped values never stored, is a loop nest: runtime/loops/fusion.py.)

Indices outside [0, n_bins) are ignored; a bin that receives nothing holds the identity e.

Parallel path: T threads each fold a contiguous chunk of the input into a private histogram (T x n_bins
per leaf), then every bin combines the T private values in thread order (parallel over bins). Chunks are
contiguous and merged in order, so the order within each bin is the input order and non-commutative
operators are correct.

Sequential path, the rule: a parallel pass initialises and merges T * n_bins private values, so it runs
only if every thread gets at least max(MIN_CHUNK, 4 * n_bins) elements, i.e.
T = min(threads, n // max(MIN_CHUNK, 4 * n_bins)) >= 2; the private histograms then cost at most half the
element work and a quarter of the input's size. Otherwise one thread folds straight into the output.
"""

from __future__ import annotations

from typing import Any, Sequence

import numba
import numpy as np

from . import host
from .codegen import call, compile_kernel, each, names

# A thread's chunk must hold at least this many elements per bin for private histograms to pay.
ELEMENTS_PER_BIN = 4


def _histogram_source(k: int) -> str:
    """The kernel's source."""
    out_s = ", ".join(f"out{j}[s]" for j in range(k))
    priv_tc, priv_tb = (", ".join(f"priv{j}[t, {c}]" for j in range(k)) for c in "cb")
    x_i = ", ".join(f"x{j}[i]" for j in range(k))
    return f"""
def kernel(T, idx, {names("x", k)}, {names("id", k)}, {names("priv", k)}, {names("out", k)}):
    n = idx.shape[0]
    nb = out0.shape[0]
    if T == 1:
        for z in range(nb):
{each("out{j}[z] = id{j}", k, 12)}
        for i in range(n):
            s = np.int64(idx[i])
            if s >= 0 and s < nb:
                {call("r", "combine", f"{out_s}, {x_i}", k)}
{each("out{j}[s] = r{j}", k, 16)}
        return
    for t in prange(T):
        for z in range(nb):
{each("priv{j}[t, z] = id{j}", k, 12)}
        for i in range(t * n // T, (t + 1) * n // T):
            c = np.int64(idx[i])
            if c >= 0 and c < nb:
                {call("q", "combine", f"{priv_tc}, {x_i}", k)}
{each("priv{j}[t, c] = q{j}", k, 16)}
    for b in prange(nb):
{each("acc{j} = priv{j}[0, b]", k, 8)}
        for t in range(1, T):
            {call("acc", "combine", f"{names('acc', k)}, {priv_tb}", k)}
{each("out{j}[b] = acc{j}", k, 8)}
"""


def histogram_kernel(combine: Any, k: int, parallel: bool = True) -> Any:
    """The compiled kernel(T, indices, x_0.., id_0.., priv_0.., out_0..), filling out_j in place.

    priv_j are (T, n_bins) scratch arrays (unused when T == 1); out_j have n_bins elements.
    """
    return compile_kernel(("histogram", combine, k, parallel), lambda: _histogram_source(k), {"combine": combine},
                          parallel=parallel)


def histogram_threads(n: int, n_bins: int) -> int:
    """The documented rule: how many private histograms (1 = the sequential path)."""
    per_thread = max(host.MIN_CHUNK, ELEMENTS_PER_BIN * n_bins)
    return max(1, min(numba.get_num_threads(), n // per_thread))


def histogram(combine: Any, k: int, identity: Sequence[Any], n_bins: int, indices: np.ndarray,
              leaves: Sequence[np.ndarray], *, chunks: int | None = None, carry: Sequence[Any] | None = None) -> tuple:
    """Combine each element x_i = (leaves[0][i], ...) into bin indices[i], in input order.

    `indices` is a 1-D integer array as long as the leaves. Returns a tuple of k arrays of n_bins elements
    with the leaves' dtypes. `chunks` overrides the number of private histograms (1 = sequential). `carry`:
    the dtypes the bins are folded in (see host.carried_dtypes; `combine` takes and returns those, and
    each bin is rounded to its leaf's dtype once, at the end).
    """
    host.check_function(combine, "combine")
    k = host.check_count(k, "k")
    leaves = host.check_arrays(leaves, k, 1, "leaves")
    return _run(combine, k, identity, n_bins, indices, leaves, [a.dtype for a in leaves], chunks, carry)


def _run(combine: Any, k: int, identity: Sequence[Any], n_bins: int, indices: np.ndarray, xs: list[np.ndarray],
         dtypes: list[np.dtype], chunks: int | None, carry: Sequence[Any] | None) -> tuple:
    if not isinstance(n_bins, (int, np.integer)) or isinstance(n_bins, bool) or n_bins < 0:
        raise ValueError(f"n_bins must be an integer >= 0, got {n_bins!r}")
    (indices,) = host.check_arrays([indices], 1, 1, "indices")
    if indices.dtype.kind not in "iu":
        raise TypeError(f"indices must have an integer dtype, got {indices.dtype}")
    if indices.shape != xs[0].shape:
        raise ValueError(f"indices and leaves must have one length, got {indices.shape} and {xs[0].shape}")
    carried = host.carried_dtypes(carry, dtypes)
    ident = host.cast_identity(identity, carried)
    host.check_combine(combine, carried)
    n_bins, n = int(n_bins), indices.shape[0]
    if n == 0 or n_bins == 0:
        return tuple(np.full(n_bins, v, d) for v, d in zip(ident, dtypes, strict=True))
    bins = tuple(np.empty(n_bins, d) for d in carried)  # T == 1 folds into them in place
    T = histogram_threads(n, n_bins) if chunks is None else host.num_chunks(n, chunks)
    privates = [np.empty((T, n_bins) if T > 1 else (0, 0), d) for d in carried]
    histogram_kernel(combine, k, T > 1)(T, indices, *xs, *ident, *privates, *bins)
    return tuple(b.astype(d, copy=False) for b, d in zip(bins, dtypes, strict=True))
