"""Loop nests (runtime/loops): maps of maps written the natural way run as one kernel on the numba backend,
with the same results as the numpy backend, primal, gradient and Hessian-vector product, and nothing of
the maps' size materialised (what `fold.lowered` shows)."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fold
from fold.kernels.cpu import vector_math
from fold.runtime.loops import LoopNest, describe, kernel_of
from fold.runtime.loops.nest import Buffer, ParallelFold, buffers
from fold.runtime.numba_backend.passes import prepare
from natural_programs import (gmm_objective, kmeans_cost, min_pairwise_distance, ordered_fold, periodic_stencil_energy,
                              three_deep)

pytest.importorskip("numba")

M = fold.monoids
rng = np.random.default_rng(11)


def _nests(f, *args):
    program = prepare(fold.trace(f, *args), whole_arrays=True)
    return program, [kernel_of(s.prim) for s in program.stmts if isinstance(s.prim, LoopNest)]


def _both(f, *args):
    return fold.jit(f, backend="numba")(*args), fold.jit(f, backend="numpy")(*args)


def _close(got, want, rtol):
    """Close within rtol of the largest finite reference value; infinities and NaNs where the reference has them."""
    for g, w in zip(fold.tree_flatten(got)[0], fold.tree_flatten(want)[0], strict=True):
        w = np.asarray(w)
        finite = np.abs(w[np.isfinite(w)])
        scale = max(1.0, float(finite.max())) if finite.size else 1.0
        np.testing.assert_allclose(np.asarray(g), w, rtol=rtol, atol=rtol * scale)


CASES = {
    "kmeans": (kmeans_cost, lambda: (rng.normal(size=(7, 5)), rng.normal(size=(300, 5)))),
    "min_pairwise": (min_pairwise_distance, lambda: (rng.normal(size=(90, 3)), rng.normal(size=(40, 3)))),
    "three_deep": (three_deep, lambda: (rng.normal(size=(20, 6, 4)), rng.normal(size=4))),
    "ordered_fold": (ordered_fold, lambda: (rng.normal(size=(200, 9)),)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_natural_nests_run_as_one_loop_nest_with_the_reference_results(case):
    f, make = CASES[case]
    args = make()
    program, kernels = _nests(f, *args)
    assert [s.prim.name for s in program.stmts] == ["loop_nest"], program
    (kernel,) = kernels
    n = args[-1].shape[0] if case != "three_deep" else args[0].shape[0]
    assert all(np.prod(b.shape) < n for b in buffers(kernel.outer.step)), describe(kernel)
    got, want = _both(f, *args)
    _close(got, want, 1e-12)


@pytest.mark.parametrize("case", ["kmeans", "min_pairwise", "three_deep"])
def test_gradients_and_hessian_vector_products_of_natural_nests_fuse(case):
    f, make = CASES[case]
    args = make()
    grad = fold.grad(f, argnums=0)
    tangent = rng.normal(size=args[0].shape)

    def hvp(*a):
        return fold.jvp(grad, a, (tangent,) + tuple(np.zeros_like(x) for x in a[1:]))[1]

    for g in (grad, hvp):
        program, kernels = _nests(g, *args)
        assert kernels, program
        n = args[-1].shape[0] if case != "three_deep" else args[0].shape[0]
        assert not any(s.prim.name == "map" and s.outs[0].aval.shape[:1] == (n,) for s in program.stmts), program
        got, want = _both(g, *args)
        _close(got, want, 1e-10)


def test_the_kmeans_gradient_folds_one_row_per_centroid_matrix_not_one_per_point():
    C, P = rng.normal(size=(6, 4)), rng.normal(size=(500, 4))
    program, kernels = _nests(fold.grad(kmeans_cost, argnums=0), C, P)
    folds = [k for k in kernels if hasattr(k.outer, "states")]
    assert folds and all(s.shape in ((), (6, 4)) for k in folds for s in k.outer.states)
    got, want = _both(fold.grad(kmeans_cost, argnums=0), C, P)
    _close(got, want, 1e-12)


def test_float32_nests_compute_in_float32():
    C, P = rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=(200, 3)).astype(np.float32)
    got, want = _both(kmeans_cost, C, P)
    assert np.asarray(got).dtype == np.float32
    _close(got, want, 1e-5)


def test_lowered_shows_the_nest_and_what_it_materialises():
    C, P = rng.normal(size=(4, 3)), rng.normal(size=(50, 3))
    text = str(fold.lowered(kmeans_cost, C, P))
    assert "loop_nest" in text and "parallel fold i < 50" in text
    assert "materialised: nothing but the outputs" in text
    assert "loop_nest" not in str(fold.lowered(kmeans_cost, C, P, backend="numpy"))
    with pytest.raises(ValueError, match="backend must be"):
        fold.lowered(kmeans_cost, C, P, backend="tpu")


def test_a_nest_with_a_statement_it_cannot_write_stays_as_it_was():
    X = rng.normal(size=(30, 5, 4))
    bins = np.array([0, 2, 1, 2])

    def f(X):  # a histogram inside: no loop-nest rule yet
        return fold.map(lambda m: fold.reduce(M.sum, fold.map(lambda r: fold.reduce_by_index(M.sum, 3, bins, r), m)), X)

    program, kernels = _nests(f, X)
    assert not kernels
    got, want = _both(f, X)
    _close(got, want, 1e-12)


SCANNED_ROWS = {
    "inclusive sum": lambda r: fold.scan(M.sum, r),
    "reverse exclusive max": lambda r: fold.scan(M.max, r, reverse=True, exclusive=True),
    "user operator, two leaves": lambda r: fold.scan(lambda p, q: (p[0] * q[0], q[0] * p[1] + q[1]),
                                                     (1.0 + 0.1 * fold.tanh(r), r), identity=(1.0, 0.0))[1],
    "reverse logaddexp": lambda r: fold.scan(M.logaddexp, r, reverse=True),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", sorted(SCANNED_ROWS))
def test_a_map_whose_rows_are_scanned_and_folded_is_one_loop_nest(case, dtype):
    """A scan of each row is a sequential loop of the nest (forward or backward, each prefix stored in a
    row-sized buffer), float32 carried in float64 as the numpy backend's scans: the map and the fold of its
    results are one kernel, and its results are the reference's. The gradient (scans of the rows' cotangents)
    is a nest too."""
    scanned = SCANNED_ROWS[case]
    f = lambda X: fold.reduce(M.sum, fold.map(lambda r: fold.reduce(M.sum, fold.sin(scanned(r)) * r), X))  # noqa: E731
    X = rng.normal(size=(50, 23)).astype(dtype)
    program, kernels = _nests(f, X)
    assert [s.prim.name for s in program.stmts] == ["loop_nest"], program
    assert all(np.prod(b.shape) <= 23 for b in buffers(kernels[0].outer.step)), describe(kernels[0])
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    _close(*_both(f, X), rtol)
    grad = fold.grad(f)
    assert _nests(grad, X)[1]
    _close(*_both(grad, X), 1e-10 if dtype == np.float64 else 1e-4)


def test_the_generic_rule_gradient_of_a_row_logsumexp_runs_its_rows_scans_in_a_nest():
    """The generic vjp of a reduce (exclusive forward and reverse scans of each row, then a map of them) is
    one nest over the rows; it matches the monoid rule's gradient."""
    lse = lambda X: fold.reduce(M.sum, fold.map(lambda r: fold.reduce(M.logaddexp, r), X))  # noqa: E731
    X = rng.normal(size=(60, 17))
    generic = lambda X: fold.vjp(lse, X, reduce_rule="generic")[1](1.0)  # noqa: E731
    program, _ = _nests(generic, X)
    nested_scans = [t for s in program.stmts if isinstance(s.prim, LoopNest) for m in s.prim.program.stmts
                    if m.prim.name == "map" for t in m.prim.body.stmts if t.prim.name == "scan"]
    assert len(nested_scans) == 2, program
    got, want = _both(generic, X)
    _close(got, want, 1e-12)
    monoid = fold.jit(lambda X: fold.vjp(lse, X, reduce_rule="monoid")[1](1.0), backend="numba")(X)
    _close(got, monoid, 1e-10)


# ---------------------------------------------------------------- random nests

_UNARY = [fold.tanh, fold.sin, lambda x: x * x, lambda x: -x, lambda x: fold.exp(-x * x)]
_BINARY = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b, fold.maximum, lambda a, b: fold.where(a > b, a, 0.5 * b)]
_MONOIDS = [M.sum, M.max, M.min, M.logaddexp, "affine_first", "scanned", "looped", "affine_reverse"]


def _fold(kind, xs):
    if kind == "looped":  # a loop carrying a vector: each step mixes the state with the row's element t
        return fold.reduce(M.sum, fold.loop(lambda t, h: fold.tanh(0.5 * h + xs[t] * xs), xs * 0.0, xs.shape[0]))
    if kind == "affine_reverse":  # a reverse scan by an operator that does not commute: the order shows
        ys = fold.scan(lambda p, q: (p[0] * q[0], q[0] * p[1] + q[1]), (1.0 + 0.1 * fold.tanh(xs), xs),
                       identity=(1.0, 0.0), reverse=True)[1]
        return fold.reduce(M.sum, ys * ys)
    if kind == "scanned":  # a scan of the row, then its sum: a sequential loop storing each prefix
        return fold.reduce(M.sum, fold.tanh(fold.scan(M.max, xs, reverse=True) * xs))
    if kind == "affine_first":  # a user operator, not commutative: x -> a x + b composed, first leaf only kept
        return fold.reduce(lambda p, q: (p[0] * q[0], q[0] * p[1] + q[1]), (1.0 + 0.1 * fold.tanh(xs), xs),
                           identity=(1.0, 0.0))[1]
    return fold.reduce(kind, xs)


@st.composite
def nests(draw):
    depth = draw(st.integers(1, 3))
    # the last axis sometimes long enough that its folds run in lanes (nest_lanes.MIN_EXTENT)
    shape = tuple(draw(st.integers(1, 6)) for _ in range(depth)) + (draw(st.integers(1, 13)),)
    ops = [(draw(st.sampled_from(range(len(_UNARY)))), draw(st.sampled_from(range(len(_BINARY)))),
            draw(st.sampled_from(range(len(_MONOIDS))))) for _ in range(depth + 1)]
    return shape, ops, draw(st.integers(0, 2**31 - 1))


def _program(shape, ops):
    def level(x, w, d):
        u, b, m = ops[d]
        if d == len(shape) - 1:  # x is a vector: an elementwise body folded
            return _fold(_MONOIDS[m], _UNARY[u](_BINARY[b](x, w)))
        inner = fold.map(lambda row: level(row, w, d + 1), x)
        return _fold(_MONOIDS[m], _UNARY[u](inner))

    return lambda X, w: fold.map(lambda row: level(row, w, 1), X)


