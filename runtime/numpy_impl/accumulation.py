"""Where NumPy folds float32 in one float32 chain per result, and the float64 accumulator that stops the drift.

NumPy sums float32 pairwise only along the axes innermost in memory. Everywhere else its recognised folds
keep one float32 running value per result: `np.cumsum`, `multiply.reduce`, `add.at` (reduce_by_index), a
sum over a matrix's first axis. Over 10^6 equal terms of 0.8153 those are 2e-3 to 3e-3 relative off,
where a pairwise sum is 1.5e-8. The numpy backend is the reference the other backends are checked
against, so its float32 folds accumulate in float64 there and round each result once (NumPy converts in
buffered blocks; a column sum of a 4096 x 4096 float32 matrix takes 11 ms instead of 4). Maximum and
minimum pick an operand and round nothing.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

WIDE = np.dtype(np.float64)
# Ufuncs whose every step rounds: a chain of them drifts.
_ROUNDING = (np.add, np.multiply, np.logaddexp)


def chain_dtype(ufunc: np.ufunc, dtype: np.dtype) -> np.dtype | None:
    """The dtype= for an accumulate or `at` of `ufunc` over `dtype` (always one chain per result): float64
    for float32 under a rounding ufunc, else None (NumPy's own)."""
    return WIDE if np.dtype(dtype) == np.float32 and ufunc in _ROUNDING else None


def reduce_dtype(ufunc: np.ufunc, x: np.ndarray, axes: Sequence[int]) -> np.dtype | None:
    """The dtype= for `ufunc.reduce` (np.sum for np.add) of x over `axes`: as chain_dtype, except for a sum
    over the axes innermost in memory, which NumPy adds pairwise."""
    if chain_dtype(ufunc, x.dtype) is None or (ufunc is np.add and _summed_pairwise(x, axes)):
        return None
    return WIDE


def _summed_pairwise(x: np.ndarray, axes: Sequence[int]) -> bool:
    """Whether `axes` are the trailing axes of a C-contiguous x or the leading ones of an F-contiguous x."""
    axes = sorted(a % x.ndim for a in axes) if x.ndim else []
    trailing, leading = list(range(x.ndim - len(axes), x.ndim)), list(range(len(axes)))
    return (x.flags.c_contiguous and axes == trailing) or (x.flags.f_contiguous and axes == leading)
