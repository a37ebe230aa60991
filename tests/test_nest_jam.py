"""A loop nest's sweeps of a shared matrix run several rows at once (runtime/numba_backend/nest_jam.py): the
kernels of map bodies multiplying a large captured matrix by their row jam the sweep, give bitwise the
values of the same kernels run row by row and the numpy backend's values, and steps that do not qualify
keep their one-row form."""

from __future__ import annotations

import numpy as np
import pytest

import fold
import fold.monoids as M
from fold.runtime.loops import LoopNest, kernel_of
from fold.runtime.loops.nest import Assign, Buffer, Loop, Store
from fold.runtime.loops.text import statement_lines
from fold.runtime.numba_backend import nest_jam
from fold.runtime.numba_backend.loop_nests import kernel_source
from fold.runtime.numba_backend.passes import prepare_jitted

rng = np.random.default_rng(70)
N = 1001  # groups of four rows, the last of each chunk short


def kmeans(X, C):
    """k-means' cost in its matrix form: each point's nearest centroid through C @ x."""
    def nearest(x):
        return fold.reduce(M.min, fold.sum(x * x) - 2.0 * fold.matmul(C, x) + fold.sum(C * C, axis=1))
    return fold.reduce(M.sum, fold.map(nearest, X))


def row_maxima(X, W):
    """A map (no fold over its rows) of each row's largest entry of W @ x."""
    return fold.map(lambda x: fold.reduce(M.max, fold.matmul(W, x)), X)


def _normal(dtype, *shapes):
    return tuple(rng.standard_normal(s).astype(dtype) for s in shapes)


def _kmeans_gradient(X, C):
    return fold.vjp(kmeans, X, C)[1](X.dtype.type(1.0))


CASES = {  # each shared matrix 64 KB, its shared axis short (passes.SHORT_SHARED_AXIS): the nest takes it
    "k-means": (kmeans, lambda: _normal(np.float32, (N, 32), (512, 32))),
    "k-means gradient": (_kmeans_gradient, lambda: _normal(np.float32, (N, 32), (512, 32))),
    "k-means gradient float64": (_kmeans_gradient, lambda: _normal(np.float64, (N, 32), (256, 32))),  # see below
    "row maxima": (row_maxima, lambda: _normal(np.float32, (N, 64), (256, 64))),
}


def _sources(f, args) -> list[str]:
    program = prepare_jitted(fold.trace(f, *args))
    return [kernel_source(kernel_of(s.prim)) for s in program.stmts if isinstance(s.prim, LoopNest)]


def _flat(values):
    return [np.asarray(v) for v in fold.tree_flatten(values)[0]]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_sweep_of_a_large_shared_matrix_is_jammed_and_gives_the_row_by_row_values(case, monkeypatch):
    from fold.runtime.numba_backend import passes

    f, make = CASES[case]
    args = make()
    # float64 products past 8 KB go to the product kernel unless every product is given to the nest
    monkeypatch.setattr(passes, "MAX_NEST_PRODUCT_BYTES_FLOAT64", 1 << 40)
    jammed = [t for t in _sources(f, args) if f"for {nest_jam.GROUP} in range" in t]
    assert jammed  # a gradient's forward nest and its own
    assert all(f"{nest_jam.JAMMED}[{nest_jam.ROWS - 1}, " in t for t in jammed)  # the last row's accumulators
    got = _flat(fold.jit(f, backend="numba")(*args))
    monkeypatch.setattr(nest_jam, "MIN_SHARED_BYTES", 1 << 40)
    assert not any(f"for {nest_jam.GROUP} in range" in t for t in _sources(f, args))
    row_by_row = _flat(fold.jit(f, backend="numba")(*args))
    for a, b in zip(got, row_by_row, strict=True):
        np.testing.assert_array_equal(a, b)  # the same arithmetic in the same order
    for a, b in zip(got, _flat(fold.jit(f, backend="numpy")(*args)), strict=True):
        tol = 1e-10 if a.dtype == np.float64 else 2e-4
        np.testing.assert_allclose(a, b, rtol=tol, atol=10 * tol)


def test_a_matrix_that_fits_the_first_level_cache_is_swept_row_by_row():
    X, C = _normal(np.float32, (N, 32), (256, 32))  # 32 KB
    assert _sources(kmeans, (X, C)) and not any(f"for {nest_jam.GROUP} in range" in t for t in _sources(kmeans, (X, C)))


F64 = np.dtype(np.float64)
READ_ONLY = {"in0": 8 * 256 * 32, "in1": 8 * 100 * 32}


