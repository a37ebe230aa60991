"""Scalar functions with NumPy's semantics (NaN propagation, -inf for log(0), stable logaddexp and sigmoid),
which the generated scalar programs call where Python's own operators and math functions differ from NumPy."""

import math

import numba

HELPERS = ("_maximum", "_minimum", "_logaddexp", "_sigmoid", "_log", "_log1p", "_sqrt", "_sign", "_mod")


@numba.njit(inline="always")
def _maximum(a, b):
    return a if (a >= b or a != a) else b


@numba.njit(inline="always")
def _minimum(a, b):
    return a if (a <= b or a != a) else b


@numba.njit(inline="always")
def _logaddexp(a, b):
    hi = a if a >= b else b
    if hi == -math.inf:
        return hi
    return hi + math.log1p(math.exp(-abs(a - b)))


@numba.njit(inline="always")
def _sigmoid(x):
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@numba.njit(inline="always")
def _log(x):
    if x > 0:
        return math.log(x)
    return -math.inf if x == 0 else math.nan


@numba.njit(inline="always")
def _log1p(x):
    if x > -1:
        return math.log1p(x)
    return -math.inf if x == -1 else math.nan


@numba.njit(inline="always")
def _sqrt(x):
    return math.sqrt(x) if x >= 0 else math.nan


@numba.njit(inline="always")
def _sign(x):
    return (x > 0) - (x < 0) if x == x else x


@numba.njit(inline="always")
def _mod(a, b):
    return a - (a // b) * b

