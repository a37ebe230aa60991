"""A sum over the first axis of a matrix run joins the run (kernels.cpu.map_with_column_sums): batch
normalisation's variance and a logsumexp over columns never write the (n, c) values they sum."""

from __future__ import annotations

import numpy as np
import pytest

import fold

pytest.importorskip("numba")

from fold.runtime.numba_backend.elementwise_fusion import FusedElementwise  # noqa: E402
from fold.runtime.numba_backend.passes import prepare  # noqa: E402

rng = np.random.default_rng(17)


def variance(X):
    mu = np.mean(X, axis=0)
    return np.mean((X - mu) ** 2, axis=0)


def logsumexp_columns(X):
    m = np.max(X, axis=0)
    return np.log(np.sum(np.exp(X - m), axis=0)) + m


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-5)])
@pytest.mark.parametrize("f", [variance, logsumexp_columns])
def test_a_column_sum_joins_its_run_and_matches_numpy(f, dtype, rtol, kernel_calls):
    X = rng.normal(size=(3000, 37)).astype(dtype)
    runs = [s for s in prepare(fold.trace(f, X), whole_arrays=True).stmts if isinstance(s.prim, FusedElementwise)]
    summing = [s for s in runs if s.prim.sums_columns]
    assert len(summing) == 1 and X.shape not in [v.aval.shape for v in summing[0].outs], runs  # nothing stored
    got = fold.jit(f, backend="numba")(X)
    assert kernel_calls.get("map_with_column_sums") == 1, kernel_calls
    np.testing.assert_allclose(got, f(X.astype(np.float64)), rtol=rtol)
    np.testing.assert_allclose(got, fold.jit(f, backend="numpy")(X), rtol=rtol)


def test_the_gradient_of_a_column_logsumexp_matches_the_numpy_backend():
    X = rng.normal(size=(3000, 37))
    g = fold.grad(lambda X: np.sum(logsumexp_columns(X)))
    np.testing.assert_allclose(fold.jit(g, backend="numba")(X), fold.jit(g, backend="numpy")(X), rtol=1e-10)


def batch_normalised_square_sum(X, g, b):
    """X - mu written twice: the variance's run sums one, the normalising run, after the variance, reads
    the other."""
    mu = np.mean(X, axis=0)
    var = np.mean((X - mu) ** 2, axis=0)
    return np.sum(((X - mu) / np.sqrt(var + 1e-5) * g + b) ** 2)


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_batch_normalisation_writes_nothing_of_the_inputs_shape(dtype, rtol):
    """The second X - mu opens the normalising run instead of joining the variance's (which would store it
    for that run to read back): the variance's run stores nothing but the sums."""
    X = rng.normal(size=(3000, 37)).astype(dtype)
    g, b = (rng.normal(size=37).astype(dtype) for _ in range(2))
    prepared = prepare(fold.trace(batch_normalised_square_sum, X, g, b), whole_arrays=True)
    runs = [s for s in prepared.stmts if isinstance(s.prim, FusedElementwise) and s.prim.run_shape == X.shape]
    variance_run, normalising = runs
    assert variance_run.prim.sums_columns and [v.aval.shape for v in variance_run.outs] == [(37,)], prepared
    assert prepared.inputs[0] in normalising.args  # X itself, not a stored X - mu
    want = batch_normalised_square_sum(X.astype(np.float64), g.astype(np.float64), b.astype(np.float64))
    for backend in ("numba", "numpy"):
        np.testing.assert_allclose(fold.jit(batch_normalised_square_sum, backend=backend)(X, g, b), want, rtol=rtol)
    grad = fold.grad(batch_normalised_square_sum, argnums=(0, 1, 2))
    for got, ref in zip(fold.jit(grad, backend="numba")(X, g, b), fold.jit(grad, backend="numpy")(X, g, b), strict=True):
        # the gradient's sums cancel (it sums to 0 over each column): compared against its largest entry
        tol = 1e-7 if dtype == np.float64 else 1e-3
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_a_sibling_read_with_the_open_runs_values_still_joins_it():
    """The control: x + 1 reads nothing of the run of x * 2, and the maximum of x * 2 waits for that run to
    end; but x + 1's reader reads the run's value, not the maximum, so all three share the run."""
    def f(x):
        doubled = x * 2.0
        top = np.max(doubled)
        shifted = x + 1.0
        return np.sum(doubled * shifted) + top

    x = rng.normal(size=(3000, 37))
    prepared = prepare(fold.trace(f, x), whole_arrays=True)
    runs = [s for s in prepared.stmts if isinstance(s.prim, FusedElementwise)]
    ops = [[m.prim.op for m in s.prim.region.stmts if hasattr(m.prim, "op")] for s in runs]
    assert any(o[:3] == ["mul", "add", "mul"] for o in ops), prepared
    np.testing.assert_allclose(fold.jit(f, backend="numba")(x), np.sum(x * 2.0 * (x + 1.0)) + np.max(2 * x), rtol=1e-12)
