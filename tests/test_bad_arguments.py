"""Mistakes that used to pass silently or leak a raw Python error: each now gets a fold error naming the
value at fault, and the correct spellings next to them keep working (checked against NumPy)."""

from __future__ import annotations

import re

import warnings

import numpy as np
import pytest

import fold

X = np.array([2.0, 3.0, 5.0])


# ------------------------------------------------------------------ identities that do not fit the elements


@pytest.mark.parametrize("identity, dtype, shown", [
    (0.9, np.int64, "0.9"), (1e20, np.int32, "1e+20"), (np.nan, np.int64, "nan"), (-1, np.bool_, "-1"),
    (0.5, np.bool_, "0.5"), (2, np.bool_, "2"), (1e300, np.float32, "1e+300"), (2**40, np.int32, str(2**40)),
])
def test_an_identity_the_cast_would_change_is_an_error(identity, dtype, shown) -> None:
    xs = np.array([1, 0], dtype=dtype)
    with pytest.raises(fold.FoldTypeError, match=rf"identity leaf .* = {re.escape(shown)} does not fit the element dtype {np.dtype(dtype).name}"):
        fold.reduce(lambda a, b: a + b, xs, identity=identity)


@pytest.mark.parametrize("identity, dtype", [(0, np.int64), (0.0, np.int32), (False, np.int64), (np.float64(-0.0), np.float32),
                                             (np.int32(0), np.float64)])
def test_an_identity_that_fits_is_accepted(identity, dtype) -> None:
    xs = np.array([3, 1], dtype=dtype)
    got = fold.reduce(lambda a, b: (a + b) * 1, xs, identity=identity)  # not recognised: the identity is used
    assert got == 4 and got.dtype == np.dtype(dtype)
    assert fold.reduce(lambda a, b: (a + b) * 1, xs[:0], identity=identity) == 0


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
def test_infinite_identities_of_min_and_max_still_mean_the_extreme_values(dtype) -> None:
    xs = np.array([1, 0, 1], dtype=dtype)
    assert fold.reduce(fold.monoids.max, xs) == xs.max() and fold.reduce(fold.monoids.min, xs) == xs.min()
    empty = np.zeros(0, dtype)
    want_max = False if dtype is np.bool_ else np.iinfo(dtype).min
    assert fold.reduce(fold.monoids.max, empty) == want_max


# ------------------------------------------------------------------ a monoid's d must return element-like cotangents


def _summing(d, name: str) -> fold.Monoid:
    """A sum written so that it is not recognised as +: the "auto" rule then uses its d too."""
    return fold.Monoid(lambda a, b: (a + b) * 1.0, 0.0, commutative=True, d=d, name=name)


BAD_D = {
    "shape": (lambda c, a, g: fold.broadcast_to(g, (2,)), "element is f64\\[\\], d gave f64\\[.*2\\]"),
    "int dtype": (lambda c, a, g: fold.convert(g, np.int64), "element is f64\\[\\], d gave i64"),
    "float32": (lambda c, a, g: fold.convert(g, np.float32), "element is f64\\[\\], d gave f32"),
    "structure": (lambda c, a, g: (g, g), "d returned structure"),
}


@pytest.mark.parametrize("kind", sorted(BAD_D))
@pytest.mark.parametrize("rule", ["monoid", "auto"])
def test_a_reduce_whose_d_returns_the_wrong_cotangent_is_an_error(kind, rule) -> None:
    d, message = BAD_D[kind]
    m = _summing(d, f"bad_d_{kind.replace(' ', '_')}")
    with pytest.raises(fold.StructureError, match=f"monoid {m.name}: .*{message}"):
        fold.grad(lambda x: fold.reduce(m, x), reduce_rule=rule)(X)


@pytest.mark.parametrize("kind", sorted(BAD_D))
def test_a_reduce_by_index_whose_d_returns_the_wrong_cotangent_is_an_error(kind) -> None:
    d, message = BAD_D[kind]
    m = _summing(d, "bad_bins")
    with pytest.raises(fold.StructureError, match=f"monoid bad_bins: .*{message}"):
        fold.grad(lambda x: fold.reduce(fold.monoids.sum, fold.reduce_by_index(m, 2, np.array([0, 1, 1]), x)),
                  reduce_rule="monoid")(X)


