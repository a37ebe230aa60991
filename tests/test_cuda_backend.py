"""The cuda backend against the numpy backend: user-operator reduces and scans (elements of scalars, tuples
and 2 x 2 matrices), maps, and the gradient programs whose scans and maps it lowers; what it does not lower
runs on numpy after one warning saying why. Runs on Numba's CUDA simulator where there is no GPU (`make
test` sets NUMBA_ENABLE_CUDASIM=1), at sizes that need several blocks and two levels of block totals."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

cuda = pytest.importorskip("numba.cuda")
if not cuda.is_available():
    pytest.skip("no CUDA GPU, and NUMBA_ENABLE_CUDASIM is not set", allow_module_level=True)

import fold  # noqa: E402
import fold.kernels.cuda as cuda_kernels  # noqa: E402
from helpers import assert_same  # noqa: E402
from fold.runtime.numba_backend import lowering as numba_lowering  # noqa: E402

rng = np.random.default_rng(5)
# the simulator's default block spans 64 elements: 300 needs 5 blocks and a scan of their totals (deeper
# levels of block totals are tested in test_cuda_kernels.py, with smaller blocks: the simulator is slow)
SIZES = [0, 1, 300]


@pytest.fixture
def cuda_calls(monkeypatch):
    """Counts the kernels.cuda drivers the backend calls, so a test can tell a kernel ran."""
    calls: dict[str, int] = {}
    for name in ("reduce", "scan", "map", "segmented_reduce", "segmented_scan", "histogram"):
        original = getattr(cuda_kernels, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(cuda_kernels, name, counted)
    return calls


class Declines:
    """The 'runs on the numpy backend' warnings given so far, read when asked (iterated, or tested for any)."""

    def __init__(self, caught: list):
        self.caught = caught

    def __iter__(self):
        return iter([str(w.message) for w in self.caught if "runs on the numpy backend" in str(w.message)])

    def __bool__(self) -> bool:
        return any(True for _ in self)

    def __repr__(self) -> str:
        return repr(list(self))


@pytest.fixture
def declines():
    """The warnings of the test's calls that a statement ran on numpy (each is given once per process: reset)."""
    numba_lowering._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield Declines(caught)


def on_both(f, *args):
    """f jitted on the numpy backend (the reference) and on the cuda backend, each applied to args."""
    return fold.jit(f, backend="numpy")(*args), fold.jit(f, backend="cuda")(*args)


def affine(a, b):
    (a0, a1), (b0, b1) = a, b
    return a0 * b0, b0 * a1 + b1


def matmul(a, b):
    return a @ b


FOLDS = {
    "a + b + a b": lambda x: fold.reduce(lambda a, b: a + b + a * b, x, identity=0.0),
    "affine maps": lambda x: fold.reduce(affine, (1.0 + 0.1 * x, x), identity=(1.0, 0.0)),
    "2 x 2 matrices": lambda x: fold.reduce(matmul, np.eye(2) + 0.05 * fold.map(lambda v: v * np.ones((2, 2)), x),
                                            identity=np.eye(2)),
    "logaddexp": lambda x: fold.reduce(fold.monoids.logaddexp, x),
    "scan": lambda x: fold.scan(lambda a, b: a + b + a * b, 0.01 * x, identity=0.0),
    "reverse exclusive scan of affine maps": lambda x: fold.scan(affine, (1.0 + 0.1 * x, x), identity=(1.0, 0.0),
                                                                 reverse=True, exclusive=True),
    "scan of 2 x 2 matrices": lambda x: fold.scan(matmul, np.eye(2) + 0.05 * fold.map(lambda v: v * np.ones((2, 2)), x),
                                                  identity=np.eye(2), reverse=True),
}


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", list(FOLDS))
def test_folds_run_as_cuda_kernels_and_agree_with_numpy(name, n, cuda_calls, declines):
    x = rng.uniform(-0.01, 0.01, n)
    expected, got = on_both(FOLDS[name], x)
    assert_same(expected, got, rtol=1e-11, scaled=True)
    kernel = "scan" if "scan" in name else "reduce"
    assert cuda_calls.get(kernel), cuda_calls
    assert not declines


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_other_dtypes_keep_their_dtype(dtype, cuda_calls):
    x = rng.integers(-3, 4, 500).astype(dtype)
    f = lambda x: (fold.reduce(lambda a, b: a + b, x * x, identity=0), fold.scan(fold.monoids.max, x))  # noqa: E731
    expected, got = on_both(f, x)
    for e, g in zip(expected, got, strict=True):
        assert g.dtype == e.dtype == dtype
        np.testing.assert_allclose(g, e, rtol=1e-6)
    assert cuda_calls.get("reduce") and cuda_calls.get("scan")


