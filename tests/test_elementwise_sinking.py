"""Elementwise statements moved to their first reader (runtime/numba_backend/elementwise_sinking.py), so that
array code written in another order fuses into one run."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.cse import cse
from fold.dce import dce
from fold.primitives import Elementwise, MatMul

pytest.importorskip("numba")

from fold.runtime.numba_backend.elementwise_fusion import FusedElementwise  # noqa: E402
from fold.runtime.numba_backend.elementwise_sinking import sink_elementwise  # noqa: E402
from fold.runtime.numba_backend.passes import prepare  # noqa: E402

rng = np.random.default_rng(3)


def gaussian_sum(A, B):
    """Written with NumPy's functions: the norms' sum is traced before the product it is combined with."""
    squared = np.sum(A * A, axis=1)[:, None] + np.sum(B * B, axis=1)[None, :] - 2.0 * (A @ B.T)
    return np.sum(np.exp(-squared))


def test_a_sum_of_broadcast_norms_joins_the_run_after_the_product_and_no_matrix_is_written():
    # FLAT_FROM elements: summed by rows; 2A of COMPILE_FROM elements, a run of its own traced between
    A, B = (rng.normal(size=(1024, 32)).astype(np.float32) for _ in range(2))
    prepared = prepare(fold.trace(gaussian_sum, A, B), whole_arrays=True)
    matrices = [s for s in prepared.stmts if any(v.aval.shape == (1024, 1024) for v in s.outs)]
    kinds = sorted(type(s.prim).__name__ for s in matrices)
    assert kinds == ["BroadcastTo", "BroadcastTo", "MatMul"], kinds  # views and the product only
    (run,) = [s for s in prepared.stmts if isinstance(s.prim, FusedElementwise) and s.prim.run_shape == (1024, 1024)]
    assert run.prim.row_sum is not None
    ops = [s.prim.op for s in run.prim.region.stmts if isinstance(s.prim, Elementwise)]
    assert ops[:2] == ["add", "sub"] and "exp" in ops, ops
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    want = np.exp(-((A64 ** 2).sum(1)[:, None] + (B64 ** 2).sum(1)[None, :] - 2 * A64 @ B64.T)).sum()
    for backend in ("numba", "numpy"):
        np.testing.assert_allclose(fold.jit(gaussian_sum, backend=backend)(A, B), want, rtol=2e-5)
    grads = [fold.jit(fold.grad(gaussian_sum, argnums=(0, 1)), backend=b)(A, B) for b in ("numba", "numpy")]
    for got, ref in zip(*grads, strict=True):
        np.testing.assert_allclose(got, ref, rtol=2e-4, atol=1e-4 * np.abs(ref).max())


def test_each_elementwise_statement_moves_to_just_before_its_first_reader():
    def f(x, y, W):
        a = fold.exp(x)  # read only after the product
        b = x * 2.0  # read by the product
        p = b @ W
        return fold.sum(a * p) + fold.sum(y * y), a

    x, y, W = rng.normal(size=(5, 4)), rng.normal(size=(3, 2)), rng.normal(size=(4, 4))
    program = dce(cse(fold.trace(f, x, y, W)))
    sunk = sink_elementwise(program)
    order = [getattr(s.prim, "op", type(s.prim).__name__) for s in sunk.stmts]
    assert order.index("mul") < order.index("MatMul") < order.index("exp"), order
    assert sorted(map(id, sunk.stmts)) == sorted(map(id, program.stmts))  # the same statements, moved
    position = {v: k for k, s in enumerate(sunk.stmts) for v in s.outs}
    for k, s in enumerate(sunk.stmts):  # every value made before it is read
        assert all(position.get(a, -1) < k for a in s.args if a in position), (k, order)
    assert sink_elementwise(sunk) is sunk  # nothing left to move
    for got, want in zip(fold.jit(f, backend="numba")(x, y, W), fold.jit(f, backend="numpy")(x, y, W)):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_value_only_the_outputs_read_moves_to_the_end():
    def f(x, W):
        kept = x + 1.0
        return fold.sum(x @ W), kept

    x, W = rng.normal(size=(5, 4)), rng.normal(size=(4, 3))
    sunk = sink_elementwise(dce(cse(fold.trace(f, x, W))))
    assert getattr(sunk.stmts[-1].prim, "op", None) == "add" and isinstance(sunk.stmts[0].prim, MatMul)
    for got, want in zip(fold.jit(f, backend="numba")(x, W), (np.sum(x @ W), x + 1.0)):
        np.testing.assert_allclose(got, want, rtol=1e-12)
