"""fold.kernels.cuda against plain Python folds: operands kept in order (non-commutative operators, ties), sizes
either side of a block's span and of each level of block totals, 0 included, mixed leaf dtypes, device
arrays in and out, and the drivers' errors. Runs on Numba's CUDA simulator where there is no GPU (`make
test` sets NUMBA_ENABLE_CUDASIM=1)."""

from __future__ import annotations

import importlib
import math
import sys

import numpy as np
import pytest

cuda = pytest.importorskip("numba.cuda")
if not cuda.is_available():
    pytest.skip("no CUDA GPU, and NUMBA_ENABLE_CUDASIM is not set", allow_module_level=True)

import fold.kernels.cuda as kc  # noqa: E402


@cuda.jit(device=True)
def affine(a0, a1, b0, b1):
    """x -> a0 x + a1, then x -> b0 x + b1: the composition, associative and not commutative."""
    return a0 * b0, b0 * a1 + b1


@cuda.jit(device=True)
def first_max(v, i, w, j):
    """(value, index) of the larger, the earlier on ties: the answer depends on the operands' order."""
    return (w, j) if w > v else (v, i)


@cuda.jit(device=True)
def first_nonzero(a, b):
    return a if a != 0 else b


@cuda.jit(device=True)
def scaled_pair(c, x, y):
    return c * x + y, x > y


def _wide_sum_source(k: int) -> str:
    a, b = [f"a{j}" for j in range(k)], [f"b{j}" for j in range(k)]
    return f"def wide_sum({', '.join(a + b)}):\n    return ({', '.join(f'{x} + {y}' for x, y in zip(a, b))},)\n"


_namespace: dict = {}
exec(_wide_sum_source(64), _namespace)
wide_sum = cuda.jit(device=True)(_namespace["wide_sum"])  # elements of 64 float64 leaves: 512 bytes


def python_scan(op, identity, leaves, exclusive=False, reverse=False):
    """Every prefix (suffix) of the elements, one at a time, as the definition says."""
    n = len(leaves[0])
    out = [np.empty(n, a.dtype) for a in leaves]
    acc = tuple(identity)
    for i in (range(n - 1, -1, -1) if reverse else range(n)):
        x = tuple(a[i] for a in leaves)
        if exclusive:
            for o, v in zip(out, acc):
                o[i] = v
        acc = op(*x, *acc) if reverse else op(*acc, *x)
        acc = acc if isinstance(acc, tuple) else (acc,)
        if not exclusive:
            for o, v in zip(out, acc):
                o[i] = v
    return out, acc


def py(fn):
    return getattr(fn, "py_func", fn)


# threads=4, items=2: a block spans 8 elements, and more than 64 need a second level of block totals
SIZES = [0, 1, 7, 8, 9, 63, 64, 65, 200]
rng = np.random.default_rng(3)


def affine_leaves(n):
    return [rng.uniform(0.8, 1.2, n), rng.uniform(-1.0, 1.0, n)]


@pytest.mark.parametrize("n", SIZES)
def test_reduce_keeps_a_non_commutative_operator_in_order(n):
    leaves = affine_leaves(n)
    got = kc.reduce(affine, 2, (1.0, 0.0), leaves, threads=4, items=2)
    _, expected = python_scan(py(affine), (1.0, 0.0), leaves)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", SIZES)
def test_reduce_of_mixed_dtypes_gives_the_first_maximum(n):
    values = rng.integers(0, 4, n).astype(np.float64)  # many ties
    index = np.arange(n, dtype=np.int64)
    got = kc.reduce(first_max, 2, (-np.inf, -1), [values, index], threads=4, items=2)
    expected = (values.max(), int(np.argmax(values))) if n else (-np.inf, -1)
    assert got == expected and got[1].dtype == np.int64


@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 129])
def test_reduce_with_the_default_launch(n):
    x = np.where(rng.uniform(size=n) < 0.9, 0, rng.integers(1, 100, n)).astype(np.int32)
    got = kc.reduce(first_nonzero, 1, (0,), [x])
    nonzero = x[x != 0]
    assert got == ((nonzero[0] if nonzero.size else 0),) and got[0].dtype == np.int32


@cuda.jit(device=True)
def add(a, b):
    return a + b