def test_maps_of_every_scalar_helper_run_on_cuda(cuda_calls, declines):
    """NumPy's semantics (NaN, log of 0 and of negatives, stable logaddexp and sigmoid, sign of 0) in the
    device functions, compiled from the numba backend's helpers."""
    x = np.array([-np.inf, -3.0, -1.0, -0.0, 0.0, 0.5, 2.0, np.inf, np.nan] * 4)

    def f(x):
        return fold.map(lambda v: (np.sign(v), np.log(v), np.log1p(v), np.sqrt(v), fold.sigmoid(v),
                                   np.maximum(v, 0.5), np.minimum(v, 0.5), np.logaddexp(v, 1.0)), x)

    expected, got = on_both(f, x)
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-15)
    assert cuda_calls.get("map") == 1 and not declines


def test_a_map_with_a_captured_value_and_vector_rows(cuda_calls, declines):
    rows, w = rng.normal(size=(300, 3)), rng.normal(size=3)

    def f(rows, w, c):
        return fold.map(lambda r: (fold.reduce(fold.monoids.sum, r * w) * c, r[0] > r[1]), rows)

    expected, got = on_both(f, rows, w, 1.5)
    assert_same(expected, got)
    assert got[1].dtype == np.bool_
    assert cuda_calls.get("map") and not declines


def test_gradients_of_the_generic_rules_run_their_scans_as_cuda_kernels(cuda_calls, declines):
    """The generic reduce rule is two exclusive scans and a map; the generic scan rule's adjoint is a reverse
    scan. The product's gradient is prod(x) / x, and the scan's is checked against the numpy backend."""
    x = rng.uniform(0.5, 1.5, 100)
    prod = lambda x: fold.reduce(lambda a, b: a * b, x, identity=1.0)  # noqa: E731
    (grad,) = fold.jit(lambda x: fold.vjp(prod, x, reduce_rule="generic")[1](1.0), backend="cuda")(x)
    np.testing.assert_allclose(grad, np.prod(x) / x, rtol=1e-12)
    assert cuda_calls.get("scan", 0) >= 2

    def scanned(x):
        return fold.reduce(fold.monoids.sum, fold.scan(lambda a, b: a + b + a * b, 0.1 * x, identity=0.0))

    expected, got = on_both(lambda x: fold.vjp(scanned, x, reduce_rule="generic")[1](1.0), x)
    assert_same(expected, got, rtol=1e-10)
    assert not declines


@pytest.mark.parametrize("rows, length", [(0, 20), (3, 0), (40, 20), (7, 150)])
def test_folds_per_row_run_as_the_segmented_kernels(rows, length, cuda_calls, declines):
    """Rows longer than a map body unrolls (16), so the map runs batched and its folds once per row; the
    2 x 2 matrices' product and the reverse scan keep each row's order."""
    x = rng.uniform(-0.05, 0.05, (rows, length))

    def f(x):
        per_row = fold.map(lambda r: fold.reduce(lambda a, b: a + b + a * b, r, identity=0.0), x)
        mats = fold.map(lambda r: fold.reduce(matmul, np.eye(2) + fold.map(lambda v: v * np.ones((2, 2)), r),
                                              identity=np.eye(2)), x)
        suffixes = fold.map(lambda r: fold.scan(affine, (1.0 + r, r), identity=(1.0, 0.0), reverse=True), x)
        return per_row, mats, suffixes

    expected, got = on_both(f, x)
    assert_same(expected, got, rtol=1e-11, scaled=True)
    assert cuda_calls.get("segmented_reduce") == 2 and cuda_calls.get("segmented_scan") == 1 and not declines


def test_a_per_row_gradient_runs_on_cuda_kernels(cuda_calls, declines):
    x = rng.uniform(0.5, 1.5, (30, 20))
    f = lambda x: fold.reduce(fold.monoids.sum, fold.map(lambda r: fold.reduce(lambda a, b: a * b, r, identity=1.0), x))  # noqa: E731
    (grad,) = fold.jit(lambda x: fold.vjp(f, x, reduce_rule="generic")[1](1.0), backend="cuda")(x)
    np.testing.assert_allclose(grad, np.prod(x, axis=1, keepdims=True) / x, rtol=1e-12)
    assert cuda_calls.get("segmented_reduce") and cuda_calls.get("segmented_scan") and not declines


@pytest.mark.parametrize("n", [0, 1, 300])
def test_reduce_by_index_runs_as_the_histogram_kernel(n, cuda_calls, declines):
    indices = rng.integers(-1, 9, n)  # -1 and 8 are out of range for 8 bins: ignored
    x = rng.uniform(-0.1, 0.1, n)

    def f(indices, x):
        sums = fold.reduce_by_index(fold.monoids.sum, 8, indices, x)
        maps = fold.reduce_by_index(affine, 8, indices, (1.0 + x, x), identity=(1.0, 0.0))
        return sums, maps

    expected, got = on_both(f, indices, x)
    assert_same(expected, got, rtol=1e-12, scaled=True)
    assert cuda_calls.get("histogram") == 2 and not declines


def test_a_gather_gradient_adds_into_its_table_on_cuda(cuda_calls, declines):
    """The vjp of x[i] (an index array traced) is a reduce_by_index of + into x's shape."""
    x, i = rng.normal(size=50), rng.integers(0, 50, 400)
    f = lambda x, i: fold.reduce(fold.monoids.sum, x[i] * x[i])  # noqa: E731
    (grad, _) = fold.jit(lambda x, i: fold.vjp(f, x, i)[1](1.0), backend="cuda")(x, i)
    np.testing.assert_allclose(grad, 2 * x * np.bincount(i, minlength=50), rtol=1e-12)
    assert cuda_calls.get("histogram") and not declines