@settings(max_examples=12, deadline=None)
@given(nests())
def test_random_nests_and_their_gradients_match_the_numpy_backend(spec):
    shape, ops, seed = spec
    r = np.random.default_rng(seed)
    X, w = 0.5 * r.normal(size=(7,) + shape[1:]), r.normal(size=shape[-1])
    f = _program(shape, ops)
    # the outer map's body folds (its rows, or a map of its rows): the loop nest runs it, forward and backward
    assert _nests(f, X, w)[1]
    assert _nests(fold.grad(lambda X, w: fold.reduce(M.sum, f(X, w)), argnums=(0, 1)), X, w)[1]
    got, want = _both(f, X, w)
    _close(got, want, 1e-9)
    loss = lambda X, w: fold.reduce(M.sum, f(X, w))  # noqa: E731
    got, want = _both(fold.grad(loss, argnums=(0, 1)), X, w)
    _close(got, want, 1e-8)


def test_a_long_map_body_is_written_once_as_straight_line_code():
    """A body of more than LONG_BODY statements runs as a nest (the older expansion compiled in time growing
    faster than the body: 100 statements took a minute), with the reference's results."""
    from fold.runtime.loops.fusion import LONG_BODY

    def body(x):
        y = x
        for j in range(LONG_BODY // 2 + 1):
            y = fold.tanh(y) * 0.5 + x * (0.01 * (j + 1))
        return y

    X = rng.normal(size=500)
    program, kernels = _nests(lambda X: fold.map(body, X), X)
    assert [s.prim.name for s in program.stmts] == ["loop_nest"] and not buffers(kernels[0].outer.body)
    got, want = _both(lambda X: fold.map(body, X), X)
    _close(got, want, 1e-12)


def test_a_sum_over_rows_of_scalars_folds_one_scalar_state():
    """sum[axes=(0,)] of a map's scalar results (a gradient's contribution to a captured scalar) is a fold of
    a 0-d state: its chunks' partial states are merged element by element (a Numba typing error before)."""
    X = rng.normal(size=(40, 6))

    def f(X):
        return fold.sum(fold.map(lambda r: fold.reduce(M.max, fold.map(lambda e: e * e, r)), X), axis=0)

    program, kernels = _nests(f, X)
    assert [s.prim.name for s in program.stmts] == ["loop_nest"], program
    assert [s.shape for s in kernels[0].outer.states] == [()]
    got, want = _both(f, X)
    _close(got, want, 1e-12)


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_rows_scaled_by_their_cotangent_and_summed_add_into_a_row_state(dtype, rtol):
    """The gradient of a per-class logsumexp of scores x.w with respect to w: sum over the rows of x times
    the row's cotangent, a map of a vector times a scalar summed over its axis. Before, no nest took that map
    (its body maps no map and folds nothing) and it wrote its (n, d) rows to be summed after."""
    X = rng.normal(size=(3000, 7)).astype(dtype)
    w = rng.normal(size=7).astype(dtype)
    labels = rng.integers(0, 5, 3000)

    def loss(w, X, labels):
        scores = fold.map(lambda x: fold.sum(x * w), X)
        return fold.sum(fold.reduce_by_index(M.logaddexp, 5, labels, scores))

    g = fold.grad(loss)
    program, kernels = _nests(g, w, X, labels)
    assert not [v for s in program.stmts for v in s.outs if v.aval.shape == X.shape], program
    assert any([s.shape for s in k.outer.states] == [(7,)] for k in kernels if isinstance(k.outer, ParallelFold))
    got, want = _both(g, w, X, labels)
    _close(got, want, rtol)
    scores = X.astype(np.float64) @ w.astype(np.float64)
    per_class = np.array([np.logaddexp.reduce(scores[labels == c]) for c in range(5)])
    softmax = np.exp(scores - per_class[labels])  # each row's weight within its class
    _close(got, X.T.astype(np.float64) @ softmax, 1e3 * rtol)


def _chain_source_length(n: int) -> int:
    from fold.runtime.numba_backend.loop_nests import kernel_source

    def body(r):
        x = r
        for _ in range(n):
            x = x * x + x * 0.5  # each statement reads the one before twice
        return fold.reduce(M.sum, x)

    X = rng.normal(size=(10, 4))
    _, kernels = _nests(lambda X: fold.reduce(M.sum, fold.map(body, X)), X)
    return len(kernel_source(kernels[0]))


def test_the_kernel_text_grows_linearly_with_the_body():
    """An element read twice is written once where it is still in scope, and a long chain is stored now and
    then: the kernel's text grows in proportion to the body (it doubled with every statement before, and a
    chain of a few hundred statements overflowed Python's recursion)."""
    short, long = _chain_source_length(100), _chain_source_length(400)
    assert long < 5 * short, (short, long)


def test_a_scans_producer_is_left_to_the_scan_fusion():
    """The generic scan gradient's per-element Jacobians are a map of maps that only a scan reads: the scan's
    fusion reads them as it scans (one map_scan kernel), where a nest would store them first."""
    from fold import ad

    x = rng.uniform(0.99, 1.01, 500)
    program = fold.trace(lambda x: fold.scan(lambda a, b: a * b, x, identity=1.0), x)
    grad_program, _ = ad.vjp_program(program)
    prepared = prepare(grad_program, whole_arrays=True)
    names = [s.prim.name for s in prepared.stmts]
    assert "loop_nest" not in names and "map_scan" in names, names


# ---------------------------------------------------------------- lanes (runtime/numba_backend/nest_lanes.py)

def _sources(f, *args) -> str:
    from fold.runtime.numba_backend.loop_nests import kernel_source

    return "\n".join(kernel_source(k) for k in _nests(f, *args)[1])


def _vector_math_available() -> bool:
    from fold.kernels.cpu import vector_math

    return vector_math.AVAILABLE


lanes_only = pytest.mark.skipif(not _vector_math_available(),
                                reason="no libmvec with AVX2 here (or FOLD_VECTOR_MATH=0): the loops stay scalar")


@pytest.fixture(params=[False, True], ids=["four", "wide"])
def lanes(request, monkeypatch):
    """The lanes nest_lanes gives a loop whose transcendentals are all of a dtype: four at these tests' sizes,
    and (`wide`) eight for float32, as it does from WIDE_MIN_ITERATIONS iterations on (lowered to 0 for the
    test, with the compiled kernels of the same nests set aside)."""
    from fold.runtime.numba_backend import loop_nests, nest_lanes

    if request.param:
        monkeypatch.setattr(nest_lanes, "WIDE_MIN_ITERATIONS", 0)
        monkeypatch.setattr(loop_nests, "_compiled", type(loop_nests._compiled)())
    return lambda dtype: nest_lanes.WIDE if request.param and np.dtype(dtype) == np.float32 else nest_lanes.WIDTH


def _call(op: str, dtype, lanes: int) -> str:
    """The vector call of `op` on `lanes` lanes of `dtype`, as a kernel's text has it."""
    return vector_math.function_name(op, np.dtype(dtype).name, lanes) + "("


def _logsumexp_rows(X):
    return fold.reduce(M.sum, fold.map(lambda r: fold.reduce(M.logaddexp, r), X))


@lanes_only
@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-6)])
def test_a_commutative_fold_over_a_row_runs_in_lanes_merged_after(dtype, rtol, lanes):
    """The logaddexp of each row (its maximum, then the sum of exp(x - maximum); the gradient's exp of each
    element) runs four elements per vector call (float32: eight), each fold in a copy per lane merged after
    the loop; 103 columns leave three (seven) for the scalar loop after."""
    X = rng.normal(size=(30, 103)).astype(dtype)
    X[3] = -np.inf  # a row of -inf in every lane: the merge keeps -inf, and the gradient's 0 * ... stays 0
    X[4, :50] = np.inf
    grad = fold.grad(_logsumexp_rows)
    text = _sources(grad, X)
    width = lanes(dtype)
    assert _call("exp", dtype, width) in text and "_maximum(acc" in text, text
    assert f"__g in range({103 // width})" in text and f"in range({103 % width})" in text, text
    for f in (_logsumexp_rows, grad):
        got, want = _both(f, X)
        np.testing.assert_array_equal(np.isnan(np.asarray(got)), np.isnan(np.asarray(want)))
    got, want = _both(grad, np.where(np.isinf(X), 0.0, X).astype(dtype))
    _close(got, want, rtol)


@lanes_only
def test_a_non_commutative_fold_keeps_its_order_while_its_elements_run_in_lanes():
    """A user operator (affine maps composed: not commutative) folds in iteration order, lane after lane;
    only its elements' tanh is computed four at a time. 13 columns: three groups and one left over."""
    X = rng.normal(size=(9, 5, 13))

    def f(X):
        return fold.reduce(M.sum, fold.map(lambda m: fold.reduce(M.max, fold.map(lambda r: fold.reduce(
            lambda p, q: (p[0] * q[0], q[0] * p[1] + q[1]), (1.0 + 0.1 * fold.tanh(r), r), identity=(1.0, 0.0))[1],
            m)), X))

    text = _sources(f, X)
    assert "vtanh(" in text and "__g in range(3)" in text, text
    got, want = _both(f, X)
    _close(got, want, 1e-13)


@lanes_only
def test_float32_transcendentals_run_eight_lanes_and_others_four(monkeypatch):
    """A row's float32 exp runs eight lanes per call (one AVX2 register) where the loop runs often enough
    (here: from any number of iterations on); a float32 sigmoid, which computes in float64 as its scalar
    helper does, and float64 exp run four."""
    from fold.runtime.numba_backend import loop_nests, nest_lanes

    monkeypatch.setattr(nest_lanes, "WIDE_MIN_ITERATIONS", 0)
    monkeypatch.setattr(loop_nests, "_compiled", type(loop_nests._compiled)())
    X32 = rng.normal(size=(6, 40)).astype(np.float32)
    exp_sum = lambda X: fold.sum(fold.map(lambda r: fold.sum(fold.exp(r)), X))  # noqa: E731
    sigmoid_sum = lambda X: fold.sum(fold.map(lambda r: fold.sum(fold.sigmoid(r)), X))  # noqa: E731
    eight, four = vector_math.function_name("exp", "float32", 8), vector_math.function_name("exp", "float64", 4)
    assert f"{eight}(" in _sources(exp_sum, X32), _sources(exp_sum, X32)
    assert f"{four}(" in _sources(sigmoid_sum, X32) and f"{eight}(" not in _sources(sigmoid_sum, X32)
    assert f"{four}(" in _sources(exp_sum, X32.astype(np.float64))
    for f in (exp_sum, sigmoid_sum):
        _close(*_both(f, X32), 2e-6)


@lanes_only
def test_eight_lanes_over_the_statement_budget_fall_back_to_four(monkeypatch):
    """A loop whose eight-lane form would add more statements than the kernel's budget (MAX_ADDED) has left
    runs four lanes where those fit, and stays scalar where neither does."""
    from fold.runtime.loops.nest import Assign, Loop, Store
    from fold.runtime.loops.text import size
    from fold.runtime.numba_backend import nest_lanes

    loop = Loop("j", 64, (Assign("e", "in0[j]"), Assign("t", "np.float32(math.exp(e))"), Store("out0", ("j",), "t")))
    calls = {width: _call("exp", np.float32, width) for width in (4, 8)}
    added = {width: size(nest_lanes._laned(loop, Counter(), width=width)) - size([loop]) for width in (4, 8)}
    assert added[4] < added[8], added
    runs = nest_lanes.WIDE_MIN_ITERATIONS // 64
    for budget, want in ((added[8], 8), (added[8] - 1, 4), (added[4] - 1, None)):
        monkeypatch.setattr(nest_lanes, "MAX_ADDED", budget)
        text = repr(nest_lanes.in_lanes((loop,), runs=runs))
        assert all((call in text) == (width == want) for width, call in calls.items()), (budget, text)
    monkeypatch.setattr(nest_lanes, "MAX_ADDED", added[8])
    assert calls[4] in repr(nest_lanes.in_lanes((loop,), runs=runs - 1))  # below WIDE_MIN_ITERATIONS


