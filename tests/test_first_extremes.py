"""The first position of a row's min or max, fused with the matrix product it is taken over.

runtime/numba_backend/first_extremes.py marks a min/max gradient's re-run extreme and its first position
as one statement; product-fold fusion runs that statement with the elementwise map of the product that
feeds it (kernels.cpu.product_first_extreme). Checked here, against the numpy backend (which runs the
statements as written):
- k-means' gradient, with ties between duplicated centroids (the first must win), points at +inf
  distance from every centroid, and a point holding NaN (its row's gradient is zero, as the fill index
  makes it); the prepared body holds one product kernel and no matrix product;
- a row maximum of x W + b, differentiated for W, x and b (the max side, a vector-first product);
- where the pattern is not what the statements ask (a fill inside [0, K), an identity that is not the
  extreme's), nothing is marked; where no product kernel takes it (distances without a product), the
  body is left as it was;
and the smaller rewrites the gradient needed: reshape round trips dropped (shared_views.py), scalar
statements of a body fused into one kernel (elementwise_fusion.py's `scalars`).
"""

from __future__ import annotations

import warnings

import numpy as np

import fold
from fold.ir import Let, Lit, Program, Var
from fold.primitives import Elementwise, Map, MatMul, Reshape
from fold.runtime.numba_backend.elementwise_fusion import FusedElementwise, fuse_elementwise
from fold.runtime.numba_backend.first_extremes import FirstExtreme, mark_first_extremes
from fold.runtime.numba_backend.passes import MAX_NEST_PRODUCT_BYTES_FLOAT64, prepare
from fold.runtime.numba_backend.product_fold_fusion import ProductFold
from fold.runtime.numba_backend.shared_views import share_views
from helpers import assert_same as assert_same_leaves, both
from test_one_hots import kmeans_gradient

rng = np.random.default_rng(11)
# centroids of 8 float64 dimensions more than a loop nest takes (smaller matrices run in the nest)
CENTROIDS = MAX_NEST_PRODUCT_BYTES_FLOAT64 // 64 + 32


def assert_same(a, b, rtol=1e-12):
    assert_same_leaves(a, b, rtol, scaled=True)


def prepared_body(f, *args) -> Program:
    """The body of f's widest map as the numba backend runs it."""
    top = prepare(fold.trace(f, *args), True)
    body = max((s.prim.body for s in top.stmts if isinstance(s.prim, Map)), key=lambda b: len(b.stmts))
    return prepare(body)


def test_kmeans_gradient_finds_the_nearest_centroid_in_the_product_kernel():
    points, centroids = rng.normal(size=(3000, 8)), rng.normal(size=(CENTROIDS, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(kmeans_gradient, points, centroids))
    body = prepared_body(kmeans_gradient, points, centroids)
    (kernel,) = [s.prim for s in body.stmts if isinstance(s.prim, ProductFold)]
    first = kernel.first_extreme
    assert first is not None and first.extreme == "minimum" and first.fill == CENTROIDS
    assert not any(isinstance(s.prim, (MatMul, FirstExtreme)) for s in body.stmts)


def test_ties_infinities_and_nan_take_the_statements_answer():
    centroids = rng.normal(size=(CENTROIDS, 8))
    centroids[[3, 11, 20]] = centroids[7]  # four equal centroids: every point nearest to them takes the first, 3
    points = np.concatenate([centroids[7] + 1e-3 * rng.normal(size=(1500, 8)), rng.normal(size=(1500, 8))])
    points[9] = 1e300  # distances overflow to +inf for every centroid: the first centroid, 0
    assert_same(*both(kmeans_gradient, points, centroids))
    # A NaN coordinate: no centroid equals a NaN distance, so the fill index and a zero cotangent for the point
    # (its own gradient is 0 * p there, NaN only in the NaN coordinate). The centroids' gradient is left out:
    # the numpy backend's dense one-hot product adds 0 * NaN to every centroid (one_hots.py documents it).
    points[5, 2] = np.nan
    (want, _), (got, _) = both(kmeans_gradient, points, centroids)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9, equal_nan=True)
    assert np.isnan(got[5, 2]) and (np.delete(got[5], 2) == 0).all() and np.isfinite(np.delete(got, 5, axis=0)).all()


def test_row_maximum_gradient_for_the_matrix_the_rows_and_the_bias():
    x, w, b = rng.normal(size=(2500, 8)), rng.normal(size=(8, CENTROIDS)), rng.normal(size=CENTROIDS)

    def loss(x, w, b):
        return fold.sum(fold.map(lambda row: fold.reduce(fold.monoids.max, row @ w + b), x))

    grad = lambda x, w, b: fold.vjp(loss, x, w, b)[1](1.0)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(grad, x, w, b))
    body = prepared_body(grad, x, w, b)
    (kernel,) = [s.prim for s in body.stmts if isinstance(s.prim, ProductFold)]
    assert kernel.first_extreme.extreme == "maximum" and kernel.vector_first


