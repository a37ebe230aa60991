"""The Numba CPU kernel templates (kernels.cpu) against plain Python / NumPy references.

- reduce, map_reduce, scan (all four exclusive/reverse variants), histogram, segmented_reduce and map,
  at sizes 0, 1, 2, either side of the thread count, of explicit chunk counts and of the automatic
  chunking boundary (MIN_CHUNK * threads), and ~10^5;
- operators: add, mul, max (k = 1), the 2x2 matrix product (k = 4) and the linear-recurrence pair
  ((a1, b1), (a2, b2)) -> (a1 a2, a2 b1 + b2) (k = 2); the last two are not commutative, so any change of
  operand order shows up. int64 data makes them exact (wrap-around arithmetic is a ring);
- histograms with out-of-range indices, empty bins and a non-commutative operator, per bin against a
  sequential fold;
- clear errors for bad arguments; one compiled kernel per (template, functions, k, m);
- kernels/ imports nothing of fold, ad or runtime.

References: a sequential Python fold over the operator's py_func on NumPy scalars (the definition) for
small n, a vectorised NumPy tree (reduce) or Hillis-Steele (scan) over the same py_func for large n.
Compiled combines live at module level so each kernel compiles once per dtype for the whole file.
"""

from __future__ import annotations

import ast
import re
import importlib
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numba
import numpy as np
import pytest
from numba import njit

import fold.kernels.cpu as kc
from fold.kernels.cpu import host
from fold.kernels.cpu.histogram import histogram_threads
from fold.kernels.cpu.reduce import TILE, fold_kernel

ROOT = Path(__file__).resolve().parents[1]
THREADS = numba.get_num_threads()
MIN_CHUNK = host.MIN_CHUNK
SMALL = 300  # up to this size the reference is the sequential Python fold


# ---------------------------------------------------------------- operators (compiled once per file)

@njit
def add(a, b):
    return a + b


@njit
def add_tuple(a, b):  # k == 1 may also return a 1-tuple
    return (a + b,)


@njit
def mul(a, b):
    return a * b


@njit
def maximum(a, b):
    return np.maximum(a, b)


@njit
def matmul2(a00, a01, a10, a11, b00, b01, b10, b11):
    return (a00 * b00 + a01 * b10, a00 * b01 + a01 * b11,
            a10 * b00 + a11 * b10, a10 * b01 + a11 * b11)


@njit
def linrec(a1, b1, a2, b2):
    return a1 * a2, a2 * b1 + b2


@njit
def argmax(v1, i1, v2, i2):  # leaves of two dtypes; on ties the first index wins (not commutative)
    if v2 > v1:
        return v2, i2
    return v1, i1


@njit
def argmax_lowest(v1, i1, v2, i2):  # on ties the lower index wins wherever it is: commutative
    if v2 > v1 or (v2 == v1 and i2 < i1):
        return v2, i2
    return v1, i1


@njit
def square(x):
    return x * x


@njit
def shear(p, q):  # [[1, p], [0, 1]] @ [[1, 0], [q, 1]]: an integer matrix with determinant 1
    return 1 + p * q, p, q, 1


@njit
def to_linrec(p, q):
    return 2 * p + 1, q - p


# ---------------------------------------------------------------- data

def _rng(*key: Any) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _ints(rng, n, dtype, lo=-8, hi=8):
    return [rng.integers(lo, hi, n).astype(dtype)]


def _mul_data(rng, n, dtype):
    if np.dtype(dtype).kind == "f":
        return [rng.uniform(0.999, 1.001, n).astype(dtype)]
    return [rng.integers(-(1 << 20), 1 << 20, n).astype(dtype) | 1]  # odd: never 0 modulo 2^64


def _max_data(rng, n, dtype):
    return [rng.standard_normal(n).astype(dtype)] if np.dtype(dtype).kind == "f" \
        else [rng.integers(-10**6, 10**6, n).astype(dtype)]


def _matrix_data(rng, n, dtype):
    if np.dtype(dtype).kind == "f":  # random rotations and reflections: O(2) is not commutative, stays bounded
        theta, flip = rng.uniform(0, 2 * np.pi, n), rng.integers(0, 2, n) * 2 - 1
        c, s = np.cos(theta), np.sin(theta)
        return [c, -flip * s, s, flip * c]
    p, q = rng.integers(-3, 4, n), rng.integers(-3, 4, n)
    return [a.astype(dtype) for a in shear.py_func(p, q)[:3]] + [np.ones(n, dtype)]


def _linrec_data(rng, n, dtype):
    if np.dtype(dtype).kind == "f":
        return [rng.uniform(0.5, 1.0, n), rng.uniform(-1, 1, n)]
    return [rng.integers(-5, 6, n).astype(dtype) | 1, rng.integers(-100, 100, n).astype(dtype)]


class Op(NamedTuple):
    fn: Any
    k: int
    identity: Callable[[np.dtype], tuple]
    data: Callable[..., list]


OPS = {
    "add": Op(add, 1, lambda d: (0,), _ints),
    "add_tuple": Op(add_tuple, 1, lambda d: (0,), _ints),
    "mul": Op(mul, 1, lambda d: (1,), _mul_data),
    "max": Op(maximum, 1, lambda d: (-np.inf,) if d.kind == "f" else (np.iinfo(d).min,), _max_data),
    "matmul": Op(matmul2, 4, lambda d: (1, 0, 0, 1), _matrix_data),
    "linrec": Op(linrec, 2, lambda d: (1, 0), _linrec_data),
}


def _exact(op: str, dtype: np.dtype) -> bool:
    return dtype.kind in "iu" or op in ("add", "add_tuple", "max")  # add sums small integers: exact in floats


def _check(got, want, op, dtype, what):
    assert len(got) == len(want), what
    for j, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == dtype, f"{what}: leaf {j} has dtype {g.dtype}, expected {dtype}"
        if _exact(op, dtype):
            np.testing.assert_array_equal(g, w, err_msg=f"{what}: leaf {j}")
        else:
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9, err_msg=f"{what}: leaf {j}")


# ---------------------------------------------------------------- references

def _as_tuple(x):
    return tuple(x) if isinstance(x, tuple) else (x,)


def _swapped(fn, k):
    def swapped(*args):
        return fn(*args[k:], *args[:k])
    return swapped


def seq_fold(fn, identity, xs):
    acc = tuple(identity)
    with np.errstate(over="ignore"):
        for i in range(len(xs[0])):
            acc = _as_tuple(fn(*acc, *(x[i] for x in xs)))
    return acc


def tree_fold(fn, identity, xs):
    """Pairwise, order-preserving; the identity is used for n == 0 only (it is exact for every operator here)."""
    n = len(xs[0])
    if n == 0:
        return tuple(identity)
    with np.errstate(over="ignore"):
        while n > 1:
            m = n // 2
            pairs = _as_tuple(fn(*(x[0:2 * m:2] for x in xs), *(x[1:2 * m:2] for x in xs)))
            xs = [np.concatenate([p, x[n - 1:]]) if n % 2 else p for p, x in zip(pairs, xs, strict=True)]
            n = m + n % 2
    return tuple(x[0] for x in xs)


def fold_reference(fn, identity, xs):
    return seq_fold(fn, identity, xs) if len(xs[0]) <= SMALL else tree_fold(fn, identity, xs)


