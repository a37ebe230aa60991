"""Loop-invariant statements lifted out of maps nested in bodies (fold/hoist.py, run by cse): computed once
per run of the map, at any depth (the top level's maps too), and results and gradients unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.cse import cse
from fold.dce import dce
from fold.hoist import hoist_invariants
from fold.primitives import Iota, Map, SumAxes

M = fold.monoids
rng = np.random.default_rng(5)


def _maps(program):
    """Every map statement of the program, outermost first."""
    found = []
    for stmt in program.stmts:
        if isinstance(stmt.prim, Map):
            found.append(stmt)
        for body in stmt.prim.bodies():
            found += _maps(body)
    return found


def _count(body, kind) -> int:
    return sum(isinstance(s.prim, kind) for s in body.stmts)


def cosine_max(Q, K):
    """Each query's largest cosine similarity: |q|^2 is the same for every key."""
    def best(q):
        return fold.reduce(M.max, fold.map(lambda k: fold.sum(q * k) / fold.sqrt(fold.sum(q * q) * fold.sum(k * k)), K))
    return fold.sum(fold.map(best, Q))


Q, K = rng.normal(size=(7, 5)), rng.normal(size=(6, 5))


def test_a_sum_of_the_captured_row_is_computed_once_per_query_not_once_per_key():
    program = fold.trace(cosine_max, Q, K)
    outer, inner = _maps(program)
    assert _count(inner.prim.body, SumAxes) == 3 and _count(outer.prim.body, SumAxes) == 0
    outer, inner = _maps(cse(program))
    assert _count(inner.prim.body, SumAxes) == 2 and _count(outer.prim.body, SumAxes) == 1


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_results_and_gradients_are_unchanged(backend):
    norms = np.sqrt((Q * Q).sum(1))[:, None] * np.sqrt((K * K).sum(1))[None, :]
    np.testing.assert_allclose(fold.jit(cosine_max, backend=backend)(Q, K), ((Q @ K.T) / norms).max(1).sum(), rtol=1e-12)
    grad = fold.grad(cosine_max, argnums=(0, 1))
    want = fold.jit(grad, backend="numpy")(Q, K)
    eps, dQ = 1e-6, rng.normal(size=Q.shape)
    slope = (fold.jit(cosine_max)(Q + eps * dQ, K) - fold.jit(cosine_max)(Q - eps * dQ, K)) / (2 * eps)
    got = fold.jit(grad, backend=backend)(Q, K)
    np.testing.assert_allclose(np.sum(got[0] * dQ), slope, rtol=1e-6)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_a_value_invariant_in_nested_maps_rises_through_all_of_them():
    def f(X, Y, Z, w):
        return fold.map(lambda x: fold.sum(fold.map(
            lambda y: fold.sum(fold.map(lambda z: fold.sum(z * y) * fold.sum(w * w), Z)), Y) * x), X)

    X, Y, Z, w = (rng.normal(size=s) for s in ((3, 4), (4, 5), (6, 5), (5,)))
    program = fold.trace(f, X, Y, Z, w)
    assert _count(_maps(program)[0].prim.body, SumAxes) == 1  # the sum over the middle map
    hoisted = cse(program)
    middle, inner, outer = _maps(hoisted)  # the middle map reads no x: it runs once, before the outer map
    assert _count(hoisted, SumAxes) == 1  # |w|^2, invariant in all three maps
    assert _count(outer.prim.body, SumAxes) == 1 and _count(middle.prim.body, SumAxes) == 1
    assert _count(inner.prim.body, SumAxes) == 1 and hoisted.stmts.index(middle) < hoisted.stmts.index(outer)
    want = X @ ((Y @ Z.T).sum(1) * (w @ w))
    np.testing.assert_allclose(fold.jit(f)(X, Y, Z, w), want, rtol=1e-12)


def test_the_top_levels_maps_are_lifted_from_too_but_statements_of_literals_stay():
    def top(X, w):
        return fold.map(lambda x: fold.sum(x * w) + fold.sum(w * w), X)

    program = fold.trace(top, Q, K[0])
    hoisted = hoist_invariants(program)
    (row,) = _maps(hoisted)
    assert _count(program, SumAxes) == 0 and _count(hoisted, SumAxes) == 1  # |w|^2 once, before the map
    assert _count(row.prim.body, SumAxes) == 1
    for backend in ("numba", "numpy"):
        np.testing.assert_allclose(fold.jit(top, backend=backend)(Q, K[0]), Q @ K[0] + K[0] @ K[0], rtol=1e-12)

    def positions(X):
        return fold.map(lambda x: fold.sum(fold.map(lambda r: fold.sum(r * fold.iota(5) * x), X)), X)

    outer, inner = _maps(dce(cse(fold.trace(positions, Q))))
    assert _count(inner.prim.body, Iota) == 1


def test_a_loop_is_lifted_but_a_cheap_comparison_of_its_result_stays_in_the_row_loop():
    def f(X):
        return fold.map(lambda x: fold.sum(fold.map(lambda v: fold.where(fold.sum(x) > 0.0, v, -v), x)), X)

    outer, inner = _maps(dce(cse(fold.trace(f, Q))))
    assert _count(outer.prim.body, SumAxes) == 2 and _count(inner.prim.body, SumAxes) == 0
    assert sum(getattr(s.prim, "op", None) == "gt" for s in inner.prim.body.stmts) == 1
    np.testing.assert_allclose(fold.jit(f)(Q), np.where(Q.sum(1) > 0, 1, -1) * Q.sum(1), rtol=1e-12)
