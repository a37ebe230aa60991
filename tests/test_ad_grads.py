"""Derivatives of every primitive and combinator against central finite differences in float64.

One row per operation drives `fold.testing.check_grads`: jvp against finite differences, then vjp against
jvp by the dot-product identity; rows marked `order=2` also check second derivatives (forward over reverse).
Inputs are drawn away from kinks and ties (distinct values for max/min, |x| > 0 for abs, x > 0 for sqrt/log).
Every traced program, and its jvp and vjp programs, also goes through `fold.check_program`.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable, NamedTuple

import numpy as np
import pytest

from fold import ad
import fold
from fold.testing import check_grads


class Case(NamedTuple):
    name: str
    fn: Callable[..., Any]
    args: Callable[[np.random.Generator], tuple]
    order: int = 1
    check: dict = {}


def pos(shape, lo=0.5, hi=1.5):
    return lambda rng: rng.uniform(lo, hi, shape)


def signed(shape):
    """Values with |x| in [0.5, 1.5] and random signs: away from 0 (abs, sign)."""
    return lambda rng: rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)


def args_of(*makers):
    return lambda rng: tuple(m(rng) for m in makers)


def distinct(shape, lo=-2.0, hi=2.0):
    """Values with no two equal (well separated), in random order: no ties for max/min."""
    size = int(np.prod(shape))

    def make(rng):
        return rng.permutation(np.linspace(lo, hi, size)).reshape(shape) + rng.uniform(-0.01, 0.01, shape)

    return make


def verify_transformed(f, args: tuple) -> None:
    """check_program on the traced program and on its vjp and jvp programs."""
    program = fold.trace(f, *args)
    fold.check_program(program)
    fold.check_program(ad.vjp_program(program)[0])
    fold.check_program(ad.jvp_program(program)[0])


def run_case(case: Case) -> None:
    args = case.args(np.random.default_rng(zlib.crc32(case.name.encode())))
    verify_transformed(case.fn, args)
    check_grads(case.fn, args, order=case.order, **case.check)


S = (3, 4)

# ------------------------------------------------------------------------------------------ elementwise

ELEMENTWISE = [
    Case("add", lambda x, y: x + y, args_of(signed(S), signed(S)), 2),
    Case("add_broadcast_scalar", lambda x, y: x + y, args_of(signed(S), signed(()))),
    Case("add_python_number", lambda x: 2.5 + x, args_of(signed(S))),
    Case("sub", lambda x, y: x - y, args_of(signed(S), signed((4,))), 2),
    Case("mul", lambda x, y: x * y, args_of(signed(S), signed(S)), 2),
    Case("mul_broadcast_column", lambda x, y: x * y, args_of(signed(S), signed((3, 1)))),
    Case("div", lambda x, y: x / y, args_of(signed(S), signed(S)), 2),
    Case("div_python_number", lambda x: 1.0 / x, args_of(signed(S))),
    Case("pow", lambda x, y: x ** y, args_of(pos(S), signed(S)), 2),
    Case("pow_constant_exponent", lambda x: x ** 3, args_of(signed(S)), 2),
    Case("pow_constant_base", lambda y: 2.0 ** y, args_of(signed(S))),
    Case("mod", lambda x, y: x % y, args_of(pos(S, 5.2, 5.4), pos(S, 1.9, 2.1)), 2),
    Case("maximum", fold.maximum, lambda rng: tuple(np.split(distinct((2, 3, 4))(rng), 2)[i][0] for i in (0, 1)), 2),
    Case("minimum", fold.minimum, lambda rng: tuple(np.split(distinct((2, 3, 4))(rng), 2)[i][0] for i in (0, 1)), 2),
    Case("maximum_with_constant", lambda x: fold.maximum(x, 0.0), args_of(signed(S))),
    Case("logaddexp", fold.logaddexp, args_of(signed(S), signed(S)), 2),
    Case("neg", lambda x: -x, args_of(signed(S)), 2),
    Case("abs", fold.abs, args_of(signed(S)), 2),
    Case("exp", fold.exp, args_of(signed(S)), 2),
    Case("log", fold.log, args_of(pos(S)), 2),
    Case("log1p", fold.log1p, args_of(pos(S, -0.5, 1.5)), 2),
    Case("expm1", fold.expm1, args_of(signed(S)), 2),
    Case("sin", fold.sin, args_of(signed(S)), 2),
    Case("cos", fold.cos, args_of(signed(S)), 2),
    Case("tanh", fold.tanh, args_of(signed(S)), 2),
    Case("sqrt", fold.sqrt, args_of(pos(S)), 2),
    Case("sigmoid", fold.sigmoid, args_of(signed(S)), 2),
    Case("where", lambda c, x, y: fold.where(c > 0.0, x, y), args_of(signed(S), signed(S), signed(S)), 2),
    Case("where_scalar_branch", lambda x: fold.where(x > 0.0, x * x, 0.5), args_of(signed(S))),
    Case("composite", lambda x, y: fold.tanh(x * y) / (1.0 + fold.exp(-x)) + fold.sqrt(y * y + 1.0),
         args_of(signed(S), signed(S)), 2),
]

# piecewise constant or boolean-valued: the derivative is zero (away from the jumps)
ZERO_DERIVATIVE = [
    Case("sign", lambda x: fold.sign(x) * 1.0, args_of(signed(S))),
    Case("floordiv", lambda x, y: x // y, args_of(pos(S, 5.2, 5.4), pos(S, 1.9, 2.1))),
    Case("lt", lambda x, y: fold.convert(x < y, "float64"), args_of(distinct(S), distinct(S))),
    Case("le", lambda x, y: fold.convert(x <= y, "float64"), args_of(distinct(S), distinct(S))),
    Case("gt", lambda x, y: fold.convert(x > y, "float64"), args_of(distinct(S), distinct(S))),
    Case("ge", lambda x, y: fold.convert(x >= y, "float64"), args_of(distinct(S), distinct(S))),
    Case("eq", lambda x, y: fold.convert(x == y, "float64"), args_of(distinct(S), distinct(S))),
    Case("ne", lambda x, y: fold.convert(x != y, "float64"), args_of(distinct(S), distinct(S))),
    Case("logical", lambda x, y: fold.convert(fold.logical_or(fold.logical_and(x > 0, y > 0), fold.logical_not(x > y)), "float64"),
         args_of(signed(S), signed(S))),
    Case("convert_to_int", lambda x: fold.convert(fold.convert(x * 3.0, "int64"), "float64"), args_of(pos(S, 0.1, 0.3))),
]


@pytest.mark.parametrize("case", ELEMENTWISE, ids=lambda c: c.name)
def test_elementwise_gradients(case: Case) -> None:
    run_case(case)


@pytest.mark.parametrize("case", ZERO_DERIVATIVE, ids=lambda c: c.name)
def test_zero_derivative_ops(case: Case) -> None:
    run_case(case)
    args = case.args(np.random.default_rng(1))
    ybar = np.ones_like(fold.run(case.fn, *args))
    for ct, x in zip(fold.vjp(case.fn, *args)[1](ybar), args, strict=True):
        assert ct.dtype == x.dtype and ct.shape == x.shape
        assert not np.any(ct), f"{case.name}: cotangent {ct} should be zero"


def test_python_scalar_mixed_expressions_reach_both_arguments() -> None:
    x, y = np.array([0.7, -1.2]), np.array(1.3)
    cx, cy = fold.vjp(lambda a, b: 3.0 * a * b - b / 2.0, x, y)[1](np.ones(2))
    np.testing.assert_allclose(cx, 3.0 * y * np.ones(2))
    np.testing.assert_allclose(cy, 3.0 * x.sum() - 1.0)


# ------------------------------------------------------------------------------------------ structural

IDX = np.array([[0, 2], [2, 1], [0, 0]])  # repeated indices: the scatter-add must accumulate

STRUCTURAL = [
    Case("broadcast_to_leading", lambda x: fold.broadcast_to(x, (2, 3, 4)) * np.arange(24.0).reshape(2, 3, 4),
         args_of(signed(S)), 2),
    Case("broadcast_to_stretch", lambda x: fold.broadcast_to(x, (3, 4)) ** 2, args_of(signed((3, 1))), 2),
    Case("replicate", lambda x: fold.replicate(2, x) * np.arange(1.0, 7.0).reshape(2, 3), args_of(signed((3,)))),
    Case("reshape", lambda x: fold.reshape(x, (2, 6)) * np.arange(12.0).reshape(2, 6), args_of(signed(S)), 2),
    Case("reshape_infer", lambda x: x.reshape(-1) ** 2, args_of(signed(S))),
    Case("transpose_2d", lambda x: x.T * np.arange(12.0).reshape(4, 3), args_of(signed(S)), 2),
    Case("transpose_3d", lambda x: fold.transpose(x, (1, 2, 0)) ** 2, args_of(signed((2, 3, 4)))),
    Case("index_int", lambda x: x[1] * 2.0, args_of(signed(S)), 2),
    Case("index_negative_int", lambda x: x[-1, -2] * x[0], args_of(signed(S))),
    Case("index_slice", lambda x: x[1:3, ::2] ** 2, args_of(signed(S)), 2),
    Case("index_negative_step", lambda x: x[::-1, ::-2] * np.arange(6.0).reshape(3, 2), args_of(signed(S)), 2),
    Case("index_negative_step_bounds", lambda x: x[2:0:-1, -1:0:-2] ** 2, args_of(signed(S))),
    Case("index_ellipsis_none", lambda x: x[..., None, 1] * x[None, :, 0], args_of(signed(S))),
    Case("gather_index_array", lambda x: x[IDX] ** 2, args_of(signed(S)), 2),
    Case("gather_axis1", lambda x: x[:, np.array([3, 0, 3])] ** 2, args_of(signed(S))),
    Case("gather_negative_index", lambda x: x[np.array([-1, 0, -1])] * 2.0, args_of(signed(S))),
    Case("gather_traced_index_in_map",
         lambda x: fold.map(lambda i: x[i] * x[(i + 1) % 3], np.array([0, 2, 2, 1])), args_of(signed(S)), 2),
    Case("gather_traced_row_index_in_map",
         lambda x, w: fold.map(lambda row, i: row[i] * w[i], x, np.array([1, 3, 3])), args_of(signed(S), signed((4,)))),
    Case("concatenate_axis0", lambda x, y: fold.concatenate([x, y, x], axis=0) ** 2, args_of(signed(S), signed((2, 4))), 2),
    Case("concatenate_axis1", lambda x, y: fold.concatenate([x, y], axis=1) * 3.0, args_of(signed(S), signed((3, 2)))),
    Case("matmul_2d_2d", lambda a, b: a @ b, args_of(signed(S), signed((4, 2))), 2),
    Case("matmul_1d_2d", lambda a, b: a @ b, args_of(signed((3,)), signed(S)), 2),
    Case("matmul_2d_1d", lambda a, b: fold.matmul(a, b), args_of(signed(S), signed((4,)))),
    Case("matmul_1d_1d", lambda a, b: fold.dot(a, b), args_of(signed((4,)), signed((4,))), 2),
    Case("sum_all", lambda x: fold.sum(x * x), args_of(signed(S)), 2),
    Case("sum_axis", lambda x: fold.sum(x ** 3, axis=1), args_of(signed(S)), 2),
    Case("sum_axes", lambda x: fold.sum(x * x, axis=(0, 2)), args_of(signed((2, 3, 4)))),
    Case("sum_negative_axis", lambda x: x.sum(-1) ** 2, args_of(signed(S))),
    Case("convert_64_32_64", lambda x: fold.convert(fold.convert(x, "float32") * 2.0, "float64"), args_of(signed(S)), 1,
         dict(eps=1e-2, rtol=1e-4, atol=1e-5)),
    Case("convert_32_to_64", lambda x: fold.convert(x, "float64") ** 2,
         lambda rng: (signed(S)(rng).astype(np.float32),), 1, dict(eps=1e-2, rtol=2e-2, atol=1e-3)),
    Case("convert_int_input_mixed", lambda x, n: x * fold.convert(n, "float64"), lambda rng: (signed(S)(rng), np.arange(12).reshape(S))),
]


@pytest.mark.parametrize("case", STRUCTURAL, ids=lambda c: c.name)
def test_structural_gradients(case: Case) -> None:
    run_case(case)


def test_convert_cotangent_dtypes() -> None:
    x32 = np.linspace(-1, 1, 5).astype(np.float32)
    (ct,) = fold.vjp(lambda x: fold.convert(x, "float64") * 2.0, x32)[1](np.ones(5))
    assert ct.dtype == np.float32
    np.testing.assert_allclose(ct, 2.0)
    t = fold.jvp(lambda x: fold.convert(x, "float32"), (np.ones(3),), (np.full(3, 0.5),))[1]
    assert t.dtype == np.float32
    np.testing.assert_allclose(t, 0.5)


def test_gather_scatter_accumulates_repeated_indices() -> None:
    (ct,) = fold.vjp(lambda x: x[np.array([0, 0, 2, 0])], np.arange(3.0))[1](np.array([1.0, 2.0, 3.0, 4.0]))
    np.testing.assert_array_equal(ct, [7.0, 0.0, 3.0])


def test_indices_computed_in_the_program_count_from_the_end_when_negative() -> None:
    """x[i] for a traced i with negative entries reads as NumPy does, forward and in both modes, in a map too."""
    x, i = np.arange(1.0, 6.0), np.array([-1, 0, -5, 4, -1])
    ct = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    np.testing.assert_array_equal(fold.run(lambda x, i: x[i], x, i), x[i])
    np.testing.assert_array_equal(fold.run(lambda x, i: fold.map(lambda j: x[j], i), x, i), x[i])
    scattered = np.zeros(5)
    np.add.at(scattered, i, ct)
    np.testing.assert_array_equal(fold.vjp(lambda x: x[i], x)[1](ct)[0], scattered)
    np.testing.assert_array_equal(fold.vjp(lambda x, i: x[i], x, i)[1](ct)[0], scattered)
    np.testing.assert_array_equal(fold.jvp(lambda x, i: x[i], (x, i), (ct, np.zeros(5, np.int64)))[1], ct[i])
    check_grads(lambda x, i: x[i] * x[i], (x, i))


# ------------------------------------------------------------------------------------------ combinators


def nested_map_3(x, w, s):
    """Three nested maps, each body using values of every enclosing scope (and the arguments)."""
    def depth1(row2d):
        a = fold.sum(row2d * w) * s  # captures w and s (arguments)

        def depth2(row):
            b = fold.sin(row) * w + a  # captures w (argument) and a (depth 1)

            def depth3(e, wi):
                return fold.tanh(e * a + fold.sum(b) * s) * wi + b[0] * e  # a (depth 1), b (depth 2), s

            return fold.map(depth3, row, b)

        return fold.map(depth2, row2d)

    return fold.map(depth1, x)


def mat2(a, b):
    """2x2 matrix product on records {p, q, r, t} = [[p, q], [r, t]]: associative, not commutative."""
    return {"p": a["p"] * b["p"] + a["q"] * b["r"], "q": a["p"] * b["q"] + a["q"] * b["t"],
            "r": a["r"] * b["p"] + a["t"] * b["r"], "t": a["r"] * b["q"] + a["t"] * b["t"]}


MAT2_ID = {"p": 1.0, "q": 0.0, "r": 0.0, "t": 1.0}


def affine(f, g):
    """Composition of x -> f0 x + f1 then g0 x + g1, on tuple elements: a linear recurrence's operator."""
    return f[0] * g[0], g[0] * f[1] + g[1]


