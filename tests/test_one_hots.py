"""runtime/numba_backend/one_hots.py: one-hot vectors in map bodies read as (index, value) pairs.

The numba backend's results against the numpy backend's, which runs the dense program (within 1e-12), for
- k-means' gradient (the min monoid's one-hot cotangent: in-body product and sum, stacked one-hots summed
  over the points and multiplied by them), with the prepared program checked to hold no (points, K)
  product any more but two reduce_by_index statements;
- a max over W x per row, differentiated for W and x;
- one-hots written by hand with indices outside [0, K) (all-zero vectors), readers the rewrite leaves
  dense (an output of the program, an elementwise use), a one-hot read both ways;
and the rewrite's own output for a program without one-hots (the same program).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fold
from fold.primitives import Map, MatMul, ReduceByIndex
from helpers import assert_same, both
from fold.runtime.numba_backend.one_hots import sparse_one_hots

rng = np.random.default_rng(7)


def kmeans(points, centroids):
    cc = fold.map(lambda c: fold.sum(c * c), centroids)
    return fold.reduce(fold.monoids.sum, fold.map(
        lambda p: fold.reduce(fold.monoids.min, fold.sum(p * p) - 2.0 * fold.matmul(centroids, p) + cc), points))


def kmeans_gradient(points, centroids):
    return fold.vjp(kmeans, points, centroids)[1](1.0)


def test_kmeans_gradient_scatters_instead_of_multiplying_one_hots():
    points, centroids = rng.normal(size=(3000, 8)), rng.normal(size=(24, 8))
    assert_same(*both(kmeans_gradient, points, centroids))
    dense = fold.trace(kmeans_gradient, points, centroids)
    sparse = sparse_one_hots(dense)
    assert sum(isinstance(s.prim, ReduceByIndex) for s in sparse.stmts) == 2
    assert not any(isinstance(s.prim, MatMul) for s in sparse.stmts)  # the (K, points) @ (points, d) product is gone
    (body,) = [s.prim.body for s in sparse.stmts if isinstance(s.prim, Map) and len(s.outs) > 2]
    assert not any(isinstance(s.prim, MatMul) and s.args[1].aval.shape == (24, 1) for s in body.stmts)
    assert all(o.aval.shape != (24,) for o in body.outputs)  # no one-hot leaves the body


def test_gradient_of_a_row_maximum_for_the_matrix_and_the_rows():
    x, w = rng.normal(size=(2000, 6)), rng.normal(size=(10, 6))

    def f(x, w):
        return fold.sum(fold.map(lambda r: fold.reduce(fold.monoids.max, fold.matmul(w, r)) ** 2, x))

    assert_same(*both(lambda x, w: fold.vjp(f, x, w)[1](1.0), x, w))
    sparse = sparse_one_hots(fold.trace(lambda x, w: fold.vjp(f, x, w)[1](1.0), x, w))
    assert sparse.stmts  # it ran
    assert sum(isinstance(s.prim, ReduceByIndex) for s in sparse.stmts) == 1  # w's cotangent: a scatter-add
    assert not any(isinstance(s.prim, MatMul) for s in sparse.stmts)
    (body,) = [s.prim.body for s in sparse.stmts if isinstance(s.prim, Map) and len(s.outs) > 2]
    assert not any(isinstance(s.prim, MatMul) and s.args[1].aval.shape == (10, 1) for s in body.stmts)  # x's: a gather


K = 7


def _mask(i, v):
    return fold.where(fold.iota(K) == i, v, 0.0)


def _scatter(i, v):  # as ad/reduce_rules.py writes a min or max gradient's row
    return fold.reduce_by_index(fold.monoids.sum, K, fold.reshape(i, (1,)), fold.reshape(v, (1,)))


def _hand_written(i, v, a, x, one_hot=_mask):
    """Per row: a one-hot at i (possibly outside [0, K)) with value v, read by a product with a, by a sum,
    and output; its negation scaled, stacked, summed and multiplied at the top level."""
    def row(i, v):
        h = one_hot(i, v)
        column = fold.reshape(-2.0 * h, (K, 1))
        return fold.matmul(a, column)[:, 0] + fold.sum(h), h, 3.0 * h
    through, hots, scaled = fold.map(row, i, v)
    return through, fold.sum(hots, axis=0), fold.matmul(fold.transpose(scaled), x), hots * 2.0 + 1.0


@pytest.mark.parametrize("one_hot", [_mask, _scatter])
@pytest.mark.parametrize("low,high", [(0, K), (-2, K + 3)])
def test_hand_written_one_hots_with_indices_in_and_out_of_range(low, high, one_hot):
    """Written as a mask, where(iota == i, v, 0), or as one value scattered into zeros."""
    n = 500
    i = rng.integers(low, high, n)
    v, a, x = rng.normal(size=n), rng.normal(size=(4, K)), rng.normal(size=(n, 3))
    f = lambda *args: _hand_written(*args, one_hot=one_hot)  # noqa: E731
    numpy_result, numba_result = both(f, i, v, a, x)
    assert_same(numpy_result, numba_result)
    program = fold.trace(f, i, v, a, x)
    sparse = sparse_one_hots(program)
    # the product of the scaled one-hots is a scatter; `hots` is also read elementwise, so it stays dense and
    # so does its sum (an output is rewritten only where every reader is)
    assert sum(isinstance(s.prim, ReduceByIndex) for s in sparse.stmts) == 1
    outside = (i < 0) | (i >= K)
    if outside.any():
        assert np.all(numba_result[1] == np.bincount(i[~outside], v[~outside], minlength=K))


def test_one_hots_the_program_returns_stay_dense():
    i, v, x = rng.integers(0, K, 300), rng.normal(size=300), rng.normal(size=(300, 2))

    def f(i, v, x):
        hots = fold.map(lambda i, v: fold.where(fold.iota(K) == i, v, 0.0), i, v)
        t = fold.transpose(hots)
        return hots, fold.sum(hots, axis=0), t, fold.matmul(t, x)

    assert_same(*both(f, i, v, x))


def test_stacked_row_one_hots_and_elementwise_readers_stay_dense():
    """One-hot rows (1, K) stacked and transposed are not columns to scatter; one-hots read only elementwise
    leave the map as it is."""
    i, v = rng.integers(0, K, 300), rng.normal(size=300)

    def rows(i, v):
        hots = fold.map(lambda i, v: fold.reshape(fold.where(fold.iota(K) == i, v, 0.0), (1, K)), i, v)
        return fold.matmul(fold.reshape(fold.transpose(hots, (1, 0, 2)), (300, K)), np.ones((K, 2)))

    program = fold.trace(rows, i, v)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no rewrite attempted, so none fails
        assert sparse_one_hots(program) is program
    assert_same(*both(rows, i, v))
    elementwise = fold.trace(lambda i, v: fold.map(lambda i, v: fold.where(fold.iota(K) == i, v, 0.0) * 2.0 + 1.0, i, v),
                             i, v)
    assert sparse_one_hots(elementwise) is elementwise


def test_a_rewrite_that_fails_leaves_the_map_dense_with_a_warning(monkeypatch):
    from fold.runtime.numba_backend import one_hots

    def broken(*args):
        raise RuntimeError("no")

    monkeypatch.setattr(one_hots, "_map_rewrite", broken)
    program = fold.trace(kmeans_gradient, rng.normal(size=(50, 4)), rng.normal(size=(6, 4)))
    with pytest.warns(UserWarning, match=r"one-hot values of a map left dense \(RuntimeError: no\)"):
        assert sparse_one_hots(program) is program


def test_a_program_without_one_hots_is_left_as_it_is():
    program = fold.trace(lambda x: fold.map(lambda r: fold.sum(r * r), x), rng.normal(size=(5, 3)))
    assert sparse_one_hots(program) is program
