"""One table of scalar partial derivatives, shared by jvp and vjp so the two modes cannot disagree.

`PARTIALS[op](args, out, wanted)` returns, for each argument, its partial derivative d out / d arg as an
expression: `ONE`, `MINUS_ONE`, an array expression, or None (zero). `wanted[i]` says whether argument i
needs one (so, e.g., `x ** 2` never builds log(x) for the constant exponent).

Ties: maximum/minimum give the whole derivative to the first argument when both are equal.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from fold import ops

ONE = "one"
MINUS_ONE = "minus_one"

Partials = Callable[[Sequence[Any], Any, Sequence[bool]], tuple]
PARTIALS: dict[str, Partials] = {}


def partials(*ops_names: str) -> Callable[[Partials], Partials]:
    def register(fn: Partials) -> Partials:
        for name in ops_names:
            if name in PARTIALS:
                raise ValueError(f"partials for {name} are already registered")
            PARTIALS[name] = fn
        return fn

    return register


def apply_partial(partial: Any, t: Any) -> Any:
    """partial * t, without multiplying by one."""
    if partial is ONE:
        return t
    if partial is MINUS_ONE:
        return -t
    return partial * t


@partials("add")
def _add(args, out, wanted):
    return ONE, ONE


@partials("sub")
def _sub(args, out, wanted):
    return ONE, MINUS_ONE


@partials("mul")
def _mul(args, out, wanted):
    x, y = args
    return y, x


@partials("div")
def _div(args, out, wanted):
    x, y = args
    return 1.0 / y, (-out / y if wanted[1] else None)


@partials("pow")
def _pow(args, out, wanted):
    x, y = args
    # y x^(y-1); 0 where y == 0 (x^0 is constant: 0 * 0^-1 would be NaN at x == 0), with x replaced there so
    # that no branch of the where is infinite (its derivative, in a second derivative, would be 0 * inf)
    if wanted[0] and isinstance(y, (np.ndarray, np.number, int, float)) and np.ndim(y) == 0:
        # a constant exponent (x ** 2) decides those cases now: no selection on a known condition is traced
        c = float(y)
        dx = None if c == 0 else (ONE if c == 1 else (c * x if c == 2 else c * x ** (c - 1)))
    elif wanted[0]:
        zero_exponent = y == 0
        safe_x = ops.where(zero_exponent, 1.0, x).astype(out.dtype)
        dx = ops.where(zero_exponent, 0.0, y * safe_x ** (y - 1)).astype(out.dtype)
    else:
        dx = None
    # d/dy x**y = out * log(x); at x == 0 the limit is 0 (for y > 0), not nan
    dy = ops.where(x == 0, 0.0, out * ops.log(ops.where(x == 0, 1.0, x))) if wanted[1] else None
    return dx, dy


@partials("maximum")
def _maximum(args, out, wanted):
    x, y = args
    first = x >= y
    return ops.where(first, 1.0, 0.0).astype(out.dtype), ops.where(first, 0.0, 1.0).astype(out.dtype)


@partials("minimum")
def _minimum(args, out, wanted):
    x, y = args
    first = x <= y
    return ops.where(first, 1.0, 0.0).astype(out.dtype), ops.where(first, 0.0, 1.0).astype(out.dtype)


@partials("logaddexp")
def _logaddexp(args, out, wanted):
    x, y = args
    # exp(x - out), made safe where x == out. Both +inf: split evenly instead of exp(nan). Both -inf: 0, as
    # the result stays -inf whatever finite change either gets; this also keeps (-inf, 0), the identity of
    # logaddexp lifted to (value, tangent) pairs, an identity there, so a fold's tangent does not depend on
    # how often its kernel combines the identity in.
    def weight(a, b):
        tie = ops.where(out == -np.inf, -np.inf, float(-np.log(2.0))).astype(out.dtype)
        shift = ops.where(a == out, ops.where(b == out, tie, 0.0).astype(out.dtype), a - out)
        return ops.exp(shift)

    return (weight(x, y) if wanted[0] else None), (weight(y, x) if wanted[1] else None)


@partials("neg")
def _neg(args, out, wanted):
    return (MINUS_ONE,)


@partials("abs")
def _abs(args, out, wanted):
    return (ops.sign(args[0]),)


@partials("exp")
def _exp(args, out, wanted):
    return (out,)


@partials("expm1")
def _expm1(args, out, wanted):
    return (out + 1.0,)


@partials("log")
def _log(args, out, wanted):
    return (1.0 / args[0],)


@partials("log1p")
def _log1p(args, out, wanted):
    return (1.0 / (1.0 + args[0]),)


@partials("sin")
def _sin(args, out, wanted):
    return (ops.cos(args[0]),)


@partials("cos")
def _cos(args, out, wanted):
    return (-ops.sin(args[0]),)


@partials("tanh")
def _tanh(args, out, wanted):
    return (1.0 - out * out,)


@partials("sqrt")
def _sqrt(args, out, wanted):
    return (0.5 / out,)


@partials("sigmoid")
def _sigmoid(args, out, wanted):
    return (out * (1.0 - out),)


@partials("mod")
def _mod(args, out, wanted):
    x, y = args
    return ONE, (-ops.elementwise("floordiv", x, y) if wanted[1] else None)


# piecewise constant, or boolean-valued: no derivative
ZERO_DERIVATIVE_OPS = frozenset({"sign", "floordiv", "lt", "le", "gt", "ge", "eq", "ne", "and", "or", "not"})