@pytest.mark.parametrize("kind", ["shape", "int dtype"])
def test_a_gemm_map_reduce_whose_d_returns_the_wrong_cotangent_is_an_error(kind) -> None:
    d, message = BAD_D[kind]
    m = _summing(d, "bad_gemm")
    lhs, rhs = np.ones((3, 2)), np.ones((4, 2))
    with pytest.raises(fold.StructureError, match=f"monoid bad_gemm: .*{message}"):
        fold.grad(lambda a: fold.reduce(fold.monoids.sum, fold.gemm_map_reduce(m, lambda s: s, a, rhs)))(lhs)


def test_a_correct_d_still_gives_the_sum_gradient() -> None:
    m = _summing(lambda c, a, g: g, "good_sum")
    got = fold.grad(lambda x: fold.reduce(m, x * x), reduce_rule="monoid")(X)
    np.testing.assert_allclose(got, 2 * X)


# ------------------------------------------------------------------ static parameters of the combinators


@pytest.mark.parametrize("flag", ["exclusive", "reverse"])
@pytest.mark.parametrize("value", ["False", 0, 1, None])
def test_scan_flags_must_be_booleans(flag, value) -> None:
    with pytest.raises(fold.FoldTypeError, match=f"fold.scan: {flag} must be True or False, got {value!r}"):
        fold.scan(fold.monoids.sum, X, **{flag: value})


def test_scan_flags_accept_numpy_booleans() -> None:
    np.testing.assert_allclose(fold.scan(fold.monoids.sum, X, exclusive=np.bool_(True), reverse=True), [8.0, 5.0, 0.0])


@pytest.mark.parametrize("n", [True, 2.0, -1, "2"])
def test_reduce_by_index_n_must_be_a_non_negative_int(n) -> None:
    with pytest.raises(fold.FoldTypeError, match=f"fold.reduce_by_index: n must be a non-negative int, got {n!r}"):
        fold.reduce_by_index(fold.monoids.sum, n, np.array([0, 1, 1]), X)


def test_reduce_by_index_indices_given_as_a_list_is_one_clear_error() -> None:
    with pytest.raises(fold.FoldTypeError, match=r"indices must be one 1-d integer array, got a structure of 3 leaves"):
        fold.reduce_by_index(fold.monoids.sum, 2, [0, 1, 1], X)
    np.testing.assert_allclose(fold.reduce_by_index(fold.monoids.sum, np.int64(2), np.array([0, 1, 1]), X), [2.0, 8.0])


@pytest.mark.parametrize("kwargs, message", [
    ({"n": True}, "n must be a non-negative int, got True"), ({"n": 3.0}, "n must be a non-negative int, got 3.0"),
    ({"n": 3, "checkpoint": True}, "checkpoint must be a positive int or None, got True"),
    ({"n": 3, "checkpoint": 0}, "checkpoint must be a positive int or None, got 0"),
])
def test_loop_counts_must_be_ints(kwargs, message) -> None:
    with pytest.raises(fold.FoldTypeError, match=f"fold.loop: {message}"):
        fold.loop(lambda i, s: s + 1.0, 0.0, **kwargs)


def test_loop_counts_accept_numpy_integers() -> None:
    assert fold.loop(lambda i, s: s + 1.0, 0.0, np.int64(3), checkpoint=np.int32(2)) == 3.0


@pytest.mark.parametrize("budget, error", [(-5, fold.ShapeError), (0, fold.ShapeError), ("x", fold.FoldTypeError),
                                           (2.5e6, fold.FoldTypeError), (True, fold.FoldTypeError)])
def test_gemm_budget_must_be_a_positive_int(budget, error) -> None:
    with pytest.raises(error, match=f"fold.gemm_map_reduce: budget must be .*got {budget!r}"):
        fold.gemm_map_reduce(fold.monoids.sum, lambda s: s, np.ones((3, 2)), np.ones((4, 2)), budget=budget)


# ------------------------------------------------------------------ functions that cannot be called as asked


