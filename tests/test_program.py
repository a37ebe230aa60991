"""Programs: the verifier, the printed form, the trace cache, jit, and the memory estimate."""

from __future__ import annotations

import textwrap
import tracemalloc

import numpy as np
import pytest
from helpers import assert_close, checked_program, run_checked

import fold
import fold.runtime.numpy_impl.folds as folds_impl
from fold.dtypes import ShapedArray
from fold.ir import Let, Lit, Program, Var
from fold.primitives import Elementwise, Map

F64 = ShapedArray((3,), np.dtype("float64"))

# ------------------------------------------------------------------------------------------- verifier


def _add(out: Var, a, b) -> Let:
    return Let((out,), Elementwise("add"), (a, b))


def test_check_program_accepts_a_well_formed_program() -> None:
    x, y = Var(F64), Var(F64)
    fold.check_program(Program(inputs=(x,), stmts=(_add(y, x, x),), outputs=(y,)))


def test_check_program_rejects_an_unbound_variable() -> None:
    x, y, stray = Var(F64), Var(F64), Var(F64)
    with pytest.raises(fold.ProgramError, match="unbound"):
        fold.check_program(Program(inputs=(x,), stmts=(_add(y, x, stray),), outputs=(y,)))
    with pytest.raises(fold.ProgramError, match="output .* unbound"):
        fold.check_program(Program(inputs=(x,), stmts=(), outputs=(stray,)))


def test_check_program_rejects_a_variable_bound_twice() -> None:
    x, y = Var(F64), Var(F64)
    with pytest.raises(fold.ProgramError, match="bound twice"):
        fold.check_program(Program(inputs=(x,), stmts=(_add(y, x, x), _add(y, x, x)), outputs=(y,)))
    with pytest.raises(fold.ProgramError, match="bound twice"):
        fold.check_program(Program(inputs=(x,), stmts=(_add(x, x, x),), outputs=(x,)))


def test_check_program_rejects_a_statement_that_disagrees_with_its_shape_rule() -> None:
    x, y = Var(F64), Var(ShapedArray((4,), np.dtype("float64")))
    with pytest.raises(fold.ProgramError, match="shape rule"):
        fold.check_program(Program(inputs=(x,), stmts=(_add(y, x, x),), outputs=(y,)))
    z = Var(F64)
    bad_args = Let((z,), Elementwise("add"), (x, Lit(np.ones(4))))
    with pytest.raises(fold.ProgramError, match="fails its shape rule"):
        fold.check_program(Program(inputs=(x,), stmts=(bad_args,), outputs=(z,)))


def test_check_program_rejects_a_body_that_is_not_closed() -> None:
    # a map body that uses the outer variable `w` directly instead of receiving it as a const
    xs, w = Var(ShapedArray((2, 3), np.dtype("float64"))), Var(F64)
    elem, r = Var(F64), Var(F64)
    body = Program(inputs=(elem,), stmts=(_add(r, elem, w),), outputs=(r,))
    out = Var(ShapedArray((2, 3), np.dtype("float64")))
    program = Program(inputs=(xs, w), stmts=(Let((out,), Map(body, 0), (xs,)),), outputs=(out,))
    with pytest.raises(fold.ProgramError, match="body.*unbound"):
        fold.check_program(program)


# -------------------------------------------------------------------------------------- printed form


def rowdots(x, w):
    return fold.map(lambda r: fold.reduce(fold.monoids.sum, r * w), x)


def prefix_affine(a, b):
    return fold.scan(lambda p, q: (p[0] * q[0], q[0] * p[1] + q[1]), (a, b), identity=(1.0, 0.0), exclusive=True)[1]


def histogram_min(i, v):
    return fold.reduce_by_index(fold.monoids.min, 3, i, fold.exp(v[1:]))


def halving_loop(x):
    return fold.loop(lambda i, s: s * 0.5 + x, x, 3)


PINNED = [
    (rowdots, (np.ones((4, 3)), np.ones(3)), """
        in a: f64[4,3], b: f64[3]
        let c: f64[4] = map a [captures b]
            \\ d: f64[3] | e: f64[3] ->
              let f: f64[3] = e * d
              let g: f64[] = reduce[sum] (0.0) f
                  \\ h: f64[], i: f64[] ->
                    let j: f64[] = h + i
                    in j
              in g
        out c
    """),
    (prefix_affine, (np.ones(5, np.float32), np.ones(5, np.float32)), """
        in a: f32[5], b: f32[5]
        let c: f32[5], d: f32[5] = scan (exclusive) (1.0, 0.0) a b
            \\ e: f32[], f: f32[], g: f32[], h: f32[] ->
              let i: f32[] = e * g
              let j: f32[] = g * f
              let k: f32[] = j + h
              in i, k
        out d
    """),
    (histogram_min, (np.zeros(4, np.int64), np.ones(5)), """
        in a: i64[4], b: f64[5]
        let c: f64[4] = index[index=((1, 5, 1),)] b
        let d: f64[4] = exp c
        let e: f64[3] = reduce_by_index[min][n=3] (inf) a d
            \\ f: f64[], g: f64[] ->
              let h: f64[] = minimum f g
              in h
        out e
    """),
    (halving_loop, (np.ones(2, np.float32),), """
        in a: f32[2]
        let b: f32[2] = loop[n=3] a [captures a]
            \\ c: f32[2] | d: i64[], e: f32[2] ->
              let f: f32[2] = e * 0.5
              let g: f32[2] = f + c
              in g
        out b
    """),
]


