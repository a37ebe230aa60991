"""Column sums of a tall 2-D float array: out[j] = x[0, j] + x[1, j] + ... + x[n-1, j].

The rows are split into T contiguous chunks (prange); each thread adds its rows into a private row of
partial sums (contiguous, so the inner loop is vectorised and stays in cache), and the T partial rows are
added in chunk order. NumPy's own sum over axis 0 makes the same row-by-row pass on one thread; a
gradient's reduction over a batch (k-means' per-centroid counts over 10^6 points) is such a sum. The
partial sums are float64 for float32 input too, rounded once at the end: a float32 running total over 10^6
rows drifts by 1e-3 (NumPy's does).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import host
from .checked_cache import cached_njit


def _column_sums_source(T, x, partial):
    n, c = x.shape
    for t in prange(T):
        for j in range(c):
            partial[t, j] = 0.0
        for i in range(t * n // T, (t + 1) * n // T):
            for j in range(c):
                partial[t, j] += x[i, j]
    out = partial[0].copy()
    for t in range(1, T):
        for j in range(c):
            out[j] += partial[t, j]
    return out


_KERNEL = cached_njit(_column_sums_source, parallel=True, error_model="numpy")


def column_sums(x: np.ndarray, *, chunks: int | None = None) -> np.ndarray:
    """The sum over the first axis of a C-contiguous 2-D float array (float32 or float64), of its dtype.

    `chunks` overrides the number of row chunks (default: one per Numba thread, see host.num_chunks)."""
    (x,) = host.check_arrays([x], 1, 2, "x")
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"x must be a float32 or float64 array, got dtype {x.dtype}")
    n, c = x.shape
    if n == 0 or c == 0:
        return np.zeros(c, x.dtype)
    T = min(n, host.num_chunks(n * c, None)) if chunks is None else host.num_chunks(n, chunks)
    return _KERNEL(T, x, np.empty((T, c), np.float64)).astype(x.dtype, copy=False)
