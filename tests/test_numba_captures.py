"""Folds whose operator captures values, on the numba backend: they run in the fold kernels (the captured
scalars carried as element fields), forward and backward, and agree with the numpy backend; what cannot be
carried runs on numpy after one warning saying why."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fold
from helpers import assert_same, both
from fold.runtime.numba_backend import lowering
from fold.runtime.numba_backend.captured_operands import MAX_CAPTURED_COMPONENTS

rng = np.random.default_rng(11)


def combine(t):
    """a + b + t a b: associative with identity 0 for every t, and not one of the operators fold recognises."""
    return lambda a, b: a + b + t * a * b


def reference(x, t):
    return (np.prod(1.0 + t * x) - 1.0) / t


@pytest.fixture
def no_fallback():
    """Fails the test on any 'runs on the numpy backend' warning (each is given once per process: reset)."""
    lowering._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    fallbacks = [str(w.message) for w in caught if "runs on the numpy backend" in str(w.message)]
    assert not fallbacks, fallbacks


FOLDS = {
    "reduce": (lambda x, t: fold.reduce(combine(t), x, identity=0.0), "reduce"),
    "scan": (lambda x, t: fold.scan(combine(t), x, identity=0.0), "scan"),
    "reverse exclusive scan": (lambda x, t: fold.scan(combine(t), x, identity=0.0, reverse=True, exclusive=True), "scan"),
    "reduce_by_index": (lambda x, t: fold.reduce_by_index(combine(t), 5, np.arange(x.shape[0]) % 7 - 1, x, identity=0.0),
                        "histogram"),
}


@pytest.mark.parametrize("n", [0, 1, 9, 20_001])
@pytest.mark.parametrize("kind", list(FOLDS))
def test_folds_capturing_a_scalar_run_in_the_kernels(kind, n, kernel_calls, no_fallback):
    f, kernel = FOLDS[kind]
    x = rng.uniform(-0.01, 0.01, n)
    expected, got = both(f, x, 0.7)
    assert_same(expected, got, rtol=1e-10, scaled=True)
    if n:
        assert kernel_calls.get(kernel), kernel_calls
    if kind == "reduce":
        np.testing.assert_allclose(got, reference(x, 0.7), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("kind", list(FOLDS))
def test_gradients_through_the_captured_scalar_run_in_the_kernels(kind, kernel_calls, no_fallback):
    """The generic rule's folds (scans; reduce_by_index's per-bin folds) capture t too; both gradients
    (x and t) as on the numpy backend, nothing left to numpy."""
    f, _ = FOLDS[kind]
    loss = lambda x, t: (f(x, t) * f(x, t)).sum()  # noqa: E731
    x = rng.uniform(-0.1, 0.1, 20_001)
    assert_same(*both(fold.grad(loss, argnums=(0, 1)), x, 0.7), rtol=1e-8, scaled=True)
    if kind == "reduce_by_index":  # each bin's fold of its elements, a map folding its rows: a loop nest
        assert "loop_nest" in _prepared_names(fold.grad(loss, argnums=(0, 1)), x, 0.7)
    else:
        assert kernel_calls.get("scan"), kernel_calls


def _prepared_names(f, *args) -> list[str]:
    """The statements of f's program as the numba backend runs it."""
    from fold.runtime.numba_backend.passes import prepare

    return [s.prim.name for s in prepare(fold.trace(f, *args), whole_arrays=True).stmts]


def test_vector_integer_and_float32_captures(kernel_calls, no_fallback):
    """A captured vector (each component a field), an integer, and float32 elements with a float32 capture
    (carried in float64, as every float32 fold)."""
    x = rng.uniform(-0.01, 0.01, 20_001)
    w = np.array([0.5, 1.5])
    assert_same(*both(lambda x, w: fold.reduce(lambda a, b: a + b + (w[0] * w[1]) * a * b, x, identity=0.0), x, w), rtol=1e-10, scaled=True)
    assert_same(*both(lambda x, k: fold.scan(lambda a, b: a + b + k * a * b, x, identity=0.0), x, np.int64(3)), rtol=1e-10, scaled=True)
    x32 = x.astype(np.float32)
    expected, got = both(lambda x, t: fold.reduce(combine(t), x, identity=np.float32(0.0)), x32, np.float32(0.7))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, reference(x, 0.7), rtol=1e-5)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert kernel_calls.get("reduce") == 2 and kernel_calls.get("scan") == 1, kernel_calls