@lanes_only
def test_a_loop_runs_eight_lanes_from_a_million_iterations_per_call_on():
    """Eight lanes compile longer than four: a loop takes them where it runs WIDE_MIN_ITERATIONS times or more
    per call (a 1024 x 1024 float32 matrix's row sums of exp), four below (1023 rows)."""
    from fold.runtime.numba_backend import nest_lanes

    assert nest_lanes.WIDE_MIN_ITERATIONS == 1024 * 1024
    f = lambda X: fold.map(lambda r: fold.sum(fold.exp(r)), X)  # noqa: E731
    for rows, width in ((1024, 8), (1023, 4)):
        X = rng.normal(size=(rows, 1024)).astype(np.float32)
        text = _sources(f, X)
        assert _call("exp", np.float32, width) in text and f"__g in range({1024 // width})" in text, (rows, text)
        _close(*_both(f, X), 2e-6)


@lanes_only
def test_a_fold_whose_operator_is_a_lambda_is_not_split_into_lanes():
    """A lambda the recogniser does not know as logaddexp carries no commutativity: the fold stays one
    accumulator, updated in order (a value carried from one iteration to the next is never computed ahead),
    and agrees with the monoid's result."""
    X = rng.normal(size=(12, 4, 21))

    def f(op, **identity):
        return lambda X: fold.reduce(M.sum, fold.map(lambda m: fold.reduce(M.max, fold.map(
            lambda r: fold.reduce(op, fold.exp(0.3 * r), **identity), m)), X))

    user = f(lambda a, b: fold.logaddexp(a, b) * 1.0, identity=-np.inf)
    text = _sources(user, X)
    assert "vexp(" in text and "acc1__1" not in text and "_logaddexp(acc" in text, text
    got, want = _both(user, X)
    _close(got, want, 1e-13)
    _close(got, fold.jit(f(M.logaddexp), backend="numba")(X), 1e-13)


# ------------------------------------- a transcendental a later loop computes again (numba_backend/nest_reuse.py)

def _two_loops(between: tuple = (), scale: str = "t1"):
    """A ParallelMap over rows: a loop summing exp(x * scale) over the row into acc3, then `between`, then a
    loop writing exp(x * scale) * acc3."""
    from fold.runtime.loops.nest import Assign, Kernel, LaneFold, Loop, Param, ParallelMap, Store

    f64 = np.dtype(np.float64)
    # the sum's merge operands named as build.py names them (l<n>, r<n>)
    total = LaneFold(("acc3",), ("np.float64(0.0)",), ("l0",), ("r0",), (Assign("t9", "np.float64((l0 + r0))"),), ("t9",))
    first = Loop("j", 8, (Assign("e1", "in0[i, j]"), Assign("t2", f"np.float64(math.exp(np.float64((e1 * {scale}))))"),
                          Assign("acc3", "np.float64((acc3 + t2))")), (total,))
    second = Loop("k", 8, (Assign("e4", "in0[i, k]"), Assign("t5", f"np.float64(math.exp(np.float64((e4 * {scale}))))"),
                           Store("out0", ("i", "k"), "np.float64((t5 * acc3))")))
    body = (Assign("t1", "np.float64(0.5)"), Assign("acc3", "np.float64(0.0)"), first, *between, second)
    return Kernel((Param("in0", (3, 8), f64, "input"), Param("out0", (3, 8), f64, "output")),
                  ParallelMap("i", 3, body))


def test_a_later_loops_transcendental_is_read_from_the_first_loops_buffer():
    from fold.runtime.loops.nest import Assign, Buffer, Loop, Store
    from fold.runtime.numba_backend.nest_reuse import reused

    from fold.runtime.loops.text import defined

    kernel = _two_loops()
    body = reused(kernel).outer.body
    buffer, first, second = body[2], body[3], body[4]
    assert isinstance(buffer, Buffer) and buffer.shape == (8,) and buffer.dtype == np.float64, body
    assert buffer.name not in defined(kernel.outer.body) | {"l0", "r0"}, buffer  # a name of its own
    assert first.body[-1] == Store(buffer.name, ("j",), "t2"), first
    assert Assign("t5", f"{buffer.name}[k]") in second.body and isinstance(second, Loop), second


def test_a_value_that_changes_between_the_loops_is_computed_again():
    """t1 is assigned again between the loops: the second loop's exp(x * t1) is another value."""
    from fold.runtime.loops.nest import Assign
    from fold.runtime.numba_backend.nest_reuse import reused

    kernel = _two_loops((Assign("t1", "np.float64(2.0)"),))
    assert reused(kernel) == kernel


def test_a_value_the_earlier_loop_changes_is_computed_again():
    """exp(x * acc3): the first loop reads acc3 as it runs, the second its final value."""
    from fold.runtime.numba_backend.nest_reuse import reused

    kernel = _two_loops(scale="acc3")
    assert reused(kernel) == kernel


def _attention(Q, K, V):
    """Attention written with maps: per query, softmax(K q) weighting the rows of V."""
    def attend(q):
        s = fold.map(lambda k: fold.sum(q * k), K)
        e = fold.exp(s - fold.reduce(M.max, s))
        return fold.sum(fold.map(lambda ej, v: ej * v, e, V), axis=0) / fold.sum(e)

    return fold.map(attend, Q)


@lanes_only
def test_an_array_a_map_stored_is_read_from_its_buffer_by_the_statements_after_it(lanes):
    """Attention's weights exp(s - max) are stored for the weighted sum of V's rows (a map reading them again
    for each column); the normaliser's sum after it reads that buffer, not the exponentials again."""
    Q, K, V = (rng.normal(size=(r, 8)).astype(np.float32) for r in (12, 40, 40))
    text = _sources(_attention, Q, K, V)
    assert text.count(_call("exp", np.float32, lanes(np.float32))) == 1, text
    _close(*_both(_attention, Q, K, V), 2e-6)
    _close(*_both(fold.grad(lambda Q, K, V: fold.sum(_attention(Q, K, V)), argnums=(0, 1, 2)), Q, K, V), 2e-5)


@lanes_only
def test_softmax_rows_compute_each_exp_once(lanes):
    """exp(x - max) is summed in one loop and divided by the sum in the next: the first loop stores it. The
    max is an accumulator's final value, assigned before both loops and in neither."""
    X = rng.normal(size=(20, 70)).astype(np.float32)
    X[2, :30] = -np.inf

    def softmax_rows(X):
        return fold.map(lambda r: (lambda e: e / fold.sum(e))(fold.exp(r - fold.reduce(M.max, r))), X)

    text = _sources(softmax_rows, X)
    assert "kept0[i" in text and text.count(_call("exp", np.float32, lanes(np.float32))) == 1, text
    _close(*_both(softmax_rows, X), 2e-6)


@lanes_only
def test_a_logsumexp_hessian_vector_product_computes_each_exp_once_per_pass():
    """The HVP of a row's logsumexp sums exp(x - lse) * tangent over the row, then writes exp(x - lse) times
    (tangent - that sum): the second pass reads the first's exponentials from a row buffer. Two vector exp
    calls in the nest's group loops (the row's sum of exp(x - max), the first pass), none in the output's."""
    X = rng.normal(size=(30, 103))
    X[3, :40] = -np.inf
    T = rng.normal(size=X.shape)

    def hvp(X):
        return fold.jvp(fold.grad(_logsumexp_rows), (X,), (T,))[1]

    text = _sources(hvp, X)
    assert text.count("vexp(") == 2 and "kept0[i" in text, text
    _close(*_both(hvp, X), 1e-12)


def _tanh_of_dots(X, w):
    return fold.map(lambda x: fold.tanh(fold.sum(x * w)), X)


@lanes_only
@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-6)])
@pytest.mark.parametrize("n", [3, 4, 41])
def test_rows_go_side_by_side_where_a_transcendental_follows_their_fold(n, dtype, rtol, lanes):
    """tanh of each row's dot product: no innermost loop has the tanh, so four rows (float32: eight) go
    through the body side by side, the row's loop once for all of them (each row's sum its own, in its own
    order) and the tanh one vector call; summed, the sum in a copy per lane merged after. 3 rows: no group;
    41: ten groups (five) and one left."""
    X, w = rng.normal(size=(n, 5)).astype(dtype), rng.normal(size=5).astype(dtype)
    summed = lambda X, w: fold.sum(_tanh_of_dots(X, w))  # noqa: E731
    width = lanes(dtype)
    last = width - 1
    for f in (_tanh_of_dots, summed, fold.grad(summed, argnums=(0, 1))):
        got, want = _both(f, X, w)
        _close(got, want, rtol)
    for f in (_tanh_of_dots, summed):
        text = _sources(f, X, w)
        assert _call("tanh", dtype, width) in text and f"i__c__g in range(i__c__n // {width})" in text, text
        assert re.search(rf"e\d+__{last} = in1\[i__{last}, i\d+\]", text), text
        assert len(re.findall(r"for i\d+ in range\(5\)", text)) == 2, text  # the group's, and the rows left over
    assert re.search(rf"state\d+__{last}", _sources(summed, X, w))


@lanes_only
def test_rows_side_by_side_fold_into_an_ordered_operator_lane_after_lane():
    """A user operator (affine maps composed: not commutative) over the rows' (1 + tanh(x . w) / 10, sum x):
    the rows' folds and tanh run side by side, and the operator takes them in row order, on one state."""
    X, w = rng.normal(size=(23, 6)), rng.normal(size=6)

    def f(X, w):
        pairs = fold.map(lambda x: (1.0 + 0.1 * fold.tanh(fold.sum(x * w)), fold.sum(x)), X)
        return fold.reduce(lambda l, r: (l[0] * r[0], r[0] * l[1] + r[1]), pairs, identity=(1.0, 0.0))

    text = _sources(f, X, w)
    assert "vtanh(" in text and "i__c__g" in text, text
    state = re.search(r"(state\d+) = np\.float64\(1\.0\)", text).group(1)  # the product's, one copy
    first, second = (re.search(rf"{state} = (t\d+)__{lane}\n", text) for lane in (0, 1))
    assert f"{state}__1" not in text and first and second and first.start() < second.start(), text
    _close(*_both(f, X, w), 1e-12)