def records(rng, n):
    return {k: rng.uniform(-0.9, 0.9, n) for k in "pqrt"}


def user_op(a, b):
    """(1 + a)(1 + b) - 1: associative and commutative, but not a recognised operator."""
    return a + b + a * b


N = 6
RBI_IDX = np.array([0, 2, 2, -1, 1, 2, 4, 0, 3])  # -1 and 4 are out of range for n=3 and get no cotangent

COMBINATORS = [
    Case("map_elementwise", lambda x: fold.map(lambda r: fold.exp(r) * r, x), args_of(signed(S)), 2),
    Case("map_closure", lambda x, w: fold.map(lambda r: fold.sum(r * w) ** 2, x), args_of(signed(S), signed((4,))), 2),
    Case("map_two_inputs_tuple_out", lambda x, y: fold.map(lambda a, b: (a * b, fold.sin(a) + b), x, y),
         args_of(signed(S), signed(S))),
    Case("map_nested_3_closures", nested_map_3, args_of(signed((2, 3, 4)), signed((4,)), signed(())), 2),
    # reduce, recognised operators and monoids
    Case("reduce_sum_monoid", lambda x: fold.reduce(fold.monoids.sum, x * x), args_of(signed((N, 3))), 2),
    Case("reduce_sum_lambda", lambda x: fold.reduce(lambda a, b: a + b, fold.sin(x), identity=0.0), args_of(signed((N,))), 2),
    Case("reduce_prod", lambda x: fold.reduce(fold.monoids.prod, x), args_of(signed((N, 2))), 2),
    Case("reduce_prod_lambda", lambda x: fold.reduce(lambda a, b: a * b, x, identity=1.0), args_of(signed((N,))), 2),
    Case("reduce_max", lambda x: fold.reduce(fold.monoids.max, x), args_of(distinct((N, 3))), 2),
    Case("reduce_min", lambda x: fold.reduce(fold.monoids.min, x * x), args_of(distinct((N,), 0.1, 2.0)), 2),
    Case("reduce_max_lambda", lambda x: fold.reduce(lambda a, b: fold.maximum(a, b), x, identity=-np.inf), args_of(distinct((N,)))),
    Case("reduce_logaddexp", lambda x: fold.reduce(fold.monoids.logaddexp, x), args_of(signed((N, 2))), 2),
    Case("reduce_in_map", lambda x, w: fold.map(lambda r: fold.reduce(fold.monoids.max, r * w), x),
         args_of(distinct((3, 5)), pos((5,), 1.0, 1.01))),
    # reduce with user operators
    Case("reduce_matrix_records", lambda m: fold.reduce(mat2, m, identity=MAT2_ID), lambda rng: (records(rng, N),), 2),
    Case("reduce_affine_tuples", lambda a, b: fold.reduce(affine, (a, b), identity=(1.0, 0.0)),
         args_of(pos((N,), -0.9, 0.9), signed((N,))), 2),
    Case("reduce_matmul_elements", lambda m: fold.reduce(lambda a, b: a @ b, m, identity=np.eye(2)),
         args_of(pos((N, 2, 2), -0.9, 0.9))),
    Case("reduce_user_commutative", lambda x: fold.reduce(user_op, x, identity=0.0), args_of(pos((N,), -0.5, 0.5))),
    # scan
    *[Case(f"scan_{name}_{'excl' if ex else 'incl'}{'_rev' if rev else ''}",
           (lambda op, ident, ex, rev: lambda x: fold.scan(op, x, identity=ident, exclusive=ex, reverse=rev))(op, ident, ex, rev),
           args_of(signed((N, 2))), 2 if (ex, rev) == (False, False) else 1)
      for name, op, ident in [("add", lambda a, b: a + b, 0.0), ("mul", lambda a, b: a * b, 1.0)]
      for ex in (False, True) for rev in (False, True)],
    *[Case(f"scan_affine_{'excl' if ex else 'incl'}{'_rev' if rev else ''}",
           (lambda ex, rev: lambda a, b: fold.scan(affine, (a, b), identity=(1.0, 0.0), exclusive=ex, reverse=rev))(ex, rev),
           args_of(pos((N,), -0.9, 0.9), signed((N,))), 2 if (ex, rev) == (False, True) else 1)
      for ex in (False, True) for rev in (False, True)],
    Case("scan_sum_monoid", lambda x: fold.scan(fold.monoids.sum, x), args_of(signed((N,)))),
    Case("scan_max", lambda x: fold.scan(fold.monoids.max, x), args_of(distinct((N,)))),
    Case("scan_logaddexp", lambda x: fold.scan(fold.monoids.logaddexp, x, reverse=True), args_of(signed((N, 2)))),
    Case("scan_matrix_records", lambda m: fold.scan(mat2, m, identity=MAT2_ID, exclusive=True), lambda rng: (records(rng, 5),)),
    Case("scan_matmul_elements", lambda m: fold.scan(lambda a, b: a @ b, m, identity=np.eye(2), reverse=True),
         args_of(pos((5, 2, 2), -0.9, 0.9)), 2),
    Case("scan_in_map", lambda x: fold.map(lambda r: fold.scan(affine, (r, r * r), identity=(1.0, 0.0)), x),
         args_of(pos((3, 4), -0.9, 0.9))),
    # reduce_by_index
    Case("rbi_add", lambda v: fold.reduce_by_index(fold.monoids.sum, 3, RBI_IDX, v * v), args_of(signed((9, 2))), 2),
    Case("rbi_add_lambda", lambda v: fold.reduce_by_index(lambda a, b: a + b, 3, RBI_IDX, v, identity=0.0), args_of(signed((9,)))),
    Case("rbi_max", lambda v: fold.reduce_by_index(fold.monoids.max, 3, RBI_IDX, v), args_of(distinct((9, 2))), 2),
    Case("rbi_min", lambda v: fold.reduce_by_index(fold.monoids.min, 3, RBI_IDX, v), args_of(distinct((9,)))),
    Case("rbi_user_op", lambda v: fold.reduce_by_index(user_op, 3, RBI_IDX, v, identity=0.0), args_of(pos((9,), -0.5, 0.5)), 2),
    Case("rbi_affine_noncommutative", lambda a, b: fold.reduce_by_index(affine, 3, RBI_IDX, (a, b), identity=(1.0, 0.0)),
         args_of(pos((9,), -0.9, 0.9), signed((9,)))),
    Case("rbi_matmul_elements", lambda m: fold.reduce_by_index(lambda a, b: a @ b, 3, RBI_IDX, m, identity=np.eye(2)),
         args_of(pos((9, 2, 2), -0.9, 0.9))),
    # loop
    Case("loop", lambda x, w: fold.loop(lambda i, s: fold.tanh(s * w + fold.convert(i, "float64")), x, 5),
         args_of(signed((3,)), signed((3,))), 2),
    Case("loop_tuple_state", lambda x, y: fold.loop(lambda i, s: (s[0] * fold.cos(s[1]), s[1] + 0.1 * s[0]), (x, y), 4),
         args_of(signed((2,)), signed((2,)))),
    *[Case(f"loop_checkpoint_{k}", (lambda k: lambda x, w: fold.loop(lambda i, s: fold.sin(s) * w + s, x, 7, checkpoint=k))(k),
           args_of(signed((3,)), pos((3,), 0.2, 0.5)), 2 if k == 3 else 1) for k in (1, 3, 7, 10)],
    Case("loop_in_map", lambda x, w: fold.map(lambda r: fold.loop(lambda i, s: s * w + fold.sin(s), r, 3, checkpoint=2), x),
         args_of(signed((2, 3)), pos((3,), 0.2, 0.5))),
    Case("loop_in_loop", lambda x, w: fold.loop(lambda i, s: fold.loop(lambda j, t: fold.sin(t) * w + t, s, 3, checkpoint=2), x, 4, checkpoint=3),
         args_of(signed((3,)), pos((3,), 0.2, 0.5)), 2),
    Case("map_in_loop", lambda x, w: fold.loop(lambda i, s: fold.map(lambda r: fold.tanh(r * w), s), x, 3),
         args_of(signed((2, 3)), signed((3,)))),
    Case("reduce_in_loop", lambda x: fold.loop(lambda i, s: s + fold.reduce(fold.monoids.logaddexp, s), x, 3),
         args_of(signed((4,)))),
    # transformations inside combinators: per-row gradients, tangents and a gradient-descent loop
    Case("grad_in_map", lambda x, w: fold.map(lambda r: fold.grad(lambda w_: fold.sum(fold.sin(w_ * r)))(w), x),
         args_of(signed(S), signed((4,)))),
    Case("jvp_in_map", lambda x, w: fold.map(lambda r: fold.jvp(lambda w_: fold.sum(fold.tanh(w_ * r)), (w,), (r,))[1], x),
         args_of(signed(S), signed((4,)))),
    Case("grad_in_loop", lambda x, w: fold.loop(lambda i, s: s - 0.1 * fold.grad(lambda s_: fold.sum(fold.sin(s_ * w) ** 2))(s), x, 3),
         args_of(signed((4,)), signed((4,)))),
    # gemm_map_reduce (blocks that do not divide the sizes)
    Case("gemm_logaddexp", lambda q, k: fold.gemm_map_reduce(fold.monoids.logaddexp, lambda s: s, q, k, block=(2, 3)),
         args_of(signed((5, 3)), signed((7, 3)))),
    Case("gemm_attention_logwsum",
         lambda q, k, v: fold.gemm_map_reduce(fold.monoids.logwsum, lambda s, vj: {"z": s, "v": vj}, q, k, cols=(v,), block=(2, 3))["v"],
         args_of(signed((5, 3)), signed((7, 3)), signed((7, 2)))),
    Case("gemm_max", lambda q, k: fold.gemm_map_reduce(fold.monoids.max, fold.tanh, q, k, block=(3, 2)),
         args_of(signed((5, 3)), signed((7, 3)))),
]