def inclusive_scan_reference(fn, xs):
    n = len(xs[0])
    if n <= SMALL:
        out, acc = [np.empty_like(x) for x in xs], None
        with np.errstate(over="ignore"):
            for i in range(n):
                elem = tuple(x[i] for x in xs)
                acc = elem if acc is None else _as_tuple(fn(*acc, *elem))
                for o, a in zip(out, acc, strict=True):
                    o[i] = a
        return out
    ys, d = [x.copy() for x in xs], 1  # Hillis-Steele
    with np.errstate(over="ignore"):
        while d < n:
            new = _as_tuple(fn(*(y[:-d] for y in ys), *(y[d:] for y in ys)))
            ys = [np.concatenate([y[:d], z]) for y, z in zip(ys, new, strict=True)]
            d *= 2
    return ys


def scan_reference(fn, k, identity, xs, exclusive, reverse):
    if reverse:
        fn, xs = _swapped(fn, k), [x[::-1] for x in xs]
    ys = inclusive_scan_reference(fn, xs)
    if exclusive:
        ys = [np.concatenate([np.array([e], y.dtype), y[:-1]])[:len(y)] for e, y in zip(identity, ys, strict=True)]
    return [y[::-1] for y in ys] if reverse else ys


# ---------------------------------------------------------------- sizes

def _sizes() -> list[tuple[int, int | None]]:
    """(n, chunks): None is the automatic choice (one chunk per thread, at least MIN_CHUNK elements each)."""
    auto = [0, 1, 2, THREADS - 1, THREADS, THREADS + 1, MIN_CHUNK - 1, MIN_CHUNK, MIN_CHUNK + 1,
            MIN_CHUNK * THREADS - 1, MIN_CHUNK * THREADS, MIN_CHUNK * THREADS + 1, 100_003]
    explicit = [(n, c) for c in (3, 8) for n in (c - 1, c, c + 1, 2 * c + 1, 1001)]
    return sorted({(n, None) for n in auto if n >= 0} | set(explicit), key=lambda c: (c[0], c[1] or 0))


SIZES = _sizes()
SIZE_IDS = [f"n{n}-{'auto' if c is None else f'c{c}'}" for n, c in SIZES]
F64, F32, I64 = np.dtype("float64"), np.dtype("float32"), np.dtype("int64")

REDUCE_CASES = [("add", F64), ("add", F32), ("add", I64), ("mul", F64), ("mul", I64), ("max", F32),
                ("max", I64), ("matmul", I64), ("matmul", F64), ("linrec", I64), ("linrec", F64)]
SCAN_CASES = [("add", F64), ("add", F32), ("add", I64), ("mul", I64), ("max", F64), ("matmul", I64),
              ("linrec", I64), ("linrec", F64)]


def _case(op_name, dtype, n, *key):
    op = OPS[op_name]
    xs = op.data(_rng(op_name, str(dtype), n, *key), n, dtype)
    ident = tuple(np.asarray(v).astype(xs[0].dtype)[()] for v in op.identity(dtype))
    return op, xs, ident


# ---------------------------------------------------------------- reduce

@pytest.mark.parametrize("n,chunks", SIZES, ids=SIZE_IDS)
@pytest.mark.parametrize("op_name,dtype", REDUCE_CASES, ids=[f"{o}-{d}" for o, d in REDUCE_CASES])
def test_reduce(op_name, dtype, n, chunks):
    op, xs, ident = _case(op_name, dtype, n)
    got = kc.reduce(op.fn, op.k, op.identity(dtype), xs, chunks=chunks)
    _check(got, fold_reference(op.fn.py_func, ident, xs), op_name, dtype, f"reduce {op_name} n={n} chunks={chunks}")


@pytest.mark.parametrize("n,chunks", [(0, None), (1, None), (5, 3), (1001, 8), (100_003, None)])
def test_reduce_combine_returning_1_tuple(n, chunks):
    op, xs, ident = _case("add_tuple", F64, n)
    got = kc.reduce(add_tuple, 1, (0.0,), xs, chunks=chunks)
    _check(got, (xs[0].sum(),), "add", F64, f"reduce add_tuple n={n}")


@pytest.mark.parametrize("n,chunks", [(0, None), (1, None), (9, 8), (1001, 3), (100_003, None)])
def test_leaves_of_different_dtypes(n, chunks):
    values = _rng("argmax", n).integers(-20, 20, n).astype(np.float64)  # many ties
    index = np.arange(n, dtype=np.int64)
    v, i = kc.reduce(argmax, 2, (-np.inf, -1), [values, index], chunks=chunks)
    assert (v.dtype, i.dtype) == (np.float64, np.int64)
    assert (v, i) == ((values.max(), values.argmax()) if n else (-np.inf, -1))
    running_v, running_i = kc.scan(argmax, 2, (-np.inf, -1), [values, index], chunks=chunks)
    assert (running_v.dtype, running_i.dtype) == (np.float64, np.int64)
    np.testing.assert_array_equal(running_v, np.maximum.accumulate(values))
    want_i = [int(np.argmax(values[:j + 1])) for j in range(min(n, SMALL))]
    np.testing.assert_array_equal(running_i[:len(want_i)], want_i)


def test_reduce_follows_the_thread_count():
    op, xs, ident = _case("matmul", I64, 3 * MIN_CHUNK + 5)
    want = fold_reference(matmul2.py_func, ident, xs)
    try:
        for threads in range(1, THREADS + 1):
            numba.set_num_threads(threads)
            assert host.num_chunks(len(xs[0]), None) == min(threads, 3)
            _check(kc.reduce(matmul2, 4, (1, 0, 0, 1), xs), want, "matmul", I64, f"threads={threads}")
    finally:
        numba.set_num_threads(THREADS)


# Commutative folds run in TILE lanes of consecutive elements: sizes either side of a tile and of the chunks
TILED_SIZES = sorted({(n, c) for c in (None, 1, 3) for n in (0, 1, TILE - 1, TILE, TILE + 1, 3 * TILE + 5, 1001, 100_003)},
                     key=lambda nc: (nc[0], nc[1] or 0))
TILED_IDS = [f"n{n}-{'auto' if c is None else f'c{c}'}" for n, c in TILED_SIZES]
COMMUTATIVE_CASES = [(o, d) for o, d in REDUCE_CASES if o in ("add", "mul", "max")]


@pytest.mark.parametrize("n,chunks", TILED_SIZES, ids=TILED_IDS)
@pytest.mark.parametrize("op_name,dtype", COMMUTATIVE_CASES, ids=[f"{o}-{d}" for o, d in COMMUTATIVE_CASES])
def test_commutative_reduce(op_name, dtype, n, chunks):
    op, xs, ident = _case(op_name, dtype, n)
    got = kc.reduce(op.fn, op.k, op.identity(dtype), xs, chunks=chunks, commutative=True)
    _check(got, fold_reference(op.fn.py_func, ident, xs), op_name, dtype, f"commutative reduce {op_name} n={n} chunks={chunks}")


@pytest.mark.parametrize("n,chunks", TILED_SIZES, ids=TILED_IDS)
def test_commutative_fold_of_two_leaves_and_of_mapped_elements(n, chunks):
    values = _rng("argmax_lowest", n).integers(-20, 20, n).astype(np.float64)  # many ties
    index = np.arange(n, dtype=np.int64)
    v, i = kc.reduce(argmax_lowest, 2, (-np.inf, -1), [values, index], chunks=chunks, commutative=True)
    assert (v.dtype, i.dtype) == (np.float64, np.int64)
    assert (v, i) == ((values.max(), values.argmax()) if n else (-np.inf, -1))
    x = _rng("square-add", n).standard_normal(n)
    (total,) = kc.map_reduce(square, 1, add, 1, (0.0,), [x], chunks=chunks, commutative=True)
    np.testing.assert_allclose(total, np.sum(x * x), rtol=1e-12, atol=1e-300)


