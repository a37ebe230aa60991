"""JAX's transformations in fold, checked without JAX: vmap against a Python loop over the batch axis,
jacfwd/jacrev/hessian against central finite differences and each other, linearize and the vjp/jvp contracts
(pullback called again and under fold.jit, has_aux, lists, integer primals), and static arguments passed
through grad, jacobians and vmap under fold.jit. tests/test_jax_parity.py runs the same against JAX where
it is installed.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import fold

RNG = np.random.default_rng(42)
X = RNG.normal(size=4)
W = RNG.normal(size=(3, 4))


def mlp(x, w):
    return fold.tanh(w @ x)


def scalar(x, w):
    return fold.sum(fold.sin(w @ x) * fold.exp(x[0]))


def numeric_jacobian(f, x, eps=1e-6):
    """Central differences: (out_shape + in_shape)."""
    y = np.asarray(f(x))
    jac = np.zeros(y.shape + x.shape)
    for idx in np.ndindex(x.shape):
        dx = np.zeros_like(x)
        dx[idx] = eps
        jac[(...,) + idx] = (np.asarray(f(x + dx)) - np.asarray(f(x - dx))) / (2 * eps)
    return jac


# ------------------------------------------------------------------------------------------ vjp and jvp


def test_vjp_returns_output_and_a_reusable_pullback() -> None:
    y, pullback = fold.vjp(mlp, X, W)
    np.testing.assert_allclose(y, np.tanh(W @ X))
    for ct in (np.ones(3), RNG.normal(size=3)):
        gx, gw = pullback(ct)
        d = (1 - np.tanh(W @ X) ** 2) * ct
        np.testing.assert_allclose(gx, W.T @ d)
        np.testing.assert_allclose(gw, np.outer(d, X))


def test_pullback_under_jit_and_inside_a_trace() -> None:
    _, pullback = fold.vjp(mlp, X, W)
    ct = RNG.normal(size=3)
    jitted = fold.jit(lambda c: pullback(c)[0])
    np.testing.assert_allclose(jitted(ct), pullback(ct)[0])
    np.testing.assert_allclose(jitted(2 * ct), pullback(2 * ct)[0])

    def inside(x):  # vjp of traced primals, the pullback called in the same trace
        y, pb = fold.vjp(mlp, x, W)
        return pb(y)[0]

    want = W.T @ ((1 - np.tanh(W @ X) ** 2) * np.tanh(W @ X))
    np.testing.assert_allclose(fold.jit(inside)(X), want)


def test_jvp_returns_output_and_tangent_and_takes_lists() -> None:
    t = RNG.normal(size=4)
    y, ydot = fold.jvp(mlp, (X, W), (t, np.zeros_like(W)))
    np.testing.assert_allclose(y, np.tanh(W @ X))
    np.testing.assert_allclose(ydot, (1 - np.tanh(W @ X) ** 2) * (W @ t))
    y2, ydot2 = fold.jvp(mlp, [X, W], [t, np.zeros_like(W)])
    np.testing.assert_allclose(ydot2, ydot)


def test_integer_primals_take_none_float0_or_zeros() -> None:
    f = lambda x, i: x * i  # noqa: E731
    ints = np.arange(4)
    t = np.ones(4)
    want = fold.jvp(f, (X, ints), (t, np.zeros(4, np.int64)))
    for tangent in (None, np.zeros(4, dtype=[("float0", "V")])):
        y, ydot = fold.jvp(f, (X, ints), (t, tangent))
        np.testing.assert_allclose(ydot, want[1])
        np.testing.assert_allclose(y, X * ints)
    with pytest.raises(fold.FoldTypeError, match=re.escape("tangent 0 is None, but primal 0 has float leaves")):
        fold.jvp(f, (X, ints), (None, None))
    with pytest.raises(fold.StructureError, match="got 2 primals but 1 tangents"):
        fold.jvp(f, (X, ints), (t,))


def test_has_aux_everywhere() -> None:
    f = lambda x: (fold.sum(x * x), {"double": x * 2})  # noqa: E731
    (value, aux), g = fold.value_and_grad(f, has_aux=True)(X)
    np.testing.assert_allclose(value, np.sum(X * X))
    np.testing.assert_allclose(aux["double"], 2 * X)
    np.testing.assert_allclose(g, 2 * X)
    g2, aux2 = fold.grad(f, has_aux=True)(X)
    np.testing.assert_allclose(g2, 2 * X)
    np.testing.assert_allclose(aux2["double"], 2 * X)
    y, pullback, aux3 = fold.vjp(f, X, has_aux=True)
    np.testing.assert_allclose(pullback(1.0)[0], 2 * X)
    np.testing.assert_allclose(aux3["double"], 2 * X)
    y, ydot, aux4 = fold.jvp(f, (X,), (np.ones(4),), has_aux=True)
    np.testing.assert_allclose(ydot, 2 * X.sum())
    jac, aux5 = fold.jacrev(lambda x: (x * x, x[0]), has_aux=True)(X)
    np.testing.assert_allclose(jac, np.diag(2 * X))
    np.testing.assert_allclose(aux5, X[0])
    with pytest.raises(fold.StructureError, match="must return a pair"):
        fold.grad(lambda x: fold.sum(x), has_aux=True)(X)


# ------------------------------------------------------------------------------------------ Jacobians


@pytest.mark.parametrize("jac", [fold.jacfwd, fold.jacrev], ids=["jacfwd", "jacrev"])
def test_jacobians_against_finite_differences(jac) -> None:
    got = jac(mlp)(X, W)
    np.testing.assert_allclose(got, numeric_jacobian(lambda x: np.tanh(W @ x), X), rtol=1e-6, atol=1e-8)
    gw = jac(mlp, argnums=1)(X, W)
    assert gw.shape == (3, 3, 4)
    np.testing.assert_allclose(gw, numeric_jacobian(lambda w: np.tanh(w @ X), W), rtol=1e-6, atol=1e-8)
    both = jac(mlp, argnums=(0, 1))(X, W)
    assert isinstance(both, tuple) and len(both) == 2
    np.testing.assert_allclose(both[1], gw)


def test_jacobian_layout_follows_the_pytrees() -> None:
    f = lambda p: {"a": p["u"] * p["v"][0], "b": fold.sum(p["u"])}  # noqa: E731
    p = {"u": X, "v": np.array([2.0, 3.0])}
    for jac in (fold.jacfwd, fold.jacrev):
        J = jac(f)(p)
        assert J["a"]["u"].shape == (4, 4) and J["a"]["v"].shape == (4, 2) and J["b"]["u"].shape == (4,)
        np.testing.assert_allclose(J["a"]["u"], 2.0 * np.eye(4))
        np.testing.assert_allclose(J["a"]["v"][:, 0], X)
        np.testing.assert_allclose(J["a"]["v"][:, 1], 0.0)
        np.testing.assert_allclose(J["b"]["u"], np.ones(4))


def test_hessian_against_finite_differences_of_the_gradient() -> None:
    H = fold.hessian(scalar)(X, W)
    grad = fold.grad(scalar)
    np.testing.assert_allclose(H, numeric_jacobian(lambda x: grad(x, W), X), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(H, H.T, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fold.jacrev(fold.jacfwd(scalar))(X, W), H, rtol=1e-10, atol=1e-12)


def test_linearize() -> None:
    y, f_jvp = fold.linearize(mlp, X, W)
    np.testing.assert_allclose(y, np.tanh(W @ X))
    for t in (np.ones(4), RNG.normal(size=4)):
        np.testing.assert_allclose(f_jvp(t, np.zeros_like(W)), fold.jvp(mlp, (X, W), (t, np.zeros_like(W)))[1])


# ------------------------------------------------------------------------------------------ vmap


def test_vmap_matches_a_loop() -> None:
    xs = RNG.normal(size=(5, 4))
    got = fold.vmap(mlp, in_axes=(0, None))(xs, W)
    np.testing.assert_allclose(got, np.stack([np.tanh(W @ x) for x in xs]))
    got_t = fold.vmap(mlp, in_axes=(1, None), out_axes=1)(xs.T, W)
    np.testing.assert_allclose(got_t, got.T)
    ws = RNG.normal(size=(5, 3, 4))
    np.testing.assert_allclose(fold.vmap(mlp)(xs, ws), np.stack([np.tanh(w @ x) for x, w in zip(xs, ws)]))


def test_vmap_pytrees_and_static_arguments() -> None:
    xs = RNG.normal(size=(5, 4))
    f = lambda p, n: fold.sum(p["x"] * p["s"]) * n  # noqa: E731
    got = fold.vmap(f, in_axes=({"x": 0, "s": None}, None))({"x": xs, "s": 2.0}, 3)
    np.testing.assert_allclose(got, 6.0 * xs.sum(1))
    loops = fold.vmap(lambda x, n: fold.loop(lambda i, s: s * x, x, n), in_axes=(0, None))
    np.testing.assert_allclose(loops(xs, 2), xs ** 3)


def test_vmap_of_grad_and_grad_of_vmap() -> None:
    xs = RNG.normal(size=(5, 4))
    per_row = fold.vmap(fold.grad(scalar), in_axes=(0, None))(xs, W)
    np.testing.assert_allclose(per_row, np.stack([fold.grad(scalar)(x, W) for x in xs]), rtol=1e-12)
    total = fold.grad(lambda xs: fold.sum(fold.vmap(scalar, in_axes=(0, None))(xs, W)))(xs)
    np.testing.assert_allclose(total, per_row, rtol=1e-12)


@pytest.mark.parametrize("in_axes, args, message", [
    ((0,), (X, W), "in_axes has 1 entries, but the function was called with 2 positional arguments"),
    ((0, 2), (X, W), "in_axes=2 for argument 1, which has shape (3, 4) (2 axes)"),
    ((0, 0), (X, W), "mapped axes have different sizes: argument 1 has 3 on axis 0, but an earlier argument has 4"),
    ((None, None), (X, W), "in_axes maps no argument"),
    ("rows", (X, W), "in_axes must be an int, None, or a tuple/list"),
    ((0.5, None), (X, W), "in_axes for argument 0 is 0.5"),
])
def test_vmap_bad_axes_are_named(in_axes, args, message) -> None:
    with pytest.raises(fold.FoldError, match=re.escape(message)):
        fold.vmap(mlp, in_axes=in_axes)(*args)


# ------------------------------------------------------------------------------------------ static arguments


def looped(x, n):
    return fold.sum(fold.loop(lambda i, s: s * x, x, n))  # sum(x ** (n + 1))


@pytest.mark.parametrize("transform", [fold.grad, fold.jacfwd, fold.jacrev, fold.hessian],
                         ids=["grad", "jacfwd", "jacrev", "hessian"])
def test_static_argnums_through_transformations(transform) -> None:
    x = np.abs(X) + 0.5
    want = {fold.grad: 4 * x ** 3, fold.jacfwd: 4 * x ** 3, fold.jacrev: 4 * x ** 3, fold.hessian: np.diag(12 * x ** 2)}
    by_number = fold.jit(transform(looped), static_argnums=1)
    by_name = fold.jit(transform(looped), static_argnames="n")
    np.testing.assert_allclose(by_number(x, 3), want[transform])
    np.testing.assert_allclose(by_name(x, n=3), want[transform])
    np.testing.assert_allclose(transform(looped)(x, 3), want[transform])  # outside jit: a Python int as it is
    assert by_number.trace_count == 1
    by_number(x, 3)
    assert by_number.trace_count == 1


def test_value_and_grad_with_a_static_count_and_a_flag() -> None:
    def f(x, n, square):
        y = fold.loop(lambda i, s: s * x, x, n)
        return fold.sum(y * y if square else y)

    value, g = fold.jit(fold.value_and_grad(f), static_argnums=(1, 2))(X, 2, True)
    np.testing.assert_allclose(value, np.sum(X ** 6))
    np.testing.assert_allclose(g, 6 * X ** 5)


def test_jit_static_argnames_errors() -> None:
    with pytest.raises(fold.FoldTypeError, match=r"static_argnames names \['m'\]"):
        fold.jit(looped, static_argnames="m")
