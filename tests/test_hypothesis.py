"""Hypothesis properties over random shapes and sizes, and random small programs, against NumPy/Python references."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_close, matprod_sequential, run_checked, scan_reference
from hypothesis import given, note
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fold
import fold.runtime.numpy_impl.folds as folds_impl

# sizes either side of the powers of two the tree reduce/scan split on, 0 and 1 included
TREE_SIZES = st.one_of(st.sampled_from([0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65]), st.integers(0, 130))
FLOAT_DTYPES = st.sampled_from([np.float32, np.float64])


def _tol(dtype, scale: float = 1.0) -> dict:
    if np.dtype(dtype) == np.float32:
        return {"rtol": 1e-4, "atol": 1e-4 * max(1.0, scale)}
    return {"rtol": 1e-9, "atol": 1e-9 * max(1.0, scale)}


def _mats(draw, n: int) -> np.ndarray:
    # entries of norm about 1/2 keep long products bounded
    seed = draw(st.integers(0, 2**32 - 1))
    return np.random.default_rng(seed).uniform(-0.7, 0.7, size=(n, 2, 2))


# ---------------------------------------------------------------------------------- reduce / scan sizes


@given(n=TREE_SIZES, data=st.data(), fast=st.booleans())
def test_reduce_matrix_product_any_size(n: int, data: st.DataObject, fast: bool) -> None:
    mats = _mats(data.draw, n)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(folds_impl, "USE_UFUNC_FAST_PATHS", fast)
        got = run_checked(lambda m: fold.reduce(lambda a, b: a @ b, m, identity=np.eye(2)), mats)
    assert_close(got, matprod_sequential(mats), rtol=1e-9, atol=1e-12)


@given(n=TREE_SIZES, data=st.data(), exclusive=st.booleans(), reverse=st.booleans())
def test_scan_affine_composition_any_size(n: int, data: st.DataObject, exclusive: bool, reverse: bool) -> None:
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(-1.0, 1.0, n), rng.normal(size=n)

    def compose(p, q):  # x -> p0 x + p1, then q0 x + q1: not commutative
        return p[0] * q[0], q[0] * p[1] + q[1]

    got = run_checked(lambda a, b: fold.scan(compose, (a, b), identity=(1.0, 0.0), exclusive=exclusive, reverse=reverse), a, b)
    expected = scan_reference(compose, list(zip(a, b)), (1.0, 0.0), exclusive=exclusive, reverse=reverse)
    assert_close(got, (np.array([e[0] for e in expected]).reshape(n), np.array([e[1] for e in expected]).reshape(n)),
                 rtol=1e-9, atol=1e-12)


@given(x=hnp.arrays(FLOAT_DTYPES, hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=9),
                    elements=st.floats(-10, 10, width=32)),
       exclusive=st.booleans(), reverse=st.booleans(), fast=st.booleans())
def test_sum_scan_and_reduce_over_random_shapes(x: np.ndarray, exclusive: bool, reverse: bool, fast: bool) -> None:
    seq = x[::-1] if reverse else x
    inclusive = np.cumsum(seq, axis=0, dtype=np.float64)
    if exclusive and len(x):
        expected = np.concatenate([np.zeros((1,) + x.shape[1:]), inclusive[:-1]])
    else:
        expected = inclusive
    expected = (expected[::-1] if reverse else expected).astype(x.dtype)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(folds_impl, "USE_UFUNC_FAST_PATHS", fast)
        got = run_checked(lambda v: fold.scan(lambda a, b: a + b, v, identity=0.0, exclusive=exclusive, reverse=reverse), x)
        total = run_checked(lambda v: fold.reduce(fold.monoids.sum, v), x)
    scale = float(np.abs(x).sum()) if x.size else 1.0
    assert_close(got, expected, dtype=x.dtype, **_tol(x.dtype, scale))
    assert_close(total, x.astype(np.float64).sum(axis=0).astype(x.dtype), dtype=x.dtype, **_tol(x.dtype, scale))


@given(x=hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=3, min_side=0, max_side=7),
                    elements=st.floats(-10, 10)), fast=st.booleans())
def test_max_and_min_inside_a_map_over_random_shapes(x: np.ndarray, fast: bool) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(folds_impl, "USE_UFUNC_FAST_PATHS", fast)
        got = run_checked(lambda v: fold.map(lambda r: (fold.reduce(fold.monoids.max, r),
                                                        fold.scan(fold.monoids.min, r, reverse=True)), v), x)
    expected_max = x.max(axis=1) if x.shape[1] else np.full((x.shape[0],) + x.shape[2:], -np.inf)
    expected_min = np.minimum.accumulate(x[:, ::-1], axis=1)[:, ::-1]
    assert_close(got, (expected_max, expected_min))


@given(m=TREE_SIZES, n=st.integers(0, 9), data=st.data(), fast=st.booleans())
def test_reduce_by_index_random(m: int, n: int, data: st.DataObject, fast: bool) -> None:
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    idx = rng.integers(-2, n + 2, size=m)
    v = rng.normal(size=m)
    mats = rng.uniform(-0.9, 0.9, size=(m, 2, 2))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(folds_impl, "USE_UFUNC_FAST_PATHS", fast)
        sums = run_checked(lambda i, v: fold.reduce_by_index(fold.monoids.sum, n, i, v), idx, v)
        prods = run_checked(lambda i, m: fold.reduce_by_index(lambda a, b: a @ b, n, i, m, identity=np.eye(2)), idx, mats)
    ok = (idx >= 0) & (idx < n)
    expected = np.zeros(n)
    np.add.at(expected, idx[ok], v[ok])
    assert_close(sums, expected, rtol=1e-9, atol=1e-12)
    expected = np.array([np.eye(2)] * n).reshape(n, 2, 2)
    for i, mat in zip(idx, mats):
        if 0 <= i < n:
            expected[i] = expected[i] @ mat
    assert_close(prods, expected, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------------------- structural on shapes


@given(data=st.data())
def test_random_static_indexing(data: st.DataObject) -> None:
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    key = data.draw(hnp.basic_indices(shape, allow_newaxis=True, allow_ellipsis=True))
    note(f"key={key!r}")
    assert_close(run_checked(lambda a: a[key], x), x[key])


@given(data=st.data())
def test_random_gather_axis(data: st.DataObject) -> None:
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5))
    axis = data.draw(st.integers(0, len(shape) - 1))
    idx = data.draw(hnp.arrays(np.int64, hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=4),
                               elements=st.integers(0, shape[axis] - 1)))
    x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    key = (slice(None),) * axis + (idx,)
    assert_close(run_checked(lambda a, i: a[(slice(None),) * axis + (i,)], x, idx), x[key])


@given(data=st.data())
def test_random_transpose_and_reshape(data: st.DataObject) -> None:
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=4))
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    new_shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=8).filter(
        lambda s: int(np.prod(s)) == x.size) if x.size > 64 else st.just((x.size,)))
    assert_close(run_checked(lambda a: fold.transpose(a, perm), x), np.transpose(x, perm), dtype="float32")
    assert_close(run_checked(lambda a: fold.reshape(fold.transpose(a, perm), new_shape), x),
                 np.transpose(x, perm).reshape(new_shape), dtype="float32")
    if x.ndim >= 2 and x.size:
        assert_close(run_checked(lambda a: fold.reshape(a, (shape[0], -1)), x), x.reshape(shape[0], -1))


@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=4), data=st.data())
def test_random_broadcasting_where(shapes, data: st.DataObject) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    c, a, b = (rng.normal(size=s) for s in shapes.input_shapes)
    got = run_checked(lambda c, a, b: fold.where(c > 0, a * b, fold.maximum(a, b)), c, a, b)
    assert_close(got, np.where(c > 0, a * b, np.maximum(a, b)))


# ------------------------------------------------------------------------------ random small programs

UNARY = {
    "sin": (fold.sin, np.sin), "cos": (fold.cos, np.cos), "tanh": (fold.tanh, np.tanh), "abs": (fold.abs, np.abs),
    "neg": (lambda x: -x, np.negative),
    "sigmoid": (fold.sigmoid, lambda x: (1 / (1 + np.exp(-x))).astype(x.dtype)),
    "exp_tanh": (lambda x: fold.exp(fold.tanh(x)), lambda x: np.exp(np.tanh(x))),
}
BINARY = {
    "add": (lambda x, y: x + y, np.add), "sub": (lambda x, y: x - y, np.subtract),
    "mul": (lambda x, y: x * y, np.multiply), "max": (fold.maximum, np.maximum), "min": (fold.minimum, np.minimum),
    "logaddexp": (fold.logaddexp, np.logaddexp),
}


def _elementwise_tree(num_inputs: int) -> st.SearchStrategy:
    # every subtree uses an input; Python constants (weakly typed) enter through "const" nodes
    return st.recursive(
        st.tuples(st.just("in"), st.integers(0, num_inputs - 1)),
        lambda kids: st.one_of(
            st.tuples(st.just("un"), st.sampled_from(sorted(UNARY)), kids),
            st.tuples(st.just("bin"), st.sampled_from(sorted(BINARY)), kids, kids),
            st.tuples(st.just("const"), st.sampled_from(sorted(BINARY)), kids, st.sampled_from([-1.5, 0.5, 2.0]),
                      st.booleans()),
            st.tuples(st.just("where"), kids, kids),
        ),
        max_leaves=6,
    )


def _program_tree(num_inputs: int) -> st.SearchStrategy:
    """Trees whose every node is an (n, d) array: elementwise nodes plus combinators over rows and columns."""
    return st.recursive(
        _elementwise_tree(num_inputs),
        lambda kids: st.one_of(
            st.tuples(st.just("un"), st.sampled_from(sorted(UNARY)), kids),
            st.tuples(st.just("bin"), st.sampled_from(sorted(BINARY)), kids, kids),
            st.tuples(st.just("cumsum"), kids),  # scan over rows
            st.tuples(st.just("center"), kids),  # map over rows: row - max(row)
            st.tuples(st.just("rev"), kids),  # x[::-1]
            st.tuples(st.just("mix"), kids),  # x @ W, a constant matrix
            st.tuples(st.just("maprow"), _elementwise_tree(num_inputs)),  # an elementwise tree inside a map
        ),
        max_leaves=8,
    )


MIX = np.array([[0.5, -0.25, 0.0], [0.125, 0.5, -0.5], [0.0, 0.25, 0.5]])


def _eval(tree, inputs: list, lib: str):
    kind = tree[0]
    ev = lambda t: _eval(t, inputs, lib)  # noqa: E731
    if kind == "in":
        return inputs[tree[1]]
    if kind == "const":  # op(x, c) or op(c, x) with a Python float c
        fn = BINARY[tree[1]][0 if lib == "fold" else 1]
        x, c = ev(tree[2]), tree[3]
        return fn(c, x) if tree[4] else fn(x, c)
    if kind == "un":
        return UNARY[tree[1]][0 if lib == "fold" else 1](ev(tree[2]))
    if kind == "bin":
        return BINARY[tree[1]][0 if lib == "fold" else 1](ev(tree[2]), ev(tree[3]))
    if kind == "where":
        a, b = ev(tree[1]), ev(tree[2])
        return fold.where(a > b, a, b - 1.0) if lib == "fold" else np.where(a > b, a, b - 1.0)
    x = ev(tree[1])
    if kind == "cumsum":
        return fold.scan(fold.monoids.sum, x) if lib == "fold" else np.cumsum(x, axis=0)
    if kind == "center":
        if lib == "fold":
            return fold.map(lambda r: r - fold.reduce(fold.monoids.max, r), x)
        return x - x.max(axis=1, keepdims=True)
    if kind == "rev":
        return x[::-1]
    if kind == "mix":
        return x @ MIX.astype(x.dtype)  # a traced x @ a constant, or NumPy's own product
    if kind == "maprow":
        if lib == "fold":
            return fold.map(lambda *rows: _eval(tree[1], list(rows), "fold"), *inputs)
        return np.stack([np.asarray(_eval(tree[1], [inp[i] for inp in inputs], "np")) for i in range(inputs[0].shape[0])]) \
            if inputs[0].shape[0] else np.zeros((0,) + inputs[0].shape[1:], inputs[0].dtype)
    raise AssertionError(kind)


@given(tree=_program_tree(2), n=st.sampled_from([0, 1, 2, 5, 8]), dtype=FLOAT_DTYPES, data=st.data())
def test_random_programs_against_numpy(tree, n: int, dtype, data: st.DataObject) -> None:
    note(f"tree={tree!r}")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    inputs = [rng.uniform(-2, 2, size=(n, 3)).astype(dtype) for _ in range(2)]
    with np.errstate(over="ignore", invalid="ignore"):
        expected = np.asarray(_eval(tree, inputs, "np"))
    got = run_checked(lambda a, b: _eval(tree, [a, b], "fold"), *inputs)
    scale = float(np.nanmax(np.abs(expected))) if expected.size else 1.0
    assert_close(got, expected.astype(dtype), dtype=dtype, **_tol(dtype, scale))


@given(tree=_elementwise_tree(3), shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=4),
       dtype=FLOAT_DTYPES, data=st.data())
def test_random_elementwise_programs_with_broadcasting(tree, shapes, dtype, data: st.DataObject) -> None:
    note(f"tree={tree!r}")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    inputs = [rng.uniform(-2, 2, size=s).astype(dtype) for s in shapes.input_shapes]
    tree = ("bin", "add", tree, ("bin", "mul", ("in", 0), ("bin", "mul", ("in", 1), ("in", 2))))  # uses every input
    with np.errstate(over="ignore", invalid="ignore"):
        expected = np.asarray(_eval(tree, inputs, "np"))
    got = run_checked(lambda a, b, c: _eval(tree, [a, b, c], "fold"), *inputs)
    scale = float(np.abs(expected).max()) if expected.size else 1.0
    assert_close(got, expected, dtype=dtype, **_tol(dtype, scale))


@given(depth_sizes=st.lists(st.integers(0, 4), min_size=1, max_size=3), data=st.data())
def test_nested_maps_of_random_depth_with_closures(depth_sizes: list, data: st.DataObject) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rng.normal(size=tuple(depth_sizes) + (3,))
    w = rng.normal(size=3)

    def body(v, level: int, outer, tw):
        # each level passes down a value computed from its own element: the innermost body closes over
        # values of every enclosing scope (and over tw, a value of the top-level trace)
        if level == len(depth_sizes):
            return v * tw + outer
        return fold.map(lambda e: body(e, level + 1, outer + fold.sum(v) * 0.1, tw), v)

    def reference(v, level: int, outer):
        if level == len(depth_sizes):
            return v * w + outer
        out = np.empty(v.shape)
        for i in range(v.shape[0]):
            out[i] = reference(v[i], level + 1, outer + v.sum() * 0.1)
        return out

    got = run_checked(lambda x, tw: body(x, 0, 0.0, tw), x, w)
    assert_close(got, reference(x, 0, 0.0))