def test_a_prepared_map_reduce_folds_new_arrays_of_its_dtypes_and_refuses_others():
    """kc.MapReduce checks its functions and dtypes once (the numba backend keeps one per statement); each
    call is map_reduce on new arrays, and an array of another dtype is refused, not compiled for."""
    fold_sq = kc.MapReduce(square, 1, add, 1, [F64], commutative=True)
    assert fold_sq.dtypes == [np.dtype(F64)]
    for n, chunks in [(0, None), (7, 1), (5000, 3)]:
        x = _rng("prepared", n).standard_normal(n)
        (total,) = fold_sq([x], (0.0,), chunks=chunks)
        assert total == kc.map_reduce(square, 1, add, 1, (0.0,), [x], chunks=chunks, commutative=True)
    with pytest.raises(TypeError, match=r"inputs\[0\] has dtype float32, but this fold was prepared for float64"):
        fold_sq([np.ones(4, np.float32)], (0.0,))
    with pytest.raises(ValueError, match="input_dtypes: expected 1 dtypes, got 2"):
        kc.MapReduce(square, 1, add, 1, [F64, F64])


INLINE_CASES = [("add", F64), ("add", F32), ("mul", F64), ("add", I64), ("mul", I64)]  # ints: the tiled path


@pytest.mark.parametrize("n,chunks", TILED_SIZES, ids=TILED_IDS)
@pytest.mark.parametrize("op_name,dtype", INLINE_CASES, ids=[f"{o}-{d}" for o, d in INLINE_CASES])
def test_inline_operator_reduce(op_name, dtype, n, chunks):
    """A fold naming its operator ("add", "mul") is written inline and reassociated: same results."""
    op, xs, ident = _case(op_name, dtype, n)
    got = kc.reduce(op.fn, 1, op.identity(dtype), xs, chunks=chunks, operator=op_name)
    _check(got, fold_reference(op.fn.py_func, ident, xs), op_name, dtype, f"inline {op_name} n={n} chunks={chunks}")
    x = _rng("square-add-inline", n).standard_normal(n)
    (total,) = kc.map_reduce(square, 1, add, 1, (0.0,), [x], chunks=chunks, operator="add")
    np.testing.assert_allclose(total, np.sum(x * x), rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize("op_name,specials,want", [
    ("add", {10: np.nan}, np.nan), ("add", {10: np.inf}, np.inf), ("add", {10: np.inf, 5000: -np.inf}, np.nan),
    ("mul", {10: np.nan}, np.nan), ("mul", {10: np.inf}, np.inf), ("mul", {10: 0.0, 5000: np.inf}, np.nan)])
def test_inline_operator_keeps_ieee_special_values(op_name, specials, want, chunks):
    """Reassociation only: NaN and infinities still propagate (no finite-math assumptions)."""
    x = np.full(10_001, 1.0)
    for i, v in specials.items():
        x[i] = v
    (got,) = kc.reduce(OPS[op_name].fn, 1, (0.0 if op_name == "add" else 1.0,), [x], chunks=chunks, operator=op_name)
    np.testing.assert_equal(got, want)


@pytest.mark.parametrize("op_name,packed", [("add", "addp"), ("mul", "mulp")])
def test_inline_operator_fold_is_vectorised(op_name, packed):
    """The point of naming the operator: LLVM vectorises the reassociable loop (packed SSE/AVX arithmetic)."""
    kernel = fold_kernel(OPS[op_name].fn, 1, square, 1, parallel=False, commutative=True, operator=op_name)
    kernel(1, np.ones(3), 0.0, np.empty(1))
    (asm,) = kernel.inspect_asm().values()
    assert re.search(rf"\bv?{packed}d\s", asm), f"no packed {packed}d in the {op_name} fold's assembly"


def test_inline_operator_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"operator must be one of \['add', 'mul'\] or None, got 'max'"):
        kc.reduce(add, 1, (0.0,), [np.ones(3)], operator="max")


# ---------------------------------------------------------------- map_reduce and map

MAP_REDUCE_CASES = [  # (mapper, m, input dtype, operator of the mapped elements)
    (square, 1, F64, "add"),
    (to_linrec, 2, I64, "linrec"),
    (shear, 2, I64, "matmul"),
]


@pytest.mark.parametrize("n,chunks", SIZES, ids=SIZE_IDS)
@pytest.mark.parametrize("mapper,m,dtype,op_name", MAP_REDUCE_CASES, ids=["square-add", "linrec", "shear-matmul"])
def test_map_reduce(mapper, m, dtype, op_name, n, chunks):
    op = OPS[op_name]
    inputs = [x.astype(dtype) for x in _ints(_rng("map_reduce", op_name, n), m * n, dtype, -3, 4)[0].reshape(m, n)]
    with np.errstate(over="ignore"):
        elems = [np.asarray(e, dtype) for e in _as_tuple(mapper.py_func(*inputs))]
    elems = [np.broadcast_to(e, (n,)).copy() for e in elems]  # shear's constant 1
    ident = tuple(dtype.type(v) for v in op.identity(dtype))
    got = kc.map_reduce(mapper, m, op.fn, op.k, op.identity(dtype), inputs, chunks=chunks)
    _check(got, fold_reference(op.fn.py_func, ident, elems), op_name, dtype, f"map_reduce {op_name} n={n}")


@pytest.mark.parametrize("parallel", [None, False, True])
@pytest.mark.parametrize("n", [0, 1, 2, THREADS + 1, 1001, 2 * MIN_CHUNK, 100_003])
def test_map(n, parallel):
    rng = _rng("map", n)
    p, q = rng.integers(-3, 4, n), rng.integers(-3, 4, n)
    got = kc.map(shear, 2, 4, [p, q], parallel=parallel)
    want = [np.broadcast_to(np.asarray(e), (n,)) for e in shear.py_func(p, q)]
    _check(got, want, "matmul", I64, f"map shear n={n}")
    x = rng.standard_normal(n).astype(np.float32)
    (y,) = kc.map(square, 1, 1, [x], parallel=parallel)
    assert y.dtype == np.float32  # the mapper's result type for float32 input
    np.testing.assert_array_equal(y, x * x)
    (z,) = kc.map(mul, 1, 1, [x], consts=[np.float64(-2.5)], parallel=parallel)  # a captured scalar first
    assert z.dtype == np.float64
    np.testing.assert_array_equal(z, -2.5 * x.astype(np.float64))


@pytest.mark.parametrize("parallel", [None, False, True])
@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (1, 1), (3, 7), (300, 257)])
def test_map_2d_reads_broadcast_and_strided_views(shape, parallel):
    rng = _rng("map2d", *shape)
    rows, cols = shape
    p_col = rng.integers(-3, 4, rows)
    q_full = rng.integers(-3, 4, (cols, rows)).T  # a transposed view: strides reversed
    p = np.broadcast_to(p_col[:, None], shape)  # stride 0 along j
    got = kc.map(shear, 2, 4, [p, q_full], parallel=parallel)
    want = [np.broadcast_to(np.asarray(e), shape) for e in shear.py_func(p.copy(), q_full.copy())]
    assert all(g.shape == shape for g in got)
    _check(got, want, "matmul", I64, f"map 2-D shear {shape}")
    out = [np.full(shape, -1, np.float64)]
    x = rng.standard_normal((cols,))
    kc.map(mul, 1, 1, [np.broadcast_to(x, shape)], consts=[np.float64(3.0)], parallel=parallel, out=out)
    np.testing.assert_array_equal(out[0], np.broadcast_to(3.0 * x, shape))


