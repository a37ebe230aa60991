"""Eager evaluation of one primitive on concrete arrays (fold functions called outside any trace)."""

from __future__ import annotations

import numpy as np

from fold.tracing import shape_rules

from . import numpy_impl  # noqa: F401  (registers the implementations)
from .interpreter import run_statement


def eval_primitive(prim, args: list[np.ndarray]) -> list[np.ndarray]:
    out_avals = shape_rules.lookup(prim)(prim, *[_aval(a) for a in args])
    return [np.asarray(o) for o in run_statement(prim, args, 0, list(out_avals))]


def _aval(a: np.ndarray):
    from fold.dtypes import ShapedArray

    return ShapedArray(tuple(a.shape), a.dtype)