def _pattern(fill: int, identity: float) -> Program:
    """x -> (min(x), first position of it, `fill` if none), written out as the gradient writes it."""
    k = 5
    x = Var(fold.ShapedArray((k,), np.dtype(np.float64)))
    trace = fold.trace(lambda v: fold.reduce(fold.monoids.min, v), np.zeros(k))
    (reduce_stmt,) = trace.stmts
    m, positions, spread, mask, chosen, first = (Var(fold.ShapedArray(shape, np.dtype(dtype))) for shape, dtype in
                                                 [((), "float64"), ((k,), "int64"), ((k,), "float64"), ((k,), "bool"),
                                                  ((k,), "int64"), ((), "int64")])
    index_reduce = fold.trace(lambda v: fold.reduce(fold.monoids.min, v), np.zeros(k, np.int64)).stmts[0]
    stmts = (
        Let((m,), reduce_stmt.prim, (Lit(np.asarray(identity)), x)),
        Let((positions,), fold.primitives.Iota(k), ()),
        Let((spread,), fold.primitives.BroadcastTo((k,)), (m,)),
        Let((mask,), Elementwise("eq"), (x, spread)),
        Let((chosen,), Elementwise("where"), (mask, positions, Lit(np.asarray(fill)))),
        Let((first,), index_reduce.prim, (index_reduce.args[0], chosen)),
    )
    return Program((x,), stmts, (m, first))


def test_only_the_statements_the_kernel_answers_are_marked():
    marked = mark_first_extremes(_pattern(5, np.inf))
    (stmt,) = [s for s in marked.stmts if isinstance(s.prim, FirstExtreme)]
    assert stmt.prim.extreme == "minimum" and stmt.prim.fill == 5
    x = rng.normal(size=5)
    x[[1, 3]] = x.min() - 1.0
    from fold.runtime.interpreter import eval_program
    assert [int(v) if i else float(v) for i, v in enumerate(eval_program(marked, [x], 0))] == [x.min(), 1]
    for fill, identity in ((4, np.inf), (5, 0.0), (5, -np.inf)):  # an index as fill; not min's identity
        program = _pattern(fill, identity)
        assert mark_first_extremes(program) is program


def test_a_first_extreme_without_a_product_kernel_stays_as_it_was():
    points, centroids = rng.normal(size=(3000, 8)), rng.normal(size=(CENTROIDS, 8))

    def direct(points, centroids):
        return fold.sum(fold.map(lambda p: fold.reduce(fold.monoids.min, fold.map(
            lambda c: fold.sum((p - c) * (p - c)), centroids)), points))

    grad = lambda p, c: fold.vjp(direct, p, c)[1](1.0)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(grad, points, centroids))
    top = prepare(fold.trace(grad, points, centroids), True)
    for body in (s.prim.body for s in top.stmts if isinstance(s.prim, Map)):
        assert not any(isinstance(s.prim, FirstExtreme) for s in prepare(body).stmts)


def test_reshape_round_trips_are_dropped():
    def f(v):
        column = fold.reshape(v * 2.0, (7, 1))
        return fold.reshape(column, (7,)) + v

    program = fold.trace(f, np.ones(7))
    shared = share_views(program)
    assert not any(isinstance(s.prim, Reshape) and s.outs[0].aval.shape == (7,) for s in shared.stmts)
    fused = fuse_elementwise(shared)
    assert [type(s.prim) for s in fused.stmts if not isinstance(s.prim, Reshape)] == [FusedElementwise]
    x = rng.normal(size=(3, 7))
    from fold.runtime.interpreter import eval_program
    np.testing.assert_array_equal(eval_program(fused, [x[0]], 0)[0], x[0] * 3.0)


def test_a_bodys_scalar_statements_run_as_one_kernel():
    x = rng.normal(size=(50_000, 3))

    def f(x):
        return fold.map(lambda row: fold.where((fold.sum(row) > 0.0) & (row[0] < 1.0), -2.0 * row[1], row[2] + 1.0), x)

    # the map folds its rows, so a loop nest runs it; its body as the backend prepares a body the nest declines
    assert [s.prim.name for s in prepare(fold.trace(f, x), True).stmts] == ["loop_nest"]
    body = prepare(fold.trace(f, x).stmts[0].prim.body)
    scalar_runs = [s for s in body.stmts if isinstance(s.prim, FusedElementwise) and s.outs[0].aval.ndim == 0]
    assert len(scalar_runs) == 1 and len(scalar_runs[0].prim.region.stmts) >= 5
    assert not any(isinstance(s.prim, Elementwise) for s in body.stmts)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(f, x))