def test_a_fold_in_a_map_capturing_a_value_shared_by_all_rows(kernel_calls, no_fallback):
    X = rng.uniform(-0.1, 0.1, (40, 301))
    f = lambda X, t: fold.map(lambda row: fold.reduce(combine(t), row, identity=0.0), X)  # noqa: E731
    expected, got = both(f, X, 0.7)
    assert_same(expected, got, rtol=1e-10, scaled=True)
    np.testing.assert_allclose(got, [reference(row, 0.7) for row in X], rtol=1e-9)
    assert _prepared_names(f, X, 0.7) == ["loop_nest"]  # a map folding its rows


def test_a_fold_in_a_loop_body_capturing_a_value(kernel_calls, no_fallback):
    x = rng.uniform(-0.1, 0.1, 20_001)
    f = lambda x, t: fold.loop(lambda i, s: s * (1.0 + fold.reduce(combine(t), s, identity=0.0)), x, 2)  # noqa: E731
    assert_same(*both(f, x, 0.7), rtol=1e-10, scaled=True)
    assert kernel_calls.get("reduce") == 2, kernel_calls


def fallback_warnings(f, *args) -> tuple[list[str], object]:
    lowering._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = fold.jit(f, backend="numba")(*args)
    return [str(w.message) for w in caught if "runs on the numpy backend" in str(w.message)], got


def test_a_value_that_differs_from_row_to_row_is_read_by_the_loop_nest():
    """A fold capturing a value of its row (t of row i) ran on numpy after a warning: its fold kernel carries
    only values shared by all rows. The map folding its rows is now a loop nest, where t is a scalar of the
    row like any other: no warning, the reference's results."""
    X, T = rng.uniform(-0.1, 0.1, (4, 50)), rng.uniform(0.2, 1.0, 4)
    f = lambda X, T: fold.map(lambda row, t: fold.reduce(combine(t), row, identity=0.0), X, T)  # noqa: E731
    messages, got = fallback_warnings(f, X, T)
    assert messages == []
    assert _prepared_names(f, X, T) == ["loop_nest"]
    np.testing.assert_allclose(got, [reference(row, t) for row, t in zip(X, T, strict=True)], rtol=1e-12)


def test_a_value_that_differs_from_row_to_row_runs_on_numpy_with_one_warning():
    """Where no loop nest takes the map (a reduce of a row's vectors, not of its scalars, has no nest rule),
    the per-row capture still runs on numpy, after one warning saying why."""
    X, T = rng.uniform(-0.1, 0.1, (4, 10, 5)), rng.uniform(0.2, 1.0, 4)
    f = lambda X, T: fold.map(lambda rows, t: fold.reduce(  # noqa: E731
        combine(t), fold.reduce(fold.monoids.sum, rows), identity=0.0), X, T)
    messages, got = fallback_warnings(f, X, T)
    assert messages == ["numba backend: reduce runs on the numpy backend (its operator captures a value that "
                        "differs from row to row)"]
    want = [reference(rows.sum(axis=0), t) for rows, t in zip(X, T, strict=True)]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_histogram_in_the_body_joins_the_nest_with_the_per_row_capture():
    """A row binned by a histogram, then folded by an operator capturing the row's t: the histogram is a rule
    of the loop nest (session 58), which reads t as a scalar of the row: no warning."""
    X, T = rng.uniform(-0.1, 0.1, (4, 50)), rng.uniform(0.2, 1.0, 4)
    bins = np.arange(50) % 3
    f = lambda X, T: fold.map(lambda row, t: fold.reduce(  # noqa: E731
        combine(t), fold.reduce_by_index(fold.monoids.sum, 3, bins, row), identity=0.0), X, T)
    messages, got = fallback_warnings(f, X, T)
    assert messages == []
    assert _prepared_names(f, X, T) == ["loop_nest"]
    want = [reference(np.bincount(bins, row, 3), t) for row, t in zip(X, T, strict=True)]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_more_captured_scalars_than_a_kernel_carries_run_on_numpy_with_one_warning():
    w = rng.uniform(0.1, 0.2, MAX_CAPTURED_COMPONENTS + 1)
    x = rng.uniform(-0.01, 0.01, 1_000)
    f = lambda x, w: fold.reduce(lambda a, b: a + b + fold.reduce(fold.monoids.sum, w) * a * b, x, identity=0.0)  # noqa: E731
    messages, got = fallback_warnings(f, x, w)
    assert messages == [f"numba backend: reduce runs on the numpy backend (its operator captures "
                        f"{MAX_CAPTURED_COMPONENTS + 1} scalars, more than the {MAX_CAPTURED_COMPONENTS} a kernel carries)"]
    np.testing.assert_allclose(got, reference(x, w.sum()), rtol=1e-9)