@pytest.mark.parametrize("blocks", [1, 3])
@pytest.mark.parametrize("n", SIZES)
def test_reduce_walks_many_tiles_per_block_in_order(n, blocks):
    """A bounded grid: with 3 blocks of 8-element tiles, 200 elements are 25 tiles, 9 a block, each block
    folding its tiles first to last; the 3 totals are then folded by one block (exactly two launches)."""
    leaves = affine_leaves(n)
    got = kc.reduce(affine, 2, (1.0, 0.0), leaves, threads=4, items=2, blocks=blocks)
    _, expected = python_scan(py(affine), (1.0, 0.0), leaves)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("items", [1, 3])
@pytest.mark.parametrize("blocks", [1, 3])
@pytest.mark.parametrize("n", SIZES)
def test_a_commutative_reduce_reads_in_grid_stride_order_and_misses_nothing(n, blocks, items):
    """Integers: the grid-stride sum is exact, so one element read twice or missed changes the answer."""
    x = rng.integers(-1000, 1000, n).astype(np.int64)
    got = kc.reduce(add, 1, (0,), [x], threads=4, items=items, blocks=blocks, commutative=True)
    assert got == (x.sum(),)


def test_reduce_can_leave_its_result_on_the_device(monkeypatch):
    """keep_on_device: one-element device arrays, no copy to the host (copy_to_host is never called)."""
    x = rng.integers(-1000, 1000, 100).astype(np.int64)
    on_device = [cuda.to_device(x)]
    for n, commutative in ((100, True), (100, False), (0, True)):
        got = kc.reduce(add, 1, (0,), [a[:n] for a in on_device], threads=4, items=2, commutative=commutative,
                        keep_on_device=True)
        assert len(got) == 1 and not isinstance(got[0], np.ndarray) and tuple(got[0].shape) == (1,)
        assert got[0].copy_to_host()[0] == x[:n].sum()
    with pytest.raises(ValueError, match="keep_on_device: the leaves are NumPy arrays"):
        kc.reduce(add, 1, (0,), [x], keep_on_device=True)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("n", SIZES)
def test_scan_gives_every_prefix_in_order(n, exclusive, reverse):
    leaves = affine_leaves(n)
    got = kc.scan(affine, 2, (1.0, 0.0), leaves, exclusive, reverse, threads=4, items=2)
    expected, _ = python_scan(py(affine), (1.0, 0.0), leaves, exclusive, reverse)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("n", [1, 9, 65, 200])
def test_scan_of_float32_and_int64_leaves_keeps_ties_first(n, reverse):
    values = rng.integers(0, 5, n).astype(np.float32)
    leaves = [values, np.arange(n, dtype=np.int64)]
    got = kc.scan(first_max, 2, (-np.inf, -1), leaves, reverse=reverse, threads=8, items=3)
    expected, _ = python_scan(py(first_max), (-np.inf, -1), leaves, reverse=reverse)
    assert [g.dtype for g in got] == [np.float32, np.int64]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("n", [16, 17, 100])
def test_deep_levels_of_block_totals(n):
    """Blocks of 2 threads x 2 items: 17 elements are 5 blocks, whose totals are 2 blocks, then 1."""
    leaves = affine_leaves(n)
    expected, total = python_scan(py(affine), (1.0, 0.0), leaves, exclusive=True, reverse=True)
    np.testing.assert_allclose(kc.reduce(affine, 2, (1.0, 0.0), leaves, threads=2, items=2), total, rtol=1e-12)
    for g, e in zip(kc.scan(affine, 2, (1.0, 0.0), leaves, True, True, threads=2, items=2), expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)


def test_device_arrays_stay_on_the_device():
    leaves = affine_leaves(100)
    on_device = [cuda.to_device(a) for a in leaves]
    scanned = kc.scan(affine, 2, (1.0, 0.0), on_device, threads=4, items=2)
    assert not any(isinstance(s, np.ndarray) for s in scanned)
    expected, total = python_scan(py(affine), (1.0, 0.0), leaves)
    for s, e in zip(scanned, expected, strict=True):
        np.testing.assert_allclose(s.copy_to_host(), e, rtol=1e-12)
    np.testing.assert_allclose(kc.reduce(affine, 2, (1.0, 0.0), on_device, threads=4, items=2), total,
                               rtol=1e-12)
    (mapped, greater) = kc.map(scaled_pair, on_device, [np.float64, np.bool_], consts=(2.0,))
    np.testing.assert_allclose(mapped.copy_to_host(), 2.0 * leaves[0] + leaves[1])
    np.testing.assert_array_equal(greater.copy_to_host(), leaves[0] > leaves[1])


