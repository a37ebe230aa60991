"""Gradient checking for users and for fold's own tests (in the spirit of autograd's and JAX's check_grads).

`check_grads(f, args)` compares, in float64 with fixed seeds:
- `fold.jvp` against central finite differences along a random direction;
- `fold.vjp` against `fold.jvp` by the dot-product identity <ybar, J xdot> = <J^T ybar, xdot>;
- with `order=2`, the same checks on the function's gradient (forward over reverse).
`check_rules_agree(f, args)` checks that every reduce rule gives the same cotangents.
Each failure names the function, the mode, and both numbers.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .errors import FoldError
from .pytree import tree_flatten, tree_unflatten

TOLERANCES = {np.dtype("float64"): dict(rtol=1e-5, atol=1e-7), np.dtype("float32"): dict(rtol=2e-2, atol=1e-3)}


class GradientCheckError(FoldError, AssertionError):
    """A derivative disagreed with its reference."""


def _float_mask(leaves: list) -> list[bool]:
    return [np.issubdtype(np.asarray(x).dtype, np.floating) for x in leaves]


def _random_like(tree: Any, rng: np.random.Generator) -> Any:
    leaves, treedef = tree_flatten(tree)
    return tree_unflatten(treedef, [rng.standard_normal(np.shape(x)).astype(np.asarray(x).dtype)
                                    if m else np.zeros(np.shape(x), np.asarray(x).dtype)
                                    for x, m in zip(leaves, _float_mask(leaves), strict=True)])


def _vdot(a: Any, b: Any) -> float:
    la, _ = tree_flatten(a)
    lb, _ = tree_flatten(b)
    return float(sum(np.vdot(np.asarray(x, np.float64), np.asarray(y, np.float64)) for x, y in zip(la, lb, strict=True)))


def _axpy(alpha: float, x: Any, y: Any) -> Any:
    lx, treedef = tree_flatten(x)
    ly, _ = tree_flatten(y)
    return tree_unflatten(treedef, [
        (np.asarray(b) + alpha * np.asarray(a)).astype(np.asarray(b).dtype) if np.issubdtype(np.asarray(b).dtype, np.floating) else b
        for a, b in zip(lx, ly, strict=True)])


def _close(name: str, mode: str, got: float, want: float, rtol: float, atol: float) -> None:
    if not abs(got - want) <= atol + rtol * abs(want):
        raise GradientCheckError(f"{name}: {mode} gives {got!r}, reference {want!r} (difference {abs(got - want):.3g})")


def check_jvp(f: Callable, args: tuple, *, eps: float = 1e-6, seed: int = 0, rtol: float = 1e-5, atol: float = 1e-7) -> None:
    """jvp along a random direction against central finite differences (float64)."""
    import fold

    rng = np.random.default_rng(seed)
    direction = _random_like(args, rng)
    ydot = fold.jvp(f, args, direction)[1]
    plus = fold.run(f, *_axpy(eps, direction, args))
    minus = fold.run(f, *_axpy(-eps, direction, args))
    probe = _random_like(ydot, rng)
    fd = (_vdot(probe, plus) - _vdot(probe, minus)) / (2 * eps)
    _close(_name(f), "jvp vs finite differences", _vdot(probe, ydot), fd, rtol, atol)


def check_vjp(f: Callable, args: tuple, *, seed: int = 0, rtol: float = 1e-7, atol: float = 1e-9, reduce_rule: str = "auto") -> None:
    """vjp against jvp by the dot-product identity <ybar, J xdot> = <J^T ybar, xdot>."""
    import fold

    rng = np.random.default_rng(seed + 1)
    xdot = _random_like(args, rng)
    ydot = fold.jvp(f, args, xdot)[1]
    ybar = _random_like(ydot, rng)
    xbar = fold.vjp(f, *args, reduce_rule=reduce_rule)[1](ybar)
    _close(_name(f), f"vjp[{reduce_rule}] vs jvp (dot-product test)", _vdot(xbar, xdot), _vdot(ybar, ydot), rtol, atol)


def check_grads(f: Callable, args: tuple, *, order: int = 1, eps: float = 1e-6, seed: int = 0,
                rtol: float = 1e-5, atol: float = 1e-7) -> None:
    """Check fold's derivatives of `f` at `args` (float64 recommended): jvp against finite differences,
    vjp against jvp, and with `order=2` the same for the map x -> vjp(f, x, ybar) (second derivatives)."""
    check_jvp(f, args, eps=eps, seed=seed, rtol=rtol, atol=atol)
    check_vjp(f, args, seed=seed, rtol=max(rtol * 1e-2, 1e-9), atol=atol)
    if order >= 2:
        import fold

        rng = np.random.default_rng(seed + 2)
        ybar = _random_like(fold.run(f, *args), rng)
        first = _Named(lambda *xs: fold.vjp(f, *xs)[1](ybar), f"vjp of {_name(f)}")
        check_grads(first, args, order=order - 1, eps=eps, seed=seed + 3, rtol=rtol, atol=atol)


def check_rules_agree(f: Callable, args: tuple, *, rules: Sequence[str] = ("auto", "generic", "monoid"),
                      seed: int = 0, rtol: float = 1e-9, atol: float = 1e-12) -> dict:
    """vjp under each reduce rule that applies; raises unless all agree. Returns {rule: cotangents}."""
    import fold

    rng = np.random.default_rng(seed)
    ybar = _random_like(fold.run(f, *args), rng)
    results = {}
    for rule in rules:
        try:
            results[rule] = fold.vjp(f, *args, reduce_rule=rule)[1](ybar)
        except FoldError as err:
            if rule == "monoid" and "reduce_rule='monoid'" in str(err):
                continue  # the monoid rule does not apply to this program
            raise
    names = list(results)
    for other in names[1:]:
        for a, b in zip(tree_flatten(results[names[0]])[0], tree_flatten(results[other])[0], strict=True):
            if not np.allclose(a, b, rtol=rtol, atol=atol):
                raise GradientCheckError(f"{_name(f)}: reduce rules {names[0]} and {other} disagree by {np.max(np.abs(np.asarray(a) - np.asarray(b))):.3g}")
    return results


class _Named:
    def __init__(self, fn: Callable, name: str):
        self.fn, self.__name__ = fn, name

    def __call__(self, *args):
        return self.fn(*args)


def _name(f: Callable) -> str:
    return getattr(f, "__name__", type(f).__name__)
