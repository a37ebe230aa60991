"""A loop nest's fold whose states are small vectors summed runs its rows TILE at a time
(runtime/numba_backend/nest_tiles.py): the kernels of such folds have their rows in tiles and give the numpy
backend's values; folds that do not qualify keep their one-row step."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.cse import cse
from fold.dce import dce
from fold.runtime.loops import LoopNest, kernel_of
from fold.runtime.loops.nest import Assign, Buffer, Loop, ParallelFold, State, Store
from fold.runtime.numba_backend import nest_tiles
from fold.runtime.numba_backend.loop_nests import kernel_module
from fold.runtime.numba_backend.passes import prepare

rng = np.random.default_rng(11)
N = 1000  # several tiles per chunk, and rows left over


def horner(c, x):
    return fold.sum(fold.loop(lambda i, acc: acc * x + c[i], x * 0.0, c.shape[0]) ** 2)


def weighted_sums(c, x):
    """Each step's sum reads a captured vector's element as well as the state: the tail of the nest's step
    reads a scalar of its head, which each lane keeps."""
    def step(i, s):
        a, total = s
        return a * 0.9 + c[i] * x, total + fold.sum(a * x) * c[i]
    a, total = fold.loop(step, (x * 0.0, 0.0), c.shape[0])
    return total + fold.sum(a)


def _coefficients_and_points():
    return (0.3 * rng.normal(size=16)).astype(np.float32), rng.uniform(-1, 1, N).astype(np.float32)


CASES = {
    "horner gradient": (lambda c, x: fold.grad(horner, argnums=(0,))(c, x), _coefficients_and_points),
    "horner hvp": (lambda c, x: fold.jvp(lambda c: fold.grad(horner, argnums=(0,))(c, x), (c,), (c,))[1],
                   _coefficients_and_points),
    "weighted sums": (weighted_sums, lambda: (rng.normal(size=6), rng.normal(size=N))),
}


def _kernel_texts(f, args) -> list[str]:
    program = prepare(dce(cse(fold.trace(f, *args))), whole_arrays=True)
    return [kernel_module(kernel_of(s.prim))[0] for s in program.stmts if isinstance(s.prim, LoopNest)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_fold_of_rows_into_small_summed_vectors_runs_its_rows_in_tiles(case):
    f, make = CASES[case]
    args = make()
    tiled = [t for t in _kernel_texts(f, args) if f"for {nest_tiles.GROUP} in range" in t]
    assert len(tiled) == 1
    assert f"for {nest_tiles.LANE} in range({nest_tiles.TILE})" in tiled[0]
    if case == "weighted sums":  # the head's scalar that the tail reads, kept per lane
        assert f"{nest_tiles.TILED}[{nest_tiles.LANE}] = t" in tiled[0]
    tol = 2e-5 if args[0].dtype == np.float32 else 1e-12
    for got, want in zip(np.atleast_1d(fold.jit(f, backend="numba")(*args)),
                         np.atleast_1d(fold.jit(f, backend="numpy")(*args)), strict=True):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _fold(state_shape=(4,), summed=True, tail=None) -> ParallelFold:
    """A fold of rows `i` whose head makes a row's buffer and whose tail adds it into the state."""
    state = State("state0", state_shape, np.dtype(np.float64), "out0", stored=True, summed=summed)
    head = (Assign("t0", "in0[i]"), Buffer("b1", state_shape, np.dtype(np.float64)),
            *(Store("b1", (str(k),), f"np.float64(t0 * {k})") for k in range(state_shape[0])))
    tail = tail or (Loop("j", state_shape[0], (Assign("t2", "b1[j]"),
                                                Store("state0", ("j",), "np.float64(state0[j] + t2)"))),)
    return ParallelFold("i", 100, (state,), (), head + tail, ())


def test_the_tiles_keep_the_head_on_each_lane_and_add_the_lanes_after_the_chunk():
    nodes = nest_tiles.rows_in_tiles(_fold(), {"in0": np.dtype(np.float64)})
    assert nodes is not None
    buffers = {n.name: n.shape for n in nodes if isinstance(n, Buffer)}
    assert buffers == {"state0__t": (4, nest_tiles.TILE), "b1__t": (4, nest_tiles.TILE)}
    from fold.runtime.loops.text import statement_lines

    text = "\n".join(statement_lines(nodes, 0, lambda b, indent: ""))
    assert "b1__t[3, lane__] = np.float64(t0 * 3)" in text
    assert "state0__t[j, lane__] = np.float64(state0__t[j, lane__] + t2)" in text
    assert "state0[j0__] = np.float64(state0[j0__] + state0__t[j0__, lane__])" in text


@pytest.mark.parametrize("why", ["too large", "not summed", "carried", "no head"])
def test_folds_that_do_not_qualify_keep_their_step(why):
    if why == "too large":
        fold_ = _fold(state_shape=(nest_tiles.MAX_STATE + 1,))
    elif why == "not summed":
        fold_ = _fold(summed=False)
    elif why == "carried":  # the tail carries a value from one component to the next
        fold_ = _fold(tail=(Loop("j", 4, (Assign("c", "c + b1[j]"), Store("state0", ("j",), "state0[j] + c"))),))
    else:
        fold_ = ParallelFold("i", 100, _fold().states, (), _fold().step[-1:], ())
    assert nest_tiles.rows_in_tiles(fold_, {"in0": np.dtype(np.float64)}) is None


def test_a_tail_reading_the_rows_index_reads_its_lanes():
    tail = (Loop("j", 4, (Assign("t2", "in1[i, j]"), Store("state0", ("j",), "np.float64(state0[j] + t2)"))),)
    nodes = nest_tiles.rows_in_tiles(_fold(tail=tail), {"in0": np.dtype(np.float64), "in1": np.dtype(np.float64)})
    from fold.runtime.loops.text import statement_lines

    text = "\n".join(statement_lines(nodes, 0, lambda b, indent: ""))
    assert "i__t[lane__] = i" in text and "t2 = in1[i__t[lane__], j]" in text


def test_a_step_whose_loop_carries_a_sum_keeps_its_one_row_step():
    """The rows of a map summed over the map's axis, each row scaled by its dot product with w: the step's
    first loop carries the dot product from one component to the next, which lanes of one tile cannot
    share, so the fold keeps its step; its values are the numpy backend's."""
    X = rng.normal(size=(N, 5))
    w = rng.normal(size=5)

    def f(X, w):
        return fold.sum(fold.map(lambda r: fold.tanh(r) * fold.sum(r * w), X), axis=0)

    (text,) = _kernel_texts(f, (X, w))
    assert nest_tiles.GROUP not in text
    np.testing.assert_allclose(fold.jit(f, backend="numba")(X, w), fold.jit(f, backend="numpy")(X, w), rtol=1e-12)


def test_a_saved_state_that_no_step_reads_is_not_stored():
    """Horner's HVP saves two states per step (the cotangent and its tangent) where the sums read only the
    tangent's: the buffer nothing reads, and its stores, are pruned from the nest."""
    gradient = CASES["horner gradient"][0]
    args = CASES["horner gradient"][1]()
    program = prepare(dce(cse(fold.trace(lambda c, x: fold.jvp(gradient, (c, x), (c, 0.0 * x))[1], *args))),
                      whole_arrays=True)
    (saving,) = [s for s in program.stmts if isinstance(s.prim, LoopNest) and "loop_saving" in str(s.prim.program)]
    from fold.runtime.loops.nest import buffers

    kernel = kernel_of(saving.prim)
    assert [b.shape for b in buffers(kernel.outer.step)] == [(16,)], kernel
