"""fold.kernels.cpu.product_fold: a matrix product mapped and folded row by row in registers, against NumPy.

- k-means' distances and minimum (a per-row and a per-column operand) at shapes with partial row blocks
  and column tiles, m below one tile, empty rows, columns and inner dimension, serial and parallel;
- a sum (reassociated: scaled tolerance) of products times a full (rows, m) operand plus a scalar, and an
  exp: every operand kind and the vector exp;
- NaN in a row of x, or in one column operand, reaches exactly the rows it should (NumPy's minimum);
- clear errors for bad arguments.

The mapper and operator here are written by hand with their F64x4 forms (the backend generates its own:
tests/test_simd.py checks those, tests/test_numba_backend.py the backend's use of this kernel).
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

import fold.kernels.cpu as kc
from fold.kernels.cpu import simd

rng = np.random.default_rng(5)


@numba.njit(inline="always")
def distance(s, p, c):
    return (p - 2.0 * s) + c


@numba.njit(inline="always")
def distance_f64x4(s, p, c):
    return simd.add(simd.sub(p, simd.mul(simd.splat(2.0), s)), c)


@numba.njit(inline="always")
def minimum(a, b):
    return a if (a <= b or a != a) else b


@numba.njit(inline="always")
def minimum_f64x4(a, b):
    return simd.nan_minimum(a, b)


@numba.njit(inline="always")
def scaled_exp(s, full, scalar):
    return np.exp(s * full - scalar)


@numba.njit(inline="always")
def scaled_exp_f64x4(s, full, scalar):
    return simd.exp(simd.sub(simd.mul(s, full), scalar))


@numba.njit(inline="always")
def add(a, b):
    return a + b


@numba.njit(inline="always")
def add_f64x4(a, b):
    return simd.add(a, b)


@numba.njit
def no_form(s, p, c):
    return s + p + c


for fn, form in ((distance, distance_f64x4), (minimum, minimum_f64x4), (scaled_exp, scaled_exp_f64x4), (add, add_f64x4)):
    simd.register_form(fn, form)


def nearest(x, b, xx, cc, **options):
    return kc.product_fold(distance, minimum, np.inf, x, b, ("product", "row", "column"), [xx, cc], **options)


@pytest.mark.parametrize("rows, K, m", [(0, 3, 5), (1, 1, 1), (5, 3, 7), (13, 16, 64), (9, 5, 19), (37, 7, 17),
                                        (4, 0, 8), (6, 4, 0), (2000, 16, 64)])
@pytest.mark.parametrize("parallel", [None, False, True])
def test_nearest_distance_matches_numpy(rows, K, m, parallel):
    x, b = rng.normal(size=(rows, K)), rng.normal(size=(m, K))
    xx, cc = (x * x).sum(1), (b * b).sum(1)
    got = nearest(x, b, xx, cc, parallel=parallel)
    want = (xx[:, None] - 2.0 * (x @ b.T) + cc).min(axis=1) if m else np.full(rows, np.inf)
    assert got.shape == (rows,) and got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(want[np.isfinite(want)]).max(initial=0.0)))


def test_strided_inputs_are_read_as_they_are():
    x, b = rng.normal(size=(40, 18))[:, ::2], rng.normal(size=(20, 27))[::2, ::3]
    xx, cc = rng.normal(size=80)[::2], rng.normal(size=30)[::3]
    want = (xx[:, None] - 2.0 * (x @ b.T) + cc).min(axis=1)
    np.testing.assert_allclose(nearest(x, b, xx, cc), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rows, m", [(3, 5), (22, 24), (101, 70)])
def test_sum_with_full_and_scalar_operands_and_exp(rows, m):
    x, b = rng.normal(size=(rows, 6)) * 0.5, rng.normal(size=(m, 6)) * 0.5
    full, scalar = rng.normal(size=(rows, m)), np.array([0.75])
    got = kc.product_fold(scaled_exp, add, 0.0, x, b, ("product", "full", "scalar"), [full, scalar])
    want = np.exp((x @ b.T) * full - 0.75).sum(axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-13)  # positive terms: reassociation changes little
    # the product's argument may come anywhere in the order
    swapped = kc.product_fold(scaled_exp, add, 0.0, x, b, ("full", "product", "scalar"), [full, scalar])
    np.testing.assert_allclose(swapped, np.exp(full * (x @ b.T) - 0.75).sum(axis=1), rtol=1e-13)


def test_nan_reaches_exactly_its_rows():
    x, b = rng.normal(size=(11, 4)), rng.normal(size=(19, 4))
    xx, cc = (x * x).sum(1), (b * b).sum(1)
    x[6, 2] = np.nan
    got = nearest(x, b, xx, cc)
    assert np.isnan(got).tolist() == [i == 6 for i in range(11)]
    for column in (0, 9, 18):  # in a tile's first half, its second half, the columns after the tiles
        c = cc.copy()
        c[column] = np.nan
        assert np.isnan(nearest(x, b, xx, c)).all()


def test_errors_name_the_problem():
    x, b, xx, cc = np.ones((3, 2)), np.ones((5, 2)), np.ones(3), np.ones(5)
    with pytest.raises(ValueError, match="mapper must have an F64x4 form"):
        kc.product_fold(no_form, minimum, np.inf, x, b, ("product", "row", "column"), [xx, cc])
    with pytest.raises(TypeError, match="combine must be a numba.njit-compiled function"):
        kc.product_fold(distance, min, np.inf, x, b, ("product", "row", "column"), [xx, cc])
    with pytest.raises(ValueError, match="exactly one 'product'"):
        kc.product_fold(distance, minimum, np.inf, x, b, ("product", "product", "column"), [cc])
    with pytest.raises(ValueError, match="x has 2 columns and b 3"):
        kc.product_fold(distance, minimum, np.inf, x, np.ones((5, 3)), ("product", "row", "column"), [xx, cc])
    with pytest.raises(ValueError, match="x must be a 2-D float64 array, got float32"):
        kc.product_fold(distance, minimum, np.inf, x.astype(np.float32), b, ("product", "row", "column"), [xx, cc])
    with pytest.raises(ValueError, match=r"operands\[1\] must be a float64 array of shape \(5,\), got float64 of shape \(3,\)"):
        kc.product_fold(distance, minimum, np.inf, x, b, ("product", "row", "column"), [xx, xx])
    with pytest.raises(ValueError, match="take 2 operands, got 1"):
        kc.product_fold(distance, minimum, np.inf, x, b, ("product", "row", "column"), [xx])
    with pytest.raises(TypeError, match=r"mapper \(of 2 arguments, kinds \('product', 'row'\)\) does not compile"):
        kc.product_fold(distance, minimum, np.inf, x, b, ("product", "row"), [xx])  # distance takes 3


def first_extreme_reference(v: np.ndarray, extreme: str, fill: int) -> tuple[np.ndarray, np.ndarray]:
    """The statements a min/max gradient runs, in NumPy: the extreme, then the first column equal to it."""
    value = np.minimum.reduce(v, axis=1) if extreme == "minimum" else np.maximum.reduce(v, axis=1)
    positions = np.where(v == value[:, None], np.arange(v.shape[1]), fill)
    return value, positions.min(axis=1)


def first_nearest(x, b, xx, cc, extreme="minimum", fill=None, **options):
    fill = b.shape[0] if fill is None else fill
    return kc.product_first_extreme(distance, extreme, x, b, ("product", "row", "column"), [xx, cc], fill, **options)


@pytest.mark.parametrize("rows, K, m", [(0, 3, 5), (1, 1, 1), (5, 3, 7), (13, 16, 64), (9, 5, 19), (37, 7, 17),
                                        (4, 0, 8), (2000, 16, 64)])
@pytest.mark.parametrize("extreme", ["minimum", "maximum"])
@pytest.mark.parametrize("parallel", [None, False, True])
def test_first_extreme_matches_the_gradient_statements(rows, K, m, extreme, parallel):
    x, b = rng.normal(size=(rows, K)), rng.normal(size=(m, K))
    xx, cc = (x * x).sum(1), (b * b).sum(1)
    values, index = first_nearest(x, b, xx, cc, extreme, parallel=parallel)
    v = xx[:, None] - 2.0 * (x @ b.T) + cc
    want_values, want_index = first_extreme_reference(v, extreme, m)
    assert values.dtype == np.float64 and index.dtype == np.int64 and values.shape == index.shape == (rows,)
    np.testing.assert_allclose(values, want_values, rtol=1e-12, atol=1e-12)
    # the kernel's products may round differently from BLAS's: compare the index where the runner-up is clearly apart
    ordered = np.sort(v, axis=1) if m > 1 else np.zeros((rows, 2))
    gap = (ordered[:, 1] - ordered[:, 0]) if extreme == "minimum" else (ordered[:, -1] - ordered[:, -2]) if m > 1 else np.ones(rows)
    clear = gap > 1e-9
    np.testing.assert_array_equal(index[clear], want_index[clear])
    np.testing.assert_allclose(v[np.arange(rows), index], values, rtol=1e-12, atol=1e-12)  # the value is at the index


@pytest.mark.parametrize("extreme", ["minimum", "maximum"])
def test_first_extreme_ties_infinities_and_nan(extreme):
    # x = 0 makes every product 0: the mapped values are the column operand, exactly, so ties are exact
    rows, m = 6, 21
    x, b, xx = np.zeros((rows, 3)), rng.normal(size=(m, 3)), np.zeros(rows)
    sign = 1.0 if extreme == "minimum" else -1.0
    cases = {
        "ties in different lanes and after the tiles": np.where(np.isin(np.arange(m), [5, 6, 9, 17, 20]), -sign * 3.0, 0.0),
        "all +-inf at the identity": np.full(m, sign * np.inf),
        "the extreme in the last column only": np.where(np.arange(m) == m - 1, -sign * 1.0, 0.0),
        "signed zeros": np.where(np.arange(m) % 2 == 0, 0.0, -0.0),
    }
    for name, cc in cases.items():
        values, index = first_nearest(x, b, xx, cc, extreme)
        want_values, want_index = first_extreme_reference(np.broadcast_to(cc, (rows, m)), extreme, m)
        np.testing.assert_array_equal(index, want_index, err_msg=name)
        np.testing.assert_array_equal(values, want_values, err_msg=name)
    for column in (0, 6, 18):  # NaN in a tile's first half, its second half, the columns after the tiles
        cc = rng.normal(size=m)
        cc[column] = np.nan
        values, index = first_nearest(x, b, xx, cc, extreme, fill=99)
        want_values, want_index = first_extreme_reference(np.broadcast_to(cc, (rows, m)), extreme, 99)
        assert np.isnan(values).all() and np.isnan(want_values).all()
        np.testing.assert_array_equal(index, want_index)  # the fill: no column equals NaN


def test_first_extreme_errors_name_the_problem():
    x, b, xx, cc = np.ones((3, 2)), np.ones((5, 2)), np.ones(3), np.ones(5)
    with pytest.raises(ValueError, match="extreme must be one of \\['maximum', 'minimum'\\], got 'median'"):
        first_nearest(x, b, xx, cc, "median")
    with pytest.raises(ValueError, match="at least one row"):
        first_nearest(x, np.ones((0, 2)), xx, np.ones(0))
    with pytest.raises(ValueError, match="mapper must have an F64x4 form"):
        kc.product_first_extreme(no_form, "minimum", x, b, ("product", "row", "column"), [xx, cc], 5)
    with pytest.raises(TypeError, match=r"fill must be an integer \(the index given to a row holding NaN\), got 1.5"):
        first_nearest(x, b, xx, cc, fill=1.5)
