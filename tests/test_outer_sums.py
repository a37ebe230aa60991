"""A matrix product over a map's axis as the sum of the rows' outer products (runtime/loops/outer_sums.py), and
products with a one-hot operand in the loop nest (build.py): the gradient of a map that multiplies a captured
matrix by its row folds the matrix's cotangent as it goes, with the numpy backend's results."""

from __future__ import annotations

import re

import numpy as np
import pytest

import fold
from fold.cse import cse
from fold.dce import dce
from fold.primitives import Map, MatMul
from fold.runtime.loops import LoopNest, describe, kernel_of
from fold.runtime.loops.one_hot_products import one_hot_products
from fold.runtime.loops.outer_sums import MAX_ONE_HOT_OUTER_SUM, MAX_OUTER_SUM, outer_products_as_sums
from fold.runtime.numba_backend.passes import prepare

pytest.importorskip("numba")

M = fold.monoids
rng = np.random.default_rng(5)


def kmeans_matrix_form(C, P):
    cc = fold.map(lambda c: fold.sum(c * c), C)
    return fold.reduce(M.sum, fold.map(lambda p: fold.reduce(M.min, fold.sum(p * p) - 2.0 * (C @ p) + cc), P))


def nearest_and_layer(C, W, D, P):
    """A body the nest takes for its inner map (each point's nearest centroid, written as a map), which also
    multiplies captured matrices by the point: a layer's output, and the largest entry of another product."""
    def per_point(p):
        nearest = fold.reduce(M.min, fold.map(lambda c: fold.sum((p - c) * (p - c)), C))
        return nearest + fold.sum(fold.tanh(W @ p)) + fold.reduce(M.max, D @ p)
    return fold.reduce(M.sum, fold.map(per_point, P))


def _gradient_program(f, *args):
    return dce(cse(fold.trace(fold.grad(f, argnums=tuple(range(len(args)))), *args)))


def _top_level_shapes(program):
    return [v.aval.shape for s in program.stmts for v in s.outs]


def _close(got, want, rtol):
    for g, w in zip(fold.tree_flatten(got)[0], fold.tree_flatten(want)[0], strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=rtol * max(1.0, np.abs(w).max()))


