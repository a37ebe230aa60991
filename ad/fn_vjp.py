"""vjp of a Python function of tracers, inside the current trace (used by rules that differentiate an operator)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from fold.tracing import trace_body

from .vjp import vjp_inline
from .zeros import aval_of, differentiable


def active_captures(consts: Sequence[Any], activity: Sequence[bool]) -> tuple[int, ...]:
    """The positions of the float values a fold's operator captures (its leading `consts`) whose cotangents
    are wanted, from the statement's `activity` (ad.vjp.arg_activity)."""
    return tuple(i for i, (c, active) in enumerate(zip(consts, activity)) if active and differentiable(aval_of(c)))


def is_identity(leaves: Sequence[Any], identity: Sequence[Any]) -> Any:
    """Inside a map over elements: whether an element (its leaves) equals the fold's identity. The operator
    applied to the identity gives the other operand whatever the captured values are, so that application
    adds nothing to their cotangents; skipping it also avoids 0 * inf there (t * logaddexp(a / t, b / t)
    at a = -inf: d(a / t)/dt is inf, its weight 0)."""
    from fold import ops

    differs = [ops.sum(ops.convert(ops.not_equal(x, e), "int64")) for x, e in zip(leaves, identity, strict=True)]
    total = differs[0]
    for d in differs[1:]:
        total = total + d
    return total == 0


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
