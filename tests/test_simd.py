"""fold.kernels.cpu.simd: four float64 lanes in one vector register, and the exp written in LLVM IR.

- exp against NumPy's (glibc's) exp, four lanes at a time: random values of several scales, the ranges
  near overflow and underflow (subnormal results), and the special values (exact); each both in vectors
  whose lanes are all in the common range and in vectors that also hold a lane outside it (the second path);
  the same when Numba compiles for a generic x86-64 CPU (a subprocess);
- load from float64 and float32 arrays, contiguous and strided; maximum's lanes and NaN rule;
- mul, div, neg, fma and NumPy's NaN-propagating minimum and maximum per lane, against the scalar
  definitions (scalar_helpers' _minimum and _maximum: the same signed zero);
- the F64x4 forms the backend's codegen writes for programs of float64 scalars, against their scalar
  functions lane by lane, and the programs that get none; booleans as lanes of 1.0 / 0.0 (comparisons,
  where, and / or / not, conversions, boolean arrays loaded).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from fold.kernels.cpu import simd

ROOT = Path(__file__).resolve().parents[1]
W = simd.WIDTH
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-300, -1e-300, 5e-324, 1.0, -1.0, 0.5 * np.log(2),
                     -0.5 * np.log(2), 708.0, 709.0, 709.78, 709.79, 710.0, -708.0, -708.4, -709.0, -745.0, -745.1,
                     -745.2, -746.0, 1e300, -1e300, 1e6, -1e6])


@njit
def _exp_four_at_a_time(x, out):
    for i in range(0, x.shape[0] - W + 1, W):
        e = simd.exp(simd.load(x, i))
        for j in range(W):
            out[i + j] = simd.lane(e, j)


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(11)
    parts = [rng.uniform(-1, 1, 20_000) * s for s in (1e-12, 1e-3, 1.0, 30.0, 700.0)]
    parts += [rng.uniform(700, 711, 5_000), rng.uniform(-750, -700, 5_000), rng.uniform(-0.35, 0.35, 5_000)]
    return np.concatenate(parts)


def check_exp(x: np.ndarray, max_ulp: float = 2.0) -> None:
    """simd.exp of x (a multiple of WIDTH long) against np.exp: special values and zeros exactly, the rest
    within max_ulp."""
    out = np.full_like(x, 12345.0)
    _exp_four_at_a_time(x, out)
    with np.errstate(all="ignore"):
        want = np.exp(x)
    same = (out == want) | (np.isnan(out) & np.isnan(want))
    ordinary = np.isfinite(want) & (want != 0)
    assert same[~ordinary].all(), f"{x[~ordinary & ~same]} -> {out[~ordinary & ~same]}, want {want[~ordinary & ~same]}"
    ulps = np.abs(out[ordinary] - want[ordinary]) / np.spacing(want[ordinary])
    assert ulps.max() <= max_ulp, f"{ulps.max()} ulp at x = {x[ordinary][np.argmax(ulps)]!r}"


def check_both_paths() -> None:
    x = _inputs()
    common = x[(x > -708) & (x < 709)]
    check_exp(common[: len(common) // W * W])  # every vector on the common path
    rng = np.random.default_rng(12)
    mixed = rng.permutation(np.concatenate([x, np.repeat(SPECIALS, 50)]))
    check_exp(mixed[: len(mixed) // W * W])  # most vectors hold a lane for the second path
    with_one_special = np.concatenate([[s, 0.25, -3.0, 100.0] for s in SPECIALS])  # lanes 1-3 ordinary
    check_exp(with_one_special)


def test_exp_agrees_with_numpy_on_both_paths():
    check_both_paths()


def test_exp_compiled_for_a_generic_cpu_agrees_too():
    code = ("import os, sys; sys.path[:0] = [os.getcwd(), 'tests']\n"
            "import test_simd as t; t.check_both_paths()\n")
    env = {"NUMBA_CPU_NAME": "generic", "FOLD_CACHE_DIR": "", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


@njit
def _loaded(x, i):
    v = simd.load(x, i)
    return simd.lane(v, 0), simd.lane(v, 1), simd.lane(v, 2), simd.lane(v, 3)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("step", [1, 3, -2])
def test_load_reads_four_consecutive_elements_as_float64(dtype, step):
    x = (np.arange(40, dtype=np.float64) * 1.1 + 0.3).astype(dtype)[::step]
    for i in (0, 1, len(x) - W):
        assert _loaded(x, i) == tuple(float(v) for v in x[i:i + W])


@njit
def _lanes_of_maximum(a, b):
    m = simd.maximum(simd.load(a, 0), simd.load(b, 0))
    return np.array([simd.lane(m, j) for j in range(W)])


def test_maximum_per_lane_and_its_nan_rule():
    a = np.array([1.0, 5.0, np.nan, -np.inf])
    b = np.array([2.0, 3.0, 7.0, np.nan])
    got = _lanes_of_maximum(a, b)
    np.testing.assert_array_equal(got[:2], [2.0, 5.0])
    assert np.isnan(got[2]) and got[3] == -np.inf  # a NaN in the first operand stays; one in the second is passed over


@njit
def _splat_add_sub(v, w):
    s = simd.sub(simd.add(simd.splat(v), simd.splat(w)), simd.splat(w))
    return simd.lane(s, 0), simd.lane(s, 3)


def test_splat_add_sub():
    assert _splat_add_sub(1.5, 2.25) == (1.5, 1.5)
    assert _splat_add_sub(np.float32(0.1), 1.0) == (float(np.float32(0.1)), float(np.float32(0.1)))


@njit
def _lanes(v):
    return np.array([simd.lane(v, j) for j in range(W)])


@njit
def _arithmetic(a, b, c):
    va, vb, vc = simd.load(a, 0), simd.load(b, 0), simd.load(c, 0)
    return (_lanes(simd.mul(va, vb)), _lanes(simd.div(va, vb)), _lanes(simd.neg(va)), _lanes(simd.fma(va, vb, vc)),
            _lanes(simd.nan_minimum(va, vb)), _lanes(simd.nan_maximum(va, vb)))


def _bits(x) -> list[int]:
    return np.asarray(x, dtype=np.float64).view(np.int64).tolist()


@pytest.mark.parametrize("a, b", [
    ([1.5, -0.0, np.nan, 3.0], [2.0, 0.0, 1.0, np.nan]),
    ([np.inf, -2.0, 0.0, 7.0], [np.inf, -np.inf, -0.0, -7.0]),
    ([1e300, 1e-300, -1.0, 0.1], [1e10, 1e-30, 3.0, 0.3]),
])
def test_arithmetic_and_propagating_minimum_maximum_per_lane(a, b):
    from fold.runtime.numba_backend.scalar_helpers import _maximum, _minimum

    a, b = np.array(a), np.array(b)
    c = np.array([0.25, -1.0, 2.0, 1e-17])
    product, quotient, negated, fused, smaller, larger = _arithmetic(a, b, c)
    with np.errstate(all="ignore"):
        assert _bits(product) == _bits(a * b) and _bits(quotient) == _bits(a / b) and _bits(negated) == _bits(-a)
        unfused = a * b + c
    np.testing.assert_allclose(fused, unfused, rtol=1e-15)  # one rounding or two: within an ulp of each other
    assert _bits(smaller) == _bits([_minimum(x, y) for x, y in zip(a, b)])
    assert _bits(larger) == _bits([_maximum(x, y) for x, y in zip(a, b)])
    np.testing.assert_array_equal(np.isnan(smaller), np.isnan(a) | np.isnan(b))  # NaN from either side, as NumPy


@njit
def _apply_form(form, a, b, out):
    for i in range(0, a.shape[0] - W + 1, W):
        r = form(simd.load(a, i), simd.load(b, i))
        for j in range(W):
            out[i + j] = simd.lane(r, j)


def _scalar_program(f, dtype=np.float64):
    import fold

    return fold.trace(f, np.zeros((), dtype), np.zeros((), dtype))


def test_codegen_writes_f64x4_forms_that_compute_what_the_scalar_function_does():
    import fold
    from fold.runtime.numba_backend.codegen import compile_scalar_program, has_f64x4_form

    def f(a, b):
        return fold.maximum(fold.exp(a - b) * 2.0, -a) / (b + 3.0) - fold.minimum(a, b * b)

    program = _scalar_program(f)
    assert has_f64x4_form(program)
    fn = compile_scalar_program(program)
    form = simd.vector_form(fn)
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=4000) * 3, rng.normal(size=4000) * 3
    a[:8], b[:8] = [np.nan, 0.0, -0.0, np.inf, 1.0, -np.inf, 2.0, 700.0], [1.0, np.nan, 0.0, 1.0, -2.5, 0.5, np.inf, -10.0]
    out = np.empty_like(a)
    _apply_form(form, a, b, out)
    want = np.array([fn(x, y) for x, y in zip(a, b)])
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(out[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    np.testing.assert_allclose(out[finite], want[finite], rtol=1e-14, atol=1e-14)  # exp within 2 ulp of the scalar one


def test_programs_outside_the_templates_get_no_f64x4_form():
    import fold
    from fold.runtime.numba_backend.codegen import has_f64x4_form

    assert not has_f64x4_form(_scalar_program(lambda a, b: fold.sin(a) + b))  # no template for sin
    assert not has_f64x4_form(_scalar_program(lambda a, b: a < b))  # a boolean result
    assert not has_f64x4_form(_scalar_program(lambda a, b: a + b, np.float32))  # float64 only
    assert not has_f64x4_form(_scalar_program(lambda a, b: a * b, np.int64))
    assert has_f64x4_form(_scalar_program(lambda a, b: a))  # a value passed through


def _masked(a, b, m):
    import fold

    inside = fold.logical_and(m, a < b) | ~(a >= b * 0.5)
    picked = fold.where(inside, fold.exp(a), -b) + fold.convert(a != a, np.float64) * 7.0
    return fold.where(fold.convert(b, np.bool_), picked, fold.convert(m == (a <= b), np.float64))


def test_f64x4_forms_of_comparisons_selections_and_boolean_inputs():
    """Booleans are lanes of 1.0 / 0.0: comparisons (NaN as in Python), where, and / or / not, conversions
    both ways, and boolean inputs loaded from a boolean array, against the scalar function."""
    import fold
    from fold.runtime.numba_backend.codegen import compile_scalar_program, has_f64x4_form

    program = fold.trace(_masked, np.zeros(()), np.zeros(()), np.zeros((), np.bool_))
    assert has_f64x4_form(program)
    fn = compile_scalar_program(program)
    form = simd.vector_form(fn)
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=4000), rng.normal(size=4000)
    a[:12] = [np.nan, 1.0, -np.inf, np.inf, 0.0, -0.0, 2.0, np.nan, 3.0, 1.0, 0.5, -1.0]
    b[:12] = [1.0, np.nan, 0.0, np.inf, -0.0, 0.0, 4.0, np.nan, 0.0, 2.0, 1.0, -2.0]
    b[100:200] = 0.0
    m = rng.random(4000) < 0.5
    out = np.empty_like(a)
    _apply_form3(form, a, b, m, out)
    want = np.array([fn(x, y, z) for x, y, z in zip(a, b, m)])
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_allclose(out, want, rtol=5e-16, atol=0)  # exp within 2 ulp; the rest exact


@njit
def _apply_form3(form, a, b, m, out):
    for i in range(0, a.shape[0] - W + 1, W):
        r = form(simd.load(a, i), simd.load(b, i), simd.load(m, i))
        for j in range(W):
            out[i + j] = simd.lane(r, j)


@pytest.mark.parametrize("step", [1, 3])
def test_load_reads_booleans_as_zero_and_one(step):
    m = np.array([True, False, False, True, True, True, False, False] * 3)[::step]
    got = np.array([simd_lane_of_load(m, i, j) for i in range(0, len(m) - W + 1, W) for j in range(W)])
    np.testing.assert_array_equal(got, m[: len(got)].astype(np.float64))


@njit
def simd_lane_of_load(m, i, j):
    return simd.lane(simd.load(m, i), j)


def test_vector_math_off_leaves_exp_to_libm(monkeypatch):
    """FOLD_VECTOR_MATH=0 asks for libm's exp: lambdas that call exp get no F64x4 form (arithmetic still does)."""
    import fold
    from fold.kernels.cpu import vector_math
    from fold.runtime.numba_backend.codegen import has_f64x4_form

    monkeypatch.setattr(vector_math, "REQUESTED", False)
    assert not has_f64x4_form(_scalar_program(lambda a, b: fold.exp(a) + b))
    assert has_f64x4_form(_scalar_program(lambda a, b: a * b - a))