def test_map_errors_name_the_problem():
    x = np.zeros((4, 3))
    with pytest.raises(ValueError, match=r"all arrays must have one shape, got \[\(4, 3\), \(3, 4\)\]"):
        kc.map(shear, 2, 4, [x, x.T])
    with pytest.raises(ValueError, match=r"out\[0\] must be a writeable array of shape \(4, 3\) and dtype float64"):
        kc.map(mul, 1, 1, [x], consts=[np.float64(2.0)], out=[np.zeros((3, 4))])
    with pytest.raises(ValueError, match=r"inputs\[1\] must be 2-D, got shape \(3,\)"):
        kc.map(shear, 2, 4, [x, np.zeros(3)])


# ---------------------------------------------------------------- scan

@pytest.mark.parametrize("n,chunks", SIZES, ids=SIZE_IDS)
@pytest.mark.parametrize("op_name,dtype", SCAN_CASES, ids=[f"{o}-{d}" for o, d in SCAN_CASES])
def test_scan(op_name, dtype, n, chunks):
    op, xs, ident = _case(op_name, dtype, n)
    for exclusive in (False, True):
        for reverse in (False, True):
            got = kc.scan(op.fn, op.k, op.identity(dtype), xs, exclusive, reverse, chunks=chunks)
            want = scan_reference(op.fn.py_func, op.k, ident, xs, exclusive, reverse)
            _check(got, want, op_name, dtype,
                   f"scan {op_name} n={n} chunks={chunks} exclusive={exclusive} reverse={reverse}")


def test_scan_is_not_commutative_by_accident():
    """Guard the guard: the two non-commutative operators really give different results swapped."""
    for op_name in ("matmul", "linrec"):
        op, xs, ident = _case(op_name, I64, 50)
        swapped = fold_reference(_swapped(op.fn.py_func, op.k), ident, xs)
        assert fold_reference(op.fn.py_func, ident, xs) != swapped, op_name


def test_strided_leaves_are_read_and_out_columns_filled_in_place():
    """Leaves that are columns of one (n, k) array, and outputs that are columns of another: no copies."""
    op, xs, ident = _case("matmul", I64, 5001)
    packed = np.stack(xs, axis=1)
    columns = [packed[:, j] for j in range(4)]
    assert not columns[1].flags.c_contiguous
    _check(kc.reduce(op.fn, 4, op.identity(I64), columns, chunks=3), kc.reduce(op.fn, 4, op.identity(I64), xs), "matmul", I64, "strided reduce")
    target = np.zeros((5001, 4), np.int64)
    filled = kc.scan(op.fn, 4, op.identity(I64), columns, exclusive=True, out=[target[:, j] for j in range(4)])
    assert all(np.shares_memory(f, target) for f in filled)
    _check([target[:, j] for j in range(4)], scan_reference(op.fn.py_func, 4, ident, xs, True, False), "matmul", I64, "scan into columns")
    mapped = np.zeros((5001, 4), np.int64)
    kc.map(shear, 2, 4, [packed[:, 0], packed[:, 3]], out=[mapped[:, j] for j in range(4)])
    _check([mapped[:, j] for j in range(4)], kc.map(shear, 2, 4, [xs[0], xs[3]]), "matmul", I64, "map into columns")


def test_column_groups_follow_views_not_addresses():
    """Runs of columns of one array become one argument; arrays that merely lie evenly spaced in memory
    stay apart (a grouping that followed the allocator's placement would compile a kernel per placement)."""
    owner = np.zeros(40)
    grouped, sizes = host.column_groups([owner[:10], owner[10:20], owner[20:30]])
    assert sizes == (3,) and grouped[0].shape == (3, 10) and np.shares_memory(grouped[0], owner)
    raw = memoryview(bytearray(160))  # two arrays of two owners, the second right after the first
    first, second = np.frombuffer(raw[:80]), np.frombuffer(raw[80:])
    assert host._address(first) + 80 == host._address(second) and first.base is not second.base
    assert host.column_groups([first, second])[1] == (1, 1)
    table = np.zeros((10, 4))
    # columns 3 then 2 are a run too (a negative step); the same column twice is not
    runs, sizes = host.column_groups([np.ones(10), table[:, 0], table[:, 1], table[:, 3], table[:, 2], table[:, 2]])
    assert sizes == (1, 2, 2, 1) and runs[2].strides == (-8, 32) and np.shares_memory(runs[2], table)
    ints = np.zeros((10, 2), np.int64)
    assert host.column_groups([table[:, 0], ints[:, 0], ints[:, 1]])[1] == (1, 2)


@pytest.mark.parametrize("chunks", [1, 3, None])
def test_grouped_columns_and_packed_scratch_give_the_results_of_separate_arrays(chunks):
    """Leaves, others and outputs that are columns of one array reach the reduce and scan_pair_map kernels as
    one 2-D argument, and their scratch and identities of one dtype as one array (fewer arguments compile
    faster): the results are those of separate contiguous arrays, with leaves of two dtypes (not packed)
    too; the scan and histogram kernels read the same columns one argument each."""
    op, xs, ident = _case("matmul", I64, 100_003, "grouped")
    table = np.stack(xs, axis=1)
    mixed = [xs[0], table[:, 1], table[:, 2], xs[3]]  # groups of sizes 1, 2, 1
    y = _rng("grouped-y").integers(-3, 4, 100_003)
    ys = np.stack([y, 2 * y], axis=1)
    for leaves in ([table[:, j] for j in range(4)], mixed):
        _check(kc.reduce(op.fn, 4, op.identity(I64), leaves, chunks=chunks), kc.reduce(op.fn, 4, op.identity(I64), xs, chunks=chunks),
               "matmul", I64, "grouped reduce")
        into = np.zeros((100_003, 4), np.int64)
        kc.scan(op.fn, 4, op.identity(I64), leaves, chunks=chunks, out=[into[:, j] for j in range(4)])
        _check([into[:, j] for j in range(4)], kc.scan(op.fn, 4, op.identity(I64), xs, chunks=chunks), "matmul", I64, "grouped scan")
        pairs = np.zeros((100_003, 2), np.int64)
        kc.scan_pair_map(op.fn, 4, op.identity(I64), leaves, sandwich_of_two, 2, [ys[:, 0], ys[:, 1]], [np.int64(5)],
                         out=[pairs[:, 0], pairs[:, 1]], parallel=chunks != 1)
        want = kc.scan_pair_map(op.fn, 4, op.identity(I64), xs, sandwich_of_two, 2, [y, 2 * y], [np.int64(5)])
        _check([pairs[:, 0], pairs[:, 1]], want, "matmul", I64, "grouped scan_pair_map")
        indices = _rng("grouped-bins").integers(0, 7, 100_003)
        _check(kc.histogram(op.fn, 4, op.identity(I64), 7, indices, leaves, chunks=chunks),
               kc.histogram(op.fn, 4, op.identity(I64), 7, indices, xs, chunks=chunks), "matmul", I64, "grouped histogram")
    values = _rng("grouped-argmax").integers(-20, 20, 100_003).astype(np.float64)
    records = np.stack([values, values], axis=1)
    index = np.arange(100_003, dtype=np.int64)
    got = kc.reduce(argmax, 2, (-np.inf, -1), [records[:, 0], index], chunks=chunks)
    assert got == (values.max(), values.argmax())
    bins = kc.histogram(argmax, 2, (-np.inf, -1), 3, index % 3, [records[:, 1], index], chunks=chunks)
    np.testing.assert_array_equal(bins[0], [values[r::3].max() for r in range(3)])
    np.testing.assert_array_equal(bins[1], [r + 3 * int(np.argmax(values[r::3])) for r in range(3)])


# ---------------------------------------------------------------- map_scan

@njit
def linrec_tail(a1, b1, a2, b2):  # linrec's second leaf alone: forward, it reads only b of the accumulator
    return a2 * b1 + b2


@njit
def linrec_post(a, b, p, q):  # two outputs from the scan's value and the inputs at i
    return b * p + q, a - 2 * b


