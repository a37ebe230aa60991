"""Reverse mode differentiates only what depends on the inputs asked for, and folds through the values their
operators capture.

A reduce, scan or reduce_by_index operator may capture a float (a parameter of the operator). The generic
rules give that value's cotangent (the monoid rule refuses: D knows only the elements). A gradient with
respect to the elements alone treats the captured value as a constant. The operator used here,
a . b = a + b + t a b  (identity 0), is associative for every t: 1 + t (a . b) = (1 + t a)(1 + t b), so the
reference values below are products, computed by NumPy apart from fold.
"""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.testing import check_grads

RULES = ("auto", "generic")


def combine(t):
    return lambda a, b: a + b + t * a * b


def fold_reference(x, t):
    """a . b . ... over the last axis, by the closed form."""
    return (np.prod(1.0 + t * x, axis=-1) - 1.0) / t


def central_difference(f, x, eps=1e-6):
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[i] = eps
        grad[i] = (f(x + step) - f(x - step)) / (2 * eps)
    return grad


@pytest.fixture
def x():
    return np.random.default_rng(7).uniform(-0.5, 0.5, 6)


@pytest.mark.parametrize("rule", RULES)
def test_reduce_gradient_with_a_captured_argument_held_fixed(x, rule):
    t = 0.7

    def f(x, t):
        return fold.reduce(combine(t), x, identity=0.0)

    assert np.isclose(fold.run(f, x, t), fold_reference(x, t), rtol=1e-12)
    got = fold.grad(f, argnums=0, reduce_rule=rule)(x, t)
    want = central_difference(lambda v: fold_reference(v, t), x)
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("rule", RULES)
def test_scan_gradient_with_a_captured_argument_held_fixed(x, rule):
    t, w = -0.4, np.linspace(0.5, 1.5, x.size)

    def f(x, t):
        return fold.reduce(fold.monoids.sum, fold.scan(combine(t), x, identity=0.0) * w)

    def reference(v):
        return float(np.sum(np.array([fold_reference(v[: k + 1], t) for k in range(v.size)]) * w))

    got = fold.grad(f, argnums=0, reduce_rule=rule)(x, t)
    np.testing.assert_allclose(got, central_difference(reference, x), rtol=1e-7, atol=1e-9)


def test_reduce_by_index_gradient_with_a_captured_argument_held_fixed(x):
    t, bins = 1.3, np.array([0, 2, 0, 1, 2, 2])
    w = np.array([1.0, -2.0, 0.5])

    def f(x, t):
        return fold.reduce(fold.monoids.sum, fold.reduce_by_index(combine(t), 3, bins, x, identity=0.0) * w)

    def reference(v):
        return float(sum(w[b] * fold_reference(v[bins == b], t) for b in range(3)))

    got = fold.grad(f, argnums=0)(x, t)
    np.testing.assert_allclose(got, central_difference(reference, x), rtol=1e-7, atol=1e-9)


def test_a_map_passes_activity_into_its_body():
    """The map captures t and its body's reduce operator captures it again: still a constant for grad in X."""
    X, t = np.random.default_rng(3).uniform(-0.5, 0.5, (4, 5)), 0.9

    def f(X, t):
        rows = fold.map(lambda row: fold.reduce(combine(t), row * t, identity=0.0), X)
        return fold.reduce(fold.monoids.sum, rows)

    got = fold.grad(f)(X, t)
    np.testing.assert_allclose(got, central_difference(lambda V: float(np.sum(fold_reference(V * t, t))), X),
                               rtol=1e-7, atol=1e-9)


