"""A run's result written into an operand that nothing else holds (runtime/numba_backend/donation.py)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import fold

pytest.importorskip("numba")

from fold.runtime import donation  # noqa: E402

rng = np.random.default_rng(11)


@pytest.fixture
def donated(monkeypatch):
    """Per call of donation.outputs: which results took an operand's buffer."""
    seen: list[list[bool]] = []
    original = donation.outputs

    def spy(values, shape, dtypes):
        out = original(values, shape, dtypes)
        seen.append([any(o is v for v in values) for o in out])
        return out

    monkeypatch.setattr(donation, "outputs", spy)
    return seen


def test_a_products_last_reader_writes_its_result_into_the_product(donated):
    X, W = rng.normal(size=(512, 256)), rng.normal(size=(256, 256)) / 16
    f = fold.jit(lambda X, W: fold.tanh(X @ W) * 2.0 + 1.0, backend="numba")
    before = X.copy(), W.copy()
    np.testing.assert_allclose(f(X, W), np.tanh(X @ W) * 2.0 + 1.0, rtol=1e-12, atol=1e-12)
    assert donated == [[True]], donated
    np.testing.assert_array_equal(X, before[0])
    np.testing.assert_array_equal(W, before[1])


def test_the_callers_arrays_are_never_written(donated):
    X = rng.normal(size=(512, 256))
    want = np.exp(X) * 2.0 + X
    got = fold.jit(lambda X: fold.exp(X) * 2.0 + X, backend="numba")(X)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.exp(X) * 2.0 + X, want, rtol=0)  # X unchanged
    assert donated == [[False]], donated


def test_an_operand_a_live_view_still_reads_is_not_written(donated):
    """The product's transpose (a view of it) is read after the run: the run must not write the product."""
    X, W = rng.normal(size=(512, 256)), rng.normal(size=(256, 512)) / 16

    def f(X, W):
        p = X @ W
        t = fold.transpose(p)  # an output, made before the run as a view of the product
        return fold.tanh(p) * 2.0 + 1.0, t

    got = fold.jit(f, backend="numba")(X, W)
    p = X @ W
    np.testing.assert_allclose(got[0], np.tanh(p) * 2.0 + 1.0, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[1], p.T, rtol=1e-12, atol=1e-12)
    assert donated == [[False]], donated
    for got_, want in zip(got, fold.jit(f, backend="numpy")(X, W)):
        np.testing.assert_allclose(got_, want, rtol=1e-12, atol=1e-12)


def test_an_output_is_not_written_by_a_later_run(donated):
    X, W = rng.normal(size=(512, 256)), rng.normal(size=(256, 256)) / 16
    f = fold.jit(lambda X, W: (lambda p: (p, fold.tanh(p) + 1.0))(X @ W), backend="numba")
    p, t = f(X, W)
    np.testing.assert_allclose(p, X @ W, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(t, np.tanh(X @ W) + 1.0, rtol=1e-12, atol=1e-12)
    assert donated == [[False]], donated


def test_the_run_holds_one_matrix_where_it_held_two():
    """Peak memory of tanh(X @ W) * 2 + 1 (numpy's allocations, traced): the product and the result are one
    buffer."""
    X, W = rng.normal(size=(1024, 64)), rng.normal(size=(64, 1024)) / 8
    f = fold.jit(lambda X, W: fold.tanh(X @ W) * 2.0 + 1.0, backend="numba")
    f(X, W)
    matrix = 1024 * 1024 * 8
    tracemalloc.start()
    try:
        f(X, W)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert matrix <= peak < 1.5 * matrix, (peak, matrix)


def test_exclusive_counts_the_holders():
    x = np.empty(3)
    alone = [np.empty(3)]
    assert donation.exclusive(alone, 0)
    assert not donation.exclusive([x], 0)  # this test's name `x` holds it too
    view = alone[0][1:]
    assert not donation.exclusive(alone, 0)  # the view holds its base
    del view
    assert donation.exclusive(alone, 0)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_a_single_elementwise_statement_writes_into_a_dead_operand(backend, monkeypatch):
    """tanh(X @ W) alone is a NumPy ufunc call: its `out=` is the product; exp(X) of the caller's X is not."""
    taken = []
    original = donation.ufunc_output

    def spy(values, ufunc):
        out = original(values, ufunc)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(donation, "ufunc_output", spy)
    X, W = rng.normal(size=(300, 200)), rng.normal(size=(200, 100)) / 10
    X0 = X.copy()
    got = fold.jit(lambda X, W: fold.tanh(X @ W), backend=backend)(X, W)
    np.testing.assert_allclose(got, np.tanh(X0 @ W), rtol=1e-12, atol=1e-12)
    assert taken == [True], taken
    taken.clear()
    np.testing.assert_allclose(fold.jit(fold.exp, backend=backend)(X), np.exp(X0), rtol=1e-12)
    np.testing.assert_array_equal(X, X0)
    assert taken == [False], taken


def test_a_run_of_two_results_takes_no_operands_buffer(donated):
    """ai = ab + 2 b g and aj = z + 2 a h in one run, z dead: were z's buffer to take ai, the compiled loop
    could store ai before it loads z at the same element (a Gaussian kernel sum's gradient read its own
    results that way). Both results are new, and right."""
    a, b, g, h = (rng.normal(size=(512, 256)) for _ in range(4))
    W = rng.normal(size=(256, 256)) / 16

    def f(a, b, g, h, W):
        z = a @ W
        return b * g * 2.0 + a, z + a * h * 2.0

    got = fold.jit(f, backend="numba")(a, b, g, h, W)
    want = (b * g * 2.0 + a, a @ W + a * h * 2.0)
    for got_, want_ in zip(got, want, strict=True):
        np.testing.assert_allclose(got_, want_, rtol=1e-12, atol=1e-12)
    assert donated and all(not any(d) for d in donated), donated
