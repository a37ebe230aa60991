"""Sequential loops of the loop nest that carry arrays: a fold.loop whose state is a vector mixed by a matrix
each step (a recurrent network over each sequence), and a scan whose elements are small matrices (the
Jacobians a user operator's gradient scans backward). Each state is a buffer of the row, its next value
stored apart and copied in after the step (runtime/loops/build.py, CarriedState). The nest is taken, and
its values and gradients are those of the numpy backend, of a hand-written NumPy loop, and of central
differences; a reverse scan with an operator that does not commute folds each element on the left."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.cse import cse
from fold.dce import dce
from fold.primitives import Loop, Map, Scan
from fold.runtime.loops import LoopNest, fuse_loop_nests, kernel_of
from fold.runtime.loops.nest import buffers
from fold.runtime.loops.facts import elementwise_facts
from fold.runtime.loops.build import Scalar

rng = np.random.default_rng(58)


def rnn(W, X):
    """Each sequence's last hidden state, h <- tanh(W h + x_t), summed as squares."""
    def last(xs):
        return fold.loop(lambda t, h: fold.tanh(W @ h + xs[t]), xs[0] * 0.0, xs.shape[0])

    return fold.sum(fold.map(lambda xs: fold.sum(last(xs) ** 2), X))


def rnn_numpy(W, X):
    total = 0.0
    for xs in X:
        h = np.zeros(X.shape[2])
        for x in xs:
            h = np.tanh(W @ h + x)
        total += np.sum(h ** 2)
    return total


def compose(first, second):
    """(a1, b1) then (a2, b2) of the affine maps v -> a v + b: associative, not commutative."""
    (a1, b1), (a2, b2) = first, second
    return a1 * a2, a2 * b1 + b2


def row_recurrence(A, B):
    return fold.sum(fold.map(lambda a, b: fold.sum(fold.scan(compose, (a, b), identity=(1.0, 0.0))[1] ** 2), A, B))


def _nested(f, args) -> list:
    """The program's loop nests' kernels, where its maps all ran inside them (no map, loop or scan left at
    the top level); else []."""
    prepared = fuse_loop_nests(dce(cse(fold.trace(f, *args))))
    top = [s.prim for s in prepared.stmts]
    if any(isinstance(p, (Map, Loop, Scan)) for p in top):
        return []
    return [kernel_of(p) for p in top if isinstance(p, LoopNest)]


def _rnn_args(n=40, t=7, d=5):
    return (rng.normal(size=(d, d)) / np.sqrt(d), rng.normal(size=(n, t, d)))


def test_a_loop_over_a_vector_state_is_a_sequential_loop_of_the_nest():
    W, X = _rnn_args()
    assert _nested(rnn, (W, X))
    want = rnn_numpy(W, X)
    np.testing.assert_allclose(fold.jit(rnn, backend="numba")(W, X), want, rtol=1e-12)
    np.testing.assert_allclose(fold.jit(rnn, backend="numpy")(W, X), want, rtol=1e-12)


def test_the_gradient_of_a_loop_over_vectors_saves_its_states_in_the_nest_and_agrees():
    W, X = _rnn_args()
    grad = fold.grad(rnn)
    (kernel,) = _nested(grad, (W, X))  # the forward loop saving its vector states and the reverse loop
    # W's cotangent, G <- G + a h^T each step, is summed in place: no second (5, 5) buffer for its next value
    assert [b.shape for b in buffers(kernel.outer.step)].count(W.shape) == 1
    got = fold.jit(grad, backend="numba")(W, X)
    np.testing.assert_allclose(got, fold.jit(grad, backend="numpy")(W, X), rtol=1e-10, atol=1e-12)
    step, direction = 1e-6, rng.normal(size=W.shape)
    central = (rnn_numpy(W + step * direction, X) - rnn_numpy(W - step * direction, X)) / (2 * step)
    np.testing.assert_allclose(np.sum(got * direction), central, rtol=1e-6)
    # with respect to the sequences too: each step's cotangent is a histogram of one row into the (T, d)
    # cotangent of the sequence, and the last step's a static index's transpose: one nest as well
    both = fold.grad(rnn, argnums=(0, 1))
    (kernel,) = _nested(both, (W, X))
    # the sequence's cotangent gains each step's row where it stands (scattered_states.py): no (T, d)
    # histogram filled with zeros and added whole at every step, only the saved states and the cotangent
    assert [b.shape for b in buffers(kernel.outer.step)].count(X.shape[1:]) == 2
    for g, want in zip(fold.jit(both, backend="numba")(W, X), fold.jit(both, backend="numpy")(W, X), strict=True):
        np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-12)