@pytest.mark.parametrize("f, args, expected", PINNED, ids=[p[0].__name__ for p in PINNED])
def test_printed_form_is_pinned(f, args, expected: str) -> None:
    program = checked_program(f, *args)
    assert str(program) == textwrap.dedent(expected).strip()


def test_pinned_programs_compute_what_they_print() -> None:
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(4, 3)), rng.normal(size=3)
    assert_close(run_checked(rowdots, x, w), x @ w)
    a, b = rng.uniform(0.5, 1, 5).astype(np.float32), rng.normal(size=5).astype(np.float32)
    expected, acc = [], 0.0
    for at, bt in zip(a, b):
        expected.append(acc)
        acc = at * acc + bt
    assert_close(run_checked(prefix_affine, a, b), np.array(expected, dtype=np.float32), dtype="float32")
    idx, v = np.array([2, 0, 2, 7]), rng.normal(size=5)
    expected = np.full(3, np.inf)
    np.minimum.at(expected, idx[:3], np.exp(v[1:4]))
    assert_close(run_checked(histogram_min, idx, v), expected)
    x = np.array([1.0, -2.0], dtype=np.float32)
    s = x
    for _ in range(3):
        s = s * 0.5 + x
    assert_close(run_checked(halving_loop, x), s, dtype="float32")


# --------------------------------------------------------------------------------------- trace cache


def test_trace_cache_same_signature_same_program() -> None:
    def f(x, y):
        return fold.exp(x) + y["b"]

    p1 = fold.trace(f, np.ones(3), {"b": 1.0})
    p2 = fold.trace(f, np.zeros(3), {"b": 2.0})
    assert p1 is p2
    assert fold.trace(f, np.ones(4), {"b": 1.0}) is not p1  # another shape
    assert fold.trace(f, np.ones(3, np.float32), {"b": 1.0}) is not p1  # another dtype
    assert fold.trace(f, np.ones(3), {"b": np.ones(3)}) is not p1  # another leaf shape
    assert fold.trace(f, np.ones(3), {"b": 1.0, "c": 0.0}) is not p1  # another structure
    assert fold.trace(f, np.ones(4), {"b": 1.0}) is fold.trace(f, np.ones(4), {"b": 3.0})


def test_trace_runs_the_python_function_once_per_signature() -> None:
    calls = []

    def f(x):
        calls.append(x.shape)
        return x * 2.0

    for _ in range(3):
        fold.trace(f, np.ones(3))
    fold.trace(f, np.ones(5))
    assert calls == [(3,), (5,)]


def test_jit_traces_once_per_signature_and_counts_it() -> None:
    g = fold.jit(lambda x: fold.reduce(fold.monoids.sum, x * x))
    assert g.trace_count == 0
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.normal(size=4)
        assert_close(g(x), np.sum(x * x))
    assert g.trace_count == 1
    x5 = rng.normal(size=5)
    assert_close(g(x5), np.sum(x5 * x5))
    assert g.trace_count == 2
    x32 = rng.normal(size=4).astype(np.float32)
    assert_close(g(x32), np.sum(x32 * x32), dtype="float32")
    assert g.trace_count == 3
    assert g.compile_seconds >= 0.0
    assert g.program(np.ones(5)) is fold.trace(g.f, np.ones(5))


