"""vjp of a Python function of tracers, inside the current trace (used by rules that differentiate an operator),
and of one application of a fold's operator through the values it captures."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from fold import ops
from fold.inline import inline_program
from fold.ir import Program
from fold.tracing import trace_body

from .vjp import vjp_inline
from .zeros import aval_of, differentiable, instantiate


def active_captures(consts: Sequence[Any], activity: Sequence[bool]) -> tuple[int, ...]:
    """The positions of the float values a fold's operator captures (its leading `consts`) whose cotangents
    are wanted, from the statement's `activity` (ad.vjp.arg_activity)."""
    return tuple(i for i, (c, active) in enumerate(zip(consts, activity)) if active and differentiable(aval_of(c)))


def substituted(consts: Sequence[Any], wanted: Sequence[int], values: Sequence[Any]) -> list:
    """`consts` with the ones at positions `wanted` replaced by `values`."""
    out = list(consts)
    for i, v in zip(wanted, values, strict=True):
        out[i] = v
    return out


def vjp_of_application(body: Program, consts: Sequence[Any], wanted: Sequence[int], left: Sequence[Any],
                       right: Sequence[Any], cts: Sequence[Any], identity: Sequence[Any],
                       then: Callable[[list], list] = lambda y: y) -> tuple[list, list]:
    """Inside a map over elements: the cotangents of `right` and of the captured values at positions `wanted`
    for then(left . right), where . is the operator `body` with those values as variables (`then` may apply it
    again with them held fixed). An application with an identity operand gives them none: op(e, a) = a
    whatever they are; it is skipped, which also avoids 0 * inf there (t * logaddexp(a / t, b / t) at
    a = -inf: d(a / t)/dt is inf, its weight 0)."""
    k = len(right)

    def applied(*z):
        return then(inline_program(body, substituted(consts, wanted, z[k:]) + list(left) + list(z[:k])))

    primals = list(right) + [consts[i] for i in wanted]
    got = [instantiate(c, aval_of(p)) for c, p in zip(vjp_of_function(applied, primals, cts), primals, strict=True)]
    idle = _is_identity(left, identity) | _is_identity(right, identity)
    return got[:k], [ops.where(idle, 0.0, t).astype(aval_of(t).dtype) for t in got[k:]]


def _is_identity(leaves: Sequence[Any], identity: Sequence[Any]) -> Any:
    """Whether an element (its leaves) equals the fold's identity."""
    differs = [ops.sum(ops.convert(ops.not_equal(x, e), "int64")) for x, e in zip(leaves, identity, strict=True)]
    return sum(differs[1:], differs[0]) == 0


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