def _inputs(dtype):
    return tuple(rng.normal(size=s).astype(dtype) for s in ((8, 5), (6, 5), (7, 5), (400, 5)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_cotangent_of_a_captured_matrix_is_folded_as_outer_products(dtype):
    C, W, D, P = _inputs(dtype)
    program = _gradient_program(nearest_and_layer, C, W, D, P)
    assert any(isinstance(s.prim, MatMul) and s.args[0].aval.shape[1] == P.shape[0] for s in program.stmts), program
    lifted, maps = outer_products_as_sums(program)
    assert maps and not any(isinstance(s.prim, MatMul) for s in lifted.stmts), lifted
    prepared = prepare(program, whole_arrays=True)
    # one nest folds the matrices' cotangents: no (points, rows) array is stored to multiply at the end
    assert not any(isinstance(s.prim, MatMul) for s in prepared.stmts), prepared
    assert not [shape for shape in _top_level_shapes(prepared) if len(shape) >= 2 and shape[0] == P.shape[0]
                and shape != P.shape], prepared
    g = fold.grad(nearest_and_layer, argnums=(0, 1, 2, 3))
    _close(fold.jit(g, backend="numba")(C, W, D, P), fold.jit(g, backend="numpy")(C, W, D, P),
           2e-4 if dtype == np.float32 else 1e-10)


def test_a_one_hot_row_adds_one_row_of_the_sum():
    # the cotangent of the largest entry of D @ p is one-hot over D's rows: its outer product with the point is
    # one row, which the nest adds alone (guarded by the index), not 7 rows of zeros
    C, W, D, P = _inputs(np.float64)
    prepared = prepare(_gradient_program(nearest_and_layer, C, W, D, P), whole_arrays=True)
    (text,) = [describe(kernel_of(s.prim)) for s in prepared.stmts if isinstance(s.prim, LoopNest)]
    def update_of(shape):  # the line adding to the fold's state of that shape
        (name,) = re.findall(rf"(state\d+) = buffer float64\[{shape}\]", text)
        (line,) = [x for x in text.splitlines() if re.search(rf"{name}\[\w+, \w+\] = np.float64\({name}", x)]
        return line

    assert re.search(r"\[h\d+, i\d+\] = ", update_of("7, 5")), text  # D's: a row at the index alone
    assert re.search(r"\[i\d+, i\d+\] = ", update_of("6, 5")), text  # W's (the layer's): every row


def test_products_over_the_map_axis_with_a_one_hot_operand_match_numpy():
    # a one-hot operand along the summed axis of a product inside the body: the one term at its index
    A = rng.normal(size=(6, 4)).astype(np.float32)
    X = rng.normal(size=(50, 6)).astype(np.float32)

    def f(A, X):
        def row(x):
            first = fold.reduce(M.min, fold.where(x == fold.reduce(M.max, x), fold.iota(6), 6))
            hot = fold.where(fold.iota(6) == first, x, 0.0).astype(np.float32)
            return fold.sum(fold.matmul(fold.reshape(hot, (1, 6)), A) * fold.matmul(fold.reshape(x, (1, 6)), A))
        return fold.reduce(M.sum, fold.map(row, X))

    g = fold.grad(f, argnums=(0, 1))
    _close(fold.jit(f, backend="numba")(A, X), fold.jit(f, backend="numpy")(A, X), 2e-5)
    _close(fold.jit(g, backend="numba")(A, X), fold.jit(g, backend="numpy")(A, X), 2e-4)


def test_a_one_hot_column_is_summed_past_the_dense_limit():
    # k-means' matrix form: the centroids' cotangent from each point is one row (its nearest centroid's),
    # so the sum over points is taken with more centroids than a dense sum's state may hold
    centroids = MAX_OUTER_SUM // 5 + 1
    C, P = rng.normal(size=(centroids, 5)).astype(np.float32), rng.normal(size=(300, 5)).astype(np.float32)
    program = _gradient_program(kmeans_matrix_form, C, P)
    lifted, maps = outer_products_as_sums(program)
    assert maps and not any(isinstance(s.prim, MatMul) for s in lifted.stmts), lifted
    prepared = prepare(program, whole_arrays=True)
    assert not any(isinstance(s.prim, MatMul) for s in prepared.stmts), prepared
    assert not [shape for shape in _top_level_shapes(prepared) if shape[:2] == (P.shape[0], centroids)], prepared
    g = fold.grad(kmeans_matrix_form, argnums=(0, 1))
    _close(fold.jit(g, backend="numba")(C, P), fold.jit(g, backend="numpy")(C, P), 2e-4)
    # the one-hot sum's own limit
    too_many = rng.normal(size=(MAX_ONE_HOT_OUTER_SUM // 5 + 1, 5)).astype(np.float32)
    assert outer_products_as_sums(_gradient_program(kmeans_matrix_form, too_many, P[:20]))[1] == set()


_BOUNDS_CHILD = """
import numpy as np
import fold
M = fold.monoids
def cost(C, P):
    cc = fold.map(lambda c: fold.sum(c * c), C)
    return fold.reduce(M.sum, fold.map(lambda p: fold.reduce(M.min, fold.sum(p * p) - 2.0 * (C @ p) + cc), P))
rng = np.random.default_rng(3)
C, P = rng.normal(size=(8, 5)), rng.normal(size=(400, 5))
P[7, 1] = np.nan  # its distances are NaN: no first index, the one-hot index is 8, one past C's rows
dP, dC = fold.jit(fold.grad(cost, argnums=(1, 0)), backend="numba")(C, P)
print(int(np.isnan(np.asarray(dP)).sum()), int(np.isnan(np.asarray(dC)).sum()))
"""


def test_a_one_hot_index_out_of_range_reads_nothing_past_the_operand(tmp_path):
    # a row holding NaN has no first index (the index is K): the term at it is read inside the guard on the
    # index, not before it (under Numba's bounds checks the read past C's rows raised IndexError)
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", FOLD_CACHE_DIR=str(tmp_path / "fold"),
               NUMBA_CACHE_DIR=str(tmp_path / "numba"), FOLD_BACKEND="numba")
    done = subprocess.run([sys.executable, "-c", _BOUNDS_CHILD], cwd=Path(__file__).resolve().parents[1], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # the NaN row gets no cotangent from its minimum (as the nest says), its own 2 p term NaN at P[7, 1] alone
    assert done.stdout.split() == ["1", "0"], done.stdout


def test_products_that_do_not_contract_over_rows_are_left_alone():
    C = rng.normal(size=(8, 5))
    # a product too large for a fold's state, and one over an axis that is not the map's, stay products
    fits, too_big = rng.normal(size=(MAX_OUTER_SUM // 5, 5)), rng.normal(size=(MAX_OUTER_SUM // 5 + 1, 5))
    P = rng.normal(size=(30, 5))
    assert outer_products_as_sums(_gradient_program(lambda W, P: nearest_and_layer(C, W, W[:2], P), fits, P))[1]
    assert outer_products_as_sums(_gradient_program(lambda W, P: nearest_and_layer(C, W, too_big, P), too_big, P))[1] == set()

    def reordered(C, P):
        # each row's elements in another order (a transpose of its own axes): not the row's outer product
        Y = fold.map(lambda p: fold.reshape(C @ p, (2, 4)), P)
        n = P.shape[0]
        return fold.sum(fold.matmul(fold.reshape(fold.transpose(Y, (2, 1, 0)), (8, n)), P) * C)

    P = rng.normal(size=(40, 5))
    assert outer_products_as_sums(dce(cse(fold.trace(reordered, C, P))))[1] == set()
    _close(fold.jit(reordered, backend="numba")(C, P), fold.jit(reordered, backend="numpy")(C, P), 1e-10)


@pytest.mark.parametrize("dtype, centroids, dims, nest", [(np.float32, 8, 5, True), (np.float64, 8, 5, True),
                                                          (np.float32, 1700, 5, True), (np.float32, 100, 96, False),
                                                          (np.float64, 210, 5, False)])
def test_a_reduce_of_a_small_product_is_a_nest(dtype, centroids, dims, nest):
    # k-means' matrix form: a nest where its centroids fit the nest's limit (nothing of points x
    # centroids stored), or in float32 past it where the shared axis is short (the nest's jammed sweep); else
    # batched products (BLAS; the product kernel's in float64), gradient included
    from fold.runtime.numba_backend.passes import MAX_NEST_PRODUCT_BYTES, MAX_NEST_PRODUCT_BYTES_FLOAT64, SHORT_SHARED_AXIS

    C, P = rng.normal(size=(centroids, dims)).astype(dtype), rng.normal(size=(400, dims)).astype(dtype)
    within = C.nbytes <= (MAX_NEST_PRODUCT_BYTES_FLOAT64 if dtype == np.float64 else MAX_NEST_PRODUCT_BYTES)
    assert (within or (dtype == np.float32 and dims <= SHORT_SHARED_AXIS)) == nest
    prepared = prepare(dce(cse(fold.trace(kmeans_matrix_form, C, P))), whole_arrays=True)
    nests = [s for s in prepared.stmts if isinstance(s.prim, LoopNest)
             and any(isinstance(t.prim, MatMul) for t in _all_statements(s.prim.program))]
    assert bool(nests) == nest, prepared
    _close(fold.jit(kmeans_matrix_form, backend="numba")(C, P), fold.jit(kmeans_matrix_form, backend="numpy")(C, P),
           1e-5 if dtype == np.float32 else 1e-12)
    if not nest:
        prepared = prepare(_gradient_program(kmeans_matrix_form, C, P), whole_arrays=True)
        assert not [s for s in prepared.stmts if isinstance(s.prim, LoopNest)
                    and any(isinstance(t.prim, MatMul) for t in _all_statements(s.prim.program))], prepared
    g = fold.grad(kmeans_matrix_form, argnums=(0, 1))
    rtol = 2e-4 if dtype == np.float32 else 1e-10
    _close(fold.jit(g, backend="numba")(C, P), fold.jit(g, backend="numpy")(C, P), rtol)


def test_a_float32_product_gradient_sums_each_rows_outer_product_in_the_nest():
    # k-means' matrix form in float32: the centroids' cotangent is the sum over points of a one-hot row (the
    # nearest centroid's) times the point; the map whose rows are so summed is a nest (the product in its body
    # is one the nest takes), which adds each point at its index into a (centroids, d) state, and counts the
    # points per centroid (a histogram, for the |c|^2 term) in the same loop: no product over the points'
    # axis and no array of rows per point but their cotangent at the top level (a vector of the points'
    # number: their seed cotangent, a broadcast 1.0)
    C, P = rng.normal(size=(8, 5)).astype(np.float32), rng.normal(size=(400, 5)).astype(np.float32)
    prepared = prepare(_gradient_program(kmeans_matrix_form, C, P), whole_arrays=True)
    assert not any(isinstance(s.prim, MatMul) for s in prepared.stmts), prepared
    per_point = [shape for shape in _top_level_shapes(prepared) if P.shape[0] in shape and len(shape) > 1]
    assert per_point == [P.shape], prepared
    (text,) = [describe(kernel_of(s.prim)) for s in _product_nests(prepared)]
    (state,) = re.findall(r"(state\d+) = buffer float64\[8, 5\]", text)
    assert re.search(rf"{state}\[h\d+, i\d+\] = ", text), text  # the nearest centroid's row alone
    assert re.search(r"state\d+ = buffer float64\[8\]", text), text  # the counts, binned in the same fold
    g = fold.grad(kmeans_matrix_form, argnums=(0, 1))
    _close(fold.jit(g, backend="numba")(C, P), fold.jit(g, backend="numpy")(C, P), 2e-4)


def test_the_products_of_a_min_gradients_scattered_cotangent_are_found_one_hot():
    # in the body of k-means' gradient map (matrix form), C @ p is dense; C^T @ onehot (the point's cotangent)
    # and onehot @ p^T (its share of C's, written by outer_sums) read one row each
    C, P = rng.normal(size=(8, 5)).astype(np.float32), rng.normal(size=(400, 5)).astype(np.float32)
    lifted, _ = outer_products_as_sums(_gradient_program(kmeans_matrix_form, C, P))
    (body,) = [s.prim.body for s in lifted.stmts if isinstance(s.prim, Map) and s.outs[0].aval.shape[0] == 400]
    products = [s for s in body.stmts if isinstance(s.prim, MatMul)]
    cheap = one_hot_products(body)
    shapes = sorted((s.args[0].aval.shape, s.args[1].aval.shape) for s in products if id(s) in cheap)
    assert shapes == [((5, 8), (8, 1)), ((8, 1), (1, 5))], body
    assert [(s.args[0].aval.shape, s.args[1].aval.shape) for s in products if id(s) not in cheap] == [((8, 5), (5, 1))]


def quantisation_error(C, P):
    """Each point's distance to its nearest centroid, the centroid picked by a one-hot mask written by hand."""
    k = C.shape[0]
    cc = fold.map(lambda c: fold.sum(c * c), C)

    def per_point(p):
        distances = fold.sum(p * p) - 2.0 * (C @ p) + cc
        nearest = fold.reduce(M.min, fold.where(distances == fold.reduce(M.min, distances), fold.iota(k), k))
        hot = fold.reshape(fold.where(fold.iota(k) == nearest, 1.0, 0.0).astype(C.dtype), (k, 1))
        centroid = fold.reshape(fold.matmul(fold.transpose(C), hot), p.shape)
        return fold.sum((p - centroid) * (p - centroid))
    return fold.reduce(M.sum, fold.map(per_point, P))


def test_a_users_mask_at_one_index_is_one_hot_as_the_scatter_is():
    # where(iota == j, 1, 0) picks the nearest centroid by a product: C^T @ hot reads one row of C, and the
    # gradient's hot @ g^T adds one row of C's cotangent per point, so the summed map is a nest (10^6 points
    # of 16, 64 centroids, float32: 3.3-4.0 s -> 72-76 ms)
    C, P = rng.normal(size=(8, 5)).astype(np.float32), rng.normal(size=(400, 5)).astype(np.float32)
    lifted, _ = outer_products_as_sums(_gradient_program(quantisation_error, C, P))
    (body,) = [s.prim.body for s in lifted.stmts if isinstance(s.prim, Map) and s.outs[0].aval.shape[0] == 400]
    products = [s for s in body.stmts if isinstance(s.prim, MatMul)]
    dense = [(s.args[0].aval.shape, s.args[1].aval.shape) for s in products if id(s) not in one_hot_products(body)]
    assert dense == [((8, 5), (5, 1))], body  # the distances' product alone
    prepared = prepare(_gradient_program(quantisation_error, C, P), whole_arrays=True)
    assert _product_nests(prepared) and not any(isinstance(s.prim, MatMul) for s in prepared.stmts), prepared
    # the mask reaches the outer product transposed (ad's cotangent of C^T): one-hot still, one row added
    (text,) = [describe(kernel_of(s.prim)) for s in _product_nests(prepared)]
    (state,) = re.findall(r"(state\d+) = buffer float64\[8, 5\]", text)
    assert re.search(rf"{state}\[h\d+, i\d+\] = ", text), text
    g = fold.grad(quantisation_error, argnums=(0, 1))
    _close(fold.jit(g, backend="numba")(C, P), fold.jit(g, backend="numpy")(C, P), 2e-4)


def test_a_layers_weight_gradient_with_dense_products_is_left_to_blas():
    # a small float32 layer applied to each row: its weight's cotangent is the sum over rows of g x^T, dense
    # outer products; with W^T g per row and W @ x, three dense products a row that BLAS runs batched over
    # blocks of rows 2-3x faster than the nest's loops (10^6 rows, K = d = 32: 108-153 against 311-369 ms)
    def layer(X, W):
        return fold.sum(fold.map(lambda x: fold.sum(fold.tanh(W @ x)), X))

    X, W = rng.normal(size=(300, 6)).astype(np.float32), rng.normal(size=(4, 6)).astype(np.float32)
    for argnums in (1, (0, 1)):
        grad = fold.grad(layer, argnums=argnums)
        assert not _product_nests(prepare(dce(cse(fold.trace(grad, X, W))), whole_arrays=True))
        _close(fold.jit(grad, backend="numba")(X, W), fold.jit(grad, backend="numpy")(X, W), 1e-5)


def _all_statements(program):
    for s in program.stmts:
        yield s
        for b in s.prim.bodies():
            yield from _all_statements(b)


def test_the_numba_backend_leaves_large_products_to_blas():
    # a nest writes a product as scalar loops; a body multiplying a matrix of more than MAX_NEST_PRODUCT_BYTES
    # by each row runs its products batched over blocks of rows (BLAS) as before, in either type
    from fold.runtime.numba_backend.passes import (MAX_NEST_PRODUCT_BYTES, MAX_NEST_PRODUCT_BYTES_FLOAT64,
                                                   nest_takes_products)

    def body_of(W):
        program = fold.trace(lambda W, X: fold.map(lambda x: fold.sum(fold.tanh(W @ x)), X), W, W)
        return program.stmts[0].prim.body

    # float64 has the product kernel beside BLAS: a lower limit
    for dtype, limit in ((np.float32, MAX_NEST_PRODUCT_BYTES), (np.float64, MAX_NEST_PRODUCT_BYTES_FLOAT64)):
        columns = limit // np.dtype(dtype).itemsize // 32
        assert nest_takes_products(body_of(np.ones((32, columns), dtype)))
        assert not nest_takes_products(body_of(np.ones((32, columns + 1), dtype)))


def _product_nests(prepared):
    return [s for s in prepared.stmts if isinstance(s.prim, LoopNest)
            and any(isinstance(t.prim, MatMul) for t in _all_statements(s.prim.program))]


def test_a_map_whose_products_are_folded_in_its_body_is_a_nest_though_its_rows_are_kept():
    # k-means' HVP with respect to the points keeps a row per point, but each row's distances (a product)
    # reach it only through their minimum and its first position: nothing of points x centroids is stored
    C, P, T = (rng.normal(size=s).astype(np.float32) for s in ((8, 5), (400, 5), (400, 5)))
    grad = fold.grad(lambda P, C: kmeans_matrix_form(C, P))
    hvp = lambda P, C: fold.jvp(grad, (P, C), (T, np.zeros_like(C)))[1]
    assert _product_nests(prepare(dce(cse(fold.trace(hvp, P, C))), whole_arrays=True))
    _close(fold.jit(hvp, backend="numba")(P, C), fold.jit(hvp, backend="numpy")(P, C), 1e-5)


def test_a_map_that_keeps_a_product_per_row_leaves_it_to_blas():
    # a layer's gradient with respect to its input keeps W^T g per row: batched products over blocks of rows
    def layer(X, W):
        return fold.sum(fold.map(lambda x: fold.sum(fold.tanh(W @ x)), X))

    X, W = rng.normal(size=(300, 6)).astype(np.float32), rng.normal(size=(6, 6)).astype(np.float32)
    grad = fold.grad(layer)
    assert not _product_nests(prepare(dce(cse(fold.trace(grad, X, W))), whole_arrays=True))
    _close(fold.jit(grad, backend="numba")(X, W), fold.jit(grad, backend="numpy")(X, W), 1e-5)


def batched_layer(As, X):
    """Each row's own matrix times its own vector (a batch of matrices): no matrix shared by the rows."""
    return fold.sum(fold.map(lambda A, x: fold.sum(fold.tanh(A @ x)), As, X))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_map_whose_products_all_multiply_its_own_rows_is_a_nest_though_it_keeps_them(dtype):
    # the gradient with respect to the matrices keeps each row's outer product (16 x 16 per row here 6 x 6):
    # batched over blocks of rows these are stacks of small products, no BLAS call over a shared matrix, so
    # the nest writes them row by row; values against the numpy backend, the HVP in both arguments too
    As, X = rng.normal(size=(300, 6, 6)).astype(dtype) / 6, rng.normal(size=(300, 6)).astype(dtype)
    grad = fold.grad(batched_layer, argnums=(0, 1))
    dA, dX = rng.normal(size=As.shape).astype(dtype), rng.normal(size=X.shape).astype(dtype)
    hvp = lambda As, X: fold.jvp(grad, (As, X), (dA, dX))[1]  # noqa: E731
    for f in (grad, hvp):
        prepared = prepare(dce(cse(fold.trace(f, As, X))), whole_arrays=True)
        assert _product_nests(prepared) and not any(isinstance(s.prim, (Map, MatMul)) for s in prepared.stmts)
        _close(fold.jit(f, backend="numba")(As, X), fold.jit(f, backend="numpy")(As, X),
               1e-5 if dtype == np.float32 else 1e-12)


def test_a_rows_dot_product_in_the_nest_is_a_fold_a_backend_may_split_into_lanes():
    # each element of A @ x sums K products: a commutative fold (a LaneFold on its loop), which the numba
    # backend runs as several chains instead of one add waiting for the last; values as the numpy backend's
    from fold.runtime.loops.nest import Loop

    def loops(nodes):
        for n in nodes:
            if isinstance(n, Loop):
                yield n
                yield from loops(n.body)

    As, X = rng.normal(size=(300, 6, 16)).astype(np.float32) / 4, rng.normal(size=(300, 16)).astype(np.float32)
    prepared = prepare(dce(cse(fold.trace(batched_layer, As, X))), whole_arrays=True)
    (nest,) = _product_nests(prepared)
    kernel = kernel_of(nest.prim)
    body = kernel.outer.step if hasattr(kernel.outer, "step") else kernel.outer.body
    assert 16 in [loop.extent for loop in loops(body) if loop.folds], describe(kernel)  # the sum over K
    _close(fold.jit(batched_layer, backend="numba")(As, X), fold.jit(batched_layer, backend="numpy")(As, X), 1e-5)