@lanes_only
def test_rows_side_by_side_each_keep_their_own_buffer():
    """A row's prefix sums are stored in a row buffer and read back: four rows side by side, four buffers."""
    X, w = rng.normal(size=(23, 6)), rng.normal(size=6)
    f = lambda X, w: fold.map(lambda r: fold.tanh(fold.sum(fold.scan(M.sum, r) * w)), X)  # noqa: E731
    text = _sources(f, X, w)
    assert "vtanh(" in text and all(f"b1__{lane}[i2] = " in text for lane in range(4)), text
    _close(*_both(f, X, w), 1e-12)


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-13), (np.float32, 2e-6)])
@pytest.mark.parametrize("identity", [None, -np.inf])
def test_a_logaddexp_fold_is_its_maximum_then_a_sum_of_exponentials(dtype, rtol, identity):
    """A logaddexp fold in a nest (the monoid, or a lambda recognised as logaddexp) runs
    as max, then sum of exp(x - max): no exponential waits for the last. Rows of -inf, of +inf, with a NaN,
    and with -inf among finite values give what logaddexp gives. Its own generator: drawn from the module's,
    the rows depended on which tests ran before in the worker, and one draw made a row's logsumexp -0.02,
    where float32's cancellation is 3e-6 relative (1 ulp of the terms)."""
    X = np.random.default_rng(7).normal(scale=3.0, size=(9, 17)).astype(dtype)
    X[1] = -np.inf
    X[2, 5] = np.inf
    X[3] = np.inf
    X[4, 7] = np.nan
    X[5, ::2] = -np.inf
    op = (M.logaddexp, {}) if identity is None else (lambda a, b: fold.logaddexp(a, b), {"identity": identity})

    def f(X):
        return fold.map(lambda r: fold.reduce(op[0], fold.map(lambda x: 2.0 * x, r), **op[1]), X)

    text = _sources(f, X)
    assert "_maximum(acc" in text and "_logaddexp(" not in text, text
    got, want = _both(f, X)
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol)


def test_a_max_cotangent_inside_a_map_computes_only_the_rows_it_reaches():
    """The gradient of a max over a map's rows reaches one row: the nest computes that row's part of the
    backward pass under `if row == argmax` (the rest of the buffer stays zero), not every row multiplied by
    zero. Results as the numpy backend's."""
    from fold.runtime.loops.nest import If, Loop

    X, w = rng.normal(size=(15, 9, 10)), rng.normal(size=10)
    grad = fold.grad(three_deep, argnums=(0, 1))
    _, kernels = _nests(grad, X, w)

    def guarded_loops(nodes):
        found = 0
        for node in nodes:
            if isinstance(node, If):
                found += sum(isinstance(n, Loop) for n in node.body)
            if isinstance(node, (If, Loop)):
                found += guarded_loops(node.body)
        return found

    assert sum(guarded_loops(k.outer.step) for k in kernels) >= 1, \
        "\n".join(describe(k) for k in kernels)
    got, want = _both(grad, X, w)
    _close(got, want, 1e-12)


def test_a_long_chain_is_stored_once_and_every_reader_reads_the_stored_array():
    """An array pulled through MAX_CHAIN statements is stored before it is read on, so that each of its
    readers reads the buffer: each statement of the body is written once per element (its readers each
    computed the whole chain again before, and the kernel's work grew with the square of the chain)."""
    from fold.runtime.loops.build import MAX_CHAIN

    steps = 3 * MAX_CHAIN // 4  # 6 statements a step: the chain is stored about four times

    def body(r):
        x = r
        for _ in range(steps):  # x is read by two statements (x * 0.9, -x): both read the stored array
            x = x * 0.9 - fold.exp(-x * x) * 0.1
        return fold.reduce(M.sum, x)

    X = rng.normal(size=(20, 9))
    f = lambda X: fold.reduce(M.sum, fold.map(body, X))  # noqa: E731
    _, (kernel,) = _nests(f, X)
    text = describe(kernel)
    assert text.count("math.exp(") == steps, text
    assert len(buffers(kernel.outer.step)) >= 3, text
    got, want = _both(f, X)
    _close(got, want, 1e-12)


@pytest.mark.parametrize("case", ["kmeans", "three_deep", "ordered_fold"])
def test_a_long_body_compiled_in_parts_gives_the_same_results(case, monkeypatch):
    """A nest body longer than nest_parts.WHOLE is compiled as functions of at most PART statements, each
    called in turn (Numba's compile time grows faster than a function's length). With both limits made
    small, every natural nest and its gradient runs in parts: buffers, carried folds and stores cross the
    parts' boundaries, with the whole kernel's results."""
    from fold.runtime.numba_backend import nest_parts
    from fold.runtime.numba_backend.loop_nests import kernel_source

    monkeypatch.setattr(nest_parts, "WHOLE", 12)
    monkeypatch.setattr(nest_parts, "PART", 10)
    f, make = CASES[case]
    args = make()
    loss = (lambda X: f(X)[1]) if case == "ordered_fold" else f  # noqa: E731
    grad = fold.grad(loss, argnums=tuple(range(len(args))))
    for g in (f, grad):
        sources = [kernel_source(k) for k in _nests(g, *args)[1]]
        assert any("def part" in s for s in sources), sources
        got, want = _both(g, *args)
        _close(got, want, 1e-12)


@settings(max_examples=6, deadline=None)
@given(nests())
def test_random_nests_compiled_in_parts_match_the_numpy_backend(spec):
    """As the random nests above, with every body compiled in parts of at most 10 statements: buffers
    allocated in inner loops, folds carried across parts, and stores all cross the parts' boundaries."""
    from fold.runtime.numba_backend import nest_parts

    shape, ops, seed = spec
    r = np.random.default_rng(seed)
    X, w = 0.5 * r.normal(size=(7,) + shape[1:]), r.normal(size=shape[-1])
    loss = lambda X, w: fold.reduce(M.sum, _program(shape, ops)(X, w))  # noqa: E731
    saved = nest_parts.WHOLE, nest_parts.PART
    nest_parts.WHOLE, nest_parts.PART = 12, 10
    try:
        for f in (loss, fold.grad(loss, argnums=(0, 1))):
            got, want = _both(f, X, w)
            _close(got, want, 1e-8)
    finally:
        nest_parts.WHOLE, nest_parts.PART = saved


def test_a_buffer_inside_a_loop_is_allocated_for_the_part_that_fills_it(monkeypatch):
    """A map stored inside an inner loop (its Buffer nested in the body) filled by an outlined part: the
    buffer is allocated per chunk with the others and passed to the part."""
    from fold.runtime.numba_backend import nest_parts

    monkeypatch.setattr(nest_parts, "WHOLE", 12)
    monkeypatch.setattr(nest_parts, "PART", 10)
    shape, ops = (7, 3, 4, 5), [(0, 1, 1), (1, 0, 3), (4, 2, 0), (0, 1, 2)]
    X, w = 0.5 * rng.normal(size=shape), rng.normal(size=shape[-1])
    loss = lambda X, w: fold.reduce(M.sum, _program(shape, ops)(X, w))  # noqa: E731
    grad = fold.grad(loss, argnums=(0, 1))
    _, kernels = _nests(grad, X, w)
    assert any(isinstance(n, Buffer) for k in kernels for loop in _loops(k) for n in loop.body), \
        "\n".join(describe(k) for k in kernels)
    got, want = _both(grad, X, w)
    _close(got, want, 1e-8)


def _loops(kernel):
    from fold.runtime.loops.nest import Loop

    def walk(nodes):
        for n in nodes:
            if isinstance(n, Loop):
                yield n
                yield from walk(n.body)

    return list(walk(kernel.outer.body if hasattr(kernel.outer, "body") else kernel.outer.step))


# ---------------------------------------------------------------- one expression once, dead temporaries gone

def test_the_same_pure_expression_is_computed_once_where_its_block_is_open():
    """Two tanh statements of the same operand (as a gradient's recomputed forward and its derivative) are
    one call (rows side by side: one vector call for a group of rows, one scalar call for the rows left
    over); a sum over a row shifted by another sum over it reads that sum's final value."""
    X = rng.normal(size=(40, 6, 5))

    def f(X):
        return fold.reduce(M.sum, fold.map(lambda m: fold.reduce(M.sum, fold.map(
            lambda r: fold.sum(fold.tanh(r) * fold.tanh(r)) + fold.sum(r - fold.sum(r)), m)), X))

    text = _sources(f, X)
    assert text.count("math.tanh(") <= 1 and text.count("vtanh(") <= 1 and "tanh(" in text, text
    got, want = _both(f, X)
    _close(got, want, 1e-12)


def test_prune_drops_dead_temporaries_and_keeps_what_folds_and_stores_read():
    from fold.runtime.loops.nest import Assign, Kernel, LaneFold, Loop, Param, ParallelMap, Store
    from fold.runtime.loops.prune import prune

    fold_ = LaneFold(("acc1",), ("np.float64(0.0)",), ("l2",), ("r3",), (Assign("t4", "(l2 + r3)"),), ("t4",))
    body = (
        Assign("t0", "in0[i]"),
        Assign("t5", "math.exp(t0)"),          # read by t6 only, which nothing reads: both go
        Assign("t6", "(t5 * 2.0)"),
        Assign("acc1", "np.float64(0.0)"),
        Loop("i7", 3, (Assign("e8", "in1[i, i7]"), Assign("t9", "math.tanh(e8)"),
                       Assign("acc1", "(acc1 + e8)")), (fold_,)),   # t9 dead: the loop keeps the fold
        Loop("i10", 3, (Assign("t11", "(t0 + 1.0)"),)),             # left empty: goes
        Store("out0", ("i",), "(acc1 + t0)"),
    )
    params = (Param("in0", (4,), np.dtype("float64"), "input"), Param("in1", (4, 3), np.dtype("float64"), "input"),
              Param("out0", (4,), np.dtype("float64"), "output"))
    pruned = prune(Kernel(params, ParallelMap("i", 4, body))).outer.body
    targets = [n.target for n in pruned if isinstance(n, Assign)]
    assert targets == ["t0", "acc1"], pruned
    (loop,) = [n for n in pruned if isinstance(n, Loop)]
    assert [n.target for n in loop.body] == ["e8", "acc1"] and loop.folds == (fold_,), loop
    assert isinstance(pruned[-1], Store)


# ------------------------------------------------- a fold of a map of scalars (the chunk's loop, nest_lanes)

def _flat(monoid, body):
    return lambda x, y: fold.reduce(monoid, fold.map(body, x, y))


@pytest.mark.parametrize("n", [1, 63, 64, 1000, 100_003])
def test_a_sum_of_a_map_of_scalars_is_one_nest_tiled_with_a_remainder(n):
    """A reduce of a map of scalars is a ParallelFold: nothing of the map's size is stored. Its sum has no
    transcendental function, so each chunk folds into 64 copies (a tile LLVM vectorises), merged after; the
    chunk's last n % 64 elements run as the body did. Sizes below one tile and at its edges too."""
    x, y = rng.normal(size=n), rng.normal(size=n)
    f = _flat(M.sum, lambda a, b: (a - b) * (a - b) + 0.5 * a)
    program, (kernel,) = _nests(f, x, y)
    assert [s.prim.name for s in program.stmts] == ["loop_nest"], program
    assert kernel.outer.folds and buffers(kernel.outer.step) == [], describe(kernel)
    text = _sources(f, x, y)
    assert "__tile" in text and "in0[i__u]" in text, text
    got, want = _both(f, x, y)
    _close(got, want, 1e-12)