@pytest.mark.parametrize("case", COMBINATORS, ids=lambda c: c.name)
def test_combinator_gradients(case: Case) -> None:
    run_case(case)


def test_rbi_out_of_range_values_get_zero_cotangent() -> None:
    v = np.linspace(1.0, 2.0, 9)
    for monoid in (fold.monoids.sum, fold.monoids.max):
        (ct,) = fold.vjp(lambda v: fold.reduce_by_index(monoid, 3, RBI_IDX, v), v)[1](np.ones(3))
        out_of_range = (RBI_IDX < 0) | (RBI_IDX >= 3)
        assert not np.any(ct[out_of_range]), (monoid, ct)


@pytest.mark.parametrize("rule", ["auto", "generic", "monoid"])
@pytest.mark.parametrize("monoid", ["sum", "max", "prod", "logaddexp"])
def test_rbi_with_no_bins_has_zero_cotangents(monoid: str, rule: str) -> None:
    v = np.array([1.0, 2.0, 0.5])
    f = lambda v: fold.reduce_by_index(getattr(fold.monoids, monoid), 0, np.array([0, 1, -1]), v)  # noqa: E731
    assert fold.run(f, v).shape == (0,)
    (ct,) = fold.vjp(f, v, reduce_rule=rule)[1](np.zeros(0))
    np.testing.assert_array_equal(ct, np.zeros(3))
    np.testing.assert_array_equal(fold.jvp(f, (v,), (np.ones(3),))[1], np.zeros(0))


