"""map, reduce, scan, reduce_by_index and loop against plain sequential Python/NumPy references."""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np
import pytest
from helpers import assert_close, matprod_sequential, run_checked, scan_reference

import fold
import fold.runtime.numpy_impl.control as control_impl
import fold.runtime.numpy_impl.folds as folds_impl


@pytest.fixture(params=[True, False], ids=["fast-paths", "generic"])
def fast_paths(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Run the test with NumPy's ufunc shortcuts for recognised operators, and with the generic tree algorithms."""
    monkeypatch.setattr(folds_impl, "USE_UFUNC_FAST_PATHS", request.param)
    return request.param


def _mat_op(a, b):
    """2x2 matrix product with each matrix a tuple (a00, a01, a10, a11) of scalars: not commutative."""
    a00, a01, a10, a11 = a
    b00, b01, b10, b11 = b
    return (a00 * b00 + a01 * b10, a00 * b01 + a01 * b11, a10 * b00 + a11 * b10, a10 * b01 + a11 * b11)


def _as_tuple(mats: np.ndarray) -> tuple:
    return tuple(np.ascontiguousarray(mats[..., i, j]) for i in range(2) for j in range(2))


def _from_tuple(parts) -> np.ndarray:
    a00, a01, a10, a11 = (np.asarray(p) for p in parts)
    return np.stack([np.stack([a00, a01], -1), np.stack([a10, a11], -1)], -2)


SIZES = [0, 1, 2, 3, 5, 8, 13, 16, 33]

# ------------------------------------------------------------------------------------------------- map


def test_nested_maps_three_deep_with_closures_over_every_level() -> None:
    rng = np.random.default_rng(0)
    a, w, c = rng.normal(size=(2, 3, 4)), rng.normal(size=4), 0.5

    def f(a, w):
        top = fold.sum(w)  # a value of the outermost trace

        def level1(plane):  # plane: (3, 4)
            s1 = fold.sum(plane)

            def level2(row):  # row: (4,)
                s2 = fold.reduce(fold.monoids.max, row)

                def level3(e, wi):  # e, wi: scalars
                    return e * wi + s1 - s2 * e + top * c

                return fold.map(level3, row, w)

            return fold.map(level2, plane)

        return fold.map(level1, a)

    expected = np.empty_like(a)
    for i in range(2):
        for j in range(3):
            for k in range(4):
                e = a[i, j, k]
                expected[i, j, k] = e * w[k] + a[i].sum() - a[i, j].max() * e + w.sum() * c
    assert_close(run_checked(f, a, w), expected)


def test_nested_maps_closure_over_a_middle_value_only() -> None:
    x = np.arange(24.0).reshape(2, 3, 4)
    got = run_checked(lambda x: fold.map(lambda p: fold.map(lambda r: fold.map(lambda e: e + p[0, 0], r), p), x), x)
    assert_close(got, x + x[:, :1, :1])


def test_map_over_several_arrays_and_pytrees() -> None:
    rng = np.random.default_rng(1)
    x, y, z = rng.normal(size=(5, 3)), rng.normal(size=5), rng.normal(size=(5, 2, 2))

    class Pair(NamedTuple):
        u: np.ndarray
        v: np.ndarray

    def f(x, y, z):
        return fold.map(lambda p, d: {"s": p.u * p.v, "t": (d["z"][0] @ p.u[:2], -p.v)}, Pair(x, y), {"z": z})

    got = run_checked(f, x, y, z)
    expected = {"s": x * y[:, None], "t": (np.stack([z[i, 0] @ x[i, :2] for i in range(5)]), -y)}
    assert_close(got, expected)


def test_map_body_returning_constants_and_captures() -> None:
    x, w = np.ones((3, 2)), np.array([1.0, 2.0])
    got = run_checked(lambda x, w: fold.map(lambda r: (w, 1.5, r), x), x, w)
    assert_close(got, (np.stack([w] * 3), np.full(3, 1.5), x))


def test_map_evaluates_its_body_once_not_per_row(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = control_impl.eval_program
    monkeypatch.setattr(control_impl, "eval_program", lambda *a, **k: calls.append(1) or real(*a, **k))
    traced = []
    x = np.random.default_rng(2).normal(size=(1000, 3))
    got = run_checked(lambda x: fold.map(lambda r: traced.append(1) or fold.map(lambda e: e * 2.0, r), x), x)
    assert_close(got, x * 2.0)
    assert len(traced) == 1, "the body is traced once, not once per row"
    assert len(calls) == 2, f"the outer and the inner map body each run once on batched arrays, not {len(calls)} times"


@pytest.mark.parametrize("n", [0, 1])
def test_map_over_empty_and_single_row(n: int) -> None:
    x = np.arange(3.0 * n).reshape(n, 3)
    assert_close(run_checked(lambda x: fold.map(lambda r: fold.exp(r) + r[0], x), x), np.exp(x) + x[:, :1])
    assert_close(run_checked(lambda x: fold.map(lambda r: fold.reduce(fold.monoids.sum, r), x), x), x.sum(1))


# ---------------------------------------------------------------------------------------------- reduce


@pytest.mark.parametrize("n", SIZES)
def test_reduce_non_commutative_matrix_product_as_tuple(n: int, fast_paths: bool) -> None:
    mats = np.random.default_rng(n).normal(size=(n, 2, 2))
    got = run_checked(lambda *m: fold.reduce(_mat_op, m, identity=(1.0, 0.0, 0.0, 1.0)), *_as_tuple(mats))
    assert_close(_from_tuple(got), matprod_sequential(mats))


@pytest.mark.parametrize("n", SIZES)
def test_reduce_non_commutative_matrix_product_as_2x2_elements(n: int, fast_paths: bool) -> None:
    mats = np.random.default_rng(100 + n).normal(size=(n, 2, 2))
    got = run_checked(lambda m: fold.reduce(lambda a, b: a @ b, m, identity=np.eye(2)), mats)
    assert_close(got, matprod_sequential(mats))


def test_reduce_non_commutative_as_a_record() -> None:
    mats = np.random.default_rng(3).normal(size=(11, 2, 2))

    def op(a, b):
        return {"m": a["m"] @ b["m"], "count": a["count"] + b["count"]}

    got = run_checked(lambda m: fold.reduce(op, {"m": m, "count": np.ones(11, dtype=np.int32)},
                                            identity={"m": np.eye(2), "count": 0}), mats)
    assert_close(got, {"count": np.int32(11), "m": matprod_sequential(mats)})
    assert got["count"].dtype == np.int32


@pytest.mark.parametrize("n", [0, 1, 6, 17])
def test_reduce_with_tuple_and_dict_valued_elements(n: int, fast_paths: bool) -> None:
    rng = np.random.default_rng(4)
    x, v = rng.normal(size=n), rng.normal(size=(n, 3))

    def mean_var(a, b):  # (count, sum, sum of squares)
        return (a[0] + b[0], a[1] + b[1], a[2] + b[2])

    got = run_checked(lambda x: fold.reduce(mean_var, (np.ones(n), x, x * x), identity=(0.0, 0.0, 0.0)), x)
    assert_close(got, (np.float64(n), x.sum(), (x * x).sum()))

    def argmax(a, b):  # keeps the first index among equals: the order matters for ties
        take_b = b["v"] > a["v"]
        return {"v": fold.where(take_b, b["v"], a["v"]), "i": fold.where(take_b, b["i"], a["i"])}

    xs = np.round(x * 2) / 2  # ties
    got = run_checked(lambda x: fold.reduce(argmax, {"v": x, "i": fold.iota(n)}, identity={"v": -np.inf, "i": -1}), xs)
    expected_i = int(np.argmax(xs)) if n else -1
    assert_close(got, {"i": np.int64(expected_i), "v": np.float64(xs.max() if n else -np.inf)})

    got = run_checked(lambda v: fold.reduce(lambda a, b: (a[0] + b[0], fold.maximum(a[1], b[1])), (v, v),
                                            identity=(0.0, -np.inf)), v)
    assert_close(got, (v.sum(0), v.max(0) if n else np.full(3, -np.inf)))


@pytest.mark.parametrize("monoid, np_reduce, ident", [
    (fold.monoids.sum, np.sum, 0.0), (fold.monoids.prod, np.prod, 1.0),
    (fold.monoids.max, np.max, -np.inf), (fold.monoids.min, np.min, np.inf),
    (fold.monoids.logaddexp, np.logaddexp.reduce, -np.inf),
], ids=["sum", "prod", "max", "min", "logaddexp"])
@pytest.mark.parametrize("n", [0, 1, 9])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_reduce_with_builtin_monoids(monoid, np_reduce, ident, n: int, dtype: str, fast_paths: bool) -> None:
    x = np.random.default_rng(5).uniform(0.5, 1.5, size=(n, 2)).astype(dtype)
    expected = np_reduce(x, axis=0) if n else np.full(2, ident, dtype=dtype)
    assert_close(run_checked(lambda x: fold.reduce(monoid, x), x), expected.astype(dtype), dtype=dtype)


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool"])
def test_reduce_integer_and_bool_dtypes(dtype: str, fast_paths: bool) -> None:
    x = np.array([3, -1, 4, 1, -5, 9, 2], dtype=np.int64).astype(dtype)
    for monoid, np_reduce in [(fold.monoids.max, np.max), (fold.monoids.min, np.min)]:
        assert_close(run_checked(lambda x: fold.reduce(monoid, x), x), np_reduce(x), dtype=dtype)
        # an empty integer max/min gives the dtype's extreme value (the +-inf identity cast)
        empty = x[:0]
        extreme = {"max": np.iinfo(dtype).min if dtype != "bool" else False,
                   "min": np.iinfo(dtype).max if dtype != "bool" else True}[monoid.name]
        assert_close(run_checked(lambda x: fold.reduce(monoid, x), empty), np.array(extreme, dtype=dtype), dtype=dtype)
    if dtype != "bool":
        assert_close(run_checked(lambda x: fold.reduce(lambda a, b: a + b, x, identity=0), x), x.sum().astype(dtype),
                     dtype=dtype)


def test_reduce_takes_logarithmic_vectorised_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(folds_impl, "USE_UFUNC_FAST_PATHS", False)
    monkeypatch.setenv("FOLD_CHECK", "0")  # check mode runs each program once more on the reference: count one run
    calls = []
    real = folds_impl.eval_program
    monkeypatch.setattr(folds_impl, "eval_program", lambda *a, **k: calls.append(1) or real(*a, **k))
    mats = np.random.default_rng(6).normal(size=(1000, 2, 2)) * 0.5
    got = run_checked(lambda m: fold.reduce(lambda a, b: a @ b, m, identity=np.eye(2)), mats)
    assert_close(got, matprod_sequential(mats), rtol=1e-9, atol=1e-12)
    assert len(calls) <= math.ceil(math.log2(1000)), f"{len(calls)} operator evaluations for n=1000"
    calls.clear()
    out = run_checked(lambda m: fold.scan(lambda a, b: a @ b, m, identity=np.eye(2)), mats)
    assert_close(out[-1], matprod_sequential(mats), rtol=1e-9, atol=1e-12)
    assert len(calls) <= 2 * math.ceil(math.log2(1000)), f"{len(calls)} operator evaluations for a scan of n=1000"


# ------------------------------------------------------------------------------------------------ scan

VARIANTS = list(itertools.product([False, True], [False, True]))
VARIANT_IDS = [f"{'exclusive' if e else 'inclusive'}-{'reverse' if r else 'forward'}" for e, r in VARIANTS]


@pytest.mark.parametrize("exclusive, reverse", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("n", SIZES)
def test_scan_matrix_product_all_variants(n: int, exclusive: bool, reverse: bool, fast_paths: bool) -> None:
    mats = np.random.default_rng(200 + n).normal(size=(n, 2, 2))
    got = run_checked(lambda m: fold.scan(lambda a, b: a @ b, m, identity=np.eye(2), exclusive=exclusive, reverse=reverse), mats)
    expected = scan_reference(lambda a, b: a @ b, list(mats), np.eye(2), exclusive=exclusive, reverse=reverse)
    assert_close(got, np.array(expected).reshape(n, 2, 2))
    got = run_checked(lambda *m: fold.scan(_mat_op, m, identity=(1.0, 0.0, 0.0, 1.0), exclusive=exclusive, reverse=reverse),
                      *_as_tuple(mats))
    assert_close(_from_tuple(got), np.array(expected).reshape(n, 2, 2))


RECOGNISED = [
    ("add", lambda a, b: a + b, fold.monoids.sum, np.add, 0.0),
    ("mul", lambda a, b: a * b, fold.monoids.prod, np.multiply, 1.0),
    ("max", fold.maximum, fold.monoids.max, np.maximum, -np.inf),
    ("min", lambda a, b: fold.minimum(a, b), fold.monoids.min, np.minimum, np.inf),
    ("logaddexp", fold.logaddexp, fold.monoids.logaddexp, np.logaddexp, -np.inf),
]


@pytest.mark.parametrize("exclusive, reverse", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("name, fn, monoid, np_op, ident", RECOGNISED, ids=[r[0] for r in RECOGNISED])
@pytest.mark.parametrize("n", [0, 1, 2, 7, 16])
def test_scan_recognised_operators_all_variants(name, fn, monoid, np_op, ident, n: int, exclusive: bool, reverse: bool,
                                                fast_paths: bool) -> None:
    x = np.random.default_rng(n).uniform(0.5, 1.5, size=(n, 3))
    expected = np.array(scan_reference(np_op, list(x), np.full(3, ident), exclusive=exclusive, reverse=reverse)).reshape(n, 3)
    got = run_checked(lambda x: fold.scan(fn, x, identity=ident, exclusive=exclusive, reverse=reverse), x)
    assert_close(got, expected)
    got = run_checked(lambda x: fold.scan(monoid, x, exclusive=exclusive, reverse=reverse), x)
    assert_close(got, expected)


@pytest.mark.parametrize("exclusive, reverse", VARIANTS, ids=VARIANT_IDS)
def test_scan_linear_recurrence_on_pairs(exclusive: bool, reverse: bool, fast_paths: bool) -> None:
    rng = np.random.default_rng(7)
    a, b = rng.uniform(0.5, 1.0, 21), rng.normal(size=21)

    def compose(first, second):  # x -> a1 x + b1, then a2 x + b2
        return first[0] * second[0], second[0] * first[1] + second[1]

    got = run_checked(lambda a, b: fold.scan(compose, (a, b), identity=(1.0, 0.0), exclusive=exclusive, reverse=reverse), a, b)
    expected = scan_reference(lambda p, q: (p[0] * q[0], q[0] * p[1] + q[1]), list(zip(a, b)), (1.0, 0.0),
                              exclusive=exclusive, reverse=reverse)
    assert_close(got, (np.array([e[0] for e in expected]), np.array([e[1] for e in expected])))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_scan_integers(dtype: str, fast_paths: bool) -> None:
    x = np.array([3, -1, 4, 1, -5, 9, 2, 6], dtype=dtype)
    assert_close(run_checked(lambda x: fold.scan(lambda a, b: a + b, x, identity=0), x), np.cumsum(x).astype(dtype), dtype=dtype)
    assert_close(run_checked(lambda x: fold.scan(fold.monoids.max, x, exclusive=True), x),
                 np.concatenate([[np.iinfo(dtype).min], np.maximum.accumulate(x)[:-1]]).astype(dtype), dtype=dtype)


def test_scan_over_empty_keeps_shape_and_dtype(fast_paths: bool) -> None:
    for exclusive, reverse in VARIANTS:
        x = np.zeros((0, 3), dtype=np.float32)
        got = run_checked(lambda x: fold.scan(lambda a, b: a * b, x, identity=1.0, exclusive=exclusive, reverse=reverse), x)
        assert_close(got, x, dtype="float32")


# -------------------------------------------------------------------------------- reduce/scan in a map


@pytest.mark.parametrize("n", [0, 1, 5, 8])
def test_reduce_and_scan_inside_a_map(n: int, fast_paths: bool) -> None:
    rng = np.random.default_rng(8)
    mats, caps = rng.normal(size=(4, n, 2, 2)), rng.uniform(0.5, 2.0, size=4)
    pos = np.minimum(np.abs(mats[:, :, 0, 0]), caps[:, None])  # elements in [0, cap], where 0 is the identity

    def f(mats, caps, pos):
        prod = fold.map(lambda ms: fold.reduce(lambda a, b: a @ b, ms, identity=np.eye(2)), mats)
        pre = fold.map(lambda ms: fold.scan(lambda a, b: a @ b, ms, identity=np.eye(2), exclusive=True, reverse=True), mats)
        sums = fold.map(lambda ms: fold.scan(fold.monoids.sum, ms[:, 0, 0]), mats)
        # saturating addition min(a + b, cap) on non-negative values is associative; its cap is a value of the
        # map's row, captured by the operator
        capped = fold.map(lambda c, xs: (fold.reduce(lambda a, b: fold.minimum(a + b, c), xs, identity=0.0),
                                         fold.scan(lambda a, b: fold.minimum(a + b, c), xs, identity=0.0, reverse=True)),
                          caps, pos)
        return prod, pre, sums, capped

    prod, pre, sums, (capped, capped_scan) = run_checked(f, mats, caps, pos)
    assert_close(prod, np.array([matprod_sequential(ms) for ms in mats]).reshape(4, 2, 2))
    expected_pre = [scan_reference(lambda a, b: a @ b, list(ms), np.eye(2), exclusive=True, reverse=True) for ms in mats]
    assert_close(pre, np.array(expected_pre).reshape(4, n, 2, 2))
    assert_close(sums, np.cumsum(mats[:, :, 0, 0], axis=1))
    expected, expected_scan = [], []
    for c, xs in zip(caps, pos):
        acc = 0.0
        for x in xs:
            acc = min(acc + x, c)
        expected.append(acc)
        expected_scan.append(scan_reference(lambda a, b, c=c: min(a + b, c), list(xs), 0.0, exclusive=False, reverse=True))
    assert_close(capped, np.array(expected))
    assert_close(capped_scan, np.array(expected_scan).reshape(4, n))


def test_reduce_inside_nested_maps(fast_paths: bool) -> None:
    mats = np.random.default_rng(9).normal(size=(2, 3, 5, 2, 2))
    got = run_checked(lambda m: fold.map(lambda p: fold.map(lambda ms: fold.reduce(lambda a, b: a @ b, ms, identity=np.eye(2)), p), m), mats)
    assert_close(got, np.array([[matprod_sequential(ms) for ms in p] for p in mats]))


# ------------------------------------------------------------------------------------- reduce_by_index


def _rbi_reference(op, n: int, indices: np.ndarray, values: np.ndarray, identity) -> np.ndarray:
    out = [identity] * n
    for i, v in zip(indices, values):
        if 0 <= i < n:
            out[i] = op(out[i], v)
    return np.array(out).reshape((n,) + values.shape[1:])


@pytest.mark.parametrize("m", [0, 1, 7, 50])
def test_reduce_by_index_against_add_at_and_minimum_at(m: int, fast_paths: bool) -> None:
    rng = np.random.default_rng(10 + m)
    n = 6
    idx = rng.integers(0, n, size=m)
    v = rng.normal(size=(m, 3))
    expected = np.zeros((n, 3))
    np.add.at(expected, idx, v)
    assert_close(run_checked(lambda i, v: fold.reduce_by_index(fold.monoids.sum, n, i, v), idx, v), expected)
    assert_close(run_checked(lambda i, v: fold.reduce_by_index(lambda a, b: a + b, n, i, v, identity=0.0), idx, v), expected)
    expected = np.full((n, 3), np.inf)
    np.minimum.at(expected, idx, v)
    assert_close(run_checked(lambda i, v: fold.reduce_by_index(fold.monoids.min, n, i, v), idx, v), expected)
    vi = rng.integers(-50, 50, size=m).astype(np.int32)
    expected = np.full(n, np.iinfo(np.int32).max, dtype=np.int32)
    np.minimum.at(expected, idx, vi)
    assert_close(run_checked(lambda i, v: fold.reduce_by_index(fold.monoids.min, n, i, v), idx.astype(np.int32), vi),
                 expected, dtype="int32")


def test_reduce_by_index_ignores_out_of_range_indices(fast_paths: bool) -> None:
    # pinned: indices < 0 or >= n are dropped (as in Futhark), not wrapped like NumPy's negative indices
    idx = np.array([0, -1, 2, 5, 9, -7, 2, 4])
    v = np.arange(1.0, 9.0)
    got = run_checked(lambda i, v: fold.reduce_by_index(fold.monoids.sum, 5, i, v), idx, v)
    assert_close(got, np.array([1.0, 0.0, 3.0 + 7.0, 0.0, 8.0]))
    got = run_checked(lambda i, v: fold.reduce_by_index(lambda a, b: a @ b, 5, i, v, identity=np.eye(2)),
                      idx, np.stack([np.eye(2) * k for k in v]))
    assert_close(got, np.stack([np.eye(2), np.eye(2), np.eye(2) * 21.0, np.eye(2), np.eye(2) * 8.0]))


def test_reduce_by_index_empty_bins_hold_the_identity(fast_paths: bool) -> None:
    idx, v = np.array([1, 1, 3]), np.array([2.0, 5.0, -1.0])
    assert_close(run_checked(lambda i, v: fold.reduce_by_index(fold.monoids.max, 5, i, v), idx, v),
                 np.array([-np.inf, 5.0, -np.inf, -1.0, -np.inf]))
    assert_close(run_checked(lambda i, v: fold.reduce_by_index(lambda a, b: a * b, 5, i, v, identity=1.0), idx, v),
                 np.array([1.0, 10.0, 1.0, -1.0, 1.0]))
    assert_close(run_checked(lambda i, v: fold.reduce_by_index(fold.monoids.sum, 0, i[:0], v[:0]), idx, v), np.zeros(0))


@pytest.mark.parametrize("m", [1, 2, 9, 40])
def test_reduce_by_index_non_commutative_keeps_order(m: int, fast_paths: bool) -> None:
    rng = np.random.default_rng(20 + m)
    idx = rng.integers(-1, 5, size=m)
    mats = rng.normal(size=(m, 2, 2))
    got = run_checked(lambda i, v: fold.reduce_by_index(lambda a, b: a @ b, 4, i, v, identity=np.eye(2)), idx, mats)
    assert_close(got, _rbi_reference(lambda a, b: a @ b, 4, idx, mats, np.eye(2)))
    got = run_checked(lambda i, *v: fold.reduce_by_index(_mat_op, 4, i, v, identity=(1.0, 0.0, 0.0, 1.0)), idx, *_as_tuple(mats))
    assert_close(_from_tuple(got), _rbi_reference(lambda a, b: a @ b, 4, idx, mats, np.eye(2)))


def test_reduce_by_index_inside_a_map(fast_paths: bool) -> None:
    rng = np.random.default_rng(11)
    idx, v = rng.integers(0, 5, size=(3, 12)), rng.normal(size=(3, 12))
    shared = rng.integers(-1, 6, size=12)
    mats = rng.normal(size=(3, 12, 2, 2))

    def f(idx, v, shared, mats):
        per_row = fold.map(lambda i, x: fold.reduce_by_index(fold.monoids.sum, 5, i, x), idx, v)
        shared_idx = fold.map(lambda x: fold.reduce_by_index(lambda a, b: fold.minimum(a, b), 5, shared, x, identity=np.inf), v)
        ordered = fold.map(lambda ms: fold.reduce_by_index(lambda a, b: a @ b, 5, shared, ms, identity=np.eye(2)), mats)
        return per_row, shared_idx, ordered

    per_row, shared_idx, ordered = run_checked(f, idx, v, shared, mats)
    expected = np.zeros((3, 5))
    for r in range(3):
        np.add.at(expected[r], idx[r], v[r])
    assert_close(per_row, expected)
    expected = np.full((3, 5), np.inf)
    ok = (shared >= 0) & (shared < 5)
    for r in range(3):
        np.minimum.at(expected[r], shared[ok], v[r][ok])
    assert_close(shared_idx, expected)
    assert_close(ordered, np.stack([_rbi_reference(lambda a, b: a @ b, 5, shared, ms, np.eye(2)) for ms in mats]))


def test_reduce_by_index_with_record_values(fast_paths: bool) -> None:
    # k-means style: per-cluster (count, sum of points)
    rng = np.random.default_rng(12)
    assign, pts = rng.integers(0, 3, size=20), rng.normal(size=(20, 2))
    got = run_checked(lambda a, p: fold.reduce_by_index(lambda x, y: {"n": x["n"] + y["n"], "s": x["s"] + y["s"]}, 3, a,
                                                        {"n": np.ones(20), "s": p}, identity={"n": 0.0, "s": 0.0}), assign, pts)
    expected_s = np.zeros((3, 2))
    np.add.at(expected_s, assign, pts)
    assert_close(got, {"n": np.bincount(assign, minlength=3).astype(float), "s": expected_s})


# ------------------------------------------------------------------------------------------------ loop


@pytest.mark.parametrize("n", [0, 1, 6])
def test_loop_against_a_python_loop_with_a_closure(n: int) -> None:
    rng = np.random.default_rng(13)
    x, w = rng.normal(size=4), rng.normal(size=(4, 4)) * 0.5

    def f(x, w):
        scale = fold.sum(w) * 0.1  # a value of the enclosing trace, used in the body

        def body(i, state):
            v, total = state
            v = fold.tanh(w @ v) + i * scale
            return v, total + fold.reduce(fold.monoids.sum, v)

        return fold.loop(body, (x, 0.0), n)

    v, total = x, 0.0
    for i in range(n):
        v = np.tanh(w @ v) + i * (w.sum() * 0.1)
        total = total + v.sum()
    assert_close(run_checked(f, x, w), (v, np.float64(total)))


def test_loop_inside_a_map_and_a_map_inside_a_loop() -> None:
    x = np.random.default_rng(14).normal(size=(3, 2))

    def f(x):
        a = fold.map(lambda r: fold.loop(lambda i, s: s * r + fold.convert(i, "float64"), r, 3), x)
        b = fold.loop(lambda i, s: fold.map(lambda row: row * 2.0 - fold.reduce(fold.monoids.sum, row), s), x, 4)
        return a, b

    expected_a = []
    for r in x:
        s = r
        for i in range(3):
            s = s * r + i
        expected_a.append(s)
    s = x
    for _ in range(4):
        s = s * 2.0 - s.sum(1, keepdims=True)
    assert_close(run_checked(f, x), (np.array(expected_a), s))


def test_loop_with_dict_state_and_int_counter() -> None:
    got = run_checked(lambda x: fold.loop(lambda i, s: {"acc": s["acc"] + i, "x": s["x"] * 2.0}, {"acc": 0, "x": x}, 5),
                      np.float32(1.5))
    assert_close(got, {"acc": np.int64(10), "x": np.float32(48.0)}, dtype=None)
    assert got["x"].dtype == np.float32 and got["acc"].dtype == np.int64


def test_folds_over_a_captured_array_with_a_per_row_operator(fast_paths: bool) -> None:
    # the folded array comes from outside the map (no batch axis of its own) while the operator closes over a
    # value of each row: the tree algorithms must broadcast one against the other
    rng = np.random.default_rng(15)
    caps = rng.uniform(0.5, 3.0, size=4)
    w = np.minimum(np.abs(rng.normal(size=7)), caps.min())  # elements in [0, cap]: 0 is the identity
    idx, mats = rng.integers(0, 3, size=(4, 7)), rng.normal(size=(7, 2, 2))

    def f(w, caps, idx, mats):
        sat = lambda c: lambda a, b: fold.minimum(a + b, c)  # noqa: E731
        red = fold.map(lambda c: fold.reduce(sat(c), w, identity=0.0), caps)
        pre = fold.map(lambda c: fold.scan(sat(c), w, identity=0.0, exclusive=True), caps)
        hist = fold.map(lambda i: fold.reduce_by_index(lambda a, b: a @ b, 3, i, mats, identity=np.eye(2)), idx)
        return red, pre, hist

    red, pre, hist = run_checked(f, w, caps, idx, mats)
    expected_red, expected_pre = [], []
    for c in caps:
        acc, row = 0.0, []
        for x in w:
            row.append(acc)
            acc = min(acc + x, c)
        expected_red.append(acc)
        expected_pre.append(row)
    assert_close(red, np.array(expected_red))
    assert_close(pre, np.array(expected_pre))
    assert_close(hist, np.stack([_rbi_reference(lambda a, b: a @ b, 3, i, mats, np.eye(2)) for i in idx]))