@pytest.mark.parametrize("call, message", [
    (lambda: fold.map(3, X), r"map body int: expected a function, got int \(3\)"),
    (lambda: fold.map(lambda a, b: a, X), r"<lambda>\(a, b\) cannot be called with 1 argument"),
    (lambda: fold.reduce(lambda a: a, X, identity=0.0), r"<lambda>\(a\) cannot be called with 2 argument"),
    (lambda: fold.loop(lambda s: s, 0.0, 3), r"loop body <lambda>: <lambda>\(s\) cannot be called with 2 argument"),
    (lambda: fold.vjp(3, X)[1](1.0), r"expected a function, got int"),
    (lambda: fold.jit(lambda a: a)(X, X), r"<lambda>\(a\) cannot be called with 2 argument"),
])
def test_a_function_of_the_wrong_arity_is_named_with_its_signature(call, message) -> None:
    with pytest.raises(fold.FoldTypeError, match=message):
        call()


def test_variadic_and_defaulted_bodies_still_trace() -> None:
    np.testing.assert_allclose(fold.map(lambda *a: a[0] * 2.0, X), 2 * X)
    np.testing.assert_allclose(fold.map(lambda a, b=3.0: a * b, X), 3 * X)
    np.testing.assert_allclose(fold.map(np.sin, X), np.sin(X))


def test_a_type_error_inside_a_body_is_the_users_own() -> None:
    def body(a):
        raise TypeError("raised by the body itself")
    with pytest.raises(TypeError, match="raised by the body itself") as info:
        fold.map(body, X)
    assert not isinstance(info.value, fold.FoldError)


@pytest.mark.parametrize("argnums", [True, "0", 0.0, None, (), (0, 1.0)])
def test_grad_argnums_must_be_ints(argnums) -> None:
    with pytest.raises(fold.FoldTypeError, match=r"fold.grad: argnums must be an int or a non-empty tuple or list of ints"):
        fold.grad(lambda a, b: fold.sum(a * b), argnums=argnums)


def test_grad_argnums_accepts_numpy_integers_and_lists() -> None:
    f = lambda a, b: fold.sum(a * b)  # noqa: E731
    np.testing.assert_allclose(fold.grad(f, argnums=np.int64(1))(X, 2 * X), X)
    ga, = fold.grad(f, argnums=[0])(X, 2 * X)
    np.testing.assert_allclose(ga, 2 * X)


def test_grad_takes_keyword_arguments_and_does_not_differentiate_them() -> None:
    f = lambda x, w=1.0, *, scale=1.0: fold.sum(x * x * w) * scale  # noqa: E731
    np.testing.assert_allclose(fold.grad(f)(X, w=3.0), 6 * X)
    np.testing.assert_allclose(fold.grad(f)(X, 3.0, scale=0.5), 3 * X)
    value, (gx, gw) = fold.value_and_grad(f, argnums=(0, -1))(X, 2.0, scale=2.0)  # -1: the last positional one
    np.testing.assert_allclose(value, 4 * np.sum(X * X))
    np.testing.assert_allclose(gx, 8 * X)
    np.testing.assert_allclose(gw, 2 * np.sum(X * X))
    g = fold.grad(f)  # one grad, calls with one and with two positional arguments beside a keyword
    np.testing.assert_allclose(g(X, scale=3.0), 6 * X)
    np.testing.assert_allclose(g(X, 2.0, scale=3.0), 12 * X)
    np.testing.assert_allclose(g(X, scale=3.0), 6 * X)


def test_a_python_int_beyond_int64_is_named() -> None:
    with pytest.raises(fold.FoldTypeError, match=r"the integer 1180591620717411303424, which does not fit in int64"):
        fold.jit(lambda x: x * 2)(2**70)


def test_a_size_passed_to_grad_stays_a_python_int() -> None:
    """grad passes a Python int it does not differentiate untraced (as JAX's reaches f concrete); vjp traces
    every primal, and its error says to close over the size."""
    sized = fold.jit(lambda x, n: x * fold.iota(n), static_argnums=1)
    np.testing.assert_allclose(fold.grad(lambda x, n: fold.sum(sized(x, n)))(np.ones(3), 3), np.arange(3.0))
    with pytest.raises(fold.FoldTypeError, match=r"every primal of fold\.vjp.*close over it"):
        fold.vjp(lambda x, n: fold.sum(sized(x, n)), np.ones(3), 3)
    np.testing.assert_allclose(fold.grad(lambda x: fold.sum(sized(x, 3)))(np.ones(3)), np.arange(3.0))


def test_check_program_of_something_else_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="check_program: expected a fold Program .*got int"):
        fold.check_program(3)


