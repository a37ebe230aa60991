"""NumPy's reductions and cumulative functions inside traced functions (fold/numpy_reductions.py): each
against NumPy on random inputs over every axis form, with keepdims and where=, and their gradients against
finite differences (fold.testing.check_grads)."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.testing import check_grads

RNG = np.random.default_rng(3)
X = RNG.normal(size=(3, 4, 5))
AXES = [None, 0, 1, -1, (0, 2), ()]


@pytest.mark.parametrize("name", ["sum", "prod", "max", "min", "mean", "var", "std", "any", "all"])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_match_numpy(name, axis, keepdims) -> None:
    fn = getattr(np, name)
    x = X > 0.3 if name in ("any", "all") else X
    got = fold.run(lambda x: fn(x, axis=axis, keepdims=keepdims), x)
    want = fn(x, axis=axis, keepdims=keepdims)
    assert np.shape(got) == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["max", "min", "prod", "std", "any", "all", "argmax", "argmin", "cumsum", "cumprod"])
def test_methods_match_numpy(name) -> None:
    got = fold.run(lambda x: getattr(x, name)(axis=1), X)
    np.testing.assert_allclose(got, getattr(X, name)(axis=1), rtol=1e-12)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_arg_extremes_match_numpy_ties_included(name, axis) -> None:
    ties = np.round(RNG.normal(size=(4, 6)))  # many equal values: the first index wins, as NumPy's
    for x in (X[0], ties, ties.astype(np.int64)):
        got = fold.run(lambda x: getattr(np, name)(x, axis=axis), x)
        np.testing.assert_array_equal(got, getattr(np, name)(x, axis=axis))
        assert np.asarray(got).dtype == np.int64
    kept = fold.run(lambda x: getattr(np, name)(x, axis=axis, keepdims=True), ties)
    np.testing.assert_array_equal(kept, getattr(np, name)(ties, axis=axis, keepdims=True))


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1])
def test_cumulative_match_numpy(name, axis) -> None:
    got = fold.run(lambda x: getattr(np, name)(x, axis=axis), X)
    np.testing.assert_allclose(got, getattr(np, name)(X, axis=axis), rtol=1e-12)
    ints = np.arange(60, dtype=np.int32).reshape(3, 4, 5) % 5
    np.testing.assert_array_equal(fold.run(lambda x: getattr(np, name)(x, axis=axis), ints), getattr(np, name)(ints, axis=axis))


@pytest.mark.parametrize("ord_, axis", [(None, None), (None, 1), (2, 0), (1, -1), (np.inf, 1), (-np.inf, 0),
                                        (3, 1), ("fro", None), ("fro", (0, 1))])
def test_norm_matches_numpy(ord_, axis) -> None:
    x = X[0]
    got = fold.run(lambda x: np.linalg.norm(x, ord=ord_, axis=axis), x)
    np.testing.assert_allclose(got, np.linalg.norm(x, ord=ord_, axis=axis), rtol=1e-12)


def test_masked_reductions_through_where() -> None:
    mask = X > 0
    np.testing.assert_allclose(fold.run(lambda x: np.sum(x, axis=1, where=x > 0), X), np.sum(X, axis=1, where=mask))
    np.testing.assert_allclose(fold.run(lambda x: np.mean(x, axis=0, where=x > 0), X), np.mean(X, axis=0, where=mask))
    np.testing.assert_allclose(fold.run(lambda x: np.prod(x, where=x > 0), X), np.prod(X, where=mask))
    np.testing.assert_allclose(fold.run(lambda x: np.max(x, axis=2, where=x < 0, initial=-5.0), X),
                               np.max(X, axis=2, where=~mask, initial=-5.0))
    np.testing.assert_allclose(fold.run(lambda x: np.min(x, where=x > 0, initial=9.0), X), np.min(X, where=mask, initial=9.0))
    np.testing.assert_array_equal(fold.run(lambda x: np.any(x > 1, axis=0, where=x > 0), X), np.any(X > 1, axis=0, where=mask))


GRADS = {
    "sum": lambda x: np.sum(np.sum(x, axis=1) ** 2),
    "prod": lambda x: np.sum(np.prod(x, axis=(0, 2))),
    "max": lambda x: np.sum(np.max(x, axis=2) * np.arange(4.0)),
    "min": lambda x: np.sum(np.min(x, axis=0, keepdims=True) ** 2),
    "x.max": lambda x: x.max() * x.min(),
    "mean": lambda x: np.sum(np.mean(x, axis=-1) ** 3),
    "var": lambda x: np.sum(np.var(x, axis=1, ddof=1)),
    "std": lambda x: np.sum(np.std(x, axis=(0, 1))),
    "cumsum": lambda x: np.sum(np.cumsum(x, axis=1) ** 2),
    "cumprod": lambda x: np.sum(np.cumprod(x, axis=2)),
    "norm": lambda x: np.linalg.norm(x) + np.sum(np.linalg.norm(x, axis=0, ord=3)),
    "masked sum": lambda x: np.sum(x * x, where=x > 0),
    "masked max": lambda x: np.sum(np.max(x, axis=1, where=x < 0.5, initial=-3.0)),
}


@pytest.mark.parametrize("name", list(GRADS))
def test_gradients_against_finite_differences(name) -> None:
    x = RNG.normal(size=(3, 4, 5)) + 0.1  # no ties, no zeros: every derivative exists
    check_grads(GRADS[name], (x,), order=1)


def test_argmax_inside_a_gradient_is_a_constant_index() -> None:
    f = lambda x: x[np.argmax(x)] ** 2  # noqa: E731
    x = RNG.normal(size=6)
    want = np.zeros(6)
    want[np.argmax(x)] = 2 * x.max()
    np.testing.assert_allclose(fold.grad(f)(x), want)


@pytest.mark.parametrize("name", ["max", "min", "prod"])
def test_a_reduction_over_trailing_axes_is_a_map_of_row_reductions(name) -> None:
    """np.max(S, axis=1) folds each row: a map of a reduce, no transposed copy of S (its gradient built a
    one-hot array on the transposed copy and transposed it back), with NumPy's values and gradients."""
    from fold.primitives import Map, Transpose

    fn = getattr(np, name)
    f = lambda x: fn(x, axis=(1, 2), keepdims=True)  # noqa: E731
    program = fold.trace(f, X)
    assert [type(s.prim) for s in program.stmts if isinstance(s.prim, (Map, Transpose))] == [Map], program
    got = fold.run(f, X)
    np.testing.assert_allclose(got, fn(X, axis=(1, 2), keepdims=True), rtol=1e-12)
    x = RNG.normal(size=(3, 4, 5)) + 0.1
    check_grads(lambda x: np.sum(fn(x, axis=-1) * np.arange(4.0)), (x,), order=2)
    grad = fold.trace(fold.grad(lambda x: np.sum(fn(x, axis=-1))), x)
    assert not any(isinstance(s.prim, Transpose) for s in grad.stmts), grad