@pytest.mark.parametrize("n", [1, 5])
def test_broadcast_views_reach_the_gpu_without_zero_strides(n, monkeypatch):
    """A captured scalar carried along the elements is a broadcast view (stride 0), and a reverse scan reads
    x[::-1] (stride -8); NumPy counts either as contiguous when it has one element, and Numba's copy to a
    real GPU failed on them ("incompatible shape: (0,) vs. (1,)", seen on an H100 only, not on the
    simulator), so every host array must reach cuda.to_device with C order's strides."""
    sent = []
    original = kc.host.cuda.to_device

    def recording(a, *args, **kwargs):
        sent.append(a)
        return original(a, *args, **kwargs)

    monkeypatch.setattr(kc.host.cuda, "to_device", recording)
    x, c = rng.normal(size=n)[::-1], np.broadcast_to(np.float64(0.5), (n,))
    (scanned,) = kc.scan(first_nonzero, 1, (0.0,), [c], threads=4, items=2)
    (mapped, greater) = kc.map(scaled_pair, [x, c], [np.float64, np.bool_], consts=(2.0,))
    np.testing.assert_array_equal(scanned, np.full(n, 0.5))
    np.testing.assert_allclose(mapped, 2.0 * x + 0.5)
    assert sent and all(a.strides == (a.itemsize,) for a in sent), [a.strides for a in sent]


@pytest.mark.parametrize("n", [0, 1, 31, 32, 33, 100])
def test_map_calls_the_mapper_with_the_constants_first(n):
    x, y = rng.normal(size=n), rng.normal(size=n)
    mapped, greater = kc.map(scaled_pair, [x, y], [np.float64, np.bool_], consts=(-3.0,))
    np.testing.assert_allclose(mapped, -3.0 * x + y, rtol=1e-15, atol=1e-15)  # a GPU fuses it into one fma
    np.testing.assert_array_equal(greater, x > y)
    assert greater.dtype == np.bool_


def test_kernels_allocate_their_arrays_with_the_installed_allocator():
    """The cuda backend installs CuPy's memory pool (device.use_memory_pool); every kernel's results and
    scratch arrays come from the installed allocator, and Numba's own is back after use_allocator(None)."""
    made = []

    def allocate(shape, dtype):
        made.append((shape, np.dtype(dtype)))
        return cuda.device_array(shape, dtype)

    x, y = rng.normal(size=40), rng.normal(size=40)
    kc.host.use_allocator(allocate)
    try:
        mapped, _ = kc.map(scaled_pair, [x, y], [np.float64, np.bool_], consts=(2.0,))
        kc.reduce(affine, 2, (1.0, 0.0), affine_leaves(40))
        kc.map_over(shifted_exp_and_sign, [cuda.to_device(x), cuda.to_device(y)], (40,), [np.float64, np.bool_])
    finally:
        kc.host.use_allocator(None)
    np.testing.assert_allclose(mapped, 2.0 * x + y)
    assert ((40,), np.dtype(np.float64)) in made and ((40,), np.dtype(np.bool_)) in made
    assert len(made) >= 5, made  # map's two results, the reduce's block totals, map_over's two
    count = len(made)
    kc.map(scaled_pair, [x, y], [np.float64, np.bool_], consts=(2.0,))
    assert len(made) == count


