"""Common-subexpression elimination in combinator bodies (fold/cse.py): a repeated statement computed once,
at any depth, the program's top level left as it was, and results (and gradients) unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.cse import cse
from fold.primitives import Map, SumAxes
from fold.primitives.elementwise import Elementwise

M = fold.monoids
rng = np.random.default_rng(11)


def _count(program, kind, op: str | None = None) -> int:
    """Statements of `kind` (with elementwise operator `op`) in the program, bodies included."""
    found = 0
    for stmt in program.stmts:
        if isinstance(stmt.prim, kind) and (op is None or stmt.prim.op == op):
            found += 1
        found += sum(_count(body, kind, op) for body in stmt.prim.bodies())
    return found


def squared_tanh_layer(W, X):
    """The way a user writes tanh(x . w)^2: the dot product traced twice."""
    return fold.sum(fold.map(lambda x: fold.sum(fold.map(
        lambda w: fold.tanh(fold.sum(x * w)) * fold.tanh(fold.sum(x * w)), W)), X))


W = (0.3 * rng.normal(size=(6, 5))).astype(np.float64)
X = rng.normal(size=(9, 5))


def test_a_repeated_dot_product_and_tanh_in_a_nested_body_are_computed_once():
    program = fold.trace(squared_tanh_layer, W, X)
    # the dot products, then the sums over the units and over the points
    assert _count(program, SumAxes) == 2 + 2 and _count(program, Elementwise, "tanh") == 2
    cleaned = cse(program)
    assert _count(cleaned, SumAxes) == 1 + 2 and _count(cleaned, Elementwise, "tanh") == 1
    assert _count(cleaned, Elementwise, "mul") == 2  # x * w once, then the tanh times itself


def test_the_top_level_keeps_its_repeats():
    """A value read twice at the top level is an array a fusion would store: both statements stay."""
    program = fold.trace(lambda x: fold.sum(x * x) + fold.sum(x * x), X[0])
    assert cse(program) is program


def test_literals_are_merged_by_value_only():
    def f(xs):
        return fold.map(lambda x: (x * 2.0) + (x * 2.0) + (x * 3.0), xs)

    cleaned = cse(fold.trace(f, X[0]))
    assert _count(cleaned, Elementwise, "mul") == 2  # x * 2.0 once, x * 3.0


def test_two_maps_of_one_lambda_traced_twice_stay_two():
    """Bodies compare by identity: two traces are not shown to compute the same thing."""
    def f(xs):
        return fold.map(lambda r: fold.sum(fold.map(lambda a: a * a, r)) + fold.sum(fold.map(lambda a: a * a, r)), xs)

    cleaned = cse(fold.trace(f, X))
    (outer,) = [s for s in cleaned.stmts if isinstance(s.prim, Map)]
    assert sum(isinstance(s.prim, Map) for s in outer.prim.body.stmts) == 2


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_results_and_gradients_are_those_of_numpy(backend):
    value = fold.jit(squared_tanh_layer, backend=backend)(W, X)
    gW = fold.jit(fold.grad(squared_tanh_layer), backend=backend)(W, X)
    t = np.tanh(X @ W.T)
    np.testing.assert_allclose(value, (t * t).sum(), rtol=1e-12)
    np.testing.assert_allclose(gW, (2 * t * (1 - t * t)).T @ X, rtol=1e-10)


def test_the_nest_of_the_layer_runs_one_dot_product_per_unit():
    """Lowered, the layer's nest sums x * w over the row once per unit, not twice."""
    shown = str(fold.lowered(squared_tanh_layer, W.astype(np.float32), X.astype(np.float32)))
    assert shown.count("sum[axes=(0,)]") == 2, shown  # the dot product's, and the sum over the units


def two_layer(W1, W2, X):
    """An MLP of two layers: the hidden units tanh(x . w) per point, then output units v . h, squared."""
    def net(x):
        h = fold.map(lambda w: fold.tanh(fold.sum(x * w)), W1)
        out = fold.map(lambda v: fold.sum(v * h), W2)
        return fold.sum(out * out)

    return fold.sum(fold.map(net, X))


W1, W2 = 0.3 * rng.normal(size=(6, 5)), 0.3 * rng.normal(size=(3, 6))


def test_a_vjp_map_reads_the_forward_maps_results_over_the_same_rows():
    """The gradient re-executes the hidden layer's map for tanh'(s); the forward map over the same units,
    in the same body, already gave tanh(s): the vjp's map reads it as a row, its own dot products dead."""
    from fold.dce import dce

    program = dce(fold.trace(fold.grad(two_layer), W1, W2, X))
    assert _count(program, Elementwise, "tanh") == 2 and _count(program, SumAxes) == 5
    cleaned = dce(cse(program))
    assert _count(cleaned, Elementwise, "tanh") == 1 and _count(cleaned, SumAxes) == 4  # one dot product less
    h = np.tanh(X @ W1.T)
    dpre = (2 * (h @ W2.T)) @ W2 * (1 - h * h)
    for backend in ("numba", "numpy"):
        np.testing.assert_allclose(fold.jit(fold.grad(two_layer), backend=backend)(W1, W2, X), dpre.T @ X, rtol=1e-10)


def test_maps_over_other_rows_or_with_other_captures_make_their_values_themselves():
    """Only a map over the same rows, capturing the same values, gives a body value to another."""
    def f(A, B, X):
        def row(x):
            over_a = fold.sum(fold.map(lambda w: fold.tanh(fold.sum(x * w)), A))
            other_rows = fold.sum(fold.map(lambda w: fold.tanh(fold.sum(x * w)), B))
            other_capture = fold.sum(fold.map(lambda w: fold.tanh(fold.sum(x * x * w)), A))
            return over_a + other_rows + other_capture
        return fold.map(row, X)

    from fold.dce import dce

    A, B = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
    cleaned = dce(cse(fold.trace(f, A, B, X)))
    assert _count(cleaned, Elementwise, "tanh") == 3