def _binned_each_step(W, L, scale_by_state: bool = False, entries: int = 1):
    """Per row, a histogram of K bins gaining a value a step at that step's label (which may lie outside
    the bins: ignored), `entries` times, its squares summed; `scale_by_state`: the value also reads the
    histogram so far."""
    K = 6

    def row(w, labels):
        def step(t, h):
            value = w[t] * w[t] * (1.0 + 0.1 * fold.sum(h) if scale_by_state else 1.0)
            return h + fold.reduce_by_index(fold.monoids.sum, K, fold.broadcast_to(labels[t], (entries,)),
                                            fold.broadcast_to(value, (entries,)))
        return fold.sum(fold.loop(step, w[:K] * 0.0, w.shape[0]) ** 2)

    return fold.sum(fold.map(row, W, L))


@pytest.mark.parametrize("entries", [1, 2])
@pytest.mark.parametrize("scale_by_state", [False, True])
def test_a_histogram_added_to_a_loop_state_each_step_is_binned_into_the_state(scale_by_state, entries):
    """A loop state that gains a histogram each step (scattered_states.py) and that nothing else reads is
    binned into in place: the nest holds the state and no histogram of its size. Labels outside the bins are
    ignored, as reduce_by_index does; where the step also reads the state, a histogram of two entries is
    made apart, and one of one entry is one-hot, added to the state element by element (no buffer)."""
    W, L = rng.normal(size=(50, 9)), rng.integers(-1, 7, (50, 9))
    f = lambda W, L: _binned_each_step(W, L, scale_by_state, entries)  # noqa: E731
    (kernel,) = _nested(f, (W, L))
    assert [b.shape for b in buffers(kernel.outer.step)].count((6,)) == (2 if scale_by_state and entries == 2 else 1)
    np.testing.assert_allclose(fold.jit(f, backend="numba")(W, L), fold.jit(f, backend="numpy")(W, L), rtol=1e-12)
    want = 0.0
    for w, labels in zip(W, L):
        h = np.zeros(6)
        for x, label in zip(w, labels):
            if 0 <= label < 6:
                h[label] += entries * x * x * (1.0 + 0.1 * h.sum() if scale_by_state else 1.0)
        want += np.sum(h ** 2)
    np.testing.assert_allclose(fold.jit(f, backend="numba")(W, L), want, rtol=1e-12)
    grad = fold.grad(f)
    np.testing.assert_allclose(fold.jit(grad, backend="numba")(W, L), fold.jit(grad, backend="numpy")(W, L),
                               rtol=1e-10, atol=1e-12)


def test_a_folds_array_state_is_copied_element_by_element_not_stored_into_a_slice():
    """Numba compiles an array stored into a slice with its shape-mismatch error: 7 of the 9 s that the
    serial kernel of a recurrent network's gradient (16 x 16 float32, 32 steps) took to compile. Each chunk's
    array state goes to its partial, and the final state to its output, by loops."""
    from fold.runtime.numba_backend.loop_nests import kernel_module

    W, X = _rnn_args()
    (kernel,) = _nested(fold.grad(rnn), (W, X))
    text, _ = kernel_module(kernel)
    (state,) = [s for s in kernel.outer.states if s.stored]  # W's cotangent
    assert "ravel()" not in text and "[:]" not in text
    fold_ = kernel.outer
    assert f"{fold_.partial}{state.name}[{fold_.chunk}, copy0, copy1] = {state.name}[copy0, copy1]" in text
    assert f"{state.output}[copy0 * {W.shape[1]} + copy1] = {state.name}[copy0, copy1]" in text