@pytest.mark.parametrize("call, message", [
    (lambda: kc.reduce(affine, 2, (1.0, 0.0), affine_leaves(9), threads=6), "power of two"),
    (lambda: kc.reduce(affine, 2, (1.0, 0.0), affine_leaves(9), items=0), "items must be an integer >= 1"),
    (lambda: kc.reduce(affine, 2, (1.0, 0.0), affine_leaves(9)[:1]), "expected a sequence of 2 arrays, got 1 arrays"),
    (lambda: kc.scan(affine, 2, (1.0, 0.0), [np.ones(3), np.ones(4)]), "one length, got [3, 4]"),
    (lambda: kc.scan(affine, 2, (1.0, 0.0), [np.ones(3), cuda.to_device(np.ones(3))]), "mix NumPy and device"),
    (lambda: kc.reduce(first_nonzero, 1, (0.5,), [np.ones(3, np.int32)]), "0.5 is not representable"),
    (lambda: kc.reduce(first_nonzero, 1, (0,), [np.ones((3, 2))]), "must be 1-D, got shape (3, 2)"),
    (lambda: kc.map(scaled_pair, [], [np.float64]), "at least one input"),
    (lambda: kc.reduce(affine, 2, (1.0, 0.0), affine_leaves(9), threads=4096), "power of two from 1 to 1024"),
    (lambda: kc.reduce(affine, 2, (1.0, 0.0), affine_leaves(9), threads=1, items=1),
     "a block must span at least 2 elements, so that each level of block totals is shorter than the last"),
    (lambda: kc.scan(affine, 2, (1.0, 0.0), affine_leaves(9), threads=True), "power of two from 1 to 1024, got True"),
    (lambda: kc.reduce(first_nonzero, 1, (2**40,), [np.ones(3, np.int32)]),
     "identity[0] = 1099511627776 does not convert to the leaf's dtype int32"),
    (lambda: kc.reduce(first_nonzero, 2, (0, 0), [np.ones(3)] * 2), "combine must take 4 scalars, but first_nonzero takes 2"),
    (lambda: kc.map(scaled_pair, [np.ones(3)], [np.float64]), "mapper must take 1 scalars, but scaled_pair takes 3"),
    (lambda: kc.map(scaled_pair, np.ones((2, 3)), [np.float64]), "inputs: expected a sequence of arrays, got one array"),
    (lambda: kc.histogram(affine, 2, (1.0, 0.0), 3, np.ones((5, 1), np.int64), affine_leaves(5)),
     "indices must be a 1-D integer array, got shape (5, 1), dtype int64"),
    (lambda: kc.histogram(affine, 2, (1.0, 0.0), True, np.ones(5, np.int64), affine_leaves(5)),
     "n_bins must be an integer >= 0, got True"),
    (lambda: kc.reduce(wide_sum, 64, (0.0,) * 64, [np.ones(3)] * 64, threads=128),
     "threads=128 blocks of 512-byte elements need 65536 bytes of shared memory, more than 49152"),
    (lambda: kc.segmented_reduce(affine, 2, (1.0, 0.0), [np.ones((2, 3)), np.ones((3, 2))]), "one shape, got [(2, 3), (3, 2)]"),
])
def test_bad_arguments_are_named(call, message):
    with pytest.raises((ValueError, TypeError)) as err:
        call()
    assert message in str(err.value)


@pytest.mark.parametrize("rows, length", [(0, 5), (3, 0), (1, 1), (4, 7), (5, 8), (3, 9), (2, 33)])
def test_segmented_reduce_folds_each_row_in_order(rows, length):
    a, b = rng.uniform(0.8, 1.2, (rows, length)), rng.uniform(-1.0, 1.0, (rows, length))
    got = kc.segmented_reduce(affine, 2, (1.0, 0.0), [a, b], threads=8)
    for r in range(rows):
        _, expected = python_scan(py(affine), (1.0, 0.0), [a[r], b[r]])
        np.testing.assert_allclose([got[0][r], got[1][r]], expected, rtol=1e-12, atol=1e-12)
    assert got[0].shape == (rows,)


def test_segmented_reduce_of_device_rows_gives_device_results():
    values = rng.integers(0, 3, (6, 40)).astype(np.float64)
    index = np.broadcast_to(np.arange(40, dtype=np.int64), (6, 40)).copy()
    got = kc.segmented_reduce(first_max, 2, (-np.inf, -1), [cuda.to_device(values), cuda.to_device(index)])
    np.testing.assert_array_equal(got[0].copy_to_host(), values.max(axis=1))
    np.testing.assert_array_equal(got[1].copy_to_host(), values.argmax(axis=1))


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("rows, length", [(0, 5), (3, 0), (1, 1), (4, 7), (3, 9), (2, 33)])
def test_segmented_scan_gives_each_rows_prefixes(rows, length, exclusive, reverse):
    a, b = rng.uniform(0.8, 1.2, (rows, length)), rng.uniform(-1.0, 1.0, (rows, length))
    got = kc.segmented_scan(affine, 2, (1.0, 0.0), [a, b], exclusive, reverse, threads=8)
    assert got[0].shape == (rows, length)
    for r in range(rows):
        expected, _ = python_scan(py(affine), (1.0, 0.0), [a[r], b[r]], exclusive, reverse)
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(g[r], e, rtol=1e-12, atol=1e-12)


