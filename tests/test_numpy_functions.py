"""NumPy's functions inside a traced function record the fold operations they mean (fold/numpy_functions.py):
the results are NumPy's own on the same arrays, gradients flow through them, and functions or options fold
does not have are refused with errors that name them."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.testing import check_grads

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4))
Y = RNG.standard_normal((4, 5))
V = RNG.standard_normal(4)

CASES = [
    ("sum", lambda x: np.sum(x), (X,)),
    ("sum axis", lambda x: np.sum(x, axis=1), (X,)),
    ("sum axes keepdims", lambda x: np.sum(x, axis=(0, 1), keepdims=True), (X,)),
    ("sum negative axis keepdims", lambda x: np.sum(x, -1, keepdims=True), (X,)),
    ("mean", lambda x: np.mean(x), (X,)),
    ("mean axis keepdims", lambda x: np.mean(x, axis=0, keepdims=True), (X,)),
    ("mean of ints", lambda x: np.mean(x), (np.arange(7),)),
    ("dot matrix", lambda x, y: np.dot(x, y), (X, Y)),
    ("dot vector", lambda x, v: np.dot(x, v), (X, V)),
    ("outer", lambda v: np.outer(v, v), (V,)),
    ("where", lambda x: np.where(x > 0, x, 0.5 * x), (X,)),
    ("clip", lambda x: np.clip(x, -0.5, 0.5), (X,)),
    ("clip below only", lambda x: np.clip(x, -0.5, None), (X,)),
    ("reshape", lambda x: np.reshape(x, (2, -1)), (X,)),
    ("reshape keyword", lambda x: np.reshape(x, shape=(4, 3)), (X,)),
    ("transpose", lambda x: np.transpose(x), (X,)),
    ("concatenate", lambda x: np.concatenate([x, 2 * x], axis=1), (X,)),
    ("stack", lambda x: np.stack([x, x + 1.0]), (X,)),
    ("stack last axis", lambda x: np.stack([x, x + 1.0], axis=-1), (X,)),
    ("expand_dims squeeze", lambda x: np.squeeze(np.expand_dims(x, 1), axis=1), (X,)),
    ("squeeze all", lambda x: np.squeeze(np.reshape(x, (1, 3, 1, 4))), (X,)),
    ("broadcast_to", lambda v: np.broadcast_to(v, (3, 4)), (V,)),
    ("zeros_like and friends", lambda x: x + np.zeros_like(x) + np.ones_like(x) + np.full_like(x, 2.5), (X,)),
    ("static shape", lambda x: x * (np.shape(x)[1] + np.ndim(x) + np.size(x) + np.size(x, 0)), (X,)),
    ("sum of int32 is int64", lambda i: np.sum(i, axis=0), (np.arange(12, dtype=np.int32).reshape(3, 4),)),
    ("clip keywords", lambda x: np.clip(x, min=-0.5, max=0.5) + np.clip(x, max=0.1), (X,)),
    ("full_like traced fill", lambda x: np.full_like(x, x[0, 0]), (X,)),
    ("dot with a scalar", lambda x: np.dot(x, 2.0) + np.dot(0.5, x), (X,)),
    ("where with a number condition", lambda x: np.where(x * (x > 0.5), 1.0, x), (X,)),
    ("concatenate flattened", lambda x: np.concatenate([x, x[:1]], axis=None), (X,)),
    ("expand_dims at several axes", lambda x: np.expand_dims(x, (0, 2, -1)), (X,)),
    ("size over axes", lambda x: x * np.size(x, (0, -1)), (X,)),
    ("constants of another shape", lambda x: np.zeros_like(x, shape=(4,)) + np.full_like(x, 2.0, shape=(2, 4))[0], (X,)),
]


@pytest.mark.parametrize("name,f,args", CASES, ids=[c[0] for c in CASES])
def test_traced_numpy_function_gives_numpy_result(name, f, args) -> None:
    expected = f(*args)
    got = fold.jit(f)(*args)
    assert np.shape(got) == np.shape(expected)
    assert np.asarray(got).dtype == np.asarray(expected).dtype
    np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("f", [
    lambda x: np.sum(np.where(x > 0.1, x * x, np.exp(x)), axis=0),
    lambda x: np.mean(np.dot(x, np.transpose(x)), axis=1, keepdims=True),
    lambda x: np.clip(np.stack([x, np.sin(x)]), -0.7, 0.7),
])
def test_gradients_flow_through_numpy_functions(f) -> None:
    check_grads(f, (X,))


SPECIAL = np.array([-3.0, -0.5, 1e-8, 0.7, 2.0, 8.0, np.inf, np.nan, -np.inf])
COMPOSITE_UFUNCS = [np.square, np.positive, np.reciprocal, np.log2, np.log10, np.exp2, np.tan, np.sinh, np.cosh,
                    np.isnan, np.isinf, np.isfinite]


@pytest.mark.parametrize("ufunc", COMPOSITE_UFUNCS, ids=lambda u: u.__name__)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_ufuncs_written_with_the_primitives_give_numpys_values(ufunc, dtype) -> None:
    x = SPECIAL.astype(dtype)
    with np.errstate(all="ignore"):
        expected = ufunc(x)
    got = fold.jit(lambda x: ufunc(x))(x)
    assert got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-14 if dtype == np.float64 else 1e-6, atol=0, equal_nan=True)


def test_gradients_flow_through_ufuncs_written_with_the_primitives() -> None:
    x = np.abs(X) + 0.5
    check_grads(lambda x: np.square(x) + np.reciprocal(x) + np.log2(x) + np.log10(x) + np.exp2(x) + np.tan(x * 0.3)
                + np.sinh(x) + np.cosh(x) + np.where(np.isfinite(x), x, 0.0), (x,))


@pytest.mark.parametrize("f,message", [
    (lambda x: np.median(x), r"np\.median is not supported on traced arrays.*np\.sum"),
    (lambda x: np.max(x, where=x > 0), r"np\.max with where= needs initial="),
    (lambda x: np.cumsum(x, out=np.zeros(12)), r"np\.cumsum\(\.\.\., out=\.\.\.\) on a traced array"),
    (lambda x: np.var(x, axis=0, ddof=3), r"np\.var: 3 elements with ddof=3"),
    (lambda x: np.mean(x, out=None), r"np\.mean .*out"),
    (lambda x: np.where(x > 0), r"np\.where\(condition\) with one argument"),
    (lambda x: np.reshape(x, (4, 3), order="F"), r"order='C'"),
    (lambda x: np.squeeze(x, axis=0), r"np\.squeeze: axes \(0,\) of shape \(3, 4\)"),
    (lambda x: np.stack([x, x[:2]]), r"np\.stack: all arrays must have one shape"),
    (lambda x: np.dot(np.reshape(x, (1, 3, 4)), np.ones((4, 2))), r"np\.dot on traced arrays takes 0-d, 1-d and 2-d operands, got 3-d and 2-d"),
    (lambda x: np.full_like(np.zeros(3), x[0, 0]), r"np\.copyto .*fold\.broadcast_to"),
    (lambda x: np.clip(x, low=0.0), r"np\.clip .*low"),
    (lambda x: np.floor(x), r"np\.floor is not supported on traced arrays; the ufuncs fold traces .*log2.*fold\.reduce"),
    (lambda x: np.add.reduce(x), r"np\.add\.reduce is not supported"),
    (lambda x: np.reciprocal(np.ones(3, np.int64) + x[0, :3].astype(np.int64)), r"np\.reciprocal .*int64.*1\.0 / x"),
    (lambda x: np.sort(x), r"np\.sort is not supported on traced arrays"),
    (lambda x: np.sum(x, axis=2), r"np\.sum: axis 2 is out of range for an array of shape \(3, 4\)"),
    (lambda x: np.mean(x, axis=-3), r"np\.mean: axis -3 is out of range for an array of shape \(3, 4\)"),
    (lambda x: np.squeeze(x, axis=4), r"np\.squeeze: axis 4 is out of range for an array of shape \(3, 4\)"),
    (lambda x: x * np.size(x, 2), r"np\.size: axis 2 is out of range for an array of shape \(3, 4\)"),
    (lambda x: np.expand_dims(x, 5), r"np\.expand_dims: axis 5 .* 3 dimensions \(array shape \(3, 4\)\)"),
    (lambda x: x.astype(np.int64) ^ 3, r"xor: needs boolean arguments, got \['int64', 'int64'\]"),
    (lambda x: x.median(), r"a traced array \(f64\[3,4\]\) has no attribute 'median'"),
    (lambda x: np.linalg.norm(x, ord=2), r"np\.linalg\.norm on a traced matrix: ord=2 is not supported"),
    (lambda x: x.__setitem__(0, 1.0), r"cannot be assigned to \(x\[\.\.\.\] = v\).*fold\.where"),
])
def test_unsupported_numpy_functions_and_options_are_named(f, message) -> None:
    with pytest.raises(fold.FoldError, match=message):
        fold.trace(f, X)


def test_ndarray_methods_on_traced_arrays() -> None:
    """The methods a NumPy user writes: sum and mean as np.sum and np.mean, copy, ravel, dot, squeeze; an
    unknown attribute is an AttributeError (hasattr works) that lists what a traced array has."""
    f = lambda x: (x.sum(), x.sum(axis=1, keepdims=True), x.mean(0), x.copy() * 2.0, x.ravel(), x.flatten(),  # noqa: E731
                   x.dot(V), x[None].squeeze(0), hasattr(x, "not_an_attribute"))
    got, want = fold.jit(f)(X), f(X)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-13, atol=1e-15)
    with pytest.raises(AttributeError, match=r"a traced array \(f64\[3,4\]\) has no attribute 'max_'.*mean"):
        fold.trace(lambda x: x.max_(), X)


def test_isinf_and_isfinite_of_integers_and_booleans() -> None:
    for x in (X > 0.5, np.arange(4, dtype=np.int32)):
        got = fold.jit(lambda x: (np.isinf(x), np.isfinite(x), np.isnan(x)))(x)
        np.testing.assert_array_equal(got, (np.isinf(x), np.isfinite(x), np.isnan(x)))


def test_an_empty_list_index_is_an_empty_integer_index() -> None:
    assert fold.run(lambda x: x[[]], X).shape == X[[]].shape == (0, 4)


def test_xor_of_booleans() -> None:
    a, b = X > 0.5, X < 0.8
    np.testing.assert_array_equal(fold.jit(lambda a, b: (a ^ b, a ^ True, False ^ b))(a, b), (a ^ b, a ^ True, False ^ b))
