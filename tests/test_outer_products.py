"""Outer products at the top level written as elementwise products of broadcasts (numba backend,
runtime/numba_backend/outer_products.py): they join the elementwise kernel of their neighbours."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.cse import cse
from fold.dce import dce
from fold.primitives import MatMul
from fold.runtime.numba_backend.outer_products import outer_products_elementwise
from fold.runtime.numba_backend.passes import prepare_jitted
import fold.runtime.numpy_impl  # noqa: F401  (registers the rules eval_program runs)
from fold.runtime.interpreter import eval_program

pytest.importorskip("numba")

rng = np.random.default_rng(3)


def logistic(w, X, y):
    return fold.sum(fold.log1p(fold.exp(-y * (X @ w))))


def _hvp_in_every_argument(dtype):
    w, X = (0.2 * rng.normal(size=6)).astype(dtype), rng.normal(size=(500, 6)).astype(dtype)
    y = rng.choice(np.array([-1.0, 1.0], dtype), 500)
    directions = (rng.normal(size=6).astype(dtype), rng.normal(size=(500, 6)).astype(dtype))
    hvp = lambda w, X: fold.jvp(fold.grad(lambda w, X: logistic(w, X, y), argnums=(0, 1)), (w, X), directions)[1]
    return hvp, (w, X)


def _outer_products(program):
    return [s for s in program.stmts if isinstance(s.prim, MatMul) and s.args[0].aval.shape[1] == 1]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_outer_products_of_a_hessian_vector_product_are_elementwise(dtype):
    # the cotangent of X in X @ w is an outer product; the HVP adds two, which now run in one kernel
    hvp, args = _hvp_in_every_argument(dtype)
    program = dce(cse(fold.trace(hvp, *args)))
    assert len(_outer_products(program)) == 2, program
    prepared = prepare_jitted(program)
    assert not _outer_products(prepared), prepared
    got, want = fold.jit(hvp, backend="numba")(*args), fold.jit(hvp, backend="numpy")(*args)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for g, v in zip(got, want, strict=True):
        np.testing.assert_allclose(g, v, rtol=tol, atol=tol * np.abs(v).max())


def test_an_outer_product_as_broadcasts_has_the_products_values_exactly():
    a, b = rng.normal(size=(7, 1)), rng.normal(size=(1, 5))
    program = fold.trace(lambda a, b: a @ b, a, b)
    rewritten = outer_products_elementwise(program)
    assert not _outer_products(rewritten) and _outer_products(program)
    np.testing.assert_array_equal(eval_program(rewritten, [a, b])[0], a * b)


def test_products_over_a_longer_shared_axis_stay_products():
    a, b = rng.normal(size=(7, 2)), rng.normal(size=(2, 5))
    program = fold.trace(lambda a, b: a @ b, a, b)
    assert outer_products_elementwise(program) is program


def test_a_gemm_blocks_product_over_one_feature_stays_a_product():
    # the gemm backward fusion shares a block's products between its walks: it finds them as products
    from fold.runtime.numba_backend.gemm_backward_fusion import GemmWithBackward

    Q, K, V = (rng.normal(size=(12, 1)) for _ in range(3))
    f = lambda Q, K, V: fold.sum(fold.gemm_map_reduce(  # noqa: E731
        fold.monoids.logwsum, lambda s, v: {"z": s, "v": v}, Q, K, cols=(V,), block=(4, 4))["v"])
    program = dce(cse(fold.trace(fold.grad(f, argnums=(0, 1, 2)), Q, K, V)))
    assert any(isinstance(s.prim, GemmWithBackward) for s in prepare_jitted(program).stmts)