def test_a_float32_recurrent_network_and_its_hessian_vector_product_agree_with_numpy():
    W, X = (a.astype(np.float32) for a in _rnn_args(n=30, t=5, d=4))
    grad = fold.grad(rnn)
    hvp = lambda W, X: fold.jvp(grad, (W, X), (W, np.zeros_like(X)))[1]  # noqa: E731
    assert _nested(hvp, (W, X))
    np.testing.assert_allclose(fold.jit(hvp, backend="numba")(W, X), fold.jit(hvp, backend="numpy")(W, X),
                               rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("exclusive", [False, True])
def test_a_reverse_scan_in_a_row_folds_each_element_on_the_left(exclusive):
    """out[i] = x_i . x_{i+1} . ... (after x_i where exclusive): an operator that does not commute tells the
    sides apart. The nest once folded the element on the right, giving another recurrence's values."""
    A, B = rng.uniform(0.5, 0.99, (30, 20)), rng.normal(size=(30, 20))

    def suffixes(A, B):
        return fold.map(lambda a, b: fold.scan(compose, (a, b), identity=(1.0, 0.0), reverse=True,
                                               exclusive=exclusive)[1], A, B)

    want = np.empty_like(B)
    for r, (a, b) in enumerate(zip(A, B)):
        acc = (1.0, 0.0)
        for i in reversed(range(len(a))):
            if exclusive:
                want[r, i] = acc[1]
            acc = (a[i] * acc[0], acc[0] * b[i] + acc[1])  # compose((a_i, b_i), acc)
            if not exclusive:
                want[r, i] = acc[1]
    assert _nested(suffixes, (A, B))
    np.testing.assert_allclose(fold.jit(suffixes, backend="numba")(A, B), want, rtol=1e-12)
    np.testing.assert_allclose(fold.jit(suffixes, backend="numpy")(A, B), want, rtol=1e-12)


def test_a_scan_of_jacobians_in_a_rows_gradient_is_in_the_nest():
    """The generic gradient of a user operator's scan scans 2 x 2 Jacobians backward along the row."""
    A, B = rng.uniform(0.5, 0.99, (25, 30)), rng.normal(size=(25, 30))
    grad = fold.grad(row_recurrence, argnums=(0, 1))
    assert _nested(grad, (A, B))
    for got, want in zip(fold.jit(grad, backend="numba")(A, B), fold.jit(grad, backend="numpy")(A, B), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    step, direction = 1e-6, rng.normal(size=B.shape)
    central = (fold.jit(row_recurrence, backend="numpy")(A, B + step * direction)
               - fold.jit(row_recurrence, backend="numpy")(A, B - step * direction)) / (2 * step)
    np.testing.assert_allclose(np.sum(fold.jit(grad, backend="numba")(A, B)[1] * direction), central, rtol=1e-6)


def test_a_product_of_bounded_integers_is_bounded():
    """A reverse loop's step index is (n - 1 - i) * 1 + 0: a gather at it reads without a check only if the
    product keeps the bounds."""
    i64 = np.dtype(np.int64)
    facts = elementwise_facts("mul", [Scalar("a", i64, bounds=(0, 5)), Scalar("b", i64, bounds=(-2, 3))],
                              Scalar("c", i64))
    assert facts["bounds"] == (-10, 15)
    unknown = elementwise_facts("mul", [Scalar("a", i64, bounds=(0, None)), Scalar("b", i64, bounds=(1, 1))],
                                Scalar("c", i64))
    assert "bounds" not in unknown


def test_a_static_index_transposed_is_zero_off_the_indexed_positions():
    """index_transpose (a static index's cotangent) of rows taken every other step from 1, in a row."""
    X = rng.normal(size=(20, 9))
    f = lambda X: fold.sum(fold.map(lambda x: fold.sum(fold.vjp(lambda y: y[1:8:2], x)[1](x[:4])[0] ** 2 * x), X))  # noqa: E731
    want = np.zeros_like(X)
    want[:, 1:8:2] = X[:, :4]
    want = np.sum(want ** 2 * X)
    assert _nested(f, (X,))
    np.testing.assert_allclose(fold.jit(f, backend="numba")(X), want, rtol=1e-12)
    np.testing.assert_allclose(fold.jit(f, backend="numpy")(X), want, rtol=1e-12)
    # single positions: the gradient of y[2] * y[5] is y[5] at 2 and y[2] at 5
    g = lambda X: fold.sum(fold.map(lambda x: fold.sum(fold.grad(lambda y: y[2] * y[5])(x) * x ** 2), X))  # noqa: E731
    want = np.sum(X[:, 5] * X[:, 2] ** 2 + X[:, 2] * X[:, 5] ** 2)
    assert _nested(g, (X,))
    np.testing.assert_allclose(fold.jit(g, backend="numba")(X), want, rtol=1e-12)


def test_on_the_cuda_backend_the_carried_arrays_are_each_threads_own(cuda_nest_kernels):
    """The recurrent network's gradient and the rows' scan of Jacobians as CUDA nests (Numba's simulator
    where there is no GPU): a thread's buffers are its local arrays."""
    import warnings

    cases = [(fold.grad(rnn), _rnn_args(n=20, t=4, d=3)),
             (fold.grad(row_recurrence, argnums=(0, 1)), (rng.uniform(0.5, 0.99, (12, 9)), rng.normal(size=(12, 9))))]
    for f, args in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a nest that declined would warn
            got = fold.jit(f, backend="cuda")(*args)
        want = fold.jit(f, backend="numpy")(*args)
        for g, w in zip(fold.tree_flatten(got)[0], fold.tree_flatten(want)[0], strict=True):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-10, atol=1e-12)
    assert len(cuda_nest_kernels) >= 2
