"""A sum over every axis of an elementwise expression over a matrix (runtime/numba_backend/full_sums.py): the
numba backend folds it into the elementwise run, over the operands as vectors, instead of writing the
run's matrix and summing it in a second pass; where the run's values are read elsewhere, or an operand is a
view, the program is left as it was. Values against the numpy backend and NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.cse import cse
from fold.dce import dce
from fold.primitives import Reshape, SumAxes
from fold.runtime.numba_backend.elementwise_fusion import FusedElementwise
from fold.runtime.numba_backend.full_sums import flat_full_sums
from fold.runtime.numba_backend.passes import prepare, prepare_jitted

pytest.importorskip("numba")

rng = np.random.default_rng(60)


def _prepared(f, *args):
    return prepare_jitted(dce(cse(fold.trace(f, *args))))


def _values_of_shape(program, shape):
    return [v for s in program.stmts for v in s.outs if v.aval.shape == shape]


def _agree(f, *args, rtol=1e-12):
    got = fold.jit(f, backend="numba")(*args)
    np.testing.assert_allclose(got, fold.jit(f, backend="numpy")(*args), rtol=rtol)
    return got


@pytest.mark.parametrize("shape, axes", [((1024, 1024), None), ((128, 96, 96), None), ((1024, 1024), (-1, 0))])
def test_a_loss_summed_over_every_axis_is_folded_into_its_run(shape, axes):
    X = rng.normal(size=shape)
    f = lambda X: fold.sum(fold.maximum(X, 0.0) ** 2, axis=axes)  # noqa: E731
    prepared = _prepared(f, X)
    assert not _values_of_shape(prepared, shape), prepared  # nothing of the matrix's shape is made
    assert not any(isinstance(s.prim, SumAxes) for s in prepared.stmts), prepared  # the sum is in the run
    got = _agree(f, X)
    np.testing.assert_allclose(got, np.sum(np.maximum(X, 0.0) ** 2), rtol=1e-12)


def test_the_sum_of_a_product_s_epilogue_reads_the_product_once():
    # cosine similarities through a ReLU, squared and summed: the (n, m) product is the run's only array
    X, Y = rng.normal(size=(1024, 16)).astype(np.float32), rng.normal(size=(1024, 16)).astype(np.float32)
    f = lambda X, Y: fold.sum(fold.maximum(X @ Y.T, 0.0) ** 2)  # noqa: E731
    assert len(_values_of_shape(_prepared(f, X, Y), (1024, 1024))) == 1
    got = _agree(f, X, Y, rtol=1e-5)
    np.testing.assert_allclose(got, np.sum(np.maximum(X.astype(float) @ Y.T.astype(float), 0) ** 2), rtol=1e-5)


def test_a_value_read_elsewhere_is_an_operand_of_the_run_and_a_view_is_summed_by_rows():
    X, mu = rng.normal(size=(1024, 1024)), rng.normal(size=1024)
    def kept(X):  # exp(X) is an output too
        e = fold.exp(X)
        return fold.sum(e * 2.0), e

    program = flat_full_sums(dce(cse(fold.trace(kept, X))))
    (exp,) = [s for s in program.stmts if getattr(s.prim, "op", None) == "exp"]  # computed once, as a matrix
    assert exp.outs[0].aval.shape == X.shape and exp.outs[0] in program.outputs
    assert [s.outs[0].aval.shape for s in program.stmts if getattr(s.prim, "op", None) == "mul"] == [(X.size,)]
    centred = lambda X, mu: fold.sum((X - mu[None, :]) ** 2)  # noqa: E731  (a broadcast row: read in place)
    program = flat_full_sums(dce(cse(fold.trace(centred, X, mu))))
    sums = [(s.args[0].aval.shape, s.prim.axes) for s in program.stmts if isinstance(s.prim, SumAxes)]
    assert sums == [(X.shape, (1,)), ((X.shape[0],), (0,))], sums  # the rows' sums, then theirs
    assert not any(isinstance(s.prim, Reshape) and s.outs[0].aval.shape == (X.size,)
                   for s in program.stmts)  # the broadcast is not made a vector (a copy)
    runs = [s for s in prepare(fold.trace(centred, X, mu), whole_arrays=True).stmts
            if isinstance(s.prim, FusedElementwise)]
    assert [s.prim.row_sum is not None for s in runs] == [True], runs  # the matrix is never written
    for got, want in zip(fold.jit(kept, backend="numba")(X), (np.sum(np.exp(X) * 2.0), np.exp(X)), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(_agree(centred, X, mu), np.sum((X - mu) ** 2), rtol=1e-12)


def test_a_sum_over_some_axes_or_of_a_small_run_is_not_flattened():
    small = rng.normal(size=(300, 200))  # fewer than FLAT_FROM elements: the second pass costs microseconds
    f = lambda X: fold.sum(fold.exp(X) ** 2)  # noqa: E731
    program = dce(cse(fold.trace(f, small)))
    assert flat_full_sums(program) is program
    np.testing.assert_allclose(_agree(f, small), np.sum(np.exp(small) ** 2), rtol=1e-12)
    X = rng.normal(size=(1024, 1024))
    f = lambda X: fold.sum(fold.exp(X), axis=1)  # noqa: E731
    program = dce(cse(fold.trace(f, X)))
    assert flat_full_sums(program) is program
    np.testing.assert_allclose(_agree(f, X), np.exp(X).sum(axis=1), rtol=1e-12)


def test_the_gradient_and_hvp_of_a_summed_loss_agree_with_the_numpy_backend():
    W, X = 0.3 * rng.normal(size=(16, 8)), rng.normal(size=(1 << 17, 16))  # X @ W: FLAT_FROM elements
    loss = lambda W, X: fold.sum(fold.log1p(fold.exp(X @ W)) ** 2)  # noqa: E731
    grad = fold.grad(loss, argnums=(0, 1))
    V = rng.normal(size=W.shape)
    hvp = lambda W, X: fold.jvp(lambda W: fold.grad(loss)(W, X), (W,), (V,))[1]  # noqa: E731
    _agree(loss, W, X, rtol=1e-12)
    for got, want in zip(fold.jit(grad, backend="numba")(W, X), fold.jit(grad, backend="numpy")(W, X), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fold.jit(hvp, backend="numba")(W, X), fold.jit(hvp, backend="numpy")(W, X),
                               rtol=1e-10, atol=1e-12)
