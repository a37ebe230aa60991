"""The F64x4 ("wide") paths of the map and segmented-reduce kernels, against the scalar paths and NumPy.

A mapper or operator with a registered F64x4 form (kernels.cpu.simd.register_form), over float64 arrays,
runs four elements per step on vector registers: loaded and stored four at a time (simd.load / simd.store,
any stride, the stride-0 rows of a broadcast included). These tests register forms for small njit
functions and check
- simd.store into contiguous and strided arrays;
- map: 1-D and 2-D, serial and parallel, lengths around the four-element step, consts, two results,
  broadcast and transposed inputs, a strided `out`; exact where the mapper is arithmetic, exp within
  2 ulp of the scalar one; which inputs take the wide path (float64 only, a form needed);
- segmented reduce: commutative folds of rows (maximum with NaN exactly as NumPy's, sums within
  reassociation, a mapped fold over a broadcast input), row lengths around the 16-element step; a
  non-commutative fold keeps the ordered kernel.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from numba import njit

import fold.kernels.cpu as kc
from fold.kernels.cpu import simd

map_module = importlib.import_module("fold.kernels.cpu.map")  # the package exports the function map
segmented_module = importlib.import_module("fold.kernels.cpu.segmented")


@njit(inline="always")
def affine(c, x):
    return (x * c - 1.5, x + c)


@njit(inline="always")
def affine_f64x4(c, x):
    return (simd.sub(simd.mul(x, c), simd.splat(1.5)), simd.add(x, c))


@njit(inline="always")
def exp_of_difference(a, b):
    return np.exp(a - b)


@njit(inline="always")
def exp_of_difference_f64x4(a, b):
    return simd.exp(simd.sub(a, b))


@njit(inline="always")
def maximum(a, b):
    return b if b > a or np.isnan(b) else a  # NumPy's maximum on the values used here: NaN wins


@njit(inline="always")
def add(a, b):
    return a + b


@njit(inline="always")
def add_f64x4(a, b):
    return simd.add(a, b)


@njit(inline="always")
def square_f64x4(a):
    return simd.mul(a, a)


@njit(inline="always")
def square(a):
    return a * a


simd.register_form(affine, affine_f64x4)
simd.register_form(exp_of_difference, exp_of_difference_f64x4)
simd.register_form(maximum, simd.nan_maximum)
simd.register_form(add, add_f64x4)
simd.register_form(square, square_f64x4)


@njit
def _store_each_step(x, out):
    for i in range(0, x.shape[0] - 3, 4):
        simd.store(out, i, simd.add(simd.load(x, i), simd.splat(1.0)))


@pytest.mark.parametrize("step", [1, 3])
def test_store_writes_four_consecutive_elements(step):
    x = np.arange(13.0)
    out = np.full(13 * step, -7.0)
    _store_each_step(x, out[::step])
    want = np.full(13 * step, -7.0)
    want[: 12 * step : step] = x[:12] + 1.0
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("parallel", [None, False, True])
@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 1001, 2 * kc.host.MIN_CHUNK + 3])
def test_wide_map_1d_matches_the_scalar_mapper(n, parallel):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n)
    c = np.float64(-2.25)
    assert map_module.has_wide_form(affine, [c.dtype], [x.dtype], [np.float64, np.float64])
    got = kc.map(affine, 1, 2, [x], consts=[c], parallel=parallel)
    np.testing.assert_array_equal(got[0], x * c - 1.5)
    np.testing.assert_array_equal(got[1], x + c)


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (300, 257), (64, 1024)])
def test_wide_map_2d_reads_broadcast_and_transposed_views(shape, parallel):
    rng = np.random.default_rng(shape[1])
    rows, cols = shape
    full = rng.uniform(-30, 30, (cols, rows)).T  # transposed: rows are strided
    per_row = np.broadcast_to(rng.uniform(-30, 30, (rows, 1)), shape)  # stride 0 along a row
    (got,) = kc.map(exp_of_difference, 2, 1, [full, per_row], parallel=parallel)
    want = np.array([[exp_of_difference(a, b) for a, b in zip(r, s)] for r, s in zip(full, per_row)]).reshape(shape)
    np.testing.assert_allclose(got, want, rtol=5e-16, atol=0)  # the vector exp within 2 ulp of the scalar one
    wide_out = np.full((rows, 2 * cols), np.nan)
    kc.map(affine, 1, 2, [full], consts=[np.float64(3.0)], parallel=parallel,
           out=[wide_out[:, ::2], wide_out[:, 1::2]])  # strided outputs: stored lane by lane
    np.testing.assert_array_equal(wide_out[:, ::2], full * 3.0 - 1.5)
    np.testing.assert_array_equal(wide_out[:, 1::2], full + 3.0)


@njit
def _affine_pair(a, b):  # no F64x4 form, a lane form below: the 2-D lanes path
    return a * 3.0 - b


lanes_module = importlib.import_module("fold.kernels.cpu.lanes")


def _pair_lane_form():
    """_affine_pair's lane form: each argument's WIDTH lanes as a tuple, the WIDTH results."""
    results = ", ".join(f"a[{lane}] * 3.0 - b[{lane}]" for lane in range(lanes_module.WIDTH))
    scope: dict = {}
    exec(f"def lanes(a, b):\n    return ({results},)", scope)
    return njit(scope["lanes"])


lanes_module.register(_affine_pair, _pair_lane_form())
_plain_pair = njit(_affine_pair.py_func)  # no form at all: the scalar path


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("rows,cols", [(1, 1), (9, 7), (3001, 16), (40, 33)])
@pytest.mark.parametrize("path", ["wide", "lanes", "scalar"])
def test_gathered_rows_read_the_table_in_place(path, rows, cols, parallel):
    """map(..., rows=[g, None]): input 0 is row g[i] of a table, as if table[g] were passed; the other
    input a plain (here broadcast) array. Each of the kernel's 2-D paths: F64x4, lane form, scalar."""
    rng = np.random.default_rng(rows * cols)
    table = rng.uniform(-3, 3, (5, cols))
    g = rng.integers(0, 5, rows)
    other = np.broadcast_to(rng.uniform(-3, 3, (rows, 1)), (rows, cols))
    mapper, dtype = {"wide": (exp_of_difference, np.float64), "lanes": (_affine_pair, np.float64),
                     "scalar": (_plain_pair, np.float32)}[path]
    table, other = table.astype(dtype), other.astype(dtype)
    (got,) = kc.map(mapper, 2, 1, [table, other], rows=[g, None], parallel=parallel)
    (want,) = kc.map(mapper, 2, 1, [table[g], other], parallel=parallel)
    np.testing.assert_array_equal(got, want)
    (swapped,) = kc.map(mapper, 2, 1, [other, table], rows=[None, g], parallel=parallel)  # a table second
    (want,) = kc.map(mapper, 2, 1, [other, table[g]], parallel=parallel)
    np.testing.assert_array_equal(swapped, want)