@njit
def linrec_tail_post(a, b, p, q):  # reads only the b leaf of the scan
    return b * p - q


def _map_scan_reference(xs, exclusive, reverse, post=None):
    op = OPS["linrec"]
    leaves = [np.asarray(v, np.int64) for v in to_linrec.py_func(*xs)]
    ys = scan_reference(op.fn.py_func, 2, (np.int64(1), np.int64(0)), leaves, exclusive, reverse)
    return ys if post is None else [np.asarray(v, np.int64) for v in _as_tuple(post.py_func(*ys, *xs))]


@pytest.mark.parametrize("n,chunks", SIZES, ids=SIZE_IDS)
def test_map_scan(n, chunks):
    """Mapped elements, a post map and a restricted final step, against the sequential reference (int64: exact)."""
    rng = _rng("map_scan", n)
    xs = [rng.integers(-3, 4, n), rng.integers(-5, 6, n)]
    for exclusive in (False, True):
        for reverse in (False, True):
            what = f"map_scan n={n} chunks={chunks} exclusive={exclusive} reverse={reverse}"
            got = kc.map_scan(to_linrec, 2, linrec, 2, (1, 0), xs, exclusive, reverse, chunks=chunks)
            _check(got, _map_scan_reference(xs, exclusive, reverse), "linrec", I64, what)
            got = kc.map_scan(to_linrec, 2, linrec, 2, (1, 0), xs, exclusive, reverse, post=linrec_post, r=2, chunks=chunks)
            _check(got, _map_scan_reference(xs, exclusive, reverse, linrec_post), "linrec", I64, what + " post")
            if not reverse:  # forward, b of the result needs only b of the accumulator
                got = kc.map_scan(to_linrec, 2, linrec, 2, (1, 0), xs, exclusive, reverse, post=linrec_tail_post, r=1,
                                  step=linrec_tail, live=(1,), chunks=chunks)
                _check(got, _map_scan_reference(xs, exclusive, reverse, linrec_tail_post), "linrec", I64, what + " step")


def test_map_scan_runs_serially_where_the_totals_pass_costs_too_much(monkeypatch):
    """With a restricted step, the parallel scan's totals compose whole elements (k leaves) where the serial
    pass computes only the live ones: parallel only while k / len(live) < 2 * threads (the 2 x 2 matrix
    recurrence of benchmark 1c, k = 20 with 4 live, runs serially on 2 threads, on 4 in parallel). Where it
    declines, map_scan runs one serial pass (same exact results); an explicit `chunks` is honoured."""
    scan_module = importlib.import_module("fold.kernels.cpu.scan")  # the package's `scan` is the function

    assert scan_module.parallel_pays(2, (1,), 2) and scan_module.parallel_pays(6, (4, 5), 2)
    assert not scan_module.parallel_pays(20, (16, 17, 18, 19), 2) and scan_module.parallel_pays(20, (16, 17, 18, 19), 4)
    assert scan_module.parallel_pays(20, None, 1)  # no step: nothing to save
    n = 4 * MIN_CHUNK * THREADS
    rng = _rng("map_scan serial", n)
    xs = [rng.integers(-3, 4, n), rng.integers(-5, 6, n)]
    want = _map_scan_reference(xs, False, False, linrec_tail_post)
    seen = []
    original = scan_module.scan_kernel
    monkeypatch.setattr(scan_module, "scan_kernel", lambda *a, **kw: seen.append(a[2]) or original(*a, **kw))
    for pays, chunks, parallel in ((True, None, THREADS > 1), (False, None, False), (False, 2, True)):
        monkeypatch.setattr(scan_module, "parallel_pays", lambda *a, _pays=pays: _pays)
        got = kc.map_scan(to_linrec, 2, linrec, 2, (1, 0), xs, post=linrec_tail_post, r=1, step=linrec_tail,
                          live=(1,), chunks=chunks)
        _check(got, want, "linrec", I64, f"map_scan pays={pays} chunks={chunks}")
        assert seen.pop() == parallel


def test_map_scan_without_mapper_is_scan_with_post():
    op, xs, ident = _case("linrec", I64, 5001)
    got = kc.map_scan(None, None, linrec, 2, (1, 0), xs, True, True, post=linrec_post, r=2, chunks=3)
    ys = scan_reference(op.fn.py_func, 2, ident, xs, True, True)
    _check(got, [np.asarray(v, np.int64) for v in linrec_post.py_func(*ys, *xs)], "linrec", I64, "map_scan, no mapper")


def test_map_scan_errors_name_the_problem():
    x = np.arange(10)
    with pytest.raises(ValueError, match=r"live must be distinct leaf indices in \[0, 2\) with step, got \(2,\)"):
        kc.map_scan(to_linrec, 2, linrec, 2, (1, 0), [x, x], step=linrec_tail, live=(2,))
    with pytest.raises(ValueError, match=r"post must return 1 value\(s\)"):
        kc.map_scan(to_linrec, 2, linrec, 2, (1, 0), [x, x], post=linrec_post, r=1)
    with pytest.raises(ValueError, match=r"mapper must return 3 value\(s\)"):
        kc.map_scan(to_linrec, 2, linrec, 3, (1, 0, 0), [x, x])
    with pytest.raises(ValueError, match=r"inputs: all arrays must have one shape"):
        kc.map_scan(to_linrec, 2, linrec, 2, (1, 0), [x, x[:9]])
    with pytest.raises(ValueError, match=r"got live=\(1,\) without a step"):
        kc.map_scan(to_linrec, 2, linrec, 2, (1, 0), [x, x], live=(1,))


# ---------------------------------------------------------------- scan_pair_map

@njit
def sandwich(c, a00, a01, a10, a11, b00, b01, b10, b11, y):  # tr(P S) y + c and (P S)[0, 0] of prefix P, suffix S
    return (a00 * b00 + a01 * b10 + a10 * b01 + a11 * b11) * y + c, a00 * b00 + a01 * b10


@njit
def linrec_sandwich(c, a1, b1, a2, b2, y):
    return a1 * a2 * y + b1 - 3 * b2 + c


@njit
def sandwich_of_two(c, a00, a01, a10, a11, b00, b01, b10, b11, y, z):  # sandwich's two results, with a second other
    return (a00 * b00 + a01 * b10 + a10 * b01 + a11 * b11) * y + c - z, a00 * b00 + a01 * b10 + z


@njit
def add_sandwich(c, a, b, y):
    return (a - 2 * b) * y + c


# one leaf (four segments per block), two (two segments), four (one); blocks of 37 leave a remainder to the
# last segment
@pytest.mark.parametrize("parallel", [None, False, True])
@pytest.mark.parametrize("block", [1, 37, None])
@pytest.mark.parametrize("n", [0, 1, 2, 7, 1001, 100_003])
@pytest.mark.parametrize("op_name,mapper,r", [("matmul", sandwich, 2), ("linrec", linrec_sandwich, 1), ("add", add_sandwich, 1)],
                         ids=["matmul", "linrec", "add"])
def test_scan_pair_map(op_name, mapper, r, n, block, parallel):
    """Against the two exclusive scans of the scan reference, mapped in NumPy (int64: exact, order-sensitive)."""
    op, xs, ident = _case(op_name, I64, n, "pair")
    y = _rng("pair-y", n).integers(-3, 4, n)
    prefix = scan_reference(op.fn.py_func, op.k, ident, xs, exclusive=True, reverse=False)
    suffix = scan_reference(op.fn.py_func, op.k, ident, xs, exclusive=True, reverse=True)
    want = [np.broadcast_to(np.asarray(w, np.int64), (n,)) for w in _as_tuple(mapper.py_func(np.int64(5), *prefix, *suffix, y))]
    options = {} if block is None else {"block": block}
    got = kc.scan_pair_map(op.fn, op.k, op.identity(I64), xs, mapper, r, [y], [np.int64(5)], parallel=parallel, **options)
    _check(got, want, op_name, I64, f"scan_pair_map {op_name} n={n} block={block} parallel={parallel}")