def test_table_covers_every_elementwise_op() -> None:
    """Every scalar op of the language appears in some row of the tables above (by name)."""
    from fold.primitives import SCALAR_OPS

    names = " ".join(c.name for c in ELEMENTWISE + ZERO_DERIVATIVE)
    aliases = {"neg": "neg", "and": "logical", "or": "logical", "not": "logical"}
    missing = [op for op in SCALAR_OPS if aliases.get(op, op) not in names]
    assert not missing, f"no gradient-table row for {missing}"


def test_the_checker_catches_a_wrong_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table above can fail: a deliberately wrong partial derivative is caught, in both modes."""
    from fold.ad import partials
    from fold.testing import GradientCheckError

    monkeypatch.setitem(partials.PARTIALS, "sin", lambda args, out, wanted: (fold.sin(args[0]),))
    with pytest.raises(GradientCheckError, match="finite differences"):
        check_grads(lambda x: fold.sin(x) * 1.0, (np.array([0.3, 0.7]),))

    # a wrong second derivative only: sin's partial is cos, right; cos's own partial is made wrong
    monkeypatch.setitem(partials.PARTIALS, "sin", lambda args, out, wanted: (fold.cos(args[0]),))
    monkeypatch.setitem(partials.PARTIALS, "cos", lambda args, out, wanted: (fold.sin(args[0]),))
    x = np.array([0.3, 0.7])
    check_grads(lambda x: fold.sin(x) * 2.0, (x,), order=1)
    with pytest.raises(GradientCheckError, match="vjp of"):
        check_grads(lambda x: fold.sin(x) * 2.0, (x,), order=2)


def test_gemm_map_reduce_with_a_monoid_without_d_falls_back_with_a_warning() -> None:
    plain = fold.Monoid(lambda a, b: a + b, 0.0, commutative=True, name="plain_sum")
    f = lambda q, k: fold.gemm_map_reduce(plain, fold.sin, q, k, block=(3, 2))  # noqa: E731
    rng = np.random.default_rng(0)
    with pytest.warns(UserWarning, match="plain_sum"):
        check_grads(f, (rng.normal(size=(5, 3)), rng.normal(size=(7, 3))))


def test_gemm_map_reduce_second_derivatives() -> None:
    rng = np.random.default_rng(0)
    check_grads(lambda q, k: fold.gemm_map_reduce(fold.monoids.logaddexp, lambda s: s, q, k, block=(2, 3)),
                (rng.normal(size=(5, 3)), rng.normal(size=(7, 3))), order=2)


@pytest.mark.parametrize("rule", ["auto", "generic"])
def test_a_fully_masked_logsumexp_row_has_zero_derivatives_in_both_modes(rule) -> None:
    """A row of -inf (a padded row of attention scores) has logsumexp -inf whatever finite change its entries
    get: its jvp and its vjp are 0 under both rules, so the dot-product test holds, and the lifted operator's
    identity (-inf, 0) stays one, so a kernel that folds it in per chunk gives the same tangent (it gave
    0.875 against the numpy backend's 1.0). Finite rows are unaffected; logaddexp(+inf, +inf) still splits."""
    X = np.array([[0.5, 1.0, -1.0], [-np.inf, -np.inf, -np.inf], [np.inf, np.inf, 0.0]])
    f = lambda X: fold.map(lambda r: fold.reduce(fold.monoids.logaddexp, r), X)  # noqa: E731
    Xdot = np.ones_like(X)
    ydot = fold.jvp(f, (X,), (Xdot,))[1]
    (xbar,) = fold.vjp(f, X, reduce_rule=rule)[1](np.ones(3))
    soft = np.exp(X[0] - np.log(np.exp(X[0]).sum()))
    np.testing.assert_allclose(ydot[:2], [1.0, 0.0], rtol=1e-12)
    np.testing.assert_allclose(xbar[:2], [soft, np.zeros(3)], rtol=1e-12)
    np.testing.assert_allclose((xbar * Xdot).sum(1)[:2], ydot[:2], rtol=1e-12)
    a, b = fold.grad(lambda a, b: fold.logaddexp(a, b), argnums=(0, 1))(np.float64(np.inf), np.float64(np.inf))
    assert (a, b) == (0.5, 0.5)
    assert fold.grad(lambda a, b: fold.logaddexp(a, b), argnums=(0, 1))(np.float64(-np.inf), np.float64(-np.inf)) == (0.0, 0.0)


def test_powers_with_exponent_zero_have_finite_derivatives_at_zero() -> None:
    """x ** 0 is constant, so its derivative is 0 at x == 0 too (it was 0 * 0^-1 = NaN), and x ** 1's second
    derivative is 0 there (the derivative of its partial 1 * x ** 0): polynomial features sum_k x ** k."""
    x = np.array([0.0, 0.5, 2.0])
    poly = lambda x: fold.reduce(fold.monoids.sum, x ** 0 + x ** 1 + x ** 2 + x ** np.arange(3.0))  # noqa: E731
    np.testing.assert_allclose(fold.grad(poly)(x), 1.0 + 2.0 * x + np.array([0.0, 1.0, 4.0]), rtol=1e-14)
    assert float(fold.jvp(poly, (x,), (np.ones(3),))[1]) == pytest.approx(float(np.sum(1.0 + 2.0 * x + [0.0, 1.0, 4.0])))
    lin = lambda x: fold.reduce(fold.monoids.sum, x ** 1)  # noqa: E731
    np.testing.assert_array_equal(fold.jvp(fold.grad(lin), (x,), (np.ones(3),))[1], np.zeros(3))
    check_grads(poly, (x + 0.25,), order=2)


@pytest.mark.parametrize("exponent", [0, 1, 2, 3, 0.5, -1.5])
def test_a_constant_exponent_differentiates_without_selections(exponent) -> None:
    """x ** c with c known when traced: its partial c x^(c-1) is written for that c (none for 0, one for 1,
    2 x for 2), not as selections on `c == 0`, which were traced and run for every power of every gradient."""
    from fold.primitives import Elementwise

    x = np.array([0.5, 1.25, 2.0])
    f = lambda x: fold.reduce(fold.monoids.sum, x ** exponent)  # noqa: E731
    program = fold.trace(fold.grad(f), x)
    assert not [s for s in program.stmts if isinstance(s.prim, Elementwise) and s.prim.op == "where"], program
    powers = [s for s in program.stmts if isinstance(s.prim, Elementwise) and s.prim.op == "pow"]
    assert len(powers) == (2 if exponent not in (0, 1, 2) else 1), program  # the primal's, and c x^(c-1)'s
    np.testing.assert_allclose(fold.grad(f)(x), exponent * x ** (exponent - 1.0) if exponent else 0.0 * x, rtol=1e-14)
    check_grads(f, (x,), order=2)