def test_gathered_rows_take_the_wide_path_and_check_their_indices(monkeypatch):
    chosen = []
    original = map_module.map_kernel

    def spy(mapper, k, m, parallel=True, c=0, ndim=1, wide=False, gathered=()):
        chosen.append((wide, gathered))
        return original(mapper, k, m, parallel, c, ndim, wide, gathered)

    monkeypatch.setattr(map_module, "map_kernel", spy)
    table, x = np.ones((4, 8)), np.ones((6, 8))
    kc.map(exp_of_difference, 2, 1, [x, table], rows=[None, np.array([0, 3, 3, 1, 2, 0])])
    assert chosen == [(True, (1,))]
    with pytest.raises(IndexError, match="rows\\[1\\]: index 4 is out of range for a table of 4 rows"):
        kc.map(exp_of_difference, 2, 1, [x, table], rows=[None, np.array([0, 4, 3, 1, 2, 0])])
    with pytest.raises(IndexError, match="index -5 is out of range"):
        kc.map(exp_of_difference, 2, 1, [x, table], rows=[None, np.array([0, -5, 3, 1, 2, 0])])
    table = np.random.default_rng(0).normal(size=(4, 8))  # rows counted from the end read the same rows
    np.testing.assert_array_equal(kc.map(exp_of_difference, 2, 1, [x, table], rows=[None, np.array([0, -1, 3, -3, 2, -4])]),
                                  kc.map(exp_of_difference, 2, 1, [x, table], rows=[None, np.array([0, 3, 3, 1, 2, 0])]))
    with pytest.raises(ValueError, match=r"one shape, got \[\(6, 8\), \(5, 8\)\]"):
        kc.map(exp_of_difference, 2, 1, [x, table], rows=[None, np.array([0, 1, 3, 1, 2])])
    with pytest.raises(TypeError, match="rows\\[1\\] must be a 1-D integer array, got float64"):
        kc.map(exp_of_difference, 2, 1, [x, table], rows=[None, np.zeros(6)])
    with pytest.raises(ValueError, match="rows: expected a sequence of 2 entries"):
        kc.map(exp_of_difference, 2, 1, [x, table], rows=[None])
    with pytest.raises(ValueError, match="must be a 2-D table, got shape \\(4,\\)"):
        kc.map(exp_of_difference, 2, 1, [x[0, :4], np.ones(4)], rows=[None, np.zeros(4, np.int64)])