def test_scan_pair_map_errors_name_the_problem():
    x = np.arange(10.0)
    with pytest.raises(ValueError, match=r"others must have the leaves' shape \(10,\), got \(9,\)"):
        kc.scan_pair_map(linrec, 2, (1.0, 0.0), [x, x], linrec_sandwich, 1, [x[:9]], [1.0])
    with pytest.raises(ValueError, match=r"mapper must return 2 value\(s\)"):
        kc.scan_pair_map(linrec, 2, (1.0, 0.0), [x, x], linrec_sandwich, 2, [x], [1.0])


# ---------------------------------------------------------------- logsumexp

@pytest.mark.parametrize("chunks", [None, 1, 3])
@pytest.mark.parametrize("n", [1, 2, 1001, 100_003])
def test_logsumexp(n, chunks):
    x = _rng("logsumexp", n).normal(scale=30.0, size=n)
    want = np.logaddexp.reduce(x)
    np.testing.assert_allclose(kc.logsumexp(x, chunks=chunks), want, rtol=1e-13)
    np.testing.assert_allclose(kc.logsumexp(x[::-2], chunks=chunks), np.logaddexp.reduce(x[::-2]), rtol=1e-13)
    assert kc.logsumexp(x.astype(np.float32), chunks=chunks).dtype == np.float32


@pytest.mark.parametrize("chunks", [1, 3])
def test_logsumexp_edges(chunks):
    inf, nan = np.inf, np.nan
    for x in ([-inf, -inf, -inf, -inf], [1.0, inf, 2.0, 0.0], [1.0, -inf, 3.0, 0.5], [0.0, nan, inf, 1.0], [-inf, nan, 1.0, 2.0]):
        x = np.array(x)
        with np.errstate(invalid="ignore"):  # NumPy's own reference, on a NaN
            want = np.logaddexp.reduce(x)
        np.testing.assert_allclose(kc.logsumexp(x, chunks=chunks), want, rtol=1e-14, err_msg=str(x))
    assert kc.logsumexp(np.empty(0)) == -np.inf
    with pytest.raises(TypeError, match="x must be a float32 or float64 array, got dtype int64"):
        kc.logsumexp(np.arange(3))


@pytest.mark.parametrize("vector", [True, False])
@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize("order", ["ascending", "descending", "spikes", "jumps"])
def test_logsumexp_running_maximum(order, chunks, vector):
    """One pass over memory: the running maximum grows block after block (ascending: every block rescales
    the sum so far), or a few large values sit far apart; jumps: a block's values lie 650 (taken in the
    fast pass and rescaled), 705 (rescaling factor near underflow) and 1000 (the fast sum overflows) above
    the maximum so far, so the block is done again the exact way."""
    x = _rng("logsumexp-order", chunks).normal(scale=50.0, size=30_011)
    if order == "ascending":
        x.sort()
    elif order == "descending":
        x[::-1].sort()
    elif order == "spikes":
        x[[5, 9_000, 20_000, 30_010]] = [300.0, 400.0, 350.0, 700.0]
    else:
        x = _rng("logsumexp-jumps", chunks).normal(size=30_011)
        x[[4_100, 9_000, 9_001, 15_000, 25_000]] = [650.0, 1355.0, 1300.0, 2355.0, 2355.5]
    np.testing.assert_allclose(kc.logsumexp(x, chunks=chunks, vector=vector), np.logaddexp.reduce(x), rtol=1e-13)


@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize("specials", [{7_000: np.nan}, {7_000: np.inf}, {7_000: np.inf, 25_000: np.nan},
                                      {25_000: np.inf, 100: np.nan}, {3: -np.inf, 9_999: -np.inf, 29_000: -np.inf},
                                      {"all": -np.inf}, {"all": -np.inf, 12_345: 2.0}, {"all": np.inf}])
def test_logsumexp_special_values_in_long_arrays(specials, chunks):
    """inf, -inf and NaN past the first block, in arrays long enough to span many blocks and chunks."""
    x = _rng("logsumexp-specials", chunks).normal(size=30_011)
    for at, value in specials.items():
        if at == "all":
            x[:] = value
        else:
            x[at] = value
    with np.errstate(invalid="ignore"):
        want = np.logaddexp.reduce(x)
    for vector in (True, False):
        np.testing.assert_allclose(kc.logsumexp(x, chunks=chunks, vector=vector), want, rtol=1e-13, err_msg=str(specials))


# ---------------------------------------------------------------- column sums

@pytest.mark.parametrize("chunks", [None, 1, 3])
@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (1, 1), (3, 7), (2, 100_000), (1000, 64), (100_003, 3)])
def test_column_sums(shape, chunks):
    x = _rng("columns", *shape).integers(-8, 8, shape).astype(np.float64)  # integers: every order is exact
    got = kc.column_sums(x, chunks=chunks)
    assert got.dtype == np.float64 and got.shape == (shape[1],)
    np.testing.assert_array_equal(got, x.sum(axis=0))
    assert kc.column_sums(x.astype(np.float32), chunks=chunks).dtype == np.float32


def test_column_sums_errors_name_the_problem():
    with pytest.raises(TypeError, match="x must be a float32 or float64 array, got dtype int64"):
        kc.column_sums(np.ones((3, 2), np.int64))
    with pytest.raises(ValueError, match="must be C-contiguous"):
        kc.column_sums(np.ones((3, 4)).T)
    with pytest.raises(ValueError, match=r"must be 2-D, got shape \(3,\)"):
        kc.column_sums(np.ones(3))


# ---------------------------------------------------------------- histogram

HIST_CASES = [("add", F64), ("max", I64), ("linrec", I64), ("matmul", I64)]


def histogram_reference(fn, identity, n_bins, indices, xs):
    """Per bin, the sequential fold of its elements in input order, starting from the identity."""
    outs = [np.empty(n_bins, x.dtype) for x in xs]
    for b in range(n_bins):
        sel = indices == b
        for o, v in zip(outs, fold_reference(fn, identity, [x[sel] for x in xs]), strict=True):
            o[b] = v
    return outs