def test_warm_calls_on_arrays_run_what_their_signature_would() -> None:
    """Warm calls whose arguments are all arrays skip flattening: they must still tell signatures, backends,
    traces and aliased outputs apart."""
    g = fold.jit(lambda x, s: (x, x.reshape(-1), x * s))
    x, two = np.arange(6.0).reshape(2, 3), np.array(2.0)
    for x_in in (x, x.copy(), x, x.copy()):  # a view of another array, and an array owning its memory
        a, b, c = g(x_in, two)
        assert not np.shares_memory(a, x_in) and not np.shares_memory(b, x_in)
        assert_close(a, x)
        assert_close(b, x.ravel())
        assert_close(c, 2.0 * x)
    assert g.trace_count == 1
    _, _, c = g(x, 3.0)  # a Python number, not an array: the same signature
    assert_close(c, 3.0 * x)
    assert g.trace_count == 1
    a, _, _ = g(x.astype(np.int64), two)
    assert a.dtype == np.int64 and g.trace_count == 2
    with pytest.raises(fold.FoldTypeError, match="complex128"):
        g(x.astype(np.complex128), two)
    with fold.use_backend("numpy"):
        g(x, two)
    with fold.use_backend("numba"):
        g(x, two)
    assert {backend for backend, _ in g._compiled} == {"numpy", "numba"}
    inner = fold.jit(lambda v: v * 3.0)
    w = np.arange(3.0)
    inner(w)
    traced = fold.jit(lambda v: inner(v) + inner(w))  # inner on a captured array, inside a trace: inlined
    assert_close(traced(np.ones(3)), 3.0 + 3.0 * w)
    assert "const:f64[3] * 3.0" in str(traced.program(np.ones(3)))


def test_static_arguments_are_passed_as_they_are_and_key_the_trace() -> None:
    """static_argnums (as jax.jit's): sizes and flags reach f as Python values, f is traced once per distinct
    value; traced, the same values get an error that says how to pass them."""
    f = lambda x, n, reverse: fold.scan(fold.monoids.sum, x * fold.iota(n).astype(x.dtype), reverse=reverse)  # noqa: E731
    with pytest.raises(fold.FoldTypeError, match=r"fold\.iota: n must be an integer, got Tracer.*static_argnums"):
        fold.jit(f)(np.ones(3), 3, False)
    g = fold.jit(f, static_argnums=(1, -1))
    x = np.arange(1.0, 4.0)
    assert_close(g(x, 3, False), np.cumsum(x * np.arange(3)))
    assert_close(g(x, 3, True), np.cumsum((x * np.arange(3))[::-1])[::-1])
    assert_close(g(x, 3, False), np.cumsum(x * np.arange(3)))
    assert g.trace_count == 2 and g.compile_seconds > 0.0
    assert "iota" in str(g.program(x, 3, True))
    with pytest.raises(fold.FoldTypeError, match=r"static arguments must be hashable.*list"):
        g(x, [3], False)
    with pytest.raises(fold.FoldTypeError, match=r"static_argnums names argument 5, but the call has 3 arguments"):
        fold.jit(f, static_argnums=5)(x, 3, False)
    with pytest.raises(fold.FoldTypeError, match=r"static_argnums must be an int or a sequence of ints"):
        fold.jit(f, static_argnums=1.0)


def test_equal_static_values_of_other_types_trace_their_own_programs() -> None:
    """2, 2.0 and True are equal and hash alike; each gets its own program, whatever was called first."""
    x = np.array([1, 2, 3])
    g = fold.jit(lambda x, s: x * s, static_argnums=1)
    assert g(x, 2).dtype == np.int64 and g(x, 2.0).dtype == np.float64
    big = fold.jit(lambda x, s: x * s, static_argnums=1)
    big(x, 2**62)
    assert_close(big(x, float(2**62)), x * float(2**62))
    h = fold.jit(lambda x, r: fold.scan(fold.monoids.sum, x, reverse=r), static_argnums=1)
    assert_close(h(np.arange(3.0), True), np.array([3.0, 3.0, 2.0]))
    with pytest.raises(fold.FoldTypeError, match=r"reverse must be True or False, got 1"):
        h(np.arange(3.0), 1)
    t = fold.jit(lambda x, s: x * s[1], static_argnums=1)
    assert t(x, (0, 2)).dtype == np.int64 and t(x, (0, 2.0)).dtype == np.float64


def test_static_argnums_name_parameters_however_they_are_passed() -> None:
    def f(x, n, a):
        return fold.iota(n) * a + x[0]

    g = fold.jit(f, static_argnums=1)
    want = np.arange(3) * 2.0 + 1.0
    for call in (lambda: g(np.ones(3), 3, 2.0), lambda: g(np.ones(3), n=3, a=2.0), lambda: g(np.ones(3), 3, a=2.0),
                 lambda: g(x=np.ones(3), a=2.0, n=3)):
        assert_close(call(), want)
    keyword_only = fold.jit(lambda x, n, *, scale: fold.iota(n) * scale + x[0], static_argnums=-1)
    assert_close(keyword_only(np.ones(2), 3, scale=2.0), want)

    def with_scale(x, n, scale=1.0):
        return fold.loop(lambda i, s: s * scale + 1.0, x, n)

    for order in ((), (1,), (0, 1), (1, 0)):  # one Jitted, calls of 2 and 3 arguments in either order
        h, x = fold.jit(with_scale, static_argnums=1), np.arange(3.0)
        calls = [lambda: h(x, 2), lambda: h(x, 2, scale=2.0), lambda: h(x, 2, 2.0)]
        wants = [x + 2.0, 4.0 * x + 3.0, 4.0 * x + 3.0]
        for k in order + (0, 1, 2):
            assert_close(calls[k](), wants[k])

    def defaults(x, m=1, n=2):
        return x * n

    with pytest.raises(fold.FoldTypeError, match=r"static argument 2 cannot be placed: the call passes n by keyword "
                                                 r"after an omitted argument"):
        fold.jit(defaults, static_argnums=2)(np.ones(2), n=3)