def test_wide_elements_get_blocks_whose_partials_fit_in_shared_memory(monkeypatch):
    """64 float64 leaves: 512 bytes an element, so a GPU's default block of 256 threads becomes 64."""
    from fold.kernels.cuda import host

    dtypes = [np.dtype(np.float64)] * 64
    monkeypatch.setattr(host, "DEFAULT_THREADS", 256)
    assert host.launch(None, None, dtypes).threads == 64
    assert host.launch(None, None, dtypes[:2]).threads == 256
    monkeypatch.undo()
    leaves = [rng.normal(size=70) for _ in range(64)]
    got = kc.reduce(wide_sum, 64, (0.0,) * 64, leaves)
    np.testing.assert_allclose(got, [x.sum() for x in leaves], rtol=1e-12)


def python_histogram(op, identity, n_bins, indices, leaves):
    bins = [list(identity) for _ in range(n_bins)]
    for i, s in enumerate(indices):
        if 0 <= s < n_bins:
            r = op(*bins[s], *(a[i] for a in leaves))
            bins[s] = list(r) if isinstance(r, tuple) else [r]
    return [np.array([b[j] for b in bins], dtype=a.dtype) for j, a in enumerate(leaves)]


@pytest.mark.parametrize("workers", [None, 1, 3, 50])
@pytest.mark.parametrize("n, n_bins", [(0, 4), (5, 0), (1, 1), (40, 5), (203, 7)])
def test_histogram_folds_each_bin_in_order(n, n_bins, workers):
    indices = rng.integers(-2, n_bins + 2, n)  # some out of range: ignored
    leaves = affine_leaves(n)
    got = kc.histogram(affine, 2, (1.0, 0.0), n_bins, indices, leaves, workers=workers, threads=8)
    expected = python_histogram(py(affine), (1.0, 0.0), n_bins, indices, leaves)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == (n_bins,)
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.int32])
def test_histogram_of_a_sum_adds_atomically(dtype, monkeypatch):
    module = sys.modules["fold.kernels.cuda.histogram"]  # the package's `histogram` is the function
    monkeypatch.setattr(module, "_private_histograms", None)  # the atomic path must not need them
    indices = rng.integers(-1, 12, 300)
    values = rng.integers(-5, 6, 300).astype(dtype)
    (got,) = kc.histogram(None, 1, (0,), 11, indices, [values], operator="add")
    valid = (indices >= 0) & (indices < 11)
    expected = np.bincount(indices[valid], weights=values[valid].astype(np.float64), minlength=11)
    np.testing.assert_array_equal(got, expected.astype(dtype))
    assert got.dtype == dtype


def test_histogram_with_ties_keeps_the_first_maximum_of_each_bin():
    indices = rng.integers(0, 6, 150)
    values, index = rng.integers(0, 3, 150).astype(np.float64), np.arange(150, dtype=np.int64)
    got = kc.histogram(first_max, 2, (-np.inf, -1), 6, cuda.to_device(indices),
                       [cuda.to_device(values), cuda.to_device(index)], workers=7)
    expected = python_histogram(py(first_max), (-np.inf, -1), 6, indices, [values, index])
    np.testing.assert_array_equal(got[1].copy_to_host(), expected[1])


