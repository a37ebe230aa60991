"""A row's value read at an index taken from the input (a label per row), and a histogram inside a row (that
gather's cotangent, scattered back), in the loop nest. The index is an element of a kernel input, which the
backend checks lies in range before it runs the kernel (Kernel.checked); out of range, the statements the
nest replaced run and raise the gather's error naming the index. The values and gradients are the numpy
backend's and a hand-written NumPy loss's, on the numba backend and on the cuda backend (Numba's simulator
where there is no GPU)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fold
from fold.cse import cse
from fold.dce import dce
from fold.errors import FoldIndexError
from fold.primitives import Map
from fold.runtime.loops import LoopNest, fuse_loop_nests, kernel_of

M = fold.monoids
rng = np.random.default_rng(581)
K, D, N = 5, 6, 300


def softmax_regression(W, X, labels):
    def loss(x, label):
        scores = fold.map(lambda w: fold.sum(w * x), W)
        return fold.reduce(M.logaddexp, scores) - scores[label]

    return fold.sum(fold.map(loss, X, labels))


def softmax_regression_numpy(W, X, labels):
    scores = X @ W.T
    top = scores.max(axis=1, keepdims=True)
    lse = (top + np.log(np.exp(scores - top).sum(axis=1, keepdims=True)))[:, 0]
    return float(np.sum(lse - scores[np.arange(len(labels)), labels]))


def _args():
    return rng.normal(size=(K, D)), rng.normal(size=(N, D)), rng.integers(-K, K, N)  # negative labels count back


def _nests(f, args) -> list:
    prepared = fuse_loop_nests(dce(cse(fold.trace(f, *args))))
    assert not any(isinstance(s.prim, Map) for s in prepared.stmts), "a map left outside the nests"
    return [kernel_of(s.prim) for s in prepared.stmts if isinstance(s.prim, LoopNest)]


def test_a_gather_at_a_label_runs_in_the_nest_which_checks_the_labels_first():
    W, X, labels = _args()
    (kernel,) = _nests(softmax_regression, (W, X, labels))
    assert kernel.checked == (("in2", -K, K - 1),)
    assert f"runs where {-K} <= in2 <= {K - 1}" in str(fold.lowered(softmax_regression, W, X, labels))
    want = softmax_regression_numpy(W, X, labels % K)
    np.testing.assert_allclose(fold.jit(softmax_regression, backend="numba")(W, X, labels), want, rtol=1e-12)
    np.testing.assert_allclose(fold.jit(softmax_regression, backend="numpy")(W, X, labels), want, rtol=1e-12)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_a_label_out_of_range_raises_the_gathers_error(backend):
    W, X, labels = _args()
    labels[123] = K + 4
    with pytest.raises(FoldIndexError, match=f"index {K + 4} is out of range for an axis of size {K}"):
        fold.jit(softmax_regression, backend=backend)(W, X, labels)


def test_the_gather_cotangent_is_a_histogram_in_the_row_and_the_gradient_one_nest():
    W, X, labels = _args()
    grad = fold.grad(softmax_regression)
    (kernel,) = _nests(grad, (W, X, labels))
    got = fold.jit(grad, backend="numba")(W, X, labels)
    np.testing.assert_allclose(got, fold.jit(grad, backend="numpy")(W, X, labels), rtol=1e-10, atol=1e-12)
    step, direction = 1e-6, rng.normal(size=W.shape)
    central = (softmax_regression_numpy(W + step * direction, X, labels % K)
               - softmax_regression_numpy(W - step * direction, X, labels % K)) / (2 * step)
    np.testing.assert_allclose(np.sum(got * direction), central, rtol=1e-6)
    hvp = lambda W, X, labels: fold.jvp(grad, (W, X, labels), (direction, np.zeros_like(X), np.zeros(N, np.int64)))[1]  # noqa: E731
    np.testing.assert_allclose(fold.jit(hvp, backend="numba")(W, X, labels), fold.jit(hvp, backend="numpy")(W, X, labels),
                               rtol=1e-9, atol=1e-11)


def linear_scores(W, X, labels):
    """Linear in the gathered row: its gradient needs no forward gather, only the scatter of X by label."""
    return fold.sum(fold.map(lambda x, label: fold.sum(W[label] * x), X, labels))


@pytest.mark.parametrize("backend", ["numba", "numpy", "cuda"])
def test_a_gradient_scatters_at_checked_labels_even_where_the_forward_gather_is_dead(backend):
    W, X, labels = _args()
    want = np.zeros_like(W)
    np.add.at(want, labels % K, X)
    grad = fold.jit(fold.grad(linear_scores), backend=backend)
    np.testing.assert_allclose(np.asarray(grad(W, X, labels)), want, rtol=1e-12)
    labels[77] = -K - 1
    with pytest.raises(FoldIndexError, match=f"index {-K - 1} is out of range for an axis of size {K}"):
        grad(W, X, labels)


def test_a_constant_index_is_scattered_at_without_a_gather_at_run_time():
    """A constant index was checked when the gather was traced: its positions are computed then, and the
    gradient holds only the forward gather."""
    x, idx = rng.normal(size=5), np.array([0, 3, -1, 3])
    f = lambda x: fold.sum(x[idx] ** 2)  # noqa: E731
    program = fold.trace(fold.grad(f), x)
    assert [s.prim.name for s in program.stmts].count("gather") == 1
    want = np.zeros(5)
    np.add.at(want, idx % 5, 2 * x[idx])
    np.testing.assert_allclose(fold.jit(fold.grad(f), backend="numba")(x), want, rtol=1e-12)


def compose(first, second):
    """(a1, b1) then (a2, b2) of the affine maps v -> a v + b: the order of a bin's elements shows."""
    (a1, b1), (a2, b2) = first, second
    return a1 * a2, a2 * b1 + b2