def test_a_float32_fold_of_a_map_is_carried_in_float64_and_rounded_once():
    """10^6 values of 0.8153 summed in one float32 running value drift to a relative error of about 1e-3;
    carried in float64 (as the backends' other float32 folds) the sum is float32's rounding of the exact one."""
    x = np.full(10**6, 0.8153, np.float32)
    f = _flat(M.sum, lambda a, b: a * b)
    got = fold.jit(f, backend="numba")(x, np.ones_like(x))
    assert np.asarray(got).dtype == np.float32
    exact = np.float32(np.sum(x.astype(np.float64)))
    assert np.asarray(got) == exact, (got, exact)
    assert "state" in _sources(f, x, x) and "np.float64((state" in _sources(f, x, x)


@lanes_only
@pytest.mark.parametrize("monoid", ["logaddexp", "max"])
def test_a_fold_of_a_map_with_a_transcendental_runs_its_chunks_in_lanes(monoid):
    """exp in the body (and logaddexp as the operator): each chunk runs four elements per vector call, the
    fold in four copies merged after. Non-finite elements (inf, -inf, NaN) give the reference's result."""
    m = getattr(M, monoid)
    f = _flat(m, lambda a, b: fold.exp(a) * b)
    x, y = rng.normal(size=10_001), rng.normal(size=10_001)
    text = _sources(f, x, y)
    assert "vexp(" in text and "__g in range(i__c__n // 4)" in text, text
    _close(*_both(f, x, y), 1e-12)
    for bad in (np.inf, -np.inf, np.nan):
        x2 = x.copy()
        x2[5000] = bad
        got, want = _both(f, x2, y)  # inf and NaN where the reference has them, else close
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12)


def test_a_non_commutative_fold_of_a_map_keeps_its_order():
    """Affine maps composed (not commutative): no lanes and no tiles; each chunk folds in order and the
    chunks are merged in order."""
    a, b = rng.uniform(0.9, 1.1, 5003), rng.normal(size=5003)

    def f(a, b):
        pairs = fold.map(lambda p, q: (p * 1.0, q + 0.0), a, b)
        return fold.reduce(lambda l, r: (l[0] * r[0], r[0] * l[1] + r[1]), pairs, identity=(1.0, 0.0))

    program, (kernel,) = _nests(f, a, b)
    assert not kernel.outer.folds
    text = _sources(f, a, b)
    assert "__tile" not in text and "__g" not in text, text
    _close(*_both(f, a, b), 1e-10)


def test_a_plain_operator_that_is_a_known_commutative_op_folds_in_lanes():
    """A reduce with no monoid whose operator is `minimum` (a user's lambda; what jvp leaves of a min reduce
    once its tangent is dropped) is as commutative as the min monoid: its row loops fold in lanes, and a long
    one is handed to LLVM's vectoriser, as the monoid's are."""
    x = rng.normal(size=(300, 96))

    def f(x):
        return fold.reduce(M.sum, fold.map(
            lambda r: fold.reduce(lambda a, b: fold.minimum(a, b), r * 2.0, identity=np.inf), x))

    assert "_vector_minimum(" in _sources(f, x), _sources(f, x)
    _close(*_both(f, x), 1e-12)


def test_a_record_monoid_of_a_map_folds_all_its_leaves_in_tiles():
    """A commutative monoid of two leaves (a weighted sum) over a map: both leaves in tiles."""
    x, w = rng.normal(size=777), rng.uniform(size=777)

    def f(x, w):
        return fold.reduce(M.wsum, fold.map(lambda v, u: {"v": u * v, "w": u}, x, w))

    program, (kernel,) = _nests(f, x, w)
    assert len(kernel.outer.states) == 2 and kernel.outer.folds
    assert _sources(f, x, w).count("__tile = np.empty") == 2
    _close(*_both(f, x, w), 1e-12)


def test_the_cuda_backend_keeps_a_fold_of_a_map_of_scalars_as_two_statements():
    """The cuda backend's reduce kernel reads grid-stride (coalesced); a nest's fold would give each thread a
    run of consecutive elements. So there the map and the reduce stay apart, while a map of maps still nests."""
    x, y = rng.normal(size=300), rng.normal(size=300)
    f = _flat(M.sum, lambda a, b: a * b)
    assert [s.prim.name for s in fold.lowered(f, x, y, backend="cuda").program.stmts] == ["map", "reduce"]
    assert [s.prim.name for s in fold.lowered(f, x, y).program.stmts] == ["loop_nest"]
    C, P = rng.normal(size=(4, 3)), rng.normal(size=(50, 3))
    assert [s.prim.name for s in fold.lowered(kmeans_cost, C, P, backend="cuda").program.stmts] == ["loop_nest"]


@pytest.mark.parametrize("monoid", ["sum", "max", "logaddexp"])
def test_a_fold_of_a_map_in_tiles_or_lanes_compiled_in_parts_gives_the_same_results(monoid, monkeypatch):
    """A chunk run in tiles or lanes (the whole chunk as the fold's step) and longer than nest_parts.WHOLE is
    compiled in parts like any other step: the accumulators' copies cross the parts' boundaries."""
    from fold.runtime.numba_backend import nest_parts
    from fold.runtime.numba_backend.loop_nests import kernel_source

    monkeypatch.setattr(nest_parts, "WHOLE", 12)
    monkeypatch.setattr(nest_parts, "PART", 10)
    f = _flat(getattr(M, monoid), lambda a, b: fold.exp(0.1 * a) * b - a * a + 0.5 * b if monoid == "logaddexp"
              else (a - b) * (a + b) * 0.5 + a * b - b)
    x, y = rng.normal(size=1001), rng.normal(size=1001)
    (source,) = [kernel_source(k) for k in _nests(f, x, y)[1]]
    assert "def part" in source and ("__tile" in source or "__g in range(i__c__n" in source), source
    _close(*_both(f, x, y), 1e-12)


def test_nests_with_the_same_kernel_text_keep_their_own_closed_over_constants():
    """Two programs closing over different arrays build kernels of the same text: each reads its own
    constants, whichever was built last (they were once kept per kernel text, and the first program then read
    the second's array)."""
    X = rng.normal(size=(40, 6))
    first, second = rng.normal(size=6), rng.normal(size=6)

    def closing_over(weights):
        return lambda X: fold.reduce(M.sum, fold.map(lambda r: fold.tanh(fold.reduce(M.sum, r * weights)), X))

    f, g = closing_over(first), closing_over(second)
    (nest_f,), (nest_g,) = _nests(f, X)[1], _nests(g, X)[1]
    assert nest_f == nest_g  # the same text
    jitted_f, jitted_g = fold.jit(f, backend="numba"), fold.jit(g, backend="numba")
    for h, weights in ((jitted_f, first), (jitted_g, second), (jitted_f, first)):
        np.testing.assert_allclose(h(X), np.sum(np.tanh(X @ weights)), rtol=1e-12)


# ---------------------------------------------------------------- small nests run serially (loop_nests.SERIAL_WORK)

def _variants_run(f, *args) -> list[bool]:
    """Which kernel variants (True: over threads) the first call of f's loop nests ran."""
    from fold.runtime.numba_backend import loop_nests

    ran: list[bool] = []
    compiled = loop_nests.compiled_kernel

    def recording(prim, parallel=True):
        ran.append(parallel)
        return compiled(prim, parallel)

    loop_nests.compiled_kernel = recording
    try:
        got = fold.jit(f, backend="numba")(*args)
    finally:
        loop_nests.compiled_kernel = compiled
    _close(got, fold.jit(f, backend="numpy")(*args), 1e-10)
    return ran


@pytest.mark.parametrize("n, parallel", [(1000, False), (300_000, True)])
def test_a_nest_of_little_work_runs_its_serial_kernel(n, parallel, monkeypatch):
    """Starting threads costs more than a small nest's work: below SERIAL_WORK statements run in all, the
    kernel compiled serially runs (in one chunk); above it, the kernel over threads."""
    import numba

    from fold.runtime.numba_backend import loop_nests

    if numba.get_num_threads() < 2:
        monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    x = rng.normal(size=n)
    f = lambda x: fold.reduce(M.sum, fold.map(lambda a: a * a + 1.0, x))  # noqa: E731
    program, kernels = _nests(f, x)
    assert (loop_nests.work(kernels[0]) >= loop_nests.SERIAL_WORK) == parallel
    assert _variants_run(f, x) == [parallel]


def test_the_work_of_a_nest_counts_each_loop_body_once_per_iteration():
    from fold.runtime.numba_backend import loop_nests

    C, P = rng.normal(size=(8, 16)), rng.normal(size=(30, 16))
    _, kernels = _nests(kmeans_cost, C, P)
    _, bigger = _nests(kmeans_cost, rng.normal(size=(16, 16)), rng.normal(size=(60, 16)))
    # twice the points and twice the centroids: four times the inner loops' work
    assert 3.5 < loop_nests.work(bigger[0]) / loop_nests.work(kernels[0]) < 4.5
    assert loop_nests.work(kernels[0]) > 30 * 8 * 16


# ---------------------------------------------------------------- histograms of a map (reduce_by_index)

def _complex_product(p, q):
    """(a + bi)(c + di) on 2-vectors: associative and commutative, and each result component reads both of
    the bin's components (so a bin must not be written while the operator still reads it)."""
    return p[0:1] * q + p[1:2] * (q[::-1] * np.array([-1.0, 1.0]))


HISTOGRAMS = {
    # name: (operator, identity, element shape, body of (index, x row) -> (index, value))
    "sum of scalars": (M.sum, None, (), lambda i, r: (i, fold.sin(r[0]) * r[1])),
    "max of rows": (M.max, None, (3,), lambda i, r: (i, fold.exp(r) * r[0])),
    "complex products": (_complex_product, np.array([1.0, 0.0]), (2,),  # unit numbers (cos t, sin t)
                         lambda i, r: (i, fold.cos(r[0:1] * np.ones(2) - np.array([0.0, np.pi / 2])))),
    "indices from the map": (M.min, None, (), lambda i, r: (i * 2 - 3, r[0] - r[1])),
}


def _binned(name, bins):
    op, identity, _, body = HISTOGRAMS[name]

    def f(idx, X):
        at, values = fold.map(body, idx, X)
        if name != "indices from the map":
            at = idx  # computed before the map: a kernel input
        return fold.reduce_by_index(op, bins, at, values, identity=identity)

    return f


@pytest.mark.parametrize("name", sorted(HISTOGRAMS))
@pytest.mark.parametrize("n", [1, 1000, 300_000])
def test_a_histogram_of_a_map_bins_each_row_as_the_map_computes_it(name, n, monkeypatch):
    """reduce_by_index(op, bins, indices, map(f, ...)) is one nest: its state is the bins, nothing of the map's
    size is stored, and indices outside the bins are ignored; the same results as the numpy backend, in one
    chunk and over threads (each chunk's own bins, merged in order)."""
    import numba

    if numba.get_num_threads() < 2:
        monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    bins = 7
    idx = rng.integers(-2, bins + 2, n)
    X = rng.uniform(-1.0, 1.0, (n, 3))
    f = _binned(name, bins)
    program, (kernel,) = _nests(f, idx, X)
    assert [s.prim.name for s in program.stmts] == ["loop_nest"], program
    (state,) = kernel.outer.states
    assert state.shape == (bins,) + HISTOGRAMS[name][2], describe(kernel)
    assert all(b.shape == HISTOGRAMS[name][2] for b in buffers(kernel.outer.step)), describe(kernel)
    got, want = _both(f, idx, X)
    _close(got, want, 1e-12)


