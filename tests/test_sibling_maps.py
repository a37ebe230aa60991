"""Sibling loop nests joined (runtime/loops/sibling_maps.py): nests over the same rows that do not read each
other run as one, computing what both bodies compute once, with the numpy backend's values."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.cse import cse
from fold.dce import dce
from fold.primitives import Elementwise, Map
from fold.runtime.loops import LoopNest
from fold.runtime.loops.sibling_maps import joined_maps
from fold.runtime.numba_backend.passes import prepare
import fold.runtime.numpy_impl  # noqa: F401  (registers the rules eval_program runs)
from fold.runtime.interpreter import eval_program

pytest.importorskip("numba")

rng = np.random.default_rng(11)


def _statements(program):
    for s in program.stmts:
        yield s
        for b in s.prim.bodies():
            yield from _statements(b)


def _exps(program) -> int:
    return sum(isinstance(s.prim, Elementwise) and s.prim.op == "exp" for s in _statements(program))


def _nests(program):
    return [s for s in program.stmts if isinstance(s.prim, LoopNest)]


def two_weighted_sums(X, w):
    """Two sums over the rows, each weighting a row by exp(x . w): two maps that compute that weight."""
    weight = lambda x: fold.exp(fold.sum(x * w))
    return (fold.sum(fold.map(lambda x: weight(x) * x, X), axis=0),
            fold.sum(fold.map(lambda x: weight(x) * x * x, X), axis=0))


def test_two_sums_over_the_same_rows_are_one_nest_computing_the_weight_once():
    X, w = rng.normal(size=(300, 5)), rng.normal(size=5)
    prepared = prepare(dce(cse(fold.trace(two_weighted_sums, X, w))), whole_arrays=True)
    (nest,) = _nests(prepared)
    assert len(nest.outs) == 2 and _exps(nest.prim.program) == 1, prepared
    got = fold.jit(two_weighted_sums, backend="numba")(X, w)
    want = fold.jit(two_weighted_sums, backend="numpy")(X, w)
    for g, v in zip(got, want, strict=True):
        np.testing.assert_allclose(g, v, rtol=1e-12)


def mixture(X, mu, logvar):
    """A Gaussian mixture's negative log-likelihood written with NumPy broadcasting: the jvp of its gradient
    with respect to every argument sums one map over the points per argument, each computing the points'
    responsibilities again."""
    z = (X[:, None, :] - mu[None, :, :]) ** 2 * np.exp(-logvar)[None, :, :]
    ll = -0.5 * np.sum(z + logvar[None, :, :], axis=2)
    top = np.max(ll, axis=1, keepdims=True)
    return -np.sum(top[:, 0] + np.log(np.sum(np.exp(ll - top), axis=1)))


def _over_points(prepared, n):
    return [s for s in _nests(prepared) if any(isinstance(t.prim, Map) and t.outs[0].aval.shape[:1] == (n,)
                                               for t in s.prim.program.stmts)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_mixtures_hessian_vector_product_in_every_argument_sums_its_points_in_one_pass(dtype):
    X, mu, logvar = (rng.normal(size=s).astype(dtype) for s in ((400, 3), (6, 3), (6, 3)))
    logvar *= 0.2
    directions = tuple(rng.normal(size=a.shape).astype(dtype) for a in (X, mu, logvar))
    hvp = lambda *a: fold.jvp(fold.grad(mixture, argnums=(0, 1, 2)), a, directions)[1]
    prepared = prepare(dce(cse(fold.trace(hvp, X, mu, logvar))), whole_arrays=True)
    summing = [s for s in _over_points(prepared, 400) if any(v.aval.shape == (6, 3) for v in s.outs)]
    assert len(summing) == 1 and sum(v.aval.shape == (6, 3) for v in summing[0].outs) == 4, prepared
    got, want = fold.jit(hvp, backend="numba")(X, mu, logvar), fold.jit(hvp, backend="numpy")(X, mu, logvar)
    tol = 2e-4 if dtype == np.float32 else 1e-10
    for g, v in zip(got, want, strict=True):
        np.testing.assert_allclose(g, v, rtol=tol, atol=tol * np.abs(v).max())


def test_a_nest_reading_an_earlier_nests_result_is_not_joined_to_it():
    # the second map's rows are scaled by the first sum: it must run after the first nest
    def chained(X, w):
        first = fold.sum(fold.map(lambda x: fold.exp(fold.sum(x * w)) * x, X), axis=0)
        return fold.sum(fold.map(lambda x: fold.exp(fold.sum(x * first)) * x, X), axis=0)

    X, w = rng.normal(size=(200, 4)), 0.1 * rng.normal(size=4)
    prepared = prepare(dce(cse(fold.trace(chained, X, w))), whole_arrays=True)
    assert len(_nests(prepared)) == 2, prepared
    np.testing.assert_allclose(fold.jit(chained, backend="numba")(X, w), fold.jit(chained, backend="numpy")(X, w),
                               rtol=1e-12)


def test_nests_over_different_rows_are_not_joined():
    def two_sets(X, Y, w):
        return (fold.sum(fold.map(lambda x: fold.exp(fold.sum(x * w)) * x, X), axis=0),
                fold.sum(fold.map(lambda y: fold.exp(fold.sum(y * w)) * y, Y), axis=0))

    X, Y, w = rng.normal(size=(200, 4)), rng.normal(size=(150, 4)), rng.normal(size=4)
    assert len(_nests(prepare(dce(cse(fold.trace(two_sets, X, Y, w))), whole_arrays=True))) == 2


def test_joined_maps_read_a_shared_value_once_and_give_both_results():
    def two_maps(X, w):
        return fold.map(lambda x: fold.exp(fold.sum(x * w)), X), fold.map(lambda x: fold.exp(fold.sum(x * w)) * 2.0, X)

    X, w = rng.normal(size=(30, 3)), rng.normal(size=3)
    program = fold.trace(two_maps, X, w)
    a, b = program.stmts
    joined = joined_maps(a, b)
    assert len(joined.args) == 2 and joined.prim.num_consts == 1 and _exps(joined.prim.body) == 1
    from fold.ir import Program

    alone = Program(program.inputs, (joined,), program.outputs)
    for g, v in zip(eval_program(alone, [X, w]), eval_program(program, [X, w]), strict=True):
        np.testing.assert_array_equal(g, v)