def test_a_loop_passes_activity_into_its_body(x):
    t = 0.5

    def f(x, t):
        return fold.loop(lambda i, s: s * fold.reduce(combine(t), s, identity=0.0), x, 2)[0]

    def reference(v):
        for _ in range(2):
            v = v * fold_reference(v, t)
        return v[0]

    got = fold.grad(f)(x, t)
    np.testing.assert_allclose(got, central_difference(reference, x), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("rule", RULES)
def test_reduce_gradient_through_the_captured_value(x, rule):
    """y = ((prod (1 + t x_i)) - 1) / t: d/dt by the generic rule's sum over the operator's applications."""
    def f(x, t):
        return fold.reduce(combine(t), x, identity=0.0)

    gx, gt = fold.grad(f, argnums=(0, 1), reduce_rule=rule)(x, 0.7)
    np.testing.assert_allclose(gx, central_difference(lambda v: fold_reference(v, 0.7), x), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(gt, central_difference(lambda t: fold_reference(x, t), np.array(0.7)), rtol=1e-7)
    check_grads(f, (x, 0.7))  # jvp against finite differences, vjp against jvp
    check_grads(f, (x[:0], 0.7))  # no elements: y = 0 whatever t is
    with pytest.raises(fold.FoldError, match=r"reduce_rule='monoid' cannot differentiate the reduce with respect "
                                             r"to values its operator captures \(f64\[\]\)"):
        fold.grad(f, argnums=(0, 1), reduce_rule="monoid")(x, 0.7)


def test_per_row_captured_values_in_a_map():
    """Each row's reduce captures its own t (a row of the map's second input): both gradients, second order
    (reverse over reverse differentiates the generic rule's scans through t), and forward over reverse."""
    rng = np.random.default_rng(5)
    X, T = rng.uniform(-0.5, 0.5, (3, 4)), rng.uniform(0.2, 1.0, 3)

    def f(X, T):
        return fold.map(lambda row, t: fold.reduce(combine(t), row, identity=0.0), X, T)

    check_grads(f, (X, T), order=2)
    total = lambda X, T: fold.reduce(fold.monoids.sum, f(X, T))  # noqa: E731
    gT = fold.grad(total, argnums=1)(X, T)
    want = [central_difference(lambda t: fold_reference(X[r], t), np.array(T[r])) for r in range(3)]
    np.testing.assert_allclose(gT, want, rtol=1e-7)
    dT = np.array([1.0, -0.5, 0.25])
    hvp = fold.jvp(lambda T: fold.grad(total, argnums=1)(X, T), (T,), (dT,))[1]
    grad_at = lambda T: fold.grad(total, argnums=1)(X, T)  # noqa: E731
    np.testing.assert_allclose(hvp, (grad_at(T + 1e-5 * dT) - grad_at(T - 1e-5 * dT)) / 2e-5, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("form", [{}, {"reverse": True}, {"exclusive": True}, {"reverse": True, "exclusive": True}],
                         ids=["inclusive", "reverse", "exclusive", "reverse exclusive"])
def test_scan_gradient_through_the_captured_value(x, rule, form):
    t, w = 0.7, np.linspace(0.5, 1.5, x.size)

    def f(x, t):
        return fold.reduce(fold.monoids.sum, fold.scan(combine(t), x, identity=0.0, **form) * w)

    def reference(x, t):
        ordered = x[::-1] if form.get("reverse") else x
        prefixes = [fold_reference(ordered[:k], t) if k else 0.0 for k in range(x.size + 1)]
        scanned = np.array(prefixes[:-1] if form.get("exclusive") else prefixes[1:])
        return float(np.sum((scanned[::-1] if form.get("reverse") else scanned) * w))

    gx, gt = fold.grad(f, argnums=(0, 1), reduce_rule=rule)(x, t)
    np.testing.assert_allclose(gx, central_difference(lambda v: reference(v, t), x), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(gt, central_difference(lambda s: reference(x, s), np.array(t)), rtol=1e-7, atol=1e-9)
    check_grads(lambda x, t: fold.scan(combine(t), x, identity=0.0, **form), (x, t))


def test_reverse_over_reverse_through_a_captured_value(x):
    """The gradient of a reduce holds the generic rule's scans of the same operator: they too give t a cotangent."""
    t = 0.7

    def f(x, t):
        return fold.reduce(combine(t), x, identity=0.0)

    second = fold.grad(lambda x, t: fold.reduce(fold.monoids.sum, fold.grad(f)(x, t)), argnums=1)(x, t)

    def gradient_total(s):  # sum_i prod_{j != i} (1 + s x_j), the closed form of sum(grad f)
        return float(np.sum([np.prod(1 + s * np.delete(x, i)) for i in range(x.size)]))

    np.testing.assert_allclose(second, central_difference(gradient_total, np.array(t)), rtol=1e-7)
    check_grads(f, (x, t), order=2)


@pytest.mark.parametrize("rule", RULES)
def test_reduce_by_index_gradient_through_the_captured_value(x, rule):
    t, bins, w = 1.3, np.array([0, 2, 0, 1, 2, 2]), np.array([1.0, -2.0, 0.5])

    def f(x, t):
        return fold.reduce(fold.monoids.sum, fold.reduce_by_index(combine(t), 3, bins, x, identity=0.0) * w)

    def reference(x, t):
        return float(sum(w[b] * fold_reference(x[bins == b], t) for b in range(3)))

    gx, gt = fold.grad(f, argnums=(0, 1), reduce_rule=rule)(x, t)
    np.testing.assert_allclose(gx, central_difference(lambda v: reference(v, t), x), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(gt, central_difference(lambda s: reference(x, s), np.array(t)), rtol=1e-7, atol=1e-9)
    check_grads(lambda x, t: fold.reduce_by_index(combine(t), 3, bins, x, identity=0.0), (x, t))
    with pytest.raises(fold.FoldError, match=r"reduce_rule='monoid' cannot differentiate the reduce_by_index with "
                                             r"respect to values its operator captures"):
        fold.grad(f, argnums=1, reduce_rule="monoid")(x, t)


def test_a_stopped_captured_value_is_a_constant(x):
    """stop_gradient cuts the dependence on t, so asking for t's gradient gives 0 rather than the error."""
    def f(x, t):
        return fold.reduce(combine(fold.stop_gradient(t)), x, identity=0.0)

    gx, gt = fold.grad(f, argnums=(0, 1))(x, 0.7)
    np.testing.assert_allclose(gx, central_difference(lambda v: fold_reference(v, 0.7), x), rtol=1e-7, atol=1e-9)
    assert gt == 0.0


def test_hessian_vector_product_through_a_captured_parameter(x):
    """grad inside jvp: the inner grad's program captures t from the outer trace, as a constant."""
    t, v = 0.7, np.linspace(-1.0, 1.0, x.size)

    def f(x, t):
        return fold.reduce(combine(t), x, identity=0.0)

    hvp = fold.jvp(lambda x: fold.grad(f)(x, t), (x,), (v,))[1]
    grad_reference = lambda u: central_difference(lambda w: fold_reference(w, t), u, eps=1e-5)  # noqa: E731
    want = (grad_reference(x + 1e-4 * v) - grad_reference(x - 1e-4 * v)) / 2e-4
    np.testing.assert_allclose(hvp, want, rtol=1e-5, atol=1e-7)


def _tempered_logaddexp(t):
    return lambda a, b: t * fold.logaddexp(a / t, b / t)


@pytest.mark.parametrize("kind", ["reduce", "scan", "reduce_by_index"])
def test_an_infinite_identity_gives_no_nan_through_the_captured_value(kind):
    """t * logaddexp(a / t, b / t) from identity -inf (a temperature): the operator applied to the identity
    would give 0 * inf in t's derivative; those applications add nothing, and are skipped."""
    x, t, bins = np.array([0.3, -1.2, 0.8, 2.0]), 0.7, np.array([0, 0, 1, 1])
    programs = {
        "reduce": (lambda x, t: fold.reduce(_tempered_logaddexp(t), x, identity=-np.inf),
                   lambda x, t: t * np.log(np.sum(np.exp(x / t)))),
        "scan": (lambda x, t: fold.reduce(fold.monoids.sum, fold.scan(_tempered_logaddexp(t), x, identity=-np.inf)),
                 lambda x, t: sum(t * np.log(np.sum(np.exp(x[: k + 1] / t))) for k in range(x.size))),
        "reduce_by_index": (lambda x, t: fold.reduce(fold.monoids.sum, fold.reduce_by_index(
            _tempered_logaddexp(t), 2, bins, x, identity=-np.inf)),
            lambda x, t: sum(t * np.log(np.sum(np.exp(x[bins == b] / t))) for b in range(2))),
    }
    f, reference = programs[kind]
    gx, gt = fold.grad(f, argnums=(0, 1))(x, t)
    np.testing.assert_allclose(gt, central_difference(lambda s: reference(x, s), np.array(t)), rtol=1e-7)
    np.testing.assert_allclose(gx, central_difference(lambda v: reference(v, t), x), rtol=1e-7, atol=1e-9)
    if kind == "reduce":
        assert fold.grad(f, argnums=1)(x[:1], t) == 0.0  # one element: x_0 whatever t is


def test_a_monoid_whose_d_captures_a_traced_value_takes_the_generic_rule(x):
    """d is called in the gradient's own trace, where the t its closure holds from f's trace would escape:
    such a monoid takes the generic rule (reduce_rule='monoid' says why), whether t is differentiated or not."""
    def f(x, t):
        tsum = fold.Monoid(combine(t), 0.0, commutative=True, d=lambda c, a, g: g * (1 + t * c) / (1 + t * a),
                           name="tsum")
        return fold.reduce(tsum, x)

    want = central_difference(lambda v: fold_reference(v, 0.7), x)
    np.testing.assert_allclose(fold.grad(f)(x, 0.7), want, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(fold.grad(f, argnums=(0, 1))(x, 0.7)[0], want, rtol=1e-7, atol=1e-9)
    with pytest.raises(fold.FoldError, match=r"reduce_rule='monoid' cannot differentiate the reduce with operator "
                                             r"tsum: its operator captures traced values, which its d cannot be given"):
        fold.grad(f, reduce_rule="monoid")(x, 0.7)
