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