def test_keyword_arguments_are_traced_like_positional_ones() -> None:
    g = fold.jit(lambda x, *, scale, shift=0.0: x * scale + shift)
    x = np.arange(3.0)
    assert_close(g(x, scale=2.0), 2.0 * x)
    assert_close(g(x, scale=np.float64(3.0)), 3.0 * x)
    assert_close(g(x, shift=1.0, scale=2.0), 2.0 * x + 1.0)
    assert g.trace_count == 2  # one per set of keyword names


def test_jit_inside_a_trace_inlines_the_program() -> None:
    inner = fold.jit(lambda v: fold.tanh(v) * 2.0)
    x = np.random.default_rng(2).normal(size=(3, 4))
    program = checked_program(lambda x: fold.map(inner, x), x)
    assert "map" in str(program) and "tanh" in str(program)
    assert_close(run_checked(lambda x: fold.map(inner, x), x), np.tanh(x) * 2.0)


# -------------------------------------------------------------------------------------------- memory


def _measured_peak(f, *args) -> int:
    """Peak bytes NumPy allocates while a jitted `f` runs (after its trace), plus the inputs the caller holds, on
    the numpy backend: the one `fold.memory` models (the numba backend's fused kernels hold less)."""
    g = fold.jit(f, backend="numpy")
    g(*args)  # trace and compile outside the measurement
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = g(*args)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    del out
    return peak + sum(np.asarray(a).nbytes for a in args)


def _elementwise(x):
    return fold.exp(x) * 2.0 + fold.tanh(x)


def _user_scan(v):
    return fold.scan(lambda a, b: fold.maximum(a, b) + 0.0, v, identity=-np.inf)


def _affine_scan(v):
    return fold.scan(lambda p, q: (p[0] * q[0], q[0] * p[1] + q[1]), (v, v), identity=(1.0, 0.0))


def _user_reduce(v):
    return fold.reduce(lambda a, b: a + b * 1.0, v, identity=0.0)


def _histogram(i, v):
    return fold.reduce_by_index(fold.monoids.sum, 100, i, v)


_RNG = np.random.default_rng(3)
MEMORY_CASES = [
    (_elementwise, (_RNG.normal(size=(1000, 1000)),)),
    (rowdots, (_RNG.normal(size=(1000, 1000)), _RNG.normal(size=1000))),
    (_user_scan, (_RNG.normal(size=1_000_000),)),
    (_affine_scan, (_RNG.normal(size=1_000_000),)),
    (_user_reduce, (_RNG.normal(size=1_000_000),)),
    (_histogram, (_RNG.integers(0, 100, size=1_000_000), _RNG.normal(size=1_000_000))),
]


@pytest.mark.parametrize("f, args", MEMORY_CASES, ids=[c[0].__name__.strip("_") for c in MEMORY_CASES])
def test_memory_estimate_within_a_factor_of_measured_peak(f, args) -> None:
    estimate = fold.memory(f, *args)
    assert fold.memory(fold.trace(f, *args)) == estimate  # a Program or a function give the same estimate
    measured = _measured_peak(f, *args)
    ratio = measured / estimate
    assert 1 / 2.5 <= ratio <= 2.5, f"{f.__name__}: estimated {estimate} bytes, measured {measured} (ratio {ratio:.2f})"


def test_memory_estimate_generic_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(folds_impl, "USE_UFUNC_FAST_PATHS", False)
    v = _RNG.normal(size=1_000_000)
    f = lambda v: fold.scan(fold.monoids.sum, v)  # noqa: E731
    estimate, measured = fold.memory(f, v), _measured_peak(f, v)
    assert 1 / 2.5 <= measured / estimate <= 2.5, (estimate, measured)


def test_memory_estimate_grows_with_the_input() -> None:
    small = fold.memory(_elementwise, np.ones(1000))
    large = fold.memory(_elementwise, np.ones(100_000))
    assert large == 100 * small
    assert small >= 1000 * 8 * 2  # at least the input and the output
