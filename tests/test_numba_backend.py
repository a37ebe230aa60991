"""The numba backend against the numpy reference: same results, kernels where they apply, a warned fallback
where they do not."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fold
from runtime.numba_backend.fusion import FusedMapReduce, fuse

rng = np.random.default_rng(7)


def compose(f, g):
    (a1, b1), (a2, b2) = f, g
    return a1 * a2, a2 * b1 + b2


def matmul2(a, b):
    return (a[0] * b[0] + a[1] * b[2], a[0] * b[1] + a[1] * b[3], a[2] * b[0] + a[3] * b[2], a[2] * b[1] + a[3] * b[3])


def both(f, *args):
    return fold.jit(f, backend="numpy")(*args), fold.jit(f, backend="numba")(*args)


def assert_same(a, b, rtol=1e-12):
    for x, y in zip(fold.tree_flatten(a)[0], fold.tree_flatten(b)[0], strict=True):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=rtol, atol=1e-12)


@pytest.mark.parametrize("n", [0, 1, 7, 20_000, 70_001])
def test_user_operator_reduce_and_scan(n):
    a, b = rng.uniform(0.9, 1.1, n), rng.normal(size=n)
    assert_same(*both(lambda a, b: fold.reduce(compose, (a, b), identity=(1.0, 0.0)), a, b))
    for exclusive in (False, True):
        for reverse in (False, True):
            f = lambda a, b: fold.scan(compose, (a, b), identity=(1.0, 0.0), exclusive=exclusive, reverse=reverse)  # noqa: E731
            assert_same(*both(f, a, b), rtol=1e-10)


def test_non_commutative_matrix_product_keeps_order():
    ms = tuple(rng.normal(size=(4, 50_001)) * 0.3 + np.eye(2).reshape(4, 1))
    numpy_result, numba_result = both(lambda *m: fold.reduce(matmul2, m, identity=(1.0, 0.0, 0.0, 1.0)), *ms)
    assert_same(numpy_result, numba_result, rtol=1e-9)


def test_histogram_with_user_operator_and_out_of_range_indices():
    idx = rng.integers(-3, 40, 30_000)
    v = rng.normal(size=30_000)
    assert_same(*both(lambda i, v: fold.reduce_by_index(fold.monoids.max, 37, i, v), idx, v))
    assert_same(*both(lambda i, v: fold.reduce_by_index(lambda a, b: a + b, 37, i, v, identity=0.0), idx, v), rtol=1e-9)


def test_map_reduce_is_fused_and_agrees():
    def f(x):
        return fold.reduce(lambda a, b: a + b, fold.map(lambda v: fold.tanh(v * 2.0 + 1.0) * fold.exp(-v) - v, x), identity=0.0)

    x = rng.normal(size=100_003)
    program = fold.trace(f, x)
    assert any(isinstance(s.prim, FusedMapReduce) for s in fuse(program).stmts)
    assert_same(*both(f, x), rtol=1e-9)


def test_segmented_reduce_inside_a_map():
    x = rng.normal(size=(300, 41))
    assert_same(*both(lambda x: fold.map(lambda row: fold.reduce(lambda a, b: fold.maximum(a, b) + 0.0 * b, row, identity=-np.inf), x), x))


def test_gradient_programs_run_unchanged():
    a, b = rng.uniform(0.5, 1.0, 5_000), rng.normal(size=5_000)
    ybar = rng.normal(size=5_000)
    g = lambda a, b: fold.vjp(lambda a, b: fold.scan(compose, (a, b), identity=(1.0, 0.0))[1], (a, b), ybar)  # noqa: E731
    assert_same(*both(g, a, b), rtol=1e-9)
    sq = fold.grad(lambda x: fold.reduce(fold.monoids.sum, fold.map(lambda v: v * v, x)))
    assert_same(*both(sq, a))


def test_vector_elements_fall_back_with_one_warning():
    z, v = rng.normal(size=64), rng.normal(size=(64, 3))
    f = lambda z, v: fold.reduce(lambda p, q: {"z": fold.maximum(p["z"], q["z"]), "v": p["v"] + q["v"]}, {"z": z, "v": v},  # noqa: E731
                                 identity={"z": -np.inf, "v": 0.0})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        numba_result = fold.jit(f, backend="numba")(z, v)
    assert any("runs on the numpy backend" in str(w.message) and "reduce" in str(w.message) for w in caught)
    assert_same(fold.jit(f, backend="numpy")(z, v), numba_result)


def test_backend_is_chosen_by_name_context_and_environment(monkeypatch):
    assert "numba" in fold.available_backends()
    f = fold.jit(lambda x: fold.reduce(compose, (x, x), identity=(1.0, 0.0)))
    with fold.use_backend("numba"):
        assert_same(f(np.ones(5)), (np.ones(()), np.asarray(5.0)))
    monkeypatch.setenv("FOLD_BACKEND", "numba")
    assert_same(fold.run(lambda x: fold.reduce(compose, (x, x), identity=(1.0, 0.0)), np.ones(3)), (1.0, 3.0))
    with pytest.raises(fold.FoldTypeError, match="unknown backend"):
        fold.jit(lambda x: x, backend="tpu")(np.ones(2))
