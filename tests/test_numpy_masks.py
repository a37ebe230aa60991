"""`x[mask]` with a traced boolean mask (fold/numpy_masks.py): reductions of the selection give NumPy's values
on random inputs (they are the where= reductions), elementwise functions of selections stay selections,
gradients match finite differences with no NaN from the left-out elements, and everything that needs the
selection as an array is refused with an error naming np.where / where=. Also where= on var and std, and
np.count_nonzero."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.testing import check_grads

from helpers import checked_program

RNG = np.random.default_rng(9)
X = RNG.normal(size=(4, 5))
Y = RNG.normal(size=(4, 5))


def _pair_with_one_mask(x, y):
    m = x > 0
    return np.sum(x[m] * y[m] + 2.0)


CASES = {
    "sum": lambda x, y: np.sum(x[x > 0]),
    "mean": lambda x, y: np.mean(x[x > 0.1]),
    "prod": lambda x, y: np.prod(x[np.abs(x) < 1.0]),
    "max with initial": lambda x, y: np.max(x[x < 0.5], initial=-10.0),
    "min with initial": lambda x, y: np.min(x[x > -0.5], initial=10.0),
    "var": lambda x, y: np.var(x[x > -0.5]),
    "std with ddof": lambda x, y: np.std(x[x > -0.5], ddof=1),
    "methods": lambda x, y: x[x > 0].sum() + x[x > 0].mean() + x[y > 0].std() + x[x > 0].max(initial=0.0),
    "squares": lambda x, y: np.sum(x[x > 0] ** 2),
    "log of the selection": lambda x, y: np.sum(np.log(x[x > 0])),
    "one mask, two arrays": _pair_with_one_mask,
    "a traced scalar times it": lambda x, y: np.sum(y[0, 0] * x[x > 0] - 1.0 / (1.0 + x[x > 0] ** 2)),
    "rows": lambda x, y: np.sum(x[x[:, 0] > 0], axis=0),
    "rows, then the row axis": lambda x, y: np.sum(x[x[:, 0] > 0].sum(axis=1)),
    "keepdims": lambda x, y: np.sum(x[y > 0], keepdims=True),
    "comparisons": lambda x, y: np.sum(x[y > 0] > 0.5),
    "any and all": lambda x, y: (np.any(x[y > 0] > 1.0), np.all(x[y > 0] > -3.0)),
    "count_nonzero": lambda x, y: (np.count_nonzero(x > 0), np.count_nonzero(x > 0, axis=1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_reductions_of_a_selection_match_numpy(name) -> None:
    f = CASES[name]
    checked_program(f, X, Y)
    got, want = fold.jit(f)(X, Y), f(X, Y)
    for g, w in zip(fold.tree_flatten(got)[0], fold.tree_flatten(want)[0], strict=True):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=1e-12)


@pytest.mark.parametrize("name", [n for n in CASES if n not in ("comparisons", "any and all", "count_nonzero")])
def test_gradients_against_finite_differences(name) -> None:
    check_grads(CASES[name], (X, Y), order=1)


def test_left_out_elements_give_no_nan_in_the_gradient() -> None:
    x = np.array([0.0, 1.0, -2.0, 4.0])  # log and 1/x at 0 and below: infinite or NaN derivatives there
    g = fold.grad(lambda x: np.sum(np.log(x[x > 0]) + 1.0 / x[x > 0]))(x)
    np.testing.assert_allclose(g, [0.0, 0.0, 0.0, 1 / 4 - 1 / 16])


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_var_and_std_with_where_match_numpy(axis) -> None:
    mask = X > -0.3
    for name in ("var", "std"):
        got = fold.jit(lambda x: getattr(np, name)(x, axis=axis, where=x > -0.3, keepdims=True))(X)
        np.testing.assert_allclose(got, getattr(np, name)(X, axis=axis, where=mask, keepdims=True), rtol=1e-12)
    check_grads(lambda x: np.sum(np.var(x, axis=axis, where=x > -0.3)), (X,))


@pytest.mark.parametrize("f,message", [
    (lambda x: len(x[x > 0]), r"len\(x\[mask\]\): the count is a traced value, np\.count_nonzero\(mask\)"),
    (lambda x: np.sort(x[x > 0]), r"np\.sort of x\[mask\]: .*np\.where\(mask, x, 0\).*where=mask"),
    (lambda x: np.max(x[x > 0]), r"np\.max of x\[mask\] needs initial=: the selection may be empty"),
    (lambda x: np.sum(x[x > 0], where=x[x > 0] > 1), r"combine the masks instead"),
    (lambda x: x[x > 0] * x[x > 0.5], r"two selections x\[m1\], y\[m2\] needs one mask"),
    (lambda x: x[x > 0] * x[0], r"an array of shape \(5,\): the selection has no known shape"),
    (lambda x: x[x > 0] @ x[0], r"x\[mask\] @ y"),
    (lambda x: x[x > 0].shape, r"x\[mask\]\.shape: .*np\.where\(mask, x, 0\)"),
    (lambda x: x[x[0] > 0], r"a boolean mask of shape \(5,\) does not match the leading axes of the array's shape \(4, 5\)"),
    (lambda x: fold.ops.getitem(x, x > 0), r"a traced boolean mask selects a number of elements known only when the program runs"),
])
def test_what_needs_the_selection_as_an_array_is_refused(f, message) -> None:
    with pytest.raises(fold.FoldError, match=message):
        fold.trace(f, X)