def test_only_float64_maps_with_a_form_are_wide(monkeypatch):
    chosen = []
    original = map_module.map_kernel

    def spy(mapper, k, m, parallel=True, c=0, ndim=1, wide=False, gathered=()):
        chosen.append(wide)
        return original(mapper, k, m, parallel, c, ndim, wide, gathered)

    monkeypatch.setattr(map_module, "map_kernel", spy)
    x = np.linspace(-1, 1, 50)
    kc.map(square, 1, 1, [x])
    kc.map(square, 1, 1, [x.astype(np.float32)])  # float32 results: the scalar path
    kc.map(square, 1, 1, [np.arange(50)])  # integers
    (y,) = kc.map(maximum, 2, 1, [x, -x])  # a form of a combine used as a mapper is fine too
    np.testing.assert_array_equal(y, np.abs(x))
    assert chosen == [True, False, False, True]
    with pytest.raises(ValueError, match="needs a mapper with a registered F64x4 form"):
        map_module.map_kernel(njit(lambda a: a), 1, 1, wide=True)


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("n", [1, 5, 15, 16, 17, 33, 1024, 1029])
def test_wide_segmented_folds_rows_commutatively(n, parallel):
    rng = np.random.default_rng(n)
    rows = 9
    x = rng.standard_normal((rows, n))
    x[2, n // 2] = np.nan
    x[3, n - 1] = np.inf
    x[4] = -np.inf
    (got,) = kc.segmented_reduce(None, maximum, 1, (-np.inf,), [x], parallel=parallel, commutative=True)
    np.testing.assert_array_equal(got, x.max(axis=1))  # NaN rows NaN, -inf rows -inf: NumPy's rule
    y = rng.standard_normal((rows, n))
    (sums,) = kc.segmented_reduce(None, add, 1, (0.0,), [y], parallel=parallel, commutative=True)
    np.testing.assert_allclose(sums, y.sum(axis=1), rtol=1e-12, atol=1e-12 * n)
    per_row = np.broadcast_to(rng.standard_normal((rows, 1)), (rows, n))
    (squares,) = kc.segmented_reduce(square, add, 1, (0.0,), [per_row], parallel=parallel, commutative=True)
    np.testing.assert_allclose(squares, n * per_row[:, 0] ** 2, rtol=1e-12)


def test_segmented_reduce_is_wide_only_when_commutative_float64_and_formed(monkeypatch):
    chosen = []
    original = segmented_module.segmented_kernel

    def spy(mapper, combine, k, m, parallel=True, lanes=1, wide=False):
        chosen.append(wide)
        return original(mapper, combine, k, m, parallel, lanes, wide)

    monkeypatch.setattr(segmented_module, "segmented_kernel", spy)
    x = np.arange(60.0).reshape(3, 20)
    for commutative in (True, False):
        (got,) = kc.segmented_reduce(None, add, 1, (0.0,), [x], commutative=commutative)
        np.testing.assert_array_equal(got, x.sum(axis=1))  # small integers: every order exact
    kc.segmented_reduce(None, add, 1, (0.0,), [x.astype(np.float32)], commutative=True)
    kc.segmented_reduce(njit(lambda a: a + 1.0), add, 1, (0.0,), [x], commutative=True)  # a mapper without a form
    assert chosen == [True, False, False, False]


# ----------------------------------------------------------------------------- map with row sums

row_sums_module = importlib.import_module("fold.kernels.cpu.row_sums")


@njit(inline="always")
def scaled_exp_and_itself(c, a, b):
    e = np.exp(a - b)
    return (e * c, e)


@njit(inline="always")
def scaled_exp_and_itself_f64x4(c, a, b):
    e = simd.exp(simd.sub(a, b))
    return (simd.mul(e, c), e)


simd.register_form(scaled_exp_and_itself, scaled_exp_and_itself_f64x4)


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (5, 4), (7, 9), (300, 257), (64, 1024)])
def test_map_with_row_sums_stores_and_sums_in_one_pass(shape, parallel):
    """Softmax's numerator and denominator: exp(s - m) stored (here scaled by a const) and summed per
    row, on the wide path and (float32) the scalar one; rows around the four-element step, a broadcast
    per-row maximum and transposed rows read in place."""
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    rows, cols = shape
    s = rng.uniform(-20, 20, (cols, rows)).T
    m = np.broadcast_to(s.max(axis=1, keepdims=True), shape)
    c = np.float64(0.5)
    want = np.array([[np.exp(a - b) for a, b in zip(r, q)] for r, q in zip(s, m)]).reshape(shape)
    (scaled,), sums = kc.map_with_row_sums(scaled_exp_and_itself, 2, 1, [s, m], consts=[c], parallel=parallel)
    np.testing.assert_allclose(scaled, want * 0.5, rtol=5e-16, atol=0)  # the vector exp within 2 ulp
    np.testing.assert_allclose(sums, want.sum(axis=1), rtol=1e-14)  # reassociated: lanes, then the rest
    (scaled32,), sums32 = kc.map_with_row_sums(scaled_exp_and_itself, 2, 1, [s.astype(np.float32), m.astype(np.float32)],
                                               consts=[np.float32(0.5)], parallel=parallel)
    assert scaled32.dtype == sums32.dtype == np.float32
    np.testing.assert_allclose(sums32, want.sum(axis=1), rtol=1e-5)