def _step(sweep_reads: str = "in1[i, j]", after=None) -> tuple:
    """A row `i`'s step: a scalar, then a buffer filled with in0 @ row (the sweep), then a min over it."""
    sweep = (Buffer("b1", (256,), F64),
             Loop("c", 256, (Assign("s2", "np.float64(0.0)"), Store("b1", ("c",), "s2"))),
             Loop("j", 32, (Loop("c", 256, (Assign("s2", "b1[c]"),
                                             Assign("s2", f"np.float64(s2 + in0[c, j] * {sweep_reads})"),
                                             Store("b1", ("c",), "s2"))),)))
    after = after or (Assign("acc3", "np.float64(np.inf)"),
                      Loop("c", 256, (Assign("acc3", "np.float64(_minimum(acc3, b1[c] + t0))"),)),
                      Store("out0", ("i",), "acc3"))
    return (Assign("t0", "in1[i, 0]"), *sweep, *after)


def _text(nodes) -> str:
    return "\n".join(statement_lines(nodes, 0, lambda b, indent: ""))


def test_the_sweep_runs_first_for_each_row_of_a_group_and_the_rest_reads_its_row():
    nodes = nest_jam.rows_jammed("i", _step(), READ_ONLY)
    assert nodes is not None
    assert {n.name: n.shape for n in nodes if isinstance(n, Buffer)} == {"b1__j": (nest_jam.ROWS, 256)}
    text = _text(nodes)
    for r in range(nest_jam.ROWS):
        assert f"s2__j{r} = np.float64(s2__j{r} + in0[c, j] * in1[i__j{r}, j])" in text
        assert f"b1__j[{r}, c] = s2__j{r}" in text
    assert "acc3 = np.float64(_minimum(acc3, b1__j[jam__r, c] + t0))" in text
    assert text.index("i = lo + jam__g * 4 + jam__r") < text.index("t0 = in1[i, 0]")  # each row's own statements


@pytest.mark.parametrize("why", ["reads the step's scalar", "matrix too small", "buffer read whole", "writes an output"])
def test_sweeps_that_do_not_qualify_keep_the_step(why):
    read_only, step = READ_ONLY, _step()
    if why == "reads the step's scalar":  # t0 is computed before the sweep, by the row's step
        step = _step(sweep_reads="t0")
    elif why == "matrix too small":
        read_only = {**READ_ONLY, "in0": nest_jam.MIN_SHARED_BYTES - 1}
    elif why == "buffer read whole":
        step = _step(after=(Store("out0", ("i",), "np.float64(b1.shape[0])"),))
    else:  # the sweep's matrix is an array the kernel writes
        read_only = {k: v for k, v in READ_ONLY.items() if k != "in0"}
    assert nest_jam.rows_jammed("i", step, read_only) is None


def _map_body(f, *args):
    from fold.primitives import Map

    (body,) = [s.prim.body for s in fold.trace(f, *args).stmts if isinstance(s.prim, Map)]
    return body


@pytest.mark.parametrize("shape, dtype, taken", [
    ((256, 32), np.float64, False),   # 64 KB: past the float64 limit (the product kernel's)
    ((64, 16), np.float64, True),     # 8 KB: within the float64 limit
    ((512, 32), np.float32, True),    # 64 KB, shared axis 32
    ((128, 128), np.float32, False),  # 64 KB, shared axis 128: BLAS over blocks of rows
])
def test_the_nest_takes_a_product_past_its_limit_where_the_shared_axis_is_short(shape, dtype, taken):
    from fold.runtime.numba_backend.passes import SHORT_SHARED_AXIS, nest_takes_products

    assert shape[1] <= SHORT_SHARED_AXIS or not taken
    X, C = _normal(dtype, (N, shape[1]), shape)
    assert nest_takes_products(_map_body(kmeans, X, C)) is taken
    if taken and shape[0] * shape[1] * np.dtype(dtype).itemsize >= nest_jam.MIN_SHARED_BYTES:
        assert any(f"for {nest_jam.GROUP} in range" in t for t in _sources(kmeans, (X, C)))


def test_a_sweep_after_a_buffer_of_the_rows_own_is_still_jammed():
    """A gradient's step allocates the row's distances (filled from the row's own scalar) and the product's
    sums side by side: the first buffer's run does not qualify, the sweep's from the next buffer on does."""
    own = (Buffer("b4", (256,), F64),)
    fill_own = (Loop("c", 256, (Store("b4", ("c",), "np.float64(t0 * 2.0)"),)),)
    step = _step()
    at = next(k for k, n in enumerate(step) if isinstance(n, Buffer))
    sweep_end = at + 3
    step = (*step[:at], *own, *step[at:sweep_end], *fill_own, *step[sweep_end:])
    nodes = nest_jam.rows_jammed("i", step, READ_ONLY)
    assert nodes is not None
    assert {n.name for n in nodes if isinstance(n, Buffer)} == {"b1__j"}
    assert "b4[c] = np.float64(t0 * 2.0)" in _text(nodes)  # the row's own buffer, filled in the row's step