def test_a_non_commutative_histogram_keeps_each_bins_order_across_chunks(monkeypatch):
    """Affine maps composed per bin (not commutative) over threads: each chunk folds its bins in order and
    the chunks are merged in order, as the numpy backend's stable segmented fold."""
    import numba

    from fold.runtime.numba_backend import loop_nests

    if numba.get_num_threads() < 2:
        monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    n, bins = 400_000, 5
    idx, a, b = rng.integers(0, bins, n), rng.uniform(0.999, 1.001, n), rng.normal(size=n)

    def f(idx, a, b):
        pairs = fold.map(lambda p, q: (p * 1.0, fold.tanh(q)), a, b)
        return fold.reduce_by_index(lambda l, r: (l[0] * r[0], r[0] * l[1] + r[1]), bins, idx, pairs,
                                    identity=(1.0, 0.0))

    _, (kernel,) = _nests(f, idx, a, b)
    assert not kernel.outer.folds and loop_nests.chunk_limit(kernel) > 1
    assert _variants_run(f, idx, a, b) == [True]


def test_a_float32_histogram_is_carried_in_float64_and_rounded_once():
    """10^5 values of 0.8153 in three bins: folded in float32 each bin would drift by about 1e-4; carried in
    float64 every bin is float32's rounding of its exact sum."""
    x = np.full(10**5, 0.8153, np.float32)
    idx = np.arange(10**5) % 3
    f = lambda idx, x: fold.reduce_by_index(M.sum, 3, idx, fold.map(lambda v: v * np.float32(1.0), x))  # noqa: E731
    got = np.asarray(fold.jit(f, backend="numba")(idx, x))
    assert got.dtype == np.float32
    exact = np.array([np.float32(np.sum(x[idx == k].astype(np.float64))) for k in range(3)])
    np.testing.assert_array_equal(got, exact)


def test_a_histogram_of_many_bins_gets_the_chunks_its_merge_can_afford():
    """Chunks are merged serially, bin by bin: a histogram whose bins are many against its work gets fewer
    chunks (loop_nests.MERGE_SHARE), and still the reference's bins."""
    from fold.runtime.numba_backend import loop_nests

    n, bins = 600_000, 400_000
    idx, x = rng.integers(0, bins, n), rng.normal(size=n)
    f = lambda idx, x: fold.reduce_by_index(M.sum, bins, idx, fold.map(lambda v: v * v + 1.0, x))  # noqa: E731
    _, (kernel,) = _nests(f, idx, x)
    limit = loop_nests.chunk_limit(kernel)
    assert 1 < limit < 2 * loop_nests.CHUNKS_PER_THREAD, limit  # fewer than two threads' chunks
    assert limit * loop_nests.MERGE_SHARE * bins <= loop_nests.work(kernel) < (limit + 1) * loop_nests.MERGE_SHARE * bins
    _close(*_both(f, idx, x), 1e-12)


def test_the_cuda_backend_keeps_a_histogram_and_its_map_apart():
    """The cuda backend's nests give each thread its own copy of a fold's state: bins stay with its
    histogram kernel."""
    idx, x = rng.integers(0, 4, 100), rng.normal(size=100)
    f = lambda idx, x: fold.reduce_by_index(M.sum, 4, idx, fold.map(lambda v: v * v, x))  # noqa: E731
    assert [s.prim.name for s in fold.lowered(f, idx, x, backend="cuda").program.stmts] == ["map", "reduce_by_index"]
    assert [s.prim.name for s in fold.lowered(f, idx, x).program.stmts] == ["loop_nest"]


_BIN_OPERATORS = [M.sum, M.max, M.min, "affine"]


@st.composite
def binned_maps(draw):
    """A random histogram of a random map: its body, operator, element shape, bins and where the indices
    come from."""
    body = (draw(st.sampled_from(range(len(_UNARY)))), draw(st.sampled_from(range(len(_BINARY)))))
    operator = draw(st.sampled_from(range(len(_BIN_OPERATORS))))
    width = draw(st.sampled_from([0, 1, 3]))  # 0: scalar elements
    return body, operator, width, draw(st.integers(1, 9)), draw(st.booleans()), draw(st.integers(0, 2**31 - 1))


def _binned_program(body, operator, width, bins, indices_from_map):
    u, b = _UNARY[body[0]], _BINARY[body[1]]
    op = _BIN_OPERATORS[operator]

    def row(i, x, y):
        value = u(b(x[:width], y[:width])) if width else fold.sum(u(b(x, y)))
        if op == "affine":  # a user's operator, not commutative: x -> a x + b composed
            value = (1.0 + 0.1 * fold.tanh(value), value)
        return (i + 1 if indices_from_map else i), value

    def f(idx, X, w):
        at, values = fold.map(lambda i, x: row(i, x, w), idx, X)
        at = at if indices_from_map else idx
        if op == "affine":
            one = np.ones(width) if width else 1.0
            return fold.reduce_by_index(lambda l, r: (l[0] * r[0], r[0] * l[1] + r[1]), bins, at, values,
                                        identity=(one, 0.0 * one))[1]
        return fold.reduce_by_index(op, bins, at, values)

    return f


@settings(max_examples=12, deadline=None)
@given(binned_maps())
def test_random_histograms_of_maps_and_their_gradients_match_the_numpy_backend(spec):
    body, operator, width, bins, indices_from_map, seed = spec
    r = np.random.default_rng(seed)
    n = int(r.integers(1, 400))
    idx = r.integers(-1, bins + 1, n)
    X, w = 0.5 * r.normal(size=(n, 3)), r.normal(size=3)
    f = _binned_program(body, operator, width, bins, indices_from_map)
    program, kernels = _nests(f, idx, X, w)
    assert any(s.prim.name == "loop_nest" and s.prim.program.stmts[-1].prim.name == "reduce_by_index"
               for s in program.stmts), program
    _close(*_both(f, idx, X, w), 1e-9)


    def loss(idx, X, w):  # an empty bin of a max or min holds an infinity: left out
        v = f(idx, X, w)
        return fold.sum(fold.where(v * v < 1e300, v, 0.0))

    _close(*_both(fold.grad(loss, argnums=(1, 2)), idx, X, w), 1e-8)


# ---------------------------------------------------------------- a map's results kept beside its folds

def test_the_kmeans_gradient_for_points_and_centroids_is_one_nest_storing_only_the_points_gradient():
    """The gradient with respect to both arguments: the points' gradient is stored row by row while the
    centroids' is folded over the points in the same traversal (a ParallelFold storing a mapped output),
    and the one-hot cotangent's sums read only the nearest centroid. Nothing of (points, centroids, d)."""
    from fold.runtime.numba_backend import loop_nests

    C, P = rng.normal(size=(8, 5)), rng.normal(size=(300, 5))
    gradient = fold.grad(kmeans_cost, argnums=(0, 1))
    program, (_, kernel) = _nests(gradient, C, P)  # the cost (traced beside its gradient), then the gradient
    assert [p.shape for p in kernel.mapped] == [(300, 5)] and [p.shape for p in kernel.folded] == [(8, 5)]
    assert all(np.prod(b.shape) <= 8 * 5 for b in buffers(kernel.outer.step)), describe(kernel)
    # per point: the distances (8 x 5 x 7 statements), their minimum and its index (8 x 10), the gradients'
    # rows (5 x 25): 568; summing the one-hot cotangent over every centroid would add 5 x 8 x 10
    assert loop_nests.work(kernel) < 300 * 700, describe(kernel)
    _close(*_both(gradient, C, P), 1e-12)


def test_a_sum_over_a_one_hot_axis_reads_its_one_index():
    """sum(where(iota == i, row, 0)) is row[i]: the nest reads that element alone (none where i is out of
    range), rather than a loop over the row."""
    from fold.runtime.numba_backend import loop_nests

    X, i = rng.normal(size=(50, 40)), rng.integers(-2, 42, 50)
    f = lambda X, i: fold.map(lambda r, j: fold.sum(fold.where(fold.iota(40) == j, 2.0 * r, 0.0)), X, i)  # noqa: E731
    _, (kernel,) = _nests(f, X, i)
    assert loop_nests.work(kernel) < 50 * 40, describe(kernel)  # a loop over the row: 50 * 40 * 6
    _close(*_both(f, X, i), 1e-12)


def test_one_value_scattered_into_zeros_is_read_at_its_one_index():
    """A histogram adding one value into zeros (x.at[i].add(v) on zeros; a min or max gradient written as a
    scatter) is one-hot: the sum of its products with a row, and a sum over a map of its elements, read the
    one index (nothing where it is out of range), as for where(iota == i, v, 0). Its gradient too."""
    from fold.runtime.numba_backend import loop_nests

    X, C = rng.normal(size=(50, 40)), rng.normal(size=(40, 6))
    i, v = rng.integers(-2, 42, 50), rng.normal(size=50)

    def f(X, C, v, i):
        def row(r, a, j):
            h = fold.reduce_by_index(M.sum, 40, j.reshape(1), (2.0 * a).reshape(1))
            return fold.sum(h * r), fold.sum(fold.map(lambda c, e: e * fold.sin(c), C, h), axis=0)
        return fold.map(row, X, v, i)

    _, (kernel,) = _nests(f, X, C, v, i)
    # per row: 75 statements; adding up all 40 elements, 40 x 4 for the row's sum and 6 x 40 x 5 for the map's
    assert loop_nests.work(kernel) < 50 * 100, describe(kernel)
    _close(*_both(f, X, C, v, i), 1e-12)
    loss = lambda *a: fold.sum(f(*a)[0]) + fold.sum(fold.sin(f(*a)[1]))  # noqa: E731
    _close(*_both(fold.grad(loss, argnums=(0, 1, 2)), X, C, v, i), 1e-12)


def test_a_statement_between_a_map_and_its_fold_that_reads_a_kept_result_runs_after_the_nest():
    """A map whose first result the program keeps and whose second a sum folds: a statement between them
    reading the first runs after the nest; a fold that reads such a statement cannot join the nest."""
    X = rng.normal(size=(60, 7))

    def f(X):
        kept, folded = fold.map(lambda r: (fold.tanh(r), fold.reduce(M.sum, fold.sin(r))), X)
        after = kept * 2.0  # reads the kept result
        return after, fold.reduce(M.sum, folded)

    def g(X):
        kept, folded = fold.map(lambda r: (fold.tanh(r), fold.reduce(M.sum, fold.sin(r))), X)
        scale = fold.sum(kept)  # read by the fold's operator: computed after the map, so no nest folds
        return fold.reduce(lambda a, b: fold.maximum(a, b) + 0.0 * scale, folded, identity=-np.inf)

    program, (kernel,) = _nests(f, X)
    assert [s.prim.name for s in program.stmts] == ["loop_nest", "mul"], program
    assert [p.shape for p in kernel.mapped] == [(60, 7)] and [p.shape for p in kernel.folded] == [()]
    _close(*_both(f, X), 1e-12)
    _close(*_both(g, X), 1e-12)


