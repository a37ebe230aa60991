"""Vector math (kernels.cpu.vector_math) and the kernels' use of lane forms (kernels.cpu.lanes).

- each vector function, in its four- and eight-lane forms, against NumPy's scalar function, on random
  values of several scales and on the special values (infinities, NaN, zeros of both signs, overflow and
  underflow), within 4 ulp as libmvec documents, the special values exactly; the same where vector math is
  not supported (a subprocess that compiles for a generic CPU: the functions fall back to libm, a call per
  lane);
- map, map_reduce, segmented_reduce, map_with_row_sums, map_with_column_sums and map_scan with a mapper whose registered lane form (of four lanes,
  and of eight) marks what it computes: exactly the elements the kernel should map a lane form's width at
  a time are marked, the rest come from the mapper; with a faithful lane form the results are exactly the
  mapper's; a float32 lambda's lane form has eight lanes, a float64 one's four;
- logsumexp's four-lane exp sum against NumPy at sizes around multiples of four and chunk boundaries.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import njit

import fold
import fold.kernels.cpu as kc
from fold.kernels.cpu import lanes, vector_math

ROOT = Path(__file__).resolve().parents[1]
W = lanes.WIDTH
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-300, -1e-300, 5e-324, 700.0, 710.0, -745.5, -1.0, 1.0,
                     -0.999999, 1e300, -1e300, 1e-17, 3.141592653589793, 1e6, -1e6])
REFERENCES = {"exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p, "sin": np.sin, "cos": np.cos,
              "tanh": np.tanh}


def _lanes_at_a_time(function, width: int):
    """njit (x, out) -> out[i:i+width] = function(x[i], ..., x[i+width-1]) for each whole `width` elements."""
    lanes = ", ".join(f"x[i + {lane}]" for lane in range(width))
    outs = ", ".join(f"out[i + {lane}]" for lane in range(width))
    scope = {"function": function}
    exec(f"def apply(x, out):\n    for i in range(0, x.shape[0] - {width - 1}, {width}):\n        {outs} = function({lanes})",
         scope)
    return njit(scope["apply"])


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(7)
    scales = [rng.uniform(-1, 1, 400) * s for s in (1e-8, 1.0, 30.0, 700.0)] + [rng.uniform(0, 5, 400), SPECIALS]
    x = np.concatenate(scales)
    return np.concatenate([x, np.zeros(-len(x) % max(vector_math.WIDTHS))])


def check_against_numpy() -> None:
    """Every vector function agrees with NumPy: special values exactly, the rest within libmvec's 4 ulp
    (float32: of NumPy's float64 result rounded to float32, as NumPy's float32 functions have errors of
    their own)."""
    for dtype in (np.float64, np.float32):
        with np.errstate(over="ignore"):  # 1e300 and the like are inf as float32
            x = _inputs().astype(dtype)
        for width in vector_math.WIDTHS:
            _check_functions(x, width)


def _check_functions(x: np.ndarray, width: int) -> None:
    for name, reference in REFERENCES.items():
        out = np.full_like(x, 12345.0)
        function = getattr(vector_math, vector_math.function_name(name, x.dtype.name, width))
        _lanes_at_a_time(function, width)(x, out)
        with np.errstate(all="ignore"):
            want = reference(x.astype(np.float64)).astype(x.dtype)
        same = (out == want) | (np.isnan(out) & np.isnan(want))
        finite = np.isfinite(want) & (want != 0)
        assert same[~finite].all(), f"{name}: {x[~finite & ~same]} -> {out[~finite & ~same]}, want {want[~finite & ~same]}"
        ulps = np.abs(out[finite] - want[finite]) / np.spacing(np.abs(want[finite]))
        assert ulps.max() <= 4, f"{name} {x.dtype} {width} lanes: {ulps.max()} ulp at x = {x[finite][np.argmax(ulps)]}"


def test_vector_functions_agree_with_numpy():
    assert set(REFERENCES) == set(vector_math.OPERATIONS)
    assert len(vector_math.NAMES) == len(set(vector_math.NAMES)) == len(REFERENCES) * 2 * len(vector_math.WIDTHS)
    check_against_numpy()


def test_without_vector_math_the_functions_fall_back_to_libm():
    code = ("import os, sys; sys.path[:0] = [os.getcwd(), 'tests']\n"
            "from fold.kernels.cpu import vector_math\n"
            "assert not vector_math.SUPPORTED and not vector_math.AVAILABLE\n"
            "import test_vector_math as t; t.check_against_numpy()\n"
            "import numpy as np, kernels.cpu as kc\n"
            "x = np.random.default_rng(1).normal(scale=30.0, size=100_003)\n"
            "assert abs(kc.logsumexp(x) - np.logaddexp.reduce(x)) <= 1e-13 * abs(np.logaddexp.reduce(x))\n")
    env = {"NUMBA_CPU_NAME": "generic", "FOLD_CACHE_DIR": "", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_fold_vector_math_0_turns_them_off_for_fold():
    code = "from fold.kernels.cpu import vector_math as v; print(v.SUPPORTED, v.AVAILABLE)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={"FOLD_VECTOR_MATH": "0", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == [str(vector_math.SUPPORTED), "False"], done.stderr[-2000:]


# ---------------------------------------------------------------- the kernels' use of lane forms

def _affine(x):  # 1 scalar in, 2 out
    return 3 * x + 1, x * x


def _lane_form(offset: int, width: int):
    """The `width`-lane form of _affine (each argument's lanes as one tuple), its first result `offset` more
    than the mapper's: 1000 shows which elements a kernel mapped through the lane form."""
    firsts = ", ".join(f"3 * x[{lane}] + {1 + offset}" for lane in range(width))
    squares = ", ".join(f"x[{lane}] * x[{lane}]" for lane in range(width))
    scope: dict = {}
    exec(f"def lanes(x):\n    return ({firsts}, {squares})", scope)
    return njit(scope["lanes"])


def _registered(offset: int, width: int):
    mapper = njit(_affine)
    lanes.register(mapper, _lane_form(offset, width), width)
    return mapper


# lane width -> (a faithful lane form's mapper, a marked one's): kernels take each form's own width
FORMS = {width: (_registered(0, width), _registered(1000, width)) for width in (lanes.WIDTH, lanes.WIDE)}
faithful, marked = FORMS[W]
plain = njit(_affine)
by_width = pytest.mark.parametrize("width", sorted(FORMS))


@njit
def add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


def test_lane_forms_are_registered_per_function():
    assert lanes.lane_form(plain) is None and lanes.lane_form(None) is None
    assert lanes.lane_form(faithful) is not lanes.lane_form(marked)
    assert lanes.lane_width(plain) == 0 and {lanes.lane_width(m) for m in FORMS[lanes.WIDE]} == {lanes.WIDE}


@pytest.mark.skipif(not vector_math.AVAILABLE, reason="no libmvec with AVX2 here: no lane forms")
def test_a_float32_lane_form_has_eight_lanes_a_float64_one_four():
    """float32 transcendentals fill an AVX2 register eight at a time; a body with a float64 one (or
    logaddexp, computed in float64) keeps four lanes."""
    from fold.runtime.numba_backend.codegen import compile_scalar_program

    def width(f, dtype):
        program = fold.trace(f, dtype(1.0), dtype(2.0))
        return lanes.lane_width(compile_scalar_program(program))

    assert width(lambda a, b: fold.exp(a) * b, np.float32) == lanes.WIDE
    assert width(lambda a, b: fold.exp(a) * b, np.float64) == lanes.WIDTH
    assert width(lambda a, b: fold.logaddexp(a, b), np.float64) == lanes.WIDTH
    assert width(lambda a, b: a * b, np.float32) == 0  # no transcendental: no lane form


@by_width
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 8, 11, 17, 1001, 100_003])
def test_map_maps_width_elements_per_lane_form_call(n, parallel, width):
    faithful, marked = FORMS[width]
    x = np.random.default_rng(n).integers(-50, 50, n)
    want = (3 * x + 1, x * x)
    for mapper in (faithful, plain):
        got = kc.map(mapper, 1, 2, [x], parallel=parallel)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    got = kc.map(marked, 1, 2, [x], parallel=parallel)
    vectored = width * (n // width)
    np.testing.assert_array_equal(got[0][:vectored], want[0][:vectored] + 1000)
    np.testing.assert_array_equal(got[0][vectored:], want[0][vectored:])
    np.testing.assert_array_equal(got[1], want[1])


@by_width
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("shape", [(3, 0), (2, 3), (5, 9), (300, 257)])
def test_map_2d_maps_width_columns_per_lane_form_call(shape, parallel, width):
    faithful, marked = FORMS[width]
    rows, cols = shape
    base = np.random.default_rng(cols).integers(-50, 50, (cols, rows))
    x = base.T  # a transposed view
    got = kc.map(marked, 1, 2, [x], parallel=parallel)
    vectored = width * (cols // width)
    np.testing.assert_array_equal(got[0][:, :vectored], 3 * x[:, :vectored] + 1001)
    np.testing.assert_array_equal(got[0][:, vectored:], 3 * x[:, vectored:] + 1)
    np.testing.assert_array_equal(got[1], x * x)


def _chunk_vectored(n: int, chunks: int, width: int) -> int:
    """How many elements map_reduce maps through a `width`-lane form: width * q of every chunk, q = len // width."""
    chunks = min(chunks, n)
    return sum(width * (((t + 1) * n // chunks - t * n // chunks) // width) for t in range(chunks))


@by_width
@pytest.mark.parametrize("chunks", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 3, 4, 7, 8, 17, 1001, 100_003])
def test_map_reduce_maps_width_elements_per_lane_form_call(n, chunks, width):
    faithful, marked = FORMS[width]
    x = np.random.default_rng(n).integers(-50, 50, n)
    want = (int((3 * x + 1).sum()), int((x * x).sum()))
    for mapper in (faithful, plain):
        assert kc.map_reduce(mapper, 1, add2, 2, (0, 0), [x], chunks=chunks) == want
    got = kc.map_reduce(marked, 1, add2, 2, (0, 0), [x], chunks=chunks)
    assert got == (want[0] + 1000 * _chunk_vectored(n, chunks, width), want[1])


@by_width
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("rows,n", [(3, 31), (5, 32), (7, 35), (64, 1001)])
def test_segmented_reduce_maps_width_elements_per_lane_form_call(rows, n, parallel, width):
    faithful, marked = FORMS[width]
    x = np.random.default_rng(rows * n).integers(-50, 50, (rows, n))
    want = ((3 * x + 1).sum(axis=1), (x * x).sum(axis=1))
    got = kc.segmented_reduce(faithful, add2, 2, (0, 0), [x], parallel=parallel)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    got = kc.segmented_reduce(marked, add2, 2, (0, 0), [x], parallel=parallel)
    laned = n >= 32  # shorter rows are one chain, mapped one element at a time
    np.testing.assert_array_equal(got[0], want[0] + (1000 * width * (n // width) if laned else 0))
    np.testing.assert_array_equal(got[1], want[1])


def _swapped(x):  # _affine's results the other way round: the row-sum kernel sums its last
    return x * x, 3 * x + 1


def _swapped_registered(offset: int, width: int):
    """_swapped with a `width`-lane form whose second result is `offset` more than the mapper's."""
    firsts = ", ".join(f"x[{lane}] * x[{lane}]" for lane in range(width))
    seconds = ", ".join(f"3 * x[{lane}] + {1 + offset}" for lane in range(width))
    scope: dict = {}
    exec(f"def lanes(x):\n    return ({firsts}, {seconds})", scope)
    mapper = njit(_swapped)
    lanes.register(mapper, njit(scope["lanes"]), width)
    return mapper


# the summing maps, each with the options that choose how it splits its rows: (kernel, axis summed, options)
SUMMING_MAPS = {
    "row sums, serial": ("map_with_row_sums", 1, {"parallel": False}),
    "row sums, parallel": ("map_with_row_sums", 1, {"parallel": True}),
    **{f"column sums, {c} chunks": ("map_with_column_sums", 0, {"chunks": c}) for c in (1, 2, 3)},
}


@by_width
@pytest.mark.parametrize("kind", sorted(SUMMING_MAPS))
@pytest.mark.parametrize("shape", [(3, 0), (2, 3), (5, 9), (7, 16), (300, 257)])
def test_summing_maps_map_width_columns_per_lane_form_call(shape, kind, width):
    """Along each row the first width * (columns // width) elements go through the lane form (marked: 1000
    more), the stored result and the summed one alike; the rest one at a time through the mapper. The sums
    (over each row, or down each column whatever the chunks) add exactly those."""
    name, axis, options = SUMMING_MAPS[kind]
    summing = getattr(kc, name)
    rows, cols = shape
    x = np.random.default_rng(cols).integers(-50, 50, (cols, rows)).T  # a transposed view
    vectored = width * (cols // width)
    marks = np.zeros(shape, np.int64)
    marks[:, :vectored] = 1000
    stored, sums = summing(FORMS[width][1], 1, 1, [x], **options)
    np.testing.assert_array_equal(stored[0][:, :vectored], 3 * x[:, :vectored] + 1001)
    np.testing.assert_array_equal(stored[0][:, vectored:], 3 * x[:, vectored:] + 1)
    np.testing.assert_array_equal(sums, (x * x).sum(axis=axis))
    stored, sums = summing(_swapped_registered(1000, width), 1, 1, [x], **options)
    np.testing.assert_array_equal(stored[0], x * x)
    np.testing.assert_array_equal(sums, (3 * x + 1 + marks).sum(axis=axis))
    stored, sums = summing(_swapped_registered(0, width), 1, 1, [x], **options)
    np.testing.assert_array_equal(sums, (3 * x + 1).sum(axis=axis))


@pytest.mark.parametrize("chunks", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 3, 4, 5, 8, 9, 1001, 100_003])
def test_logsumexp_of_four_lane_sums(n, chunks):
    x = np.random.default_rng(n).normal(scale=30.0, size=n)
    np.testing.assert_allclose(kc.logsumexp(x, chunks=chunks), np.logaddexp.reduce(x), rtol=1e-13)
    np.testing.assert_allclose(kc.logsumexp(x[::-3], chunks=chunks), np.logaddexp.reduce(x[::-3]), rtol=1e-13)


def _scan_lane_covered(n: int, chunks: int, width: int) -> np.ndarray:
    """Which elements a forward map_scan maps through a `width`-lane form: the first width * (len // width)
    of each of its chunks (T + 1 chunks for T > 1 threads' worth, else one)."""
    T = min(chunks, n)
    C = T + 1 if T > 1 else 1
    covered = np.zeros(n, bool)
    for c in range(C):
        lo, hi = c * n // C, (c + 1) * n // C
        covered[lo: lo + width * ((hi - lo) // width)] = True
    return covered


@by_width
@pytest.mark.parametrize("chunks", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 3, 4, 9, 1001, 100_003])
def test_map_scan_maps_width_elements_per_lane_form_call(n, chunks, width):
    faithful, marked = FORMS[width]
    x = np.random.default_rng(n).integers(-50, 50, n)
    elements = [3 * x + 1, x * x]
    for exclusive in (False, True):
        for reverse in (False, True):
            def reference(es):
                scanned = [np.cumsum(e[::-1])[::-1] if reverse else np.cumsum(e) for e in es]
                if exclusive:
                    scanned = [(np.concatenate([s[1:], [0]]) if reverse else np.concatenate([[0], s[:-1]])) for s in scanned]
                return scanned

            for mapper in (faithful, plain):
                got = kc.map_scan(mapper, 1, add2, 2, (0, 0), [x], exclusive, reverse, chunks=chunks)
                for g, w in zip(got, reference(elements), strict=True):
                    np.testing.assert_array_equal(g, w, err_msg=f"{mapper} exclusive={exclusive} reverse={reverse}")
    marked_elements = [elements[0] + 1000 * _scan_lane_covered(n, chunks, width), elements[1]]
    got = kc.map_scan(marked, 1, add2, 2, (0, 0), [x], chunks=chunks)
    np.testing.assert_array_equal(got[0], np.cumsum(marked_elements[0]))
    np.testing.assert_array_equal(got[1], np.cumsum(elements[1]))