@pytest.mark.parametrize("parallel", [False, True])
def test_map_with_row_sums_of_nothing_stored_and_of_integers(parallel):
    """k = 0 stores nothing (the row sums of a mapped value alone); integer sums are exact; 0 columns
    give zeros; an `out` array is filled in place."""
    x = np.arange(35.0).reshape(5, 7)
    (), sums = kc.map_with_row_sums(square, 1, 0, [x], parallel=parallel)
    np.testing.assert_array_equal(sums, (x * x).sum(axis=1))  # small integers: every order exact
    ints = np.arange(-12, 12).reshape(4, 6)
    out = np.full((4, 6), -1)
    (stored,), int_sums = kc.map_with_row_sums(njit(lambda a: (a * 3, a * a)), 1, 1, [ints], parallel=parallel, out=[out])
    assert stored is out and int_sums.dtype == ints.dtype
    np.testing.assert_array_equal(out, ints * 3)
    np.testing.assert_array_equal(int_sums, (ints * ints).sum(axis=1))
    (empty,), zero_sums = kc.map_with_row_sums(scaled_exp_and_itself, 2, 1, [np.empty((3, 0))] * 2, consts=[1.0])
    assert empty.shape == (3, 0)
    np.testing.assert_array_equal(zero_sums, np.zeros(3))


def test_map_with_row_sums_is_wide_only_for_float64_with_a_form_and_checks_its_arguments(monkeypatch):
    chosen = []
    original = row_sums_module.row_sums_kernel

    def spy(mapper, k, m, c, parallel, wide):
        chosen.append(wide)
        return original(mapper, k, m, c, parallel, wide)

    monkeypatch.setattr(row_sums_module, "row_sums_kernel", spy)
    x = np.linspace(-1, 1, 60).reshape(6, 10)
    kc.map_with_row_sums(square, 1, 0, [x])
    kc.map_with_row_sums(square, 1, 0, [x.astype(np.float32)])
    kc.map_with_row_sums(njit(lambda a: a + 1.0), 1, 0, [x])  # no form
    assert chosen == [True, False, False]
    with pytest.raises(ValueError, match=r"mapper must return 2 value\(s\)"):
        kc.map_with_row_sums(square, 1, 1, [x])
    with pytest.raises(ValueError, match="k must be an integer >= 0"):
        kc.map_with_row_sums(square, 1, -1, [x])
    with pytest.raises(ValueError, match="must be 2-D"):
        kc.map_with_row_sums(square, 1, 0, [x.ravel()])
    with pytest.raises(TypeError, match="summed .* must be a number"):
        kc.map_with_row_sums(njit(lambda a: a > 0.0), 1, 0, [x])
    with pytest.raises(ValueError, match="needs a mapper with a registered F64x4 form"):
        row_sums_module.row_sums_kernel(njit(lambda a: a), 0, 1, 0, False, True)
