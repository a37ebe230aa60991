"""Symbolic zeros: a tangent or cotangent known to be zero is a `Zero`, never an array of zeros.

Rules skip all-zero inputs; `instantiate` makes a real (broadcast, so cheap) zero only where one is needed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fold import ops
from fold.dtypes import ShapedArray, is_float


class Zero:
    __slots__ = ("aval",)

    def __init__(self, aval: ShapedArray):
        self.aval = aval

    def __repr__(self) -> str:
        return f"Zero({self.aval})"


def is_zero(x: Any) -> bool:
    return x is None or isinstance(x, Zero)


def aval_of(x: Any) -> ShapedArray:
    return x.aval if hasattr(x, "aval") else ShapedArray(tuple(np.shape(x)), np.asarray(x).dtype)


def zeros(aval: ShapedArray) -> Any:
    return ops.broadcast_to(np.zeros((), aval.dtype), aval.shape)


def instantiate(x: Any, aval: ShapedArray) -> Any:
    return zeros(aval) if is_zero(x) else x


def add_any(a: Any, b: Any) -> Any:
    """Sum of two (co)tangents, either of which may be a symbolic zero."""
    if is_zero(a):
        return b
    if is_zero(b):
        return a
    return a + b


def differentiable(aval: ShapedArray) -> bool:
    """Only floating-point values carry tangents and cotangents; integers and booleans have none."""
    return is_float(aval.dtype)
