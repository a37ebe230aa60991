"""vjp of a Python function of tracers, inside the current trace (used by rules that differentiate an operator)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from fold.tracing import trace_body

from .vjp import vjp_inline
from .zeros import aval_of


def vjp_of_function(fn: Callable[..., list], primals: Sequence[Any], cts: Sequence[Any]) -> list:
    """Cotangents of `primals` for `fn(*primals)` (a list of leaves) given output cotangents `cts`.

    Values `fn` closes over are captured by the trace and treated as constants.
    """
    traced = trace_body(lambda *xs: list(fn(*xs)), [aval_of(p) for p in primals], "operator vjp")
    nc = len(traced.consts)
    _, in_cts = vjp_inline(traced.program, list(traced.consts) + list(primals), list(cts))
    return in_cts[nc:]