@pytest.mark.parametrize("n_bins", [1, 7, 50])
@pytest.mark.parametrize("n,chunks", [(0, None), (1, None), (2, None), (5, None), (9, 8), (17, 8), (1001, 1),
                                      (1001, 3), (1001, 8), (MIN_CHUNK * THREADS + 1, None), (100_003, None)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("op_name,dtype", HIST_CASES, ids=[f"{o}-{d}" for o, d in HIST_CASES])
def test_histogram(op_name, dtype, n, chunks, n_bins):
    op, xs, ident = _case(op_name, dtype, n, n_bins)
    indices = _rng("indices", n, n_bins).integers(-3, n_bins + 3, n)  # out-of-range indices on both sides
    got = kc.histogram(op.fn, op.k, op.identity(dtype), n_bins, indices, xs, chunks=chunks)
    want = histogram_reference(op.fn.py_func, ident, n_bins, indices, xs)
    _check(got, want, op_name, dtype, f"histogram {op_name} n={n} chunks={chunks} n_bins={n_bins}")


def test_histogram_empty_bins_hold_the_identity():
    xs = [np.array([2, 3, 5]), np.array([7, 11, 13])]
    got = kc.histogram(linrec, 2, (1, 0), 6, np.array([4, -1, 4]), xs)
    np.testing.assert_array_equal(got[0], [1, 1, 1, 1, 10, 1])  # bin 4: (2, 7) then (5, 13)
    np.testing.assert_array_equal(got[1], [0, 0, 0, 0, 5 * 7 + 13, 0])
    assert all(len(g) == 0 for g in kc.histogram(linrec, 2, (1, 0), 0, np.array([0, 1, 2]), [xs[0], xs[1]]))


def test_histogram_sequential_rule():
    assert histogram_threads(1000, 5) == 1  # too few elements for MIN_CHUNK per thread
    assert histogram_threads(10**6, 10**6) == 1  # private histograms would outweigh the work
    assert histogram_threads(MIN_CHUNK * THREADS, 5) == THREADS
    assert histogram_threads(10**7, 10**5) == min(THREADS, 10**7 // (4 * 10**5))


# ---------------------------------------------------------------- segmented reduce

@pytest.mark.parametrize("parallel", [None, False, True])
# rows of 31 / 32 / 35: just below the laned kernel, the shortest laned rows, laned rows with a remainder
@pytest.mark.parametrize("rows,n", [(0, 5), (3, 0), (1, 1), (THREADS + 1, 7), (5, 1000), (301, 3), (64, 1024),
                                    (3, 31), (7, 32), (5, 35)])
def test_segmented_reduce(rows, n, parallel):
    rng = _rng("segmented", rows, n)
    x = rng.integers(-8, 8, (rows, n)).astype(np.float64)
    (got,) = kc.segmented_reduce(None, add, 1, (0.0,), [x], parallel=parallel)
    np.testing.assert_array_equal(got, x.sum(axis=1))
    mats = [np.ascontiguousarray(a.reshape(rows, n)) for a in _matrix_data(rng, rows * n, I64)]
    got = kc.segmented_reduce(None, matmul2, 4, (1, 0, 0, 1), mats, parallel=parallel)
    _check(got, _rowwise_matmul_reference(mats), "matmul", I64, f"segmented rows={rows} n={n}")
    p, q = rng.integers(-3, 4, (rows, n)), rng.integers(-3, 4, (rows, n))
    got = kc.segmented_reduce(shear, matmul2, 4, (1, 0, 0, 1), [p, q], parallel=parallel)
    mapped = [np.broadcast_to(np.asarray(e), (rows, n)) for e in shear.py_func(p, q)]
    _check(got, _rowwise_matmul_reference(mapped), "matmul", I64, f"segmented with mapper rows={rows} n={n}")


def _rowwise_matmul_reference(mats):
    rows = [fold_reference(matmul2.py_func, (1, 0, 0, 1), [a[r] for a in mats]) for r in range(len(mats[0]))]
    return [np.array([row[j] for row in rows], np.int64) for j in range(4)]


# ---------------------------------------------------------------- errors and caching

def test_errors_name_the_problem():
    x, y = np.arange(10.0), np.arange(11.0)
    with pytest.raises(TypeError, match="combine must be a numba.njit-compiled function"):
        kc.reduce(add.py_func, 1, (0.0,), [x])
    with pytest.raises(ValueError, match="expected a sequence of 2 arrays, got 1"):
        kc.reduce(linrec, 2, (1.0, 0.0), [x])
    with pytest.raises(ValueError, match=r"one shape, got \[\(10,\), \(11,\)\]"):
        kc.reduce(linrec, 2, (1.0, 0.0), [x, y])
    with pytest.raises(ValueError, match="C-contiguous"):
        kc.segmented_reduce(None, add, 1, (0.0,), [np.ones((4, 6))[:, ::2]])
    with pytest.raises(ValueError, match=r"out\[0\] must be a writeable array of shape \(10,\) and dtype float64, got shape \(11,\)"):
        kc.scan(add, 1, (0.0,), [x], out=[y])
    with pytest.raises(ValueError, match="expected 2 output arrays, got 1"):
        kc.map(to_linrec, 2, 2, [x, x], out=[x.copy()])
    with pytest.raises(ValueError, match=r"identity\[0\] = -inf does not fit the element dtype int64"):
        kc.reduce(maximum, 1, (-np.inf,), [np.arange(3)])
    with pytest.raises(ValueError, match="identity must be a tuple of 2"):
        kc.reduce(linrec, 2, (1.0,), [x, x])
    with pytest.raises(ValueError, match=r"mapper must return 4 value\(s\), got 2"):
        kc.map(to_linrec, 2, 4, [x, x])
    with pytest.raises(TypeError, match="combine does not compile"):
        kc.reduce(add, 2, (0.0, 0.0), [x, x])  # add takes 2 scalars, a k = 2 combine gets 4
    with pytest.raises(TypeError, match="indices must have an integer dtype"):
        kc.histogram(add, 1, (0.0,), 3, x, [x])
    with pytest.raises(ValueError, match="chunks must be an integer >= 1"):
        kc.reduce(add, 1, (0.0,), [x], chunks=0)
    with pytest.raises(ValueError, match=r"consts\[0\] must be a real or boolean scalar, got array.*shape \(2,\)"):
        kc.map(mul, 1, 1, [x], consts=[np.ones(2)])


@njit
def hypot(a, b):  # associative on the non-negative reals, and a float64 even of integers
    return np.sqrt(a * a + b * b)


def test_bad_values_the_drivers_once_took_are_refused_by_name():
    """Each of these once ran: the output aliasing the input gave chunk-dependent scans, an integer leaf
    truncated a float combine's partial results (2 serially, 1 in two chunks), None became a NaN identity,
    float16 and longdouble reached Numba, and r without a post was ignored."""
    ones = np.ones(4, np.int64)
    with pytest.raises(TypeError, match=r"combine returns float64 for leaf 0, whose elements are int64"):
        kc.reduce(hypot, 1, (0,), [ones])
    with pytest.raises(TypeError, match=r"combine returns float64 for leaf 0"):
        kc.scan(hypot, 1, (0,), [ones], chunks=2)
    assert kc.reduce(hypot, 1, (0.0,), [ones.astype(np.float64)], chunks=2)[0] == 2.0  # float leaves: fine
    small = np.arange(5, dtype=np.int32)  # Numba adds int32 in int64: the same kind, cast back, allowed
    assert kc.reduce(add, 1, (0,), [small], chunks=2)[0] == 10
    x = np.arange(1, 30, dtype=np.int64)
    for options in ({"chunks": 1}, {"chunks": 2}, {"chunks": 2, "reverse": True}):
        with pytest.raises(ValueError, match=r"out\[0\] shares memory with input 0"):
            kc.scan(add, 1, (0,), [x], exclusive=True, out=[x], **options)
    with pytest.raises(ValueError, match=r"out\[0\] shares memory with input 0"):
        kc.map_scan(square, 1, add, 1, (0,), [x], out=[x[::-1]])
    with pytest.raises(ValueError, match=r"out\[0\] shares memory with input 0"):
        kc.scan_pair_map(add, 1, (0,), [x], add_sandwich, 1, [x.copy()], [np.int64(1)], out=[x])
    with pytest.raises(ValueError, match=r"out\[0\] shares memory with input 1"):
        kc.scan_pair_map(add, 1, (0,), [x.copy()], add_sandwich, 1, [x[::-1]], [np.int64(1)], out=[x[::-1]])
    table, index = np.arange(12.0).reshape(4, 3), np.array([3, 0, 2, 1])
    with pytest.raises(ValueError, match=r"out\[0\] shares memory with input 1"):  # a gathered table: any row
        kc.map(add, 2, 1, [table.copy(), table], rows=[None, index], out=[table])
    same = np.arange(12.0).reshape(4, 3)  # read and written at the same element: allowed
    assert kc.map(add, 2, 1, [same, table], rows=[None, index], out=[same])[0] is same
    np.testing.assert_array_equal(same, np.arange(12.0).reshape(4, 3) + table[index])
    evens, odds = np.arange(20, dtype=np.int64)[0::2], np.arange(20, dtype=np.int64)[1::2]
    assert kc.scan(add, 1, (0,), [evens], out=[odds])[0] is odds  # interleaved views share no element
    np.testing.assert_array_equal(odds, np.cumsum(np.arange(0, 20, 2)))
    with pytest.raises(ValueError, match=r"identity\[0\] = None is not a real or boolean scalar"):
        kc.reduce(add, 1, (None,), [np.arange(3.0)])
    with pytest.raises(ValueError, match=r"identity\[0\] = 0j is not a real or boolean scalar"):
        kc.reduce(add, 1, (0j,), [np.arange(3.0)])
    with pytest.raises(TypeError, match="x must be a float32 or float64 array, got dtype float16"):
        kc.logsumexp(np.ones(3, np.float16))
    with pytest.raises(TypeError, match="x must be a float32 or float64 array, got dtype float16"):
        kc.column_sums(np.ones((3, 2), np.float16))
    with pytest.raises(TypeError, match=r"combine: the kernels take boolean, integer, float32 and float64 values, got float128"):
        kc.reduce(add, 1, (0,), [np.ones(3, np.longdouble)])
    with pytest.raises(ValueError, match=r"r is the number of post's results; got r=3 without a post"):
        kc.map_scan(square, 1, add, 1, (0,), [x], r=3)
    with pytest.raises(ValueError, match=r"inputs: expected a sequence of 1 arrays, got one array"):
        kc.map(square, 1, 1, np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"inputs: expected a sequence of 2 arrays, got 1 arrays"):
        kc.map(mul, 2, 1, [np.ones((3, 4))], rows=[None, np.zeros(3, np.int64)])
    with pytest.raises(TypeError, match=r"others must be a sequence of 1-D arrays, got one array of shape \(28,\)"):
        kc.scan_pair_map(add, 1, (0,), [x[1:]], add_sandwich, 1, x[1:], [np.int64(1)])


# ---------------------------------------------------------------- carry: float32 folds kept in float64

@njit
def both_scans(prefix, suffix):
    return prefix + suffix


@njit
def doubled(acc, x):
    return acc * 2.0


@pytest.mark.parametrize("n,chunks", [(0, None), (1, None), (1001, 1), (1001, 3), (300_001, 1), (300_001, None)],
                         ids=lambda v: str(v))
def test_carry_folds_float32_in_float64(n, chunks):
    """With carry=(float64,) every driver folds float32 elements in float64 and rounds each result once (to
    within half a float32 ulp of the float64 fold). Without it, 0.8153 added 3 * 10^5 times in float32 on
    one chunk drifts by 1e-4: the test of the reduce shows the difference."""
    x, wide, carry = np.full(n, 0.8153, F32), np.full(n, 0.8153, F32).astype(F64), (F64,)
    half_ulp = 2.0 ** -24

    def close(got, want, dtype=F32):
        for g in got:
            assert g.dtype == dtype
        np.testing.assert_allclose(np.asarray(got[0], F64), want, rtol=half_ulp, atol=0)

    close(kc.reduce(add, 1, (0.0,), [x], chunks=chunks, carry=carry), wide.sum())
    close(kc.map_reduce(square, 1, add, 1, (0.0,), [x], chunks=chunks, carry=carry), (x * x).astype(F64).sum())
    close(kc.scan(add, 1, (0.0,), [x], chunks=chunks, carry=carry), np.cumsum(wide))
    close(kc.scan(add, 1, (0.0,), [x], True, True, chunks=chunks, carry=carry), np.cumsum(wide[::-1])[::-1] - wide)
    close(kc.map_scan(None, 1, add, 1, (0.0,), [x], post=doubled, r=1, chunks=chunks, carry=carry), 2 * np.cumsum(wide), F64)
    bins = np.arange(n) % 3
    close(kc.histogram(add, 1, (0.0,), 3, bins, [x], chunks=chunks, carry=carry), np.bincount(bins, wide, 3))
    close(kc.segmented_reduce(None, add, 1, (0.0,), [np.full((2, n), 0.8153, F32)], carry=carry), np.full(2, wide.sum()))
    close(kc.scan_pair_map(add, 1, (0.0,), [x], both_scans, 1, carry=carry), wide.sum() - wide, F64)
    if n == 300_001 and chunks == 1:
        (narrow,) = kc.reduce(add, 1, (0.0,), [x], chunks=1)
        assert abs(narrow / wide.sum() - 1) > 1e-5


def test_carry_errors_name_the_problem():
    x, i = np.ones(4, F32), np.ones(4, I64)
    with pytest.raises(ValueError, match=r"carry must be a sequence of 1 dtype\(s\) \(one per leaf\), got dtype\('float64'\)"):
        kc.reduce(add, 1, (0.0,), [x], carry=F64)
    with pytest.raises(ValueError, match=r"carry must be a sequence of 2 dtype\(s\)"):
        kc.scan(argmax, 2, (-np.inf, -1), [x, i], carry=(F64,))
    with pytest.raises(ValueError, match=r"carry\[0\] = float32 cannot carry leaf 0, whose elements are float64: it must "
                                         r"be float64 or a wider float"):
        kc.histogram(add, 1, (0.0,), 2, i, [x.astype(F64)], carry=(F32,))
    with pytest.raises(ValueError, match=r"carry\[1\] = float64 cannot carry leaf 1, whose elements are int64"):
        kc.segmented_reduce(None, argmax, 2, (-np.inf, -1), [x.reshape(2, 2), i.reshape(2, 2)], carry=(F64, F64))
    v, j = kc.reduce(argmax, 2, (-np.inf, -1), [x, i], carry=(F64, I64))  # a float leaf widened beside an int one
    assert (v.dtype, j.dtype, v, j) == (F32, I64, 1.0, 1)


def test_one_kernel_per_function_and_arity():
    assert fold_kernel(add, 1) is fold_kernel(add, 1)
    assert fold_kernel(add, 1) is not fold_kernel(mul, 1)
    assert fold_kernel(add, 1) is not fold_kernel(add, 1, square, 1)
    # the kernel these sizes run (one chunk each; the identity and the partials of one dtype packed)
    kernel = fold_kernel(matmul2, 4, parallel=False, layout=((1,) * 4, (4,), (4,)))
    for n in (5, 50, 500):
        kc.reduce(matmul2, 4, (1, 0, 0, 1), [np.ones(n, np.int64)] * 4)
    assert sum(1 for sig in kernel.signatures if sig[1] == numba.int64[::1]) == 1  # one compile for all sizes


# ---------------------------------------------------------------- the dependency rule

def test_kernels_import_nothing_of_ours():
    """kernels/ (installed as fold.kernels) is IR-blind: it imports only itself, Numba and NumPy. Importing it
    runs fold/__init__.py, as any subpackage's import runs its parent's, and nothing beyond that of fold's."""
    forbidden = {"fold", "ad", "runtime", "kernels", "tests", "benchmarks", "examples"}
    for path in sorted((ROOT / "kernels").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            ours = [n for n in names if n.split(".")[0] in forbidden and not n.startswith("fold.kernels")]
            assert not ours, f"{path.relative_to(ROOT)}:{node.lineno} imports {ours}"
    code = ("import sys; import fold; before = set(sys.modules); import fold.kernels.cpu; "
            "bad = sorted(m for m in set(sys.modules) - before if m.startswith('fold.') and not m.startswith('fold.kernels')); "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"importing fold.kernels.cpu loaded {result.stdout.strip()} {result.stderr[-2000:]}"