def test_a_map_of_scalars_with_a_kept_result_stays_apart_from_its_fold():
    """A map of scalars whose one result is returned and the other summed: storing the summed one costs no
    more than the kept one, and the elementwise kernel runs exp faster than a nest's lanes: no nest."""
    x = rng.normal(size=5000)

    def f(x):
        kept, summed = fold.map(lambda v: (fold.exp(v), -fold.exp(v) * v), x)
        return kept, fold.reduce(M.sum, summed)

    program, kernels = _nests(f, x)
    assert kernels == [], program
    _close(*_both(f, x), 1e-12)


# ---------------------------------------------------------------- a transcendental read again is stored first


def _exp_depths(kernel) -> list[int]:
    """How many loops inside the outer iteration each statement calling exp stands in."""
    from fold.runtime.loops.nest import Assign, If, Loop

    def walk(nodes, depth):
        for n in nodes:
            if isinstance(n, (Loop, If)):
                yield from walk(n.body, depth + isinstance(n, Loop))
            elif isinstance(n, Assign) and "math.exp(" in n.expr:
                yield depth

    return list(walk(kernel.outer.body if hasattr(kernel.outer, "body") else kernel.outer.step, 0))


def test_a_mixtures_gradient_computes_each_components_weight_once_per_point():
    """The GMM's gradient for every argument reads each component's softmax weight exp(b_k - lse) for every
    coordinate of three results (the points', the means' and the log-weights' gradients). The weight is a
    map of a transcendental read by a map whose rows are vectors: it is stored, one loop over the components,
    rather than computed again inside each loop over (component, coordinate)."""
    Mu, X, logw = rng.normal(size=(6, 5)), rng.normal(size=(200, 5)), np.log(np.full(6, 1 / 6))
    gradient = fold.grad(gmm_objective, argnums=(0, 1, 2))
    _, kernels = _nests(gradient, Mu, X, logw)
    kernel = kernels[-1]
    depths = _exp_depths(kernel)
    assert depths and max(depths) == 1, describe(kernel)
    _close(*_both(gradient, Mu, X, logw), 1e-10)


def test_a_captured_array_of_transcendentals_is_stored_before_the_map_reads_it_for_every_row():
    """exp(x) per point, captured by a map over the components: every component's row would compute it
    again; it is stored once per point."""
    def f(C, X):
        return fold.reduce(M.sum, fold.map(lambda x: (lambda e: fold.reduce(M.max, fold.map(
            lambda c: fold.reduce(M.sum, c * e), C)))(fold.exp(x)), X))

    C, X = rng.normal(size=(9, 4)), rng.normal(size=(100, 4))
    _, (kernel,) = _nests(f, C, X)
    depths = _exp_depths(kernel)
    assert depths and max(depths) == 1, describe(kernel)
    _close(*_both(f, C, X), 1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_folds_partial_states_take_no_more_memory_than_its_inputs_and_outputs(dtype, monkeypatch):
    """The gradient of the minimum pairwise distance for both point sets folds B's gradient (3000 x 3, carried
    in float64) over A's points: each chunk keeps a partial state of that size until the merge. Eight chunks
    (two threads' worth) would hold more than the arguments and results together; the nest takes as many as
    fit within them (float64), but never fewer than one per thread (float32, where not even two fit)."""
    import numba
    from fold.runtime.numba_backend import loop_nests

    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    A, B = rng.normal(size=(400, 3)).astype(dtype), rng.normal(size=(3000, 3)).astype(dtype)
    gradient = fold.grad(min_pairwise_distance, argnums=(0, 1))
    _, kernels = _nests(gradient, A, B)
    kernel = next(k for k in kernels if getattr(k.outer, "states", ()))
    state_bytes = sum(np.prod(s.shape) * np.dtype(s.dtype).itemsize for s in kernel.outer.states)
    io_bytes = sum(np.prod(p.shape) * np.dtype(p.dtype).itemsize for p in (*kernel.inputs, *kernel.outputs))
    chunks: list[int] = []
    compiled = loop_nests.compiled_kernel

    def recording(prim, parallel=True):
        fn = compiled(prim, parallel)
        if kernel_of(prim) == kernel:
            return lambda *args: (chunks.append(args[-1]), fn(*args))[1]
        return fn

    monkeypatch.setattr(loop_nests, "compiled_kernel", recording)
    got = fold.jit(gradient, backend="numba")(A, B)
    if dtype == np.float64:
        assert chunks and 2 <= chunks[0] and chunks[0] * state_bytes <= io_bytes, (chunks, state_bytes, io_bytes)
    else:
        assert 2 * state_bytes > io_bytes and chunks == [2], (chunks, state_bytes, io_bytes)
    _close(got, fold.jit(gradient, backend="numpy")(A, B), 1e-10 if dtype == np.float64 else 1e-4)


@lanes_only
@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-6)])
def test_a_long_rows_sum_and_maximum_fold_in_lanes_without_a_transcendental(dtype, rtol):
    """A row's dot product and its maximum (40 elements): no statement has a vector call, but each fold's
    add or maximum waits for the previous one in a single accumulator. Split into a copy per lane, merged
    after; a row of 8 elements stays one chain. (A row of 64 or more has its maximum vectorised by LLVM.)"""
    from fold.runtime.numba_backend import nest_lanes

    def f(X, w):
        return fold.map(lambda x: fold.sum(x * w) + fold.reduce(M.max, x), X)

    for d, split in ((40, True), (8, False)):
        X, w = rng.normal(size=(30, d)).astype(dtype), rng.normal(size=d).astype(dtype)
        text = _sources(f, X, w)
        lanes = nest_lanes.WIDTH - 1
        found = (re.search(rf"s\d+__{lanes} = ", text), re.search(rf"_maximum\(acc\d+__{lanes}, ", text))
        assert all(found) == split and any(found) == split, text
        _close(*_both(f, X, w), rtol)


def _kernel_lines(text: str) -> str:
    """The kernels' text without their imports."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("from "))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_rows_minimum_and_its_first_index_are_one_fold_of_pairs(dtype):
    """k-means' gradient per point: the minimum of its distances and the first index holding it (ad writes
    the second as min(where(d == m, iota, n))) are one fold of (value, first index) pairs, split into lanes
    (extreme_pairs.py), not a second pass over the row. Ties give the numpy backend's gradient (the first of
    the tied centroids takes the cotangent); a point whose distances are all +inf gives its cotangent to the
    first centroid, as the numpy backend does; a NaN distance makes the cost NaN and gives no cotangent."""
    def cost(C, P):
        return fold.sum(fold.map(lambda p: fold.reduce(M.min, fold.map(lambda c: fold.sum((p - c) * (p - c)), C)), P))

    grad = fold.grad(cost, argnums=(0, 1))
    C, P = rng.normal(size=(64, 3)).astype(dtype), rng.normal(size=(50, 3)).astype(dtype)
    C[5] = C[9]
    P[13] = C[5]
    text = _sources(grad, C, P)
    assert re.search(r"(acc\d+)__0 = \(e\d+__0 if (t\d+)__0 else \1__0\)\n(?: +\1__\d = .*\n)+"
                     r" +(acc\d+)__0 = \(np\.int64\(i\d+__0\) if \2__0 else \3__0\)", text), text
    assert not re.search(r"np\.int64\(_(vector_)?minimum\(acc\w+, t\d+", text), text  # no second fold of indices
    tolerance = 1e-12 if dtype == np.float64 else 1e-5
    _close(*_both(grad, C, P), tolerance)
    P[3, 0] = np.inf  # every distance of point 3 is +inf: the minimum is the identity, at centroid 0
    got, want = (np.array(g) for g in _both(fold.grad(cost, argnums=1), C, P))
    # (its own inf coordinate: inf - inf in the numpy backend's dense rows, NaN; the nest's, inf)
    got[3, 0] = want[3, 0] = 0.0
    _close(got, want, tolerance)
    got_c, want_c = (np.array(g) for g in _both(fold.grad(cost, argnums=0), C, P))
    assert np.isneginf(got_c[0, 0]) and np.isneginf(want_c[0, 0])  # point 3's cotangent went to centroid 0
    P[3, 0] = 0.0
    C[2, 0] = np.inf
    _close(*_both(cost, C, P), tolerance)
    P[7, 1] = np.nan
    value, reference = _both(cost, C, P)
    assert np.isnan(value) and np.isnan(reference)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_long_rows_first_index_is_folded_in_int32(dtype):
    """Past MAX_PAIRED the minimum and its first index are two folds; the second's elements are indices and
    the row's length, so it folds in int32 (twice the lanes of int64) and widens once. Ties give the numpy
    backend's gradient (the first tied centroid), and a row of +inf distances its first centroid."""
    from fold.runtime.loops.extreme_pairs import MAX_PAIRED

    def cost(C, P):
        return fold.sum(fold.map(lambda p: fold.reduce(M.min, fold.map(lambda c: fold.sum((p - c) * (p - c)), C)), P))

    C, P = rng.normal(size=(2 * MAX_PAIRED + 3, 3)).astype(dtype), rng.normal(size=(40, 3)).astype(dtype)
    C[200] = C[201] = C[7] + 1.0
    P[13] = C[200]
    grad = fold.grad(cost, argnums=(0, 1))
    text = _sources(grad, C, P)
    assert re.search(rf"(acc\d+) = np\.int32\({C.shape[0]}\)", text), text
    assert re.search(r"np\.int32\(_(vector_)?minimum\(acc\w+, t\d+\)\)", text), text
    assert not re.search(r"np\.int64\(_(vector_)?minimum\(acc\w+, t\d+", text), text  # no int64 fold of indices
    tolerance = 1e-12 if dtype == np.float64 else 1e-5
    _close(*_both(grad, C, P), tolerance)
    P[3, 0] = np.inf
    got_c, want_c = (np.array(g) for g in _both(fold.grad(cost, argnums=0), C, P))
    assert np.isneginf(got_c[0, 0]) and np.isneginf(want_c[0, 0])  # point 3's cotangent went to centroid 0
    P[3, 0] = 0.0
    P[7, 1] = np.nan
    value, reference = _both(cost, C, P)
    assert np.isnan(value) and np.isnan(reference)


def test_a_maximum_loop_llvm_cannot_vectorise_stays_in_lanes():
    """A loop that calls a function (exp) is not left to LLVM's vectoriser, which would not vectorise it:
    its maximum is split into a copy per lane (nest_lanes), in the select form."""
    from fold.runtime.numba_backend import nest_lanes

    def exp_max(X):
        return fold.map(lambda x: fold.reduce(M.max, fold.exp(x)), X)

    X = rng.normal(size=(30, 80))
    text = _kernel_lines(_sources(exp_max, X))
    assert "_vector_maximum" not in text and "_unseen" not in text, text
    assert re.search(rf"_maximum\(\w+__{nest_lanes.WIDTH - 1}, ", text), text
    _close(*_both(exp_max, X), 1e-12)


# ---------------------------------------------------------------- reshapes inside a nest