def test_a_histogram_in_a_row_ignores_indices_out_of_range_and_folds_in_order():
    """Each row bins its values by its own indices (some outside [0, 8)), by a sum and by the composition of
    affine maps, which does not commute."""
    idx, a, b = rng.integers(-2, 10, (40, 25)), rng.uniform(0.5, 1.5, (40, 25)), rng.normal(size=(40, 25))

    def row(i, x, y):
        sums = fold.reduce_by_index(M.sum, 8, i, y)
        maps = fold.reduce_by_index(compose, 8, i, (x, y), identity=(1.0, 0.0))[1]
        return fold.sum(sums * sums) + fold.sum(maps)

    def binned(idx, a, b):
        return fold.sum(fold.map(row, idx, a, b))

    want_sums, want_maps = np.zeros((40, 8)), np.zeros((40, 8, 2))
    want_maps[..., 0] = 1.0
    for r in range(40):
        for i, x, y in zip(idx[r], a[r], b[r]):
            if 0 <= i < 8:
                want_sums[r, i] += y
                a1, b1 = want_maps[r, i]
                want_maps[r, i] = (a1 * x, x * b1 + y)
    want = (want_sums ** 2).sum() + want_maps[..., 1].sum()
    assert _nests(binned, (idx, a, b))
    np.testing.assert_allclose(fold.jit(binned, backend="numba")(idx, a, b), want, rtol=1e-12)
    np.testing.assert_allclose(fold.jit(binned, backend="numpy")(idx, a, b), want, rtol=1e-12)


def test_on_the_cuda_backend_the_labels_are_checked_on_the_device_and_the_nest_runs(cuda_nest_kernels):
    W, X, labels = rng.normal(size=(3, 4)), rng.normal(size=(70, 4)), rng.integers(0, 3, 70)
    for f in (softmax_regression, fold.grad(softmax_regression)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a nest that declined would warn
            got = fold.jit(f, backend="cuda")(W, X, labels)
        np.testing.assert_allclose(np.asarray(got), fold.jit(f, backend="numpy")(W, X, labels), rtol=1e-12)
    assert len(cuda_nest_kernels) == 2 and cuda_nest_kernels[0].checked
    labels[5] = 7
    with pytest.raises(FoldIndexError, match="index 7 is out of range"):
        fold.jit(softmax_regression, backend="cuda")(W, X, labels)


def test_a_histogram_of_rows_in_a_row_folds_each_row_into_its_bin():
    """Each row bins rows of its (m, 3) values by index (some out of range): bins that are arrays."""
    idx, vals = rng.integers(-1, 6, (30, 12)), rng.normal(size=(30, 12, 3))

    def row(i, v):
        bins = fold.reduce_by_index(M.sum, 5, i, v)
        return fold.sum(bins * bins)

    f = lambda idx, vals: fold.sum(fold.map(row, idx, vals))  # noqa: E731
    want = 0.0
    for r in range(30):
        bins = np.zeros((5, 3))
        for i, v in zip(idx[r], vals[r]):
            if 0 <= i < 5:
                bins[i] += v
        want += np.sum(bins * bins)
    assert _nests(f, (idx, vals))
    np.testing.assert_allclose(fold.jit(f, backend="numba")(idx, vals), want, rtol=1e-12)
    np.testing.assert_allclose(fold.jit(f, backend="numpy")(idx, vals), want, rtol=1e-12)
