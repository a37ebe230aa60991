"""A sum over a map's rows of the scatter-adds its body returns is one scatter-add of all the rows' indices
and values (fold/scatter_sums.py): the gradient of a map that gathers from a captured array (a convolution
reading its windows by index, an embedding lookup) makes nothing of size rows x the captured array."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.cse import cse
from fold.dce import dce
from fold.primitives import Map, ReduceByIndex, SumAxes
from natural_programs import periodic_stencil_energy

M = fold.monoids
rng = np.random.default_rng(52)


def _conv_loss(x, w):
    k = w.shape[0]
    windows = fold.map(lambda j: fold.sum(x[j + fold.iota(k)] * w), fold.iota(x.shape[0] - k + 1))
    return fold.sum(fold.tanh(windows))


def _conv_gradient(x, w):
    """d/dx of sum(tanh(y)), y_j = sum_t x[j + t] w[t], written with NumPy."""
    k = w.shape[0]
    y = np.array([x[j: j + k] @ w for j in range(x.shape[0] - k + 1)])
    dy = 1.0 - np.tanh(y) ** 2
    dx = np.zeros_like(x)
    for t in range(k):
        dx[t: t + dy.shape[0]] += dy * w[t]
    return dx


def _largest_value(program) -> int:
    """The most elements of any value the program makes, at any depth."""
    sizes = [0]
    for stmt in program.stmts:
        sizes += [int(np.prod(o.aval.shape)) for o in stmt.outs]
        sizes += [_largest_value(b) for b in stmt.prim.bodies()]
    return max(sizes)


def test_a_convolutions_gradient_scatters_every_windows_values_once():
    x, w = rng.normal(size=300), rng.normal(size=4)
    program = dce(cse(fold.trace(fold.grad(_conv_loss), x, w)))
    rows = x.shape[0] - w.shape[0] + 1
    assert _largest_value(program) < rows * x.shape[0] / 10, program
    assert [type(s.prim) for s in program.stmts].count(ReduceByIndex) == 1, program
    assert not any(isinstance(s.prim, SumAxes) for s in program.stmts), program


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_a_convolutions_gradient_over_a_long_series_runs_and_matches_numpy(backend):
    # the rows x series scatter-adds would be 10^5 x 10^5 float64 (80 GB)
    x, w = rng.normal(size=10**5), rng.normal(size=5)
    got = fold.jit(fold.grad(_conv_loss), backend=backend)(x, w)
    np.testing.assert_allclose(got, _conv_gradient(x, w), rtol=1e-9, atol=1e-12)


def test_an_embedding_lookups_gradient_bins_each_tokens_row():
    E, v, tokens = rng.normal(size=(50, 6)), rng.normal(size=6), rng.integers(-50, 50, 400)

    def loss(E, v, tokens):
        return fold.sum(fold.map(lambda t: fold.tanh(fold.sum(E[t] * v)), tokens))

    program = dce(cse(fold.trace(fold.grad(loss), E, v, tokens)))
    assert [type(s.prim) for s in program.stmts].count(ReduceByIndex) == 1, program
    dE = np.zeros_like(E)
    np.add.at(dE, tokens, (1.0 - np.tanh(E[tokens] @ v) ** 2)[:, None] * v)  # a negative token counts from the end
    for backend in ("numba", "numpy"):
        np.testing.assert_allclose(fold.jit(fold.grad(loss), backend=backend)(E, v, tokens), dE, rtol=1e-10)


def _map_of_histograms(op, also_returned: bool = False):
    def f(idx, vals):
        rows = fold.map(lambda i, v: fold.reduce_by_index(op, 8, i, v), idx, vals)
        total = fold.sum(rows, axis=0)
        return (total, rows) if also_returned else total

    return f


@pytest.mark.parametrize("op, also_returned, rewritten", [
    (M.sum, False, True),
    (M.max, False, False),  # a max per row, then a sum over the rows: not one histogram
    (M.sum, True, False),  # the rows are returned too: they are made anyway
])
def test_only_a_sum_of_scatter_adds_read_by_it_alone_is_rewritten(op, also_returned, rewritten):
    idx, vals = rng.integers(-2, 10, (30, 5)), rng.normal(size=(30, 5))
    f = _map_of_histograms(op, also_returned)
    program = dce(cse(fold.trace(f, idx, vals)))
    maps = [s for s in program.stmts if isinstance(s.prim, Map)]
    assert any(isinstance(s.prim, ReduceByIndex) for s in program.stmts) == rewritten, program
    assert any(isinstance(s.prim, ReduceByIndex) for m in maps for s in m.prim.body.stmts) != rewritten, program
    bins = np.zeros((30, 8)) if op is M.sum else np.full((30, 8), -np.inf)
    for r in range(30):
        for i, v in zip(idx[r], vals[r]):
            if 0 <= i < 8:
                bins[r, i] = bins[r, i] + v if op is M.sum else max(bins[r, i], v)
    got = fold.jit(f)(idx, vals)
    np.testing.assert_allclose(got[0] if also_returned else got, bins.sum(axis=0), rtol=1e-12)


def test_scatter_adds_of_rows_at_bins_out_of_range_add_nothing():
    # values of three elements per index: a bin out of range must not spill into a neighbour's positions
    idx, vals = rng.integers(-3, 11, (30, 5)), rng.normal(size=(30, 5, 3))

    def f(idx, vals):
        return fold.sum(fold.map(lambda i, v: fold.reduce_by_index(M.sum, 8, i, v), idx, vals), axis=0)

    program = dce(cse(fold.trace(f, idx, vals)))
    assert not any(isinstance(s.prim, ReduceByIndex) for m in program.stmts if isinstance(m.prim, Map)
                   for s in m.prim.body.stmts), program
    want = np.zeros((8, 3))
    inside = (idx >= 0) & (idx < 8)
    np.add.at(want, idx[inside], vals[inside])
    for backend in ("numba", "numpy"):
        np.testing.assert_allclose(fold.jit(f, backend=backend)(idx, vals), want, rtol=1e-12)


def test_a_stencils_gradient_scatters_the_entries_of_both_maps_once():
    # a gather of a gathered row, and sums of scatter-adds: the entries rise through the inner and the outer map
    X = rng.normal(size=(40, 30))
    program = dce(cse(fold.trace(fold.grad(periodic_stencil_energy), X)))
    assert _largest_value(program) < 40 * 30 * 30, program  # no (rows, columns, n, m) nor (rows, n, m) values
    assert [type(s.prim) for s in program.stmts].count(ReduceByIndex) == 1, program
    r = X - 0.25 * (np.roll(X, -1, 0) + np.roll(X, 1, 0) + np.roll(X, -1, 1) + np.roll(X, 1, 1))
    want = 2 * r - 0.5 * (np.roll(r, 1, 0) + np.roll(r, -1, 0) + np.roll(r, 1, 1) + np.roll(r, -1, 1))
    for backend in ("numba", "numpy"):
        np.testing.assert_allclose(fold.jit(fold.grad(periodic_stencil_energy), backend=backend)(X), want, rtol=1e-10)


def test_a_scatter_add_of_scatter_adds_drops_the_inner_entries_out_of_range():
    # inner indices -1 and 4 name no bin of 4: they must not wrap (-1 // 4 is row -1) into a bin of the outer one
    rows, inner = rng.integers(-1, 4, (25, 1)), rng.integers(-1, 5, (25, 2))
    vals = rng.normal(size=(25, 2))

    def f(rows, inner, vals):
        def per_row(r, j, v):
            return fold.reduce_by_index(M.sum, 3, r, fold.reduce_by_index(M.sum, 4, j, v).reshape((1, 4)))

        return fold.sum(fold.map(per_row, rows, inner, vals), axis=0)

    want = np.zeros((3, 4))
    for r, js, vs in zip(rows[:, 0], inner, vals):
        for j, v in zip(js, vs):
            if 0 <= r < 3 and 0 <= j < 4:
                want[r, j] += v
    program = dce(cse(fold.trace(f, rows, inner, vals)))
    assert [type(s.prim) for s in program.stmts].count(ReduceByIndex) == 1, program
    for backend in ("numba", "numpy"):
        np.testing.assert_allclose(fold.jit(f, backend=backend)(rows, inner, vals), want, rtol=1e-12)
