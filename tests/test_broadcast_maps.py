"""NumPy-style broadcasting written as maps (runtime/loops/broadcast_maps.py): a sum of a value made by
broadcasting runs as a loop nest, without the broadcast array, primal and gradient, with the numpy
backend's results."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fold
from fold.cse import cse
from fold.dce import dce
from fold.primitives import Map
from fold.runtime.loops import LoopNest, broadcasts_as_maps
from fold.runtime.numba_backend.passes import prepare

pytest.importorskip("numba")

rng = np.random.default_rng(5)


def pairwise_kernel_sum(A, B):
    return fold.sum(fold.exp(-fold.sum((A[:, None, :] - B[None, :, :]) ** 2, axis=2)))


# (function, argument shapes): sums over a trailing axis, over the leading one, over several, of values
# broadcast from operands of fewer axes, a leading axis of 1, or a scalar
PROGRAMS = {
    "pairwise": (pairwise_kernel_sum, [(30, 4), (20, 4)]),
    "batched_outer": (lambda x, y: fold.sum(x[:, :, None] * y[:, None, :], axis=2), [(8, 5), (8, 6)]),
    "over_leading": (lambda A, B: fold.sum(fold.tanh(A[:, None, :] * B[None, :, :]), axis=0), [(12, 3), (9, 3)]),
    "over_two": (lambda A, B: fold.sum((A[:, None, :] + 2.0 * B[None, :, :]) ** 2, axis=(0, 2)), [(8, 5), (11, 5)]),
    "vector_and_array": (lambda v, M: fold.sum(fold.sin(v[None, None, :] * M), axis=2) * 3.0, [(6,), (4, 5, 6)]),
    "middle_axis": (lambda A, B: fold.sum(A[:, None, :] * B[None, :, :], axis=1), [(10, 3), (7, 3)]),
}


def _top_level_sizes(program):
    return [int(np.prod(v.aval.shape)) for s in program.stmts for v in s.outs]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_broadcast_sums_as_maps_give_the_programs_results(name):
    from fold.runtime.interpreter import eval_program
    import fold.runtime.numpy_impl  # noqa: F401  (registers the rules eval_program runs)

    f, shapes = PROGRAMS[name]
    args = [rng.normal(size=s) for s in shapes]
    for g in (f, fold.grad(lambda *a: fold.sum(f(*a) ** 2), argnums=tuple(range(len(args))))):
        program = dce(cse(fold.trace(g, *args)))
        lifted = broadcasts_as_maps(program)
        assert lifted is not program and any(isinstance(s.prim, Map) for s in lifted.stmts), lifted
        for got, want in zip(eval_program(lifted, args), eval_program(program, args), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_broadcast_sums_run_on_the_numba_backend_as_the_numpy_backend_does(name):
    f, shapes = PROGRAMS[name]
    args = [rng.normal(size=s) for s in shapes]
    g = fold.grad(lambda *a: fold.sum(f(*a) ** 2), argnums=tuple(range(len(args))))
    for h in (f, g):
        got, want = fold.jit(h, backend="numba")(*args), fold.jit(h, backend="numpy")(*args)
        for a, b in zip(fold.tree_flatten(got)[0], fold.tree_flatten(want)[0], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mode", ["primal", "grad"])
def test_pairwise_broadcast_runs_as_nests_holding_nothing_of_the_broadcast_size(mode):
    A, B = rng.normal(size=(64, 8)), rng.normal(size=(48, 8))
    f = pairwise_kernel_sum if mode == "primal" else fold.grad(pairwise_kernel_sum, argnums=(0, 1))
    program = prepare(dce(cse(fold.trace(f, A, B))), whole_arrays=True)
    assert any(isinstance(s.prim, LoopNest) for s in program.stmts), program
    assert max(_top_level_sizes(program)) < 64 * 48, program
    got, want = fold.jit(f, backend="numba")(A, B), fold.jit(f, backend="numpy")(A, B)
    for a, b in zip(fold.tree_flatten(got)[0], fold.tree_flatten(want)[0], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10)


@pytest.mark.parametrize("f, shapes", [
    (lambda X, Y: fold.sum(fold.exp(X) * Y, axis=1), [(20, 7), (20, 7)]),  # no broadcast makes a larger array
    (lambda x, y: fold.sum(x[:, None] * y[None, :], axis=1), [(40,), (25,)]),  # broadcasts to two axes
    (lambda X: fold.sum(fold.exp(X - np.max(X, axis=1, keepdims=True)), axis=1), [(30, 9)]),
], ids=["own size", "outer product", "row softmax"])
def test_sums_the_elementwise_kernels_stream_are_left_to_them(f, shapes):
    # they read a broadcast operand of a matrix in place and sum rows in the same pass
    program = dce(cse(fold.trace(f, *[rng.normal(size=s) for s in shapes])))
    assert broadcasts_as_maps(program) is program


def test_a_broadcast_value_read_elsewhere_too_is_kept_and_recomputed_in_the_map():
    def f(A, B):
        d = A[:, None, :] - B[None, :, :]
        return fold.sum(d ** 2, axis=2), d

    A, B = rng.normal(size=(5, 2)), rng.normal(size=(4, 2))
    program = dce(cse(fold.trace(f, A, B)))
    lifted = broadcasts_as_maps(program)
    assert any(s.outs[0].aval.shape == (5, 4, 2) for s in lifted.stmts)  # d is returned: it stays
    got, want = fold.jit(f, backend="numba")(A, B), fold.jit(f, backend="numpy")(A, B)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_an_array_constant_of_the_broadcast_shape_stays_outside_the_maps():
    """A constant array the program closes over (here the tangent of a Hessian-vector product of a NumPy-style
    layer norm) is not a row of a map: the group stops at it (its kernel indexed the whole constant by one
    index, a typing error)."""
    def layernorm(X, g):
        mu = np.mean(X, axis=1, keepdims=True)
        var = np.mean((X - mu) ** 2, axis=1, keepdims=True)
        return np.sum(np.tanh((X - mu) / np.sqrt(var + 1e-5) * g))

    X, g = rng.normal(size=(40, 12)), rng.normal(size=12)
    tangent = rng.normal(size=X.shape)
    grad = fold.grad(layernorm)
    hvp = lambda X, g: fold.jvp(grad, (X, g), (tangent, np.zeros_like(g)))[1]  # noqa: E731
    got, want = fold.jit(hvp, backend="numba")(X, g), fold.jit(hvp, backend="numpy")(X, g)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


_UNARY = {"tanh": fold.tanh, "square": lambda v: v * v, "sin": fold.sin, "neg": lambda v: -v}
_BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "max": fold.maximum}


@settings(max_examples=10, deadline=None)
@given(sizes=st.tuples(*[st.integers(2, 5)] * 3), binary=st.sampled_from(sorted(_BINARY)),
       unary=st.lists(st.sampled_from(sorted(_UNARY)), min_size=1, max_size=3),
       axes=st.sampled_from([(0,), (1,), (2,), (0, 2), (1, 2), (0, 1)]), scaled=st.booleans())
def test_random_broadcast_sums_match_the_numpy_backend(sizes, binary, unary, axes, scaled):
    """Random (n, m, d) values made by broadcasting two matrices (and a scalar), summed over random axes: the
    numba backend (broadcasts as maps, then nests) against the numpy backend, value and gradient."""
    n, m, d = sizes
    A, B, s = rng.normal(size=(n, d)), rng.normal(size=(m, d)), np.asarray(0.7)

    def f(A, B, s):
        v = _BINARY[binary](A[:, None, :], B[None, :, :])
        for name in unary:
            v = _UNARY[name](v)
        v = v * s if scaled else v
        return fold.sum(fold.sum(v, axis=axes) ** 2)

    for g in (f, fold.grad(f, argnums=(0, 1))):
        got, want = fold.jit(g, backend="numba")(A, B, s), fold.jit(g, backend="numpy")(A, B, s)
        for a, b in zip(fold.tree_flatten(got)[0], fold.tree_flatten(want)[0], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
