"""JAX's `x.at[index].set/add/multiply/min/max/get` on traced arrays (fold/numpy_at.py): against NumPy's
own in-place updates (`y[i] = v`, `np.add.at`, ...) for static and traced indices, repeated indices
included; gradients against finite differences; bad updates refused with errors naming them."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.testing import check_grads

from helpers import checked_program

RNG = np.random.default_rng(5)
X = RNG.normal(size=(4, 5))
AT = {"add": np.add.at, "multiply": np.multiply.at, "min": np.minimum.at, "max": np.maximum.at}


def numpy_update(name: str, x: np.ndarray, index, values) -> np.ndarray:
    """What x.at[index].<name>(values) means, with NumPy (its last value wins for a repeated index in set)."""
    y = x.copy()
    if name == "set":
        y[index] = values
    else:
        AT[name](y, index, values)
    return y


INDICES = [
    ("int", 1, RNG.normal(size=5)),
    ("negative int", -1, 0.5),
    ("slice", slice(1, 3), 2.0),
    ("stepped slice", (slice(None), slice(None, None, 2)), RNG.normal(size=(4, 3))),
    ("index array with repeats", np.array([0, 2, 0]), RNG.normal(size=(3, 5))),
    ("index array and int", (np.array([0, 2, 0]), 1), np.array([1.0, 2.0, 3.0])),
    ("slice and list", (slice(None), [1, 1, 4]), RNG.normal(size=(4, 3))),
    ("negative index array", np.array([-1, -4]), 3.0),
]
NAMES = ["set", "add", "multiply", "min", "max"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case,index,values", INDICES, ids=[c[0] for c in INDICES])
def test_updates_match_numpy(name, case, index, values) -> None:
    f = lambda x, v: getattr(x.at[index], name)(v)  # noqa: E731
    checked_program(f, X, values)
    np.testing.assert_allclose(fold.jit(f)(X, values), numpy_update(name, X, index, values), rtol=1e-13)


@pytest.mark.parametrize("name", NAMES)
def test_updates_at_a_traced_index_array_match_numpy(name) -> None:
    index, values = np.array([3, 0, 3, 3]), RNG.normal(size=(4, 5))
    f = lambda x, v, i: getattr(x.at[i], name)(v)  # noqa: E731
    checked_program(f, X, values, index)
    np.testing.assert_allclose(fold.jit(f)(X, values, index), numpy_update(name, X, index, values), rtol=1e-13)
    g = lambda x, v, i: getattr(x.at[i, 2], name)(v)  # noqa: E731
    np.testing.assert_allclose(fold.jit(g)(X, values[:, 0], index), numpy_update(name, X, (index, 2), values[:, 0]),
                               rtol=1e-13)


@pytest.mark.parametrize("name", NAMES)
def test_updates_at_a_traced_boolean_mask(name) -> None:
    f = lambda x: getattr(x.at[x > 0.2], name)(0.5)  # noqa: E731
    np.testing.assert_allclose(fold.jit(f)(X), numpy_update(name, X, X > 0.2, 0.5), rtol=1e-13)
    rows = lambda x, v: getattr(x.at[x[:, 0] > 0], name)(v)  # noqa: E731
    v = RNG.normal(size=5)
    np.testing.assert_allclose(fold.jit(rows)(X, v), numpy_update(name, X, X[:, 0] > 0, v), rtol=1e-13)


def test_integer_arrays_and_get() -> None:
    ints = np.arange(10, dtype=np.int64)
    got = fold.jit(lambda x: (x.at[[2, 2, 5]].add(3), x.at[1:4].set(-1), x.at[::3].get()))(ints)
    want = (numpy_update("add", ints, [2, 2, 5], 3), numpy_update("set", ints, slice(1, 4), -1), ints[::3])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
        assert g.dtype == np.int64


GRADS = {
    "set": lambda x, v: np.sum(np.sin(x.at[np.array([0, 2, 0])].set(v))),
    "add": lambda x, v: np.sum(x.at[np.array([0, 2, 0])].add(v) ** 2),
    "multiply": lambda x, v: np.sum(x.at[np.array([1, 3])].multiply(v[:2]) ** 2),
    "min": lambda x, v: np.sum(x.at[np.array([0, 2, 1])].min(v) ** 2),
    "max": lambda x, v: np.sum(x.at[np.array([0, 2, 1])].max(v) ** 2),
    "slice set": lambda x, v: np.sum(x.at[1:].set(v) ** 3),
    "mask add": lambda x, v: np.sum(x.at[x > 0].add(v[0, 0]) ** 2),
}


@pytest.mark.parametrize("name", list(GRADS))
def test_gradients_against_finite_differences(name) -> None:
    v = RNG.normal(size=(3, 5)) + 0.05  # no ties with X: min and max are differentiable
    check_grads(GRADS[name], (X, v), order=1)


def test_traced_index_gradients_against_finite_differences() -> None:
    index = np.array([1, 1, 3])
    check_grads(lambda x, v: np.sum(x.at[fold.stop_gradient(index)].add(v) ** 2), (X, RNG.normal(size=(3, 5))))
    f = lambda x, v, i: np.sum(np.cos(x.at[i].set(v)))  # noqa: E731
    got = fold.grad(f, argnums=(0, 1))(X, RNG.normal(size=(3, 5)), index)
    xbar = -np.sin(X)
    xbar[[1, 3]] = 0.0  # overwritten elements: no gradient to x
    np.testing.assert_allclose(got[0], xbar, rtol=1e-12)


@pytest.mark.parametrize("f,message", [
    (lambda x: x.at[9].set(1.0), r"x\.at\[9\]\.set: the index 9 does not fit an array of shape \(4, 5\)"),
    (lambda x: x.at[np.array([0, 1])].add(np.ones(3)), r"values of shape \(3,\) do not broadcast to the shape \(2, 5\)"),
    (lambda x: x.at[0].set(1.0, mode="clip"), r"no\s+mode="),
    (lambda x: x.at[x[:, 0] > 0].set(np.ones((2, 5))), r"a scalar or broadcast to one selected row \(5,\), got shape \(2, 5\)"),
    (lambda x: x.at[x[0] > 0].set(1.0), r"a boolean mask of shape \(5,\) does not match the leading axes of the array's shape \(4, 5\)"),
    (lambda x: x.at.__setitem__(0, 1.0), r"x\.at\[0\] = v does not change a traced array .* x = x\.at\[0\]\.set\(v\)"),
])
def test_bad_updates_are_named(f, message) -> None:
    with pytest.raises(fold.FoldError, match=message):
        fold.trace(f, X)