def test_a_traced_index_into_a_numpy_table_says_how_to_gather() -> None:
    table = np.array([10.0, 20.0, 30.0])
    with pytest.raises(fold.ConcretizationError, match=r"fold.ops.getitem\(table, i\)"):
        fold.map(lambda i: table[i], np.array([0, 2]))
    np.testing.assert_allclose(fold.map(lambda i: fold.ops.getitem(table, i), np.array([0, 2])), [10.0, 30.0])


@pytest.mark.parametrize("f,error,message", [
    (lambda x: x[1.5:], fold.FoldIndexError, r"slice start must be an int or None, got 1\.5 \(float\)"),
    (lambda x: x[:, :np.float64(2.0)], fold.FoldIndexError, r"slice stop must be an int or None.*axis 1"),
    (lambda x: x[::0], fold.FoldIndexError, r"slice step cannot be 0"),
    (lambda x: x[x.shape[0] - fold.iota(3)[1]:], fold.FoldIndexError, r"slice start must be a static int, not a traced value"),
    (lambda x: x.reshape(), fold.FoldTypeError, r"reshape\(\) needs the new shape.*\(3, 4\)"),
])
def test_bad_slices_and_reshape_calls_are_named(f, error, message) -> None:
    with pytest.raises(error, match=message):
        fold.trace(f, np.zeros((3, 4)))


def test_good_slices_still_trace() -> None:
    x = np.arange(12.0).reshape(3, 4)
    f = lambda x: x[np.int64(1):, ::2] + x[:2, 1::2].reshape(2, 2)  # noqa: E731
    np.testing.assert_array_equal(fold.jit(f)(x), f(x))


def test_a_gemm_map_reduce_fn_of_the_wrong_arity_is_named() -> None:
    lhs, rhs = np.ones((3, 2)), np.ones((4, 2))
    with pytest.raises(fold.FoldTypeError, match=r"gemm_map_reduce map .*cannot be called with 2 argument\(s\)"):
        fold.run(lambda a, b: fold.gemm_map_reduce(fold.monoids.sum, lambda s: s, a, b, rows=(np.ones(3),)), lhs, rhs)


def test_gemm_map_reduce_rows_and_cols_may_be_one_array() -> None:
    lhs, rhs, t, c = np.ones((3, 2)), np.ones((4, 2)), np.arange(3.0), np.arange(4.0)
    one = fold.run(lambda a, b: fold.gemm_map_reduce(fold.monoids.sum, lambda s, t, c: s * t + c, a, b, rows=t, cols=c), lhs, rhs)
    np.testing.assert_allclose(one, 2.0 * 4 * t + c.sum())
    with pytest.raises(fold.ShapeError, match=r"rows\[0\] has shape \(4,\); its leading axis must be M"):
        fold.run(lambda a, b: fold.gemm_map_reduce(fold.monoids.sum, lambda s, t: s * t, a, b, rows=c), lhs, rhs)


# ------------------------------------------------------------------------------- byte order


@pytest.mark.parametrize("dtype", [">f8", ">f4", ">i8", ">i4"])
def test_big_endian_arrays_are_the_same_numbers(dtype) -> None:
    """Data read from some file formats arrives big-endian: as an argument or a captured constant it is
    converted to the machine's byte order, not refused as an unsupported dtype."""
    x = np.arange(1, 5).astype(dtype)
    w = np.arange(4, 0, -1).astype(dtype)
    native = np.dtype(dtype).newbyteorder("=")
    jitted = fold.jit(lambda x: fold.reduce(fold.monoids.sum, x * w))
    for _ in range(2):  # the warm call too (it finds its compiled program without the first call's conversion)
        got = jitted(x)
        assert got.dtype == native and got == np.sum(x.astype(native) * w.astype(native))
    big = np.linspace(0.0, 1.0, 100_000).astype(dtype)  # kernel-sized: a kernel given >f8 would not compile
    scan = fold.jit(lambda a: fold.scan(lambda p, q: p + q, a, identity=0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            np.testing.assert_allclose(scan(big), np.cumsum(big.astype(native)),
                                           rtol=1e-5 if native == np.float32 else 1e-12)  # reassociated
    assert fold.run(lambda x: x + 1, x).dtype == native
    if native.kind == "f":
        np.testing.assert_array_equal(fold.grad(lambda x: fold.reduce(fold.monoids.sum, x * w))(x), w.astype(native))