@pytest.mark.parametrize("n", [1, 300])
def test_operators_capturing_a_scalar_run_in_the_kernels_and_differentiate(n, cuda_calls, declines):
    """a + b + t a b captures t: every fold carries t as an element field, forward and in the gradient with
    respect to t, which the generic rules compute by scans and maps."""
    x, i = rng.uniform(-0.05, 0.05, n), rng.integers(0, 4, n)

    def f(x, t):
        op = lambda a, b: a + b + t * a * b  # noqa: E731
        return (fold.reduce(op, x, identity=0.0) + fold.reduce(fold.monoids.sum, fold.scan(op, x, identity=0.0, reverse=True))
                + fold.reduce(fold.monoids.sum, fold.reduce_by_index(op, 4, i, x, identity=0.0)))

    expected, got = on_both(lambda x, t: (f(x, t), fold.grad(f, argnums=(0, 1), reduce_rule="generic")(x, t)), x, 0.7)
    assert_same(expected, got, rtol=1e-10, scaled=True)
    assert cuda_calls.get("reduce") and cuda_calls.get("scan") and cuda_calls.get("histogram") and not declines


def test_what_is_not_lowered_runs_on_numpy_after_one_warning(cuda_calls, declines):
    x, t = rng.normal(size=(6, 20, 20)), rng.uniform(0.1, 0.5, 20)

    def f(x, t):
        two_deep = fold.map(lambda m: fold.map(lambda r: fold.scan(lambda a, b: a + b + a * b, 0.01 * r, identity=0.0), m), x)
        per_row = fold.map(lambda r, s: fold.reduce(lambda a, b: a + b + s * a * b, 0.01 * r, identity=0.0), x[0], t)
        return two_deep, per_row

    expected, got = on_both(f, x, t)
    assert_same(expected, got)
    assert any("cuda backend: scan runs on the numpy backend (this fold inside a map" in d for d in declines), declines
    assert any("cuda backend: reduce runs on the numpy backend (its operator captures a value that differs from row to row)"
               in d for d in declines), declines


def test_remainder_and_floor_division_run_in_the_kernels_with_numpys_signs(cuda_calls, declines):
    """% and // compile for CUDA (device_helpers: NumPy's semantics, the remainder taking the divisor's sign,
    for integers and floats): an operator and a map body that use them run as kernels, not declined."""
    x = rng.integers(0, 7, 300)  # 0 is the identity of (a + b) % 7 on [0, 7) only (check mode knows)
    expected, got = on_both(lambda x: fold.reduce(lambda a, b: (a + b) % 7, x, identity=0), x)
    np.testing.assert_array_equal(got, expected)
    i, f = rng.integers(-50, 50, 200), rng.normal(scale=10.0, size=200)

    def body(a, b):
        return a % 7 + a % -3 + a // 4 + a // -3, b % 2.5 + b % -1.5 + b // 0.75 + b // -2.0

    expected, got = on_both(lambda i, f: fold.map(body, i, f), i, f)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-13, atol=1e-13)
    assert cuda_calls.get("reduce") and cuda_calls.get("map") and not declines, declines


def test_the_backend_is_registered_and_says_what_it_needs_without_a_gpu(monkeypatch):
    from fold.runtime.cuda_backend.backend import CudaBackend

    assert "cuda" in fold.available_backends()
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    with pytest.raises(fold.FoldError, match="NUMBA_ENABLE_CUDASIM=1"):
        CudaBackend()


def test_a_stack_that_cannot_compile_is_named_once_with_its_fix(monkeypatch):
    """numba-cuda 0.30 with NumPy 2.5 cannot compile any kernel (its typing reads np.row_stack): the backend
    says so when it is made, naming the versions, the error and the fix, instead of declining every
    statement with a warning of its own (what an H100 with that stack showed)."""
    from numba import config

    from fold.runtime.cuda_backend import backend

    calls = []

    def broken_compiler(*args, **kwargs):
        calls.append(args)
        raise AttributeError("module 'numpy' has no attribute 'row_stack'")

    monkeypatch.setattr(config, "ENABLE_CUDASIM", 0)
    monkeypatch.setattr(cuda, "compile_ptx_for_current_device", broken_compiler, raising=False)
    monkeypatch.setattr(backend, "_TOOLCHAIN", [])
    for _ in range(2):
        with pytest.raises(fold.FoldError, match=r"cannot compile a kernel .*NumPy .*row_stack.*numpy<2\.5"):
            backend.CudaBackend()
    assert len(calls) == 1  # probed once per process
    monkeypatch.setattr(config, "ENABLE_CUDASIM", 1)
    monkeypatch.setattr(backend, "_TOOLCHAIN", [])
    assert backend.toolchain_problem() is None  # the simulator compiles nothing