def _reshaped_rows(X, w):
    def row(r):
        column = fold.reshape(r, (6, 1)) * fold.reshape(w, (6, 1))      # unit axes added
        grid = fold.reshape(fold.reshape(r, (2, 3)), (3, 2))             # general reshapes
        back = fold.reshape(fold.reshape(column, (1, 6)), (6,))           # and dropped
        return fold.sum(column) + fold.reduce(M.max, fold.sum(grid, axis=1)) * fold.sum(back * back)
    return fold.reduce(M.sum, fold.map(row, X))


def test_a_reshape_that_adds_or_drops_unit_axes_reads_its_input_at_the_same_indices():
    X, w = rng.normal(size=(50, 6)), rng.normal(size=6)
    source = _sources(_reshaped_rows, X, w)
    # the general reshape divides its flat position by 3 for its first axis (no remainder needed) and takes
    # it modulo 3 for its second; nothing is multiplied, divided or taken modulo by 1 (the unit axes)
    assert "// 3" in source and "% 3" in source, source
    assert not re.search(r"(\*|//|%) 1\b", source), source
    _close(*_both(_reshaped_rows, X, w), 1e-12)
    _close(*_both(fold.grad(_reshaped_rows, argnums=(0, 1)), X, w), 1e-12)


def _rbf_sum(X, Y):
    return fold.sum(fold.map(lambda x: fold.sum(fold.map(lambda y: fold.exp(-0.5 * fold.sum((x - y) * (x - y))), Y)), X))


def test_a_rows_array_read_by_its_loop_and_by_its_result_is_made_again_not_stored():
    """The RBF sum's gradient for X: per point x and centre y, the row 2 t (x - y), where x - y also feeds
    the sum t is computed from. The centre's scalar t is stored; x - y is cheap and made again where the
    row is summed, so no (centres, d) array is written per point."""
    X, Y = rng.normal(size=(30, 4)), rng.normal(size=(25, 4))
    grad = fold.grad(_rbf_sum)
    _, kernels = _nests(grad, X, Y)
    shapes = [b.shape for k in kernels for b in buffers(getattr(k.outer, "body", None) or k.outer.step)]
    assert (25, 4) not in shapes and (25,) in shapes, shapes
    diff = X[:, None, :] - Y[None, :, :]
    t = np.exp(-0.5 * (diff * diff).sum(axis=2))
    np.testing.assert_allclose(fold.jit(grad)(X, Y), -(t[:, :, None] * diff).sum(axis=1), rtol=1e-10, atol=1e-12)


def _windows(x, w, offset=0):
    k = w.shape[0]
    return fold.map(lambda j: fold.sum(x[j + offset + fold.iota(k)] * w), fold.iota(x.shape[0] - k + 1))


@pytest.mark.parametrize("offset", [0, -3])
def test_a_gather_at_indices_known_in_range_is_a_read_of_the_nest(offset):
    # j + offset + t lies in [offset, n - 1 + offset]: in range, or counting from the end where negative
    x, w = rng.normal(size=400), rng.normal(size=5)
    program, kernels = _nests(lambda x, w: _windows(x, w, offset), x, w)
    assert [s.prim.name for s in program.stmts] == ["loop_nest"], program
    (kernel,) = kernels
    assert [p.dtype.kind for p in kernel.inputs] == ["f", "f"], describe(kernel)  # the windows' starts are its index
    got, want = _both(lambda x, w: _windows(x, w, offset), x, w)
    _close(got, want, 1e-12)
    assert np.isclose(got[0], x[offset: offset + 5] @ w if offset >= 0 else np.r_[x[offset:], x[:offset + 5]] @ w)


def test_a_gather_at_indices_read_from_the_input_is_checked_before_the_nest_runs():
    """Tokens index an embedding's rows: the nest reads E[t] unchecked and records the tokens' range on the
    kernel (Kernel.checked); a token out of range makes the backend run the statements, which raise."""
    E, v = rng.normal(size=(20, 4)), rng.normal(size=4)

    def scores(E, v, tokens):
        return fold.map(lambda t: fold.sum(E[t] * v), tokens)

    tokens = rng.integers(0, 20, 50)
    program, kernels = _nests(scores, E, v, tokens)
    (kernel,) = kernels
    (token_input,) = [p.name for p in kernel.inputs if p.shape == (50,)]
    assert kernel.checked == ((token_input, -20, 19),), program
    got, want = _both(scores, E, v, tokens)
    _close(got, want, 1e-12)
    with pytest.raises(fold.FoldError, match="20"):
        fold.jit(scores, backend="numba")(E, v, np.r_[tokens, 20])


def test_a_histogram_of_each_rows_indices_bins_them_as_the_map_makes_them():
    # a convolution's gradient: each window's cotangents scattered at its indices (fold/scatter_sums.py)
    x, w = rng.normal(size=3000), rng.normal(size=6)

    def loss(x, w):
        return fold.sum(fold.tanh(_windows(x, w)))

    from fold.cse import cse
    from fold.dce import dce

    program = prepare(dce(cse(fold.trace(fold.grad(loss), x, w))), whole_arrays=True)  # as fold.jit prepares it
    rows = x.shape[0] - w.shape[0] + 1
    assert not [s for s in program.stmts for o in s.outs if o.aval.shape[:1] == (rows,) and o.aval.ndim == 2], program
    assert any(isinstance(s.prim, fold.primitives.ReduceByIndex)
               for s in program.stmts if isinstance(s.prim, LoopNest) for s in s.prim.program.stmts), program
    got, want = _both(fold.grad(loss), x, w)
    _close(got, want, 1e-12)


def test_a_map_of_maps_over_rows_of_arrays_that_folds_nothing_writes_its_rows_in_one_nest():
    # the gradient of a bilinear form per batch element: an outer product per matrix, no fold anywhere
    As, xs = rng.normal(size=(200, 5, 5)), rng.normal(size=(200, 5))

    def forms(As, xs):
        return fold.sum(fold.map(lambda A, x: fold.sum(x * fold.map(lambda a: fold.sum(a * x), A)), As, xs))

    program, kernels = _nests(fold.grad(forms), As, xs)
    assert not [s for s in program.stmts if s.prim.name == "map"], program
    assert next(s for s in program.stmts if program.outputs[0] in s.outs).prim.name == "loop_nest", program
    got, want = _both(fold.grad(forms), As, xs)
    _close(got, want, 1e-12)
    np.testing.assert_allclose(got, xs[:, :, None] * xs[:, None, :], rtol=1e-12)


def test_a_gather_at_a_remainder_by_the_length_is_a_read_of_the_nest():
    # a periodic stencil: (j + 1) % n and (j - 1) % n lie in [0, n - 1] (NumPy's remainder has the divisor's sign)
    X = rng.normal(size=(30, 20))

    def laplacian(X):
        n, m = X.shape
        return fold.map(lambda i: fold.map(lambda j: X[(i + 1) % n][j] + X[(i - 1) % n][j] + X[i][(j + 1) % m]
                                           + X[i][(j - 1) % m] - 4.0 * X[i][j], fold.iota(m)), fold.iota(n))

    program, kernels = _nests(laplacian, X)
    assert [s.prim.name for s in program.stmts] == ["loop_nest"], program
    want = np.roll(X, -1, 0) + np.roll(X, 1, 0) + np.roll(X, -1, 1) + np.roll(X, 1, 1) - 4.0 * X
    np.testing.assert_allclose(fold.jit(laplacian, backend="numba")(X), want, rtol=1e-12)


def test_a_concatenation_in_a_body_is_written_into_one_buffer_of_the_row():
    X, w = rng.normal(size=(300, 7)), rng.normal(size=14)

    def f(X, w):
        return fold.map(lambda r: fold.sum(fold.concatenate([fold.tanh(r), r * 2.0]) * w), X)

    program, kernels = _nests(f, X, w)
    assert [s.prim.name for s in program.stmts] == ["loop_nest"], program
    # a row's sum can cancel to ~1e-4 (which row depends on the rng's state, shared by the file's tests)
    np.testing.assert_allclose(fold.jit(f, backend="numba")(X, w), np.c_[np.tanh(X), 2.0 * X] @ w, rtol=1e-12,
                               atol=1e-13)


def test_a_stencils_gradient_bins_every_neighbours_entry_as_its_rows_are_made():
    # scatter_sums' entries of both maps, concatenated per row, binned in the nest; inner bins found by a
    # clamped quotient (bounds at both ends from a maximum and a minimum)
    from fold.cse import cse
    from fold.dce import dce

    X = rng.normal(size=(40, 30))
    energy = periodic_stencil_energy
    program = prepare(dce(cse(fold.trace(fold.grad(energy), X))), whole_arrays=True)
    assert not [s for s in program.stmts if s.prim.name in ("map", "reduce_by_index")], program
    histograms = [s for s in program.stmts if isinstance(s.prim, LoopNest)
                  and any(isinstance(t.prim, fold.primitives.ReduceByIndex) for t in s.prim.program.stmts)]
    assert len(histograms) == 1, program
    got, want = _both(fold.grad(energy), X)
    _close(got, want, 1e-12)


def test_a_gather_at_a_quotient_by_a_positive_literal_is_a_read_of_the_nest():
    x = rng.normal(size=50)

    def halves(x):  # (j + t) // 2 for j < 50, t < 4 lies in [0, 26]
        return fold.map(lambda j: fold.sum(x[(j + fold.iota(4)) // 2]), fold.iota(x.shape[0]))

    program, kernels = _nests(halves, x)
    assert [s.prim.name for s in program.stmts] == ["loop_nest"], program
    want = [sum(x[(j + t) // 2] for t in range(4)) for j in range(50)]
    np.testing.assert_allclose(fold.jit(halves, backend="numba")(x), want, rtol=1e-12)


def test_the_matrix_form_kmeans_gradient_past_the_float64_limit_stays_with_the_product_kernel():
    # after the one-hot rewrite its body gathers the nearest centroid's row beside C @ p: binned, it could be a
    # nest, which writes the product as scalar loops (the product kernel folds it in registers, faster for a
    # float64 matrix past MAX_NEST_PRODUCT_BYTES_FLOAT64)
    from fold.cse import cse
    from fold.dce import dce
    from fold.runtime.numba_backend.passes import MAX_NEST_PRODUCT_BYTES_FLOAT64

    C, P = rng.normal(size=(MAX_NEST_PRODUCT_BYTES_FLOAT64 // 40 + 1, 5)), rng.normal(size=(400, 5))

    def cost(C, P):
        cc = fold.map(lambda c: fold.sum(c * c), C)
        return fold.reduce(M.sum, fold.map(lambda p: fold.reduce(M.min, fold.sum(p * p) - 2.0 * (C @ p) + cc), P))

    program = prepare(dce(cse(fold.trace(fold.grad(cost, argnums=(0, 1)), C, P))), whole_arrays=True)

    def products(p):
        return any(isinstance(s.prim, fold.primitives.MatMul) or any(products(b) for b in s.prim.bodies())
                   for s in p.stmts)

    assert not [s for s in program.stmts if isinstance(s.prim, LoopNest) and products(s.prim.program)], program
    got, want = _both(fold.grad(cost, argnums=(0, 1)), C, P)
    _close(got, want, 1e-10)