def test_folds_own_launches_silence_only_numbas_low_occupancy_warning():
    """A small input's grid is small by design: on a GPU, Numba's "Grid size 1 will likely result in GPU
    under-utilization" (fewer than 128 blocks) raised as an error in a test's warnings filter and made the
    loop nests decline. The simulator never warns, so a kernel stand-in raises it with Numba's exact text."""
    import warnings

    from numba.core.errors import NumbaPerformanceWarning

    from fold.kernels.cuda.host import start

    class Kernel:
        def __getitem__(self, grid):
            self.grid = grid
            return self.run

        def run(self, *args):
            self.args = args
            warnings.warn(NumbaPerformanceWarning("\x1b[1mGrid size 1 will likely result in GPU under-utilization "
                                                  "due to low occupancy.\x1b[0m"))
            warnings.warn("a kernel's own warning", RuntimeWarning)

    kernel = Kernel()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="a kernel's own warning"):
            start(kernel, 1, 32, "a", 2)
    assert kernel.grid == (1, 32) and kernel.args == ("a", 2) and not seen


@cuda.jit(device=True)
def shifted_exp_and_sign(x, m):
    return math.exp(x - m), x > m


@pytest.mark.parametrize("shape", [(7,), (5, 9), (3, 4, 6), (2, 3, 2, 5), (0, 4), (40,), (3, 40), (2, 3, 33),
                                   (2, 2, 3, 35)])
@pytest.mark.parametrize("max_grid_y", [65535, 2])
def test_map_over_reads_broadcast_operands_in_place(shape, max_grid_y, monkeypatch):
    """Every index of an N-d shape, one operand full and one broadcast along all but one axis (stride 0,
    never expanded): a per-row maximum against a block of scores. A last axis of 32 or more is taken by
    rows (a 2-D grid); a grid of fewer rows than the shape's (max_grid_y = 2) loops over the rest."""
    monkeypatch.setattr(importlib.import_module("fold.kernels.cuda.map"), "MAX_GRID_Y", max_grid_y)
    x = rng.normal(size=shape)
    m_shape = shape[:1] + (1,) * (len(shape) - 1)
    m = rng.normal(size=m_shape)
    from fold.runtime.cuda_backend import device

    per_row = device.broadcast_view(device.to_device(m), shape)  # how the cuda backend passes it
    assert per_row.strides[1:] == (0,) * (len(shape) - 1)
    on_device = [device.for_kernel(device.to_device(x)), device.for_kernel(per_row)]
    shifted, above = kc.map_over(shifted_exp_and_sign, on_device, shape, [np.float64, np.bool_])
    np.testing.assert_allclose(shifted.copy_to_host(), np.exp(x - m), rtol=1e-15)
    np.testing.assert_array_equal(above.copy_to_host(), x > m)


@pytest.mark.parametrize("call, message", [
    (lambda: kc.map_over(shifted_exp_and_sign, [cuda.to_device(np.ones(3)), cuda.to_device(np.ones(4))], (3,),
                         [np.float64, np.bool_]), r"inputs\[1\] has shape \(4,\), not the map's \(3,\)"),
    (lambda: kc.map_over(shifted_exp_and_sign, [], (), [np.float64]), "1 to 4 dimensions, got ()"),
    (lambda: kc.map_over(shifted_exp_and_sign, [cuda.to_device(np.ones(3))] * 2, (3,), []), "at least one result"),
])
def test_map_over_names_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_blocks_threads_share_one_shared_array_on_the_simulator(monkeypatch):
    """Each thread writes its slot and reads its neighbour's after the barrier. On the simulator the
    allocation is slowed so that every thread reaches it before the first records it: unserialised (as
    Numba ships it), each thread got an array of its own and read garbage; tests/conftest.py serialises it."""
    from numba import config

    if not config.ENABLE_CUDASIM:
        pytest.skip("about Numba's CUDA simulator; on a GPU the kernel tests above cover shared memory")
    import time

    from numba.cuda.simulator import kernelapi

    class SlowEmpty:
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def empty(*args, **kwargs):
            time.sleep(0.01)
            return np.empty(*args, **kwargs)

    monkeypatch.setattr(kernelapi, "np", SlowEmpty())

    @cuda.jit
    def neighbours(out):
        t = cuda.threadIdx.x
        s = cuda.shared.array(16, np.float64)
        s[t] = t
        cuda.syncthreads()
        out[cuda.blockIdx.x, t] = s[(t + 1) % 16]

    out = np.full((3, 16), -1.0)
    neighbours[3, 16](out)
    np.testing.assert_array_equal(out, np.broadcast_to((np.arange(16) + 1) % 16, (3, 16)))
