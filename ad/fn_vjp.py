"""vjp of a Python function of tracers, inside the current trace (used by rules that differentiate an operator)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from fold.tracing import trace_body

from .vjp import vjp_inline
from .zeros import aval_of


def vjp_of_function(fn: Callable[..., list], primals: Sequence[Any], cts: Sequence[Any],
                    wrt: Sequence[bool] | None = None) -> list:
    """Cotangents of `primals` for `fn(*primals)` (a list of leaves) given output cotangents `cts`; only
    those marked in `wrt` (default: all) are wanted, the others are `Zero`.

    Values `fn` closes over are captured by the trace and treated as constants.
    """
    traced = trace_body(lambda *xs: list(fn(*xs)), [aval_of(p) for p in primals], "operator vjp")
    nc = len(traced.consts)
    wanted = [False] * nc + (list(wrt) if wrt is not None else [True] * len(primals))
    _, in_cts = vjp_inline(traced.program, list(traced.consts) + list(primals), list(cts), wanted)
    return in_cts[nc:]
