"""fold.gemm_map_reduce: the Table 1 layers against their naive materialised formulas, its meaning as the
nested map/reduce it abbreviates, its derivatives, the fallback for monoids without d, the memory bound, the
matrix-product lowering of column fields, and its errors."""

from __future__ import annotations

import gc
import tracemalloc
import uuid
import warnings

import numpy as np
import pytest

from fold import ad
import fold
from fold.ad.vjp import GEMM_RULES, gemm_rule_scope
from helpers import load_example
from fold.ir import Program, Var
from fold.primitives import GemmBlockSum, GemmMapReduce, Map
from fold.testing import check_grads, check_vjp



L = load_example("gemm_layers")
TOL = {np.dtype("float64"): 1e-10, np.dtype("float32"): 1e-4}


# ------------------------------------------------------------------------------------------ the layers

class Layer:
    """A Table 1 layer: its fold version, its naive reference (forward and hand-written backward), inputs."""

    def __init__(self, name, fold_fn, naive, make, float_args):
        self.name, self.fold_fn, self.naive, self.make, self.float_args = name, fold_fn, naive, make, float_args


def _r(rng, dtype):
    return lambda *shape: rng.standard_normal(shape).astype(dtype)


def _attention_args(rng, m, n, dtype, f=4, d=3):
    r = _r(rng, dtype)
    return (r(m, f), r(n, f), r(n, d)), r(m, d)


def _cross_entropy_args(rng, m, n, dtype, f=4):
    r = _r(rng, dtype)
    return (r(m, f), r(n, f), rng.integers(0, n, m)), r(m)


def _distillation_args(rng, m, n, dtype, f=4, d=3):
    r = _r(rng, dtype)
    return (r(m, f), r(n, f), r(m, d), r(n, d)), r(m)


def _mlp_args(rng, m, n, dtype, f=4, d=3):
    """X: B x D(f), P: D x K, Q: K x D(d); m is B, n is K."""
    r = _r(rng, dtype)
    return (r(m, f), r(f, n), r(n, d)), r(m, d)


LAYERS = {
    "attention": Layer("attention", L.attention, lambda Q, K, V, G: L.attention_naive(Q, K, V, G), _attention_args, 3),
    "causal_attention": Layer("causal_attention", L.causal_attention,
                              lambda Q, K, V, G: L.attention_naive(Q, K, V, G, causal=True), _attention_args, 3),
    "cross_entropy": Layer("cross_entropy", L.cross_entropy, L.cross_entropy_naive, _cross_entropy_args, 2),
    "distillation": Layer("distillation", L.distillation, L.distillation_naive, _distillation_args, 4),
    "mlp": Layer("mlp", L.mlp, L.mlp_naive, _mlp_args, 3),
}
M, N = 6, 10
BLOCKS = [1, (2, 3), (4, 4), (3, 5), (4, 7), (100, 100), (6, 1), (1, 10), None]


def _assert_rel(actual, expected, tol, what):
    """|actual - expected| <= tol * (|expected| + max|expected|), elementwise: relative, with the array's
    scale as the floor for entries near zero."""
    actual, expected = np.asarray(actual), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    scale = float(np.max(np.abs(expected), initial=0.0)) or 1.0
    err = float(np.max(np.abs(actual.astype(np.float64) - expected) / (np.abs(expected) + scale), initial=0.0))
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:g}"


def _check_layer(layer: Layer, args, cot, block, dtype):
    """fold's forward and every float cotangent (float `dtype`) against the naive formulas in float64."""
    fn = lambda *a: layer.fold_fn(*a, block=block)  # noqa: E731
    out = fold.run(fn, *args)
    grads = fold.vjp(fn, *tuple(args))[1](cot)
    as64 = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in args]
    ref, ref_grads = layer.naive(*as64, cot.astype(np.float64))
    tol = TOL[np.dtype(dtype)]
    assert np.asarray(out).dtype == np.dtype(dtype)
    _assert_rel(out, ref, tol, f"{layer.name} forward (block {block})")
    assert len(ref_grads) == layer.float_args
    for k, (g, rg) in enumerate(zip(grads[: layer.float_args], ref_grads, strict=True)):
        assert np.asarray(g).dtype == np.dtype(dtype), (k, np.asarray(g).dtype)
        _assert_rel(g, rg, tol, f"{layer.name} cotangent of input {k} (block {block})")


@pytest.mark.parametrize("block", BLOCKS, ids=str)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_against_naive_formula(name, dtype, block):
    layer = LAYERS[name]
    args, cot = layer.make(np.random.default_rng(7), M, N, dtype)
    _check_layer(layer, args, cot, block, dtype)


@pytest.mark.parametrize("mn", [(1, N), (M, 1), (1, 1)], ids=["M=1", "N=1", "M=N=1"])
@pytest.mark.parametrize("block", [None, 1, (4, 4)], ids=str)
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_with_one_row_or_column(name, block, mn):
    layer = LAYERS[name]
    args, cot = layer.make(np.random.default_rng(8), *mn, "float64")
    _check_layer(layer, args, cot, block, "float64")


@pytest.mark.parametrize("block", [None, (2, 3)], ids=str)
def test_no_columns_gives_the_identity_in_every_row_and_no_rows_an_empty_result(block):
    """The running totals of a row block start from its first column block's totals, not from the identity:
    with no column at all they must still be the identity."""
    rng = np.random.default_rng(9)
    Q, V = rng.standard_normal((5, 4)), rng.standard_normal((0, 3))
    out = fold.gemm_map_reduce(fold.monoids.logwsum, lambda s, v: {"z": s, "v": v}, Q, np.zeros((0, 4)), cols=(V,), block=block)
    assert out["z"].shape == (5,) and out["v"].shape == (5, 3)
    assert np.all(out["z"] == -np.inf) and np.all(out["v"] == 0.0)
    lse = fold.gemm_map_reduce(fold.monoids.logaddexp, lambda s: s, np.zeros((0, 4)), rng.standard_normal((6, 4)), block=block)
    assert lse.shape == (0,)


@pytest.mark.parametrize("m,n", [(0, 5), (4, 0), (0, 0)])
def test_gradient_with_no_rows_or_no_columns_is_zero(m, n):
    """An empty block grid: no pair reaches an output, so every operand's cotangent and the output's tangent
    are zeros of the operands' and outputs' shapes (the vjp once built a block sum over no blocks and failed
    with an IndexError)."""
    rng = np.random.default_rng(10)
    Q, K, V = rng.standard_normal((m, 4)), rng.standard_normal((n, 4)), rng.standard_normal((n, 3))

    def attention(Q, K, V):
        return fold.gemm_map_reduce(fold.monoids.logwsum, lambda s, v: {"z": s, "v": v}, Q, K, cols=(V,))["v"]

    for backend in ("numpy", "numba"):
        for gemm_rule in GEMM_RULES:
            with gemm_rule_scope(gemm_rule):
                grads = fold.jit(lambda Q, K, V: fold.vjp(attention, Q, K, V)[1](np.ones((m, 3))), backend=backend)(Q, K, V)
            for g, x in zip(grads, (Q, K, V), strict=True):
                assert g.shape == x.shape and not np.any(g), (backend, gemm_rule, g)
        tangent = fold.jit(lambda *a: fold.jvp(attention, a, tuple(np.ones_like(x) for x in a))[1], backend=backend)(Q, K, V)
        assert tangent.shape == (m, 3) and not np.any(tangent)


def test_default_block_covers_a_small_matrix_in_one_block():
    Q, K, V = _attention_args(np.random.default_rng(0), M, N, "float64")[0]
    program = fold.trace(L.attention, Q, K, V)
    (stmt,) = [s for s in program.stmts if isinstance(s.prim, GemmMapReduce)]
    assert stmt.prim.block == (M, N)


def test_explicit_block_is_recorded_and_clipped_shapes_are_traced():
    Q, K, V = _attention_args(np.random.default_rng(0), M, N, "float64")[0]
    program = fold.trace(lambda *a: L.attention(*a, block=(4, 4)), Q, K, V)
    (stmt,) = [s for s in program.stmts if isinstance(s.prim, GemmMapReduce)]
    assert stmt.prim.block == (4, 4)
    assert sorted(shape for shape, _ in stmt.prim.blocks) == [(2, 2), (2, 4), (4, 2), (4, 4)]


# ------------------------------------------------------------------------------------------ derivatives

@pytest.mark.parametrize("block", [(2, 3), None], ids=str)
@pytest.mark.parametrize("name", list(LAYERS))
def test_jvp_against_finite_differences_and_vjp(name, block):
    layer = LAYERS[name]
    args, _ = layer.make(np.random.default_rng(9), 5, 7, "float64")
    fn = lambda *a: layer.fold_fn(*a, block=block)  # noqa: E731
    fn.__name__ = f"{name}[block={block}]"
    check_grads(fn, tuple(args))
    check_vjp(fn, tuple(args), seed=3)


@pytest.mark.parametrize("name", ["attention", "mlp", "cross_entropy"])
def test_jvp_against_naive_jacobian(name):
    """The tangent of the output along a direction equals <cotangent, naive backward> for unit cotangents."""
    layer = LAYERS[name]
    rng = np.random.default_rng(10)
    args, cot = layer.make(rng, 5, 7, "float64")
    tangents = tuple(rng.standard_normal(a.shape) if a.dtype.kind == "f" else np.zeros_like(a) for a in args)
    fn = lambda *a: layer.fold_fn(*a, block=(2, 3))  # noqa: E731
    ydot = fold.jvp(fn, tuple(args), tangents)[1]
    _, ref_grads = layer.naive(*args, cot)
    expected = sum(float(np.vdot(g, t)) for g, t in zip(ref_grads, tangents, strict=False))
    assert float(np.vdot(cot, ydot)) == pytest.approx(expected, rel=1e-10, abs=1e-12)


def test_hessian_vector_product_of_attention_matches_finite_differences():
    """jvp of grad (forward over reverse) through gemm_map_reduce and its backward primitive."""
    rng = np.random.default_rng(12)
    args, _ = _attention_args(rng, 4, 5, "float64")
    loss = lambda *a: fold.sum(L.attention(*a, block=(2, 3)) ** 2.0)  # noqa: E731
    grad = fold.grad(loss, argnums=(0, 1, 2))
    directions = tuple(rng.normal(size=np.shape(a)) for a in args)
    hvp = fold.jvp(grad, tuple(args), directions)[1]
    eps = 1e-6
    plus = grad(*(a + eps * d for a, d in zip(args, directions, strict=True)))
    minus = grad(*(a - eps * d for a, d in zip(args, directions, strict=True)))
    for h, p, m in zip(hvp, plus, minus, strict=True):
        np.testing.assert_allclose(h, (p - m) / (2 * eps), rtol=1e-6, atol=1e-8)


def test_second_order_attention():
    """Both second-order checks (jvp of vjp and vjp of vjp) through gemm_map_reduce."""
    args, _ = _attention_args(np.random.default_rng(11), 4, 5, "float64")
    fn = lambda *a: L.attention(*a, block=(2, 3))  # noqa: E731
    check_grads(fn, tuple(args), order=2)


def test_hessian_vector_products_forward_and_reverse_over_reverse_agree():
    """Rule against rule at second order: jvp of grad (the block sum's jvp rule) and grad of <grad, v> (its vjp
    rule) give one Hessian-vector product of an attention loss, and the naive formula's, by finite differences."""
    rng = np.random.default_rng(5)
    args, w = _attention_args(rng, M, N, "float64")
    loss = lambda q, k, v: fold.sum(L.attention(q, k, v, block=(4, 3)) * w)  # noqa: E731
    directions = tuple(rng.standard_normal(a.shape) for a in args)
    grad = fold.grad(loss, argnums=(0, 1, 2))
    forward_over_reverse = fold.jvp(grad, args, directions)[1]
    reverse_over_reverse = fold.grad(lambda *a: sum(fold.sum(g * d) for g, d in zip(grad(*a), directions, strict=True)),
                                     argnums=(0, 1, 2))(*args)
    for fr, rr in zip(forward_over_reverse, reverse_over_reverse, strict=True):
        np.testing.assert_allclose(rr, fr, rtol=1e-10, atol=1e-12)
    eps = 1e-5
    naive_grad = lambda *a: L.attention_naive(*a, w)[1]  # noqa: E731  (the hand-written backward)
    plus = naive_grad(*(a + eps * d for a, d in zip(args, directions, strict=True)))
    minus = naive_grad(*(a - eps * d for a, d in zip(args, directions, strict=True)))
    for rr, p_, m_ in zip(reverse_over_reverse, plus, minus, strict=True):
        np.testing.assert_allclose(rr, (p_ - m_) / (2 * eps), rtol=1e-6, atol=1e-8)


# ------------------------------------------------------------------------------------------ pairs against blocks

def _count(program: Program, name: str) -> int:
    """Statements of primitive `name` in `program` and every body inside it."""
    return sum((s.prim.name == name) + sum(_count(b, name) for b in s.prim.bodies()) for s in program.stmts)


def _backward_blocks(program: Program, rule: str) -> list[Program]:
    with ad.gemm_rule_scope(rule):
        grad_program, _ = ad.vjp_program(program)
    return [p for s in grad_program.stmts if isinstance(s.prim, GemmBlockSum) for _, p in s.prim.blocks]


@pytest.mark.parametrize("block", [1, (2, 3), (4, 7), (6, 1), None], ids=str)
@pytest.mark.parametrize("name", list(LAYERS))
def test_pairs_and_blocks_rules_give_the_same_cotangents(name, block):
    """Rule against rule: each pair a part of its row's fold (Theorem 2.1) or each block (Corollary 2.1.1),
    on full and ragged block grids; the pairs rule, the default, is also checked against the naive formulas
    by test_layer_against_naive_formula."""
    layer = LAYERS[name]
    args, cot = layer.make(np.random.default_rng(31), M, N, "float64")
    fn = lambda *a: layer.fold_fn(*a, block=block)  # noqa: E731
    results = {}
    for rule in ad.GEMM_RULES:
        with ad.gemm_rule_scope(rule):
            results[rule] = fold.vjp(fn, *tuple(args))[1](cot)[: layer.float_args]
    for k, (p, b) in enumerate(zip(results["pairs"], results["blocks"], strict=True)):
        _assert_rel(p, b, 1e-12, f"{name} cotangent of input {k}: pairs against blocks")
    _, ref_grads = layer.naive(*args, cot)
    for k, (b, rg) in enumerate(zip(results["blocks"], ref_grads, strict=True)):
        _assert_rel(b, rg, 1e-10, f"{name} cotangent of input {k} (blocks rule) against the naive backward")


def test_pairs_rule_skips_the_block_numerator_and_the_block_totals():
    """Attention's block backward under the pairs rule is FlashAttention-2's: five matrix products (S, dP, dV,
    dQ, dK) against six (the block's own numerator exp(S) V, which cancels), and no row maximum or
    logarithm; cross-entropy's recomputes no log-sum-exp of the block."""
    args, _ = _attention_args(np.random.default_rng(0), 12, 16, "float64")
    program = fold.trace(lambda *a: L.attention(*a, block=(6, 8)), *args)
    for rule, products in (("pairs", 5), ("blocks", 6)):
        for block in _backward_blocks(program, rule):
            assert _count(block, "matmul") == products, (rule, _count(block, "matmul"))
            assert (_count(block, "log") == 0) == (rule == "pairs"), rule
    ce_args, _ = _cross_entropy_args(np.random.default_rng(0), 12, 16, "float64")
    ce = fold.trace(lambda *a: L.cross_entropy(*a, block=(6, 8)), *ce_args)
    assert all(_count(b, "log") == 0 and _count(b, "max") == 0 for b in _backward_blocks(ce, "pairs"))
    assert all(_count(b, "log") > 0 for b in _backward_blocks(ce, "blocks"))


@pytest.mark.parametrize("rule", ad.GEMM_RULES)
def test_rows_that_see_no_column_get_zero_cotangents_without_nan(rule):
    """Query 0 of a strictly causal mask sees no key: its total is the identity (z = -inf), and neither rule
    may divide by its zero weight or take exp(-inf - -inf)."""
    Q, K, V = _attention_args(np.random.default_rng(13), M, N, "float64")[0]
    G = np.random.default_rng(14).standard_normal((M, 3))

    def strict(Q, K, V):
        i, j = fold.iota(M), fold.iota(N)
        return fold.gemm_map_reduce(fold.monoids.logwsum, lambda s, i, v, j: {"z": fold.where(j < i, s, -np.inf), "v": v},
                                    Q, K, rows=(i,), cols=(V, j), block=(2, 3))["v"]

    with ad.gemm_rule_scope(rule):
        dQ, dK, dV = fold.vjp(strict, Q, K, V)[1](G)
    assert np.all(np.isfinite(dQ)) and np.all(np.isfinite(dK)) and np.all(np.isfinite(dV))
    assert np.all(dQ[0] == 0.0)
    mask = np.arange(N)[None, :] < np.arange(M)[:, None]
    s = np.where(mask, Q @ K.T, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True, initial=-1e300, where=mask))
    p = np.where(mask, p, 0.0)
    p = p / np.where(p.sum(axis=1, keepdims=True) > 0, p.sum(axis=1, keepdims=True), 1.0)
    dp = G @ V.T
    ds = p * (dp - np.sum(G * (p @ V), axis=1, keepdims=True))
    _assert_rel(dV, p.T @ G, 1e-12, "dV")
    _assert_rel(dQ, ds @ K, 1e-12, "dQ")
    _assert_rel(dK, ds.T @ Q, 1e-12, "dK")


@pytest.mark.parametrize("monoid", ["max", "logaddexp", "sum"])
def test_generic_pairs_rule_for_monoids_of_full_fields(monoid):
    """Monoids whose fields are all held per pair take D pair by pair with no rule of their own; against the
    blocks rule and finite differences (max: continuous inputs, so no ties)."""
    m = getattr(fold.monoids, monoid)
    rng = np.random.default_rng(15)
    X, Y = rng.standard_normal((M, 4)), rng.standard_normal((N, 4))
    fn = lambda x, y: fold.gemm_map_reduce(m, lambda s: fold.sin(s) * s, x, y, block=(4, 3))  # noqa: E731
    fn.__name__ = f"gemm {monoid}"
    assert _count(_backward_blocks(fold.trace(fn, X, Y), "pairs")[0], "reduce") == 0  # no block totals
    g = rng.standard_normal(M)
    results = {}
    for rule in ad.GEMM_RULES:
        with ad.gemm_rule_scope(rule):
            results[rule] = fold.vjp(fn, X, Y)[1](g)
    for p, b in zip(results["pairs"], results["blocks"], strict=True):
        _assert_rel(p, b, 1e-12, f"{monoid}: pairs against blocks")
    check_grads(fn, (X, Y))


@pytest.mark.parametrize("v_form", ["weighted column", "per pair"])
def test_logwsum_pairs_rule_with_a_weighted_or_per_pair_value_field(v_form):
    """The logwsum pair rule for v = w_ij V_j (factored with a weight: the weight's cotangent is p_ij <g_i, V_j>)
    and for a v that depends on the pair (held in full), against the blocks rule and finite differences."""
    rng = np.random.default_rng(16)
    Q, K, V = rng.standard_normal((M, 4)), rng.standard_normal((N, 4)), rng.standard_normal((N, 3))
    if v_form == "weighted column":
        fn_map = lambda s, v: {"z": s, "v": fold.sigmoid(s) * v}  # noqa: E731
    else:
        fn_map = lambda s, v: {"z": s, "v": fold.sin(s + v)}  # noqa: E731
    fn = lambda q, k, v: fold.gemm_map_reduce(fold.monoids.logwsum, fn_map, q, k, cols=(v,), block=(4, 3))["v"]  # noqa: E731
    fn.__name__ = f"logwsum with v {v_form}"
    G = rng.standard_normal((M, 3))
    results = {}
    for rule in ad.GEMM_RULES:
        with ad.gemm_rule_scope(rule):
            results[rule] = fold.vjp(fn, Q, K, V)[1](G)
    for p, b in zip(results["pairs"], results["blocks"], strict=True):
        _assert_rel(p, b, 1e-12, f"{v_form}: pairs against blocks")
    check_grads(fn, (Q, K, V))


@pytest.mark.parametrize("rule", ad.GEMM_RULES)
def test_second_order_attention_under_each_gemm_rule(rule):
    """jvp of grad and grad of grad go through either block backward (its own block programs differentiated)."""
    args, _ = _attention_args(np.random.default_rng(11), 4, 5, "float64")
    fn = lambda *a: L.causal_attention(*a, block=(2, 3))  # noqa: E731
    fn.__name__ = f"causal attention [{rule}]"
    with ad.gemm_rule_scope(rule):
        check_grads(fn, tuple(args), order=2)


def test_gemm_rule_scope_refuses_an_unknown_rule():
    with pytest.raises(fold.FoldTypeError, match="gemm_rule must be one of 'pairs', 'blocks', got 'rows'"):
        with ad.gemm_rule_scope("rows"):
            pass


def test_block_sum_refuses_roles_that_do_not_fit_its_programs():
    program = fold.trace(lambda a, b: a * b, np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(fold.ShapeError, match="2 inputs and 1 outputs for 3 input roles"):
        GemmBlockSum((((2, 3), program),), (2, 3), ("row", "col", "whole"), ("row",))
    with pytest.raises(fold.ShapeError, match=r"unknown roles \['diagonal'\]"):
        GemmBlockSum((((2, 3), program),), (2, 3), ("row", "diagonal"), ("row",))


def test_reverse_over_reverse_keeps_the_grid_blocked():
    """The second-order gradient program is block sums all the way down: no M x N value at its top level."""
    args, w = _attention_args(np.random.default_rng(6), M, N, "float64")
    grad = fold.grad(lambda q, k, v: fold.sum(L.attention(q, k, v, block=(2, 3)) * w), argnums=(0, 1, 2))
    program = fold.trace(lambda *a: fold.grad(lambda *b: sum(fold.sum(g) for g in grad(*b)), argnums=(0, 1, 2))(*a), *args)
    sums = [s for s in program.stmts if isinstance(s.prim, GemmBlockSum)]
    assert any(s.prim.label.startswith("vjp(") for s in sums), [s.prim.label for s in sums]
    for stmt in program.stmts:
        for v in stmt.outs:
            assert not {M, N} <= set(v.aval.shape), f"{stmt.prim.name} makes a {v.aval.shape} value"


# ------------------------------------------------------------------------------------------ the meaning

def attention_nested(Q, K, V):
    scale = 1.0 / np.sqrt(Q.shape[1])

    def row(q):
        H = fold.map(lambda k, v: {"z": fold.sum(q * k) * scale, "v": v}, K, V)
        return fold.reduce(fold.monoids.logwsum, H)["v"]

    return fold.map(row, Q)


def causal_attention_nested(Q, K, V):
    scale = 1.0 / np.sqrt(Q.shape[1])
    js = fold.iota(K.shape[0])

    def row(q, i):
        H = fold.map(lambda k, v, j: {"z": fold.where(j <= i, fold.sum(q * k) * scale, -np.inf), "v": v}, K, V, js)
        return fold.reduce(fold.monoids.logwsum, H)["v"]

    return fold.map(row, Q, fold.iota(Q.shape[0]))


def cross_entropy_nested(P, C, targets):
    js = fold.iota(C.shape[0])

    def row(p, t):
        H = fold.map(lambda c, j: {"p": fold.sum(p * c), "n": fold.where(j == t, fold.sum(p * c), 0.0)}, C, js)
        A = fold.reduce(fold.monoids.cross_entropy, H)
        return A["p"] - A["n"]

    return fold.map(row, P, targets)


def distillation_nested(Ps, Cs, Pt, Ct):
    def row(ps, pt):
        H = fold.map(lambda cs, ct: {"q": fold.sum(ps * cs), "p": fold.sum(pt * ct), "n": fold.sum(ps * cs)}, Cs, Ct)
        A = fold.reduce(fold.monoids.cross_entropy_dist, H)
        return A["q"] - A["n"]

    return fold.map(row, Ps, Pt)


def mlp_nested(X, P, Q):
    def row(x):
        H = fold.map(lambda p, q: {"v": fold.sigmoid(fold.sum(x * p)) * q}, fold.transpose(P), Q)
        return fold.reduce(fold.monoids.vsum, H)["v"]

    return fold.map(row, X)


NESTED = {"attention": attention_nested, "causal_attention": causal_attention_nested,
          "cross_entropy": cross_entropy_nested, "distillation": distillation_nested, "mlp": mlp_nested}


@pytest.mark.parametrize("block", [(2, 3), None], ids=str)
@pytest.mark.parametrize("name", list(LAYERS))
def test_equals_nested_map_reduce_definition(name, block):
    layer = LAYERS[name]
    args, cot = layer.make(np.random.default_rng(12), M, N, "float64")
    fn = lambda *a: layer.fold_fn(*a, block=block)  # noqa: E731
    _assert_rel(fold.run(fn, *args), fold.run(NESTED[name], *args), 1e-10, f"{name} forward vs nested")
    grads, nested_grads = fold.vjp(fn, *tuple(args))[1](cot), fold.vjp(NESTED[name], *tuple(args))[1](cot)
    for k in range(layer.float_args):
        _assert_rel(grads[k], nested_grads[k], 1e-10, f"{name} cotangent {k} vs nested")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("block", [None, (2, 2), 1], ids=str)
def test_a_nan_or_infinite_product_reaches_its_rows_totals_as_in_the_nested_fold(block, bad):
    """Column 1 of B is non-finite, so is every row's product with it: the nested logaddexp fold gives NaN
    (a NaN), +inf (a +inf), or ignores the column (-inf), whatever the block. The blocked fold once shifted
    by the row maximum and tested the weight with > 0, which dropped the NaN and the +inf (NaN > 0 is false)
    and with it every other column of its block."""
    A, B = np.array([[1.0], [2.0], [0.5]]), np.array([[1.0], [bad], [3.0], [0.5]])
    gemm = fold.run(lambda A, B: fold.gemm_map_reduce(fold.monoids.logaddexp, lambda s: s, A, B, block=block), A, B)
    nested = fold.run(lambda A, B: fold.map(lambda a: fold.reduce(fold.monoids.logaddexp,
                                                                   fold.map(lambda b: fold.dot(a, b), B)), A), A, B)
    with np.errstate(invalid="ignore"):  # inf - inf inside NumPy's logaddexp
        want = np.logaddexp.reduce(A @ B.T, axis=1)
    np.testing.assert_allclose(nested, want, rtol=1e-12)
    np.testing.assert_allclose(gemm, want, rtol=1e-12)
    V = np.arange(8.0).reshape(4, 2)  # logwsum: z as logaddexp's total, v NaN wherever a weight is (inf - inf)
    out = fold.run(lambda A, B, V: fold.gemm_map_reduce(fold.monoids.logwsum, lambda s, v: {"z": s, "v": v}, A, B,
                                                        cols=(V,), block=block), A, B, V)
    nested = fold.run(lambda A, B, V: fold.map(lambda a: fold.reduce(
        fold.monoids.logwsum, fold.map(lambda b, v: {"z": fold.dot(a, b), "v": v}, B, V)), A), A, B, V)
    np.testing.assert_allclose(out["z"], want, rtol=1e-12)
    np.testing.assert_allclose(out["v"], nested["v"], rtol=1e-12)  # NaN where the other is NaN, nowhere else
    if bad == -np.inf:  # the column has no weight
        p = np.exp(A @ np.delete(B, 1, 0).T - want[:, None])
        np.testing.assert_allclose(out["v"], p @ np.delete(V, 1, 0), rtol=1e-12)
    elif bad == np.inf:  # the +inf column weighs 1, the others 0 (monoids.exp_weight), in every row
        np.testing.assert_array_equal(out["v"], np.broadcast_to(V[1], out["v"].shape))
    else:
        assert np.isnan(out["v"]).all()


def test_nested_program_has_no_gemm_but_gemm_program_has_one():
    args, _ = _attention_args(np.random.default_rng(0), M, N, "float64")
    assert not any(isinstance(s.prim, GemmMapReduce) for s in fold.trace(attention_nested, *args).stmts)
    assert any(isinstance(s.prim, GemmMapReduce) for s in fold.trace(L.attention, *args).stmts)


def test_several_matrix_products_and_row_and_column_data():
    """fn receives one s per (lhs, rhs) pair, then the row data, then the column data."""
    rng = np.random.default_rng(13)
    A1, B1, A2, B2 = rng.standard_normal((5, 3)), rng.standard_normal((8, 3)), rng.standard_normal((5, 2)), rng.standard_normal((8, 2))
    w, c = rng.standard_normal(5), rng.standard_normal((8, 4))

    def fn(A1, B1, A2, B2, w, c):
        out = fold.gemm_map_reduce(fold.monoids.vsum, lambda s1, s2, wi, cj: {"v": (s1 * s2 + wi) * cj},
                                   (A1, A2), (B1, B2), rows=(w,), cols=(c,), block=(2, 3))
        return out["v"]

    s1, s2 = A1 @ B1.T, A2 @ B2.T
    expected = (s1 * s2 + w[:, None]) @ c
    _assert_rel(fold.run(fn, A1, B1, A2, B2, w, c), expected, 1e-12, "two products")
    check_grads(fn, (A1, B1, A2, B2, w, c))


# ------------------------------------------------------------------------------------------ no d: the fallback

def _lse(monoid, block=(2, 3)):
    return lambda Q, K: fold.gemm_map_reduce(monoid, lambda s: s, Q, K, block=block)


def test_user_monoid_without_d_falls_back_with_one_warning():
    name = f"user_logaddexp_{uuid.uuid4().hex[:8]}"  # a fresh name: the warning is once per monoid name
    user = fold.Monoid(lambda a, b: fold.logaddexp(a, b), -np.inf, commutative=True, name=name)
    assert user.d is None
    rng = np.random.default_rng(14)
    Q, K, g = rng.standard_normal((M, 4)), rng.standard_normal((N, 4)), rng.standard_normal(M)
    _assert_rel(fold.run(_lse(user), Q, K), np.log(np.exp(Q @ K.T).sum(1)), 1e-12, "user logaddexp forward")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grads = fold.vjp(_lse(user), Q, K)[1](g)
        # a second, differently shaped program (the rule runs again, but does not warn again)
        fold.vjp(_lse(user, block=(3, 4)), Q[:5], K[:7])[1](g[:5])
    ours = [w for w in caught if name in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    message = str(ours[0].message)
    assert "no d" in message and "M x N" in message, message
    builtin = fold.vjp(_lse(fold.monoids.logaddexp), Q, K)[1](g)
    for a, b in zip(grads, builtin, strict=True):
        _assert_rel(a, b, 1e-10, "fallback gradient vs built-in logaddexp")
    w = np.exp(Q @ K.T - np.log(np.exp(Q @ K.T).sum(1, keepdims=True))) * g[:, None]
    _assert_rel(grads[0], w @ K, 1e-10, "fallback dQ")
    _assert_rel(grads[1], w.T @ Q, 1e-10, "fallback dK")


def test_builtin_monoid_with_d_does_not_warn():
    rng = np.random.default_rng(15)
    Q, K, g = rng.standard_normal((M, 4)), rng.standard_normal((N, 4)), rng.standard_normal(M)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fold.vjp(_lse(fold.monoids.logaddexp, block=(4, 5)), Q, K)[1](g)


def test_gradient_program_uses_the_blocked_backward():
    args, _ = _attention_args(np.random.default_rng(0), M, N, "float64")
    grad_program, _ = ad.vjp_program(fold.trace(lambda *a: L.attention(*a, block=(2, 3)), *args))
    prims = [type(s.prim) for s in grad_program.stmts]
    assert GemmBlockSum in prims


# ------------------------------------------------------------------------------------------ memory

BIG = 2048
SMALL_BLOCK = (128, 256)


def _big_attention_inputs(f=16, d=16, dtype=np.float32):
    rng = np.random.default_rng(16)
    return [rng.standard_normal(shape).astype(dtype) for shape in [(BIG, f), (BIG, f), (BIG, d), (BIG, d)]]


def _small_block_attention(Q, K, V):
    return L.attention(Q, K, V, block=SMALL_BLOCK)


def test_memory_estimate_of_forward_vjp_and_jvp_programs_is_far_below_m_by_n():
    Q, K, V, _ = _big_attention_inputs()
    full = BIG * BIG * Q.itemsize
    program = fold.trace(_small_block_attention, Q, K, V)
    grad_program, _ = ad.vjp_program(program)
    jvp_program, _ = ad.jvp_program(program)
    for what, p in [("forward", program), ("vjp", grad_program), ("jvp", jvp_program)]:
        estimate = fold.memory(p)
        assert estimate < 0.25 * full, f"{what}: fold.memory {estimate} bytes >= 25% of M*N*itemsize = {full}"


def test_measured_peak_of_forward_and_vjp_is_far_below_m_by_n():
    Q, K, V, G = _big_attention_inputs()
    full = BIG * BIG * Q.itemsize
    forward = fold.jit(_small_block_attention)
    forward(Q, K, V)  # trace and compile outside the measurement
    fold.vjp(_small_block_attention, Q, K, V)[1](G)

    def peak(fn):
        gc.collect()
        tracemalloc.start()
        try:
            result = fn()
            return tracemalloc.get_traced_memory()[1], result
        finally:
            tracemalloc.stop()

    fwd_peak, out = peak(lambda: forward(Q, K, V))
    vjp_peak, grads = peak(lambda: fold.vjp(_small_block_attention, Q, K, V)[1](G))
    assert fwd_peak < 0.25 * full, f"forward peak {fwd_peak} >= 25% of {full}"
    assert vjp_peak < 0.25 * full, f"vjp peak {vjp_peak} >= 25% of {full}"
    # and the results are right (spot check against the naive formula on a few rows)
    rows = slice(0, 64)
    s = Q[rows].astype(np.float64) @ K.T.astype(np.float64) / np.sqrt(Q.shape[1])
    p = np.exp(s - s.max(1, keepdims=True))
    _assert_rel(out[rows], (p / p.sum(1, keepdims=True)) @ V, 1e-4, "big attention forward rows")
    assert [g.shape for g in grads] == [Q.shape, K.shape, V.shape]


# ------------------------------------------------------------------------------------------ column fields

def _effective_sizes(program: Program, in_batches: list[tuple], depth: int, out: list) -> None:
    """(variable, effective shape) for every variable of `program` and its bodies, as the batched interpreter
    holds them: inside a map every value carries the map's axis, unless it is a captured value (broadcast,
    never copied), so a body input's batch is its source's batch plus (n,) for mapped values or (1,) for
    captured ones, and a statement's batch is the largest of its arguments'."""
    batch: dict = dict(zip(program.inputs, in_batches, strict=True))
    one = (1,) * depth

    def b(atom):
        return batch.get(atom, one) if isinstance(atom, Var) else one

    for v in program.inputs:
        out.append((v, batch[v] + v.aval.shape))
    for stmt in program.stmts:
        args = [b(a) for a in stmt.args]
        joint = tuple(max(sizes) for sizes in zip(*args)) if args else one
        joint = joint or one
        if isinstance(stmt.prim, Map):
            nc = stmt.prim.num_consts
            xs = stmt.args[nc:]
            n = xs[0].aval.shape[0]
            body_in = [b(c) + (1,) for c in stmt.args[:nc]] + [b(x) + (n,) for x in xs]
            _effective_sizes(stmt.prim.body, body_in, depth + 1, out)
        else:
            for body in stmt.prim.bodies():
                _effective_sizes(body, [joint] * len(body.inputs), depth, out)
        for v in stmt.outs:
            batch[v] = joint
            out.append((v, joint + v.aval.shape))


def _block_programs(program: Program) -> list[tuple[tuple, Program]]:
    found = []
    for stmt in program.stmts:
        if isinstance(stmt.prim, GemmMapReduce):
            found += [(shape, p) for shape, p in stmt.prim.blocks]
        if isinstance(stmt.prim, GemmBlockSum):
            found += [(shape, p) for shape, p in stmt.prim.blocks]
    return found


def _assert_no_broadcast_block(program: Program, bi: int, bj: int, d: int, what: str) -> None:
    blocks = _block_programs(program)
    assert blocks, f"{what}: no gemm block programs found"
    for (ri, rj), block in blocks:
        found: list = []
        _effective_sizes(block, [()] * len(block.inputs), 0, found)
        assert found
        for var, shape in found:
            squeezed = tuple(s for s in shape if s != 1)
            assert squeezed != (ri, rj, d), f"{what} block {ri}x{rj}: {var} is held as {shape}"
            assert int(np.prod(shape)) < ri * rj * d, f"{what} block {ri}x{rj}: {var} is held as {shape} (>= bi*bj*D)"


@pytest.mark.parametrize("name", ["attention", "mlp"])
def test_column_fields_are_not_broadcast_to_block_by_d(name):
    """attention's v = V_j and the MLP's sigmoid(s) * Q_j are folded by matrix products: no value of
    bi x bj x D (counting the batch axes of map bodies) in the forward or the backward block programs."""
    bi, bj, d, f = 6, 8, 5, 3
    rng = np.random.default_rng(17)
    if name == "attention":
        args = (rng.standard_normal((12, f)), rng.standard_normal((16, f)), rng.standard_normal((16, d)))
        fn = lambda *a: L.attention(*a, block=(bi, bj))  # noqa: E731
    else:
        args = (rng.standard_normal((12, f)), rng.standard_normal((f, 16)), rng.standard_normal((16, d)))
        fn = lambda *a: L.mlp(*a, block=(bi, bj))  # noqa: E731
    program = fold.trace(fn, *args)
    _assert_no_broadcast_block(program, bi, bj, d, f"{name} forward")
    grad_program, _ = ad.vjp_program(program)
    _assert_no_broadcast_block(grad_program, bi, bj, d, f"{name} vjp")


@pytest.mark.parametrize("gemm_rule", ad.GEMM_RULES)
@pytest.mark.parametrize("name", ["attention", "causal_attention", "distillation"])
def test_softmax_weighted_sums_divide_once_per_row_not_over_the_block(name, gemm_rule):
    """logwsum and cross_entropy_dist fold a block as (exp(z - max) @ column data) / row sums: no division
    over the bi x bj block in the forward or the backward block programs (the pairs rule divides nowhere:
    its weights are exp(z - A_z) with the row totals A)."""
    from fold.primitives import Elementwise

    bi, bj = 6, 8
    rng = np.random.default_rng(21)
    args, cot = LAYERS[name].make(rng, 12, 16, "float64")
    fn = lambda *a: LAYERS[name].fold_fn(*a, block=(bi, bj))  # noqa: E731
    program = fold.trace(fn, *args)
    with ad.gemm_rule_scope(gemm_rule):
        grad_program, _ = ad.vjp_program(program)
    forward = _block_programs(program)
    backward = [block for stmt in grad_program.stmts if isinstance(stmt.prim, GemmBlockSum) for block in stmt.prim.blocks]
    assert forward and backward
    for what, blocks in (("forward", forward), ("backward", backward)):
        for (ri, rj), block in blocks:
            divisions = [st.outs[0].aval.shape for st in block.stmts if isinstance(st.prim, Elementwise) and st.prim.op == "div"]
            assert all(shape in ((ri,), (ri, 1)) for shape in divisions), (what, divisions)
            assert divisions or (what, gemm_rule) == ("backward", "pairs"), what


def test_the_check_would_see_a_broadcast_field():
    """The generic block fold (a monoid without a block rule) expands column fields: the walker finds it."""
    vsum_user = fold.Monoid(lambda a, b: {"v": a["v"] + b["v"]}, {"v": 0.0}, commutative=True, name="user_vsum")
    rng = np.random.default_rng(18)
    X, P, Q = rng.standard_normal((12, 3)), rng.standard_normal((3, 16)), rng.standard_normal((16, 5))

    def mlp_user(X, P, Q):
        return fold.gemm_map_reduce(vsum_user, lambda s, q: {"v": fold.sigmoid(s) * q}, X, fold.transpose(P),
                                    cols=(Q,), block=(6, 8))["v"]

    with pytest.raises(AssertionError, match="held as"):
        _assert_no_broadcast_block(fold.trace(mlp_user, X, P, Q), 6, 8, 5, "user vsum")
    _assert_rel(fold.run(mlp_user, X, P, Q), (1 / (1 + np.exp(-(X @ P)))) @ Q, 1e-12, "generic block fold")


# ------------------------------------------------------------------------------------------ errors

def _qkv(m=M, n=N, f=4, d=3):
    rng = np.random.default_rng(19)
    return rng.standard_normal((m, f)), rng.standard_normal((n, f)), rng.standard_normal((n, d))


def _logwsum_map(s, v):
    return {"z": s, "v": v}


def test_error_inner_dimensions_differ():
    Q, K = np.ones((6, 4)), np.ones((10, 5))
    with pytest.raises(fold.ShapeError, match=r"inner dimensions.*\(6, 4\).*\(10, 5\)"):
        fold.gemm_map_reduce(fold.monoids.logaddexp, lambda s: s, Q, K)
    with pytest.raises(fold.ShapeError, match=r"\(6, 4\).*\(10, 5\)"):
        fold.run(lambda Q, K: fold.gemm_map_reduce(fold.monoids.logaddexp, lambda s: s, Q, K), Q, K)


def test_error_inner_dimensions_differ_in_second_pair():
    A, B = np.ones((6, 4)), np.ones((10, 4))
    with pytest.raises(fold.ShapeError, match=r"lhs\[1\].*\(6, 2\).*rhs\[1\].*\(10, 3\)"):
        fold.gemm_map_reduce(fold.monoids.logaddexp, lambda s, t: s + t, (A, np.ones((6, 2))), (B, np.ones((10, 3))))


def test_error_lhs_and_rhs_tuples_of_different_length():
    with pytest.raises(fold.ShapeError, match="same length"):
        fold.gemm_map_reduce(fold.monoids.logaddexp, lambda s: s, (np.ones((6, 4)), np.ones((6, 4))), np.ones((10, 4)))


def test_error_operand_not_a_matrix():
    with pytest.raises(fold.ShapeError, match=r"matrix.*\(4,\)"):
        fold.gemm_map_reduce(fold.monoids.logaddexp, lambda s: s, np.ones(4), np.ones((10, 4)))


def test_error_column_data_leading_axis_not_n():
    Q, K, _ = _qkv()
    V = np.ones((N + 1, 3))
    with pytest.raises(fold.ShapeError, match=rf"\({N + 1}, 3\).*N.*{N}"):
        fold.gemm_map_reduce(fold.monoids.logwsum, _logwsum_map, Q, K, cols=(V,))


def test_error_row_data_leading_axis_not_m():
    Q, K, V = _qkv()
    t = np.zeros(M + 2, np.int64)
    with pytest.raises(fold.ShapeError, match=rf"\({M + 2},\).*M.*{M}"):
        fold.gemm_map_reduce(fold.monoids.logwsum, lambda s, t, v: {"z": s, "v": v}, Q, K, rows=(t,), cols=(V,))


def test_error_scalar_row_data():
    Q, K, _ = _qkv()
    with pytest.raises(fold.ShapeError, match=rf"\(\).*M.*{M}"):
        fold.gemm_map_reduce(fold.monoids.logaddexp, lambda s, t: s + t, Q, K, rows=(np.float64(1.0),))


@pytest.mark.parametrize("fn", [lambda s, v: s, lambda s, v: (s, v), lambda s, v: {"z": s}, lambda s, v: {"z": s, "w": v}],
                         ids=["scalar", "tuple", "missing field", "wrong field"])
def test_error_map_output_structure_does_not_match_monoid(fn):
    Q, K, V = _qkv()
    with pytest.raises(fold.StructureError, match="logwsum"):
        fold.gemm_map_reduce(fold.monoids.logwsum, fn, Q, K, cols=(V,))


@pytest.mark.parametrize("block", [0, -1, (0, 4), (4, 0), (2, -3)], ids=str)
def test_error_block_not_positive(block):
    Q, K, V = _qkv()
    with pytest.raises(fold.ShapeError, match="positive"):
        fold.gemm_map_reduce(fold.monoids.logwsum, _logwsum_map, Q, K, cols=(V,), block=block)


@pytest.mark.parametrize("block", [1.5, "4", (1, 2, 3), (True, 2)], ids=str)
def test_error_block_not_ints(block):
    Q, K, V = _qkv()
    with pytest.raises(fold.FoldTypeError, match="block"):
        fold.gemm_map_reduce(fold.monoids.logwsum, _logwsum_map, Q, K, cols=(V,), block=block)


def test_error_first_argument_not_a_monoid():
    Q, K, _ = _qkv()
    with pytest.raises(fold.FoldTypeError, match="Monoid"):
        fold.gemm_map_reduce(lambda a, b: a + b, lambda s: s, Q, K)


# ------------------------------------------------------------------------------------------ printing

def test_printed_program_and_gradient_program():
    args, _ = _attention_args(np.random.default_rng(0), M, N, "float64")
    program = fold.trace(lambda *a: L.attention(*a, block=(2, 3)), *args)
    text = str(program)
    assert "gemm_map_reduce[logwsum" in text, text
    grad_program, _ = ad.vjp_program(program)
    assert "gemm_map_reduce_vjp[logwsum][block=(2, 3)]" in str(grad_program), str(grad_program)


def test_block_size_follows_the_memory_budget():
    """A smaller budget gives smaller blocks (and the same result); `block=` overrides the budget."""
    rng = np.random.default_rng(13)
    Q, K, V = rng.normal(size=(512, 8)), rng.normal(size=(512, 8)), rng.normal(size=(512, 4))

    def blocks(**kw):
        program = fold.trace(lambda Q, K, V: fold.gemm_map_reduce(fold.monoids.logwsum, lambda s, v: {"z": s, "v": v},
                                                                  Q, K, cols=(V,), **kw)["v"], Q, K, V)
        (stmt,) = [s for s in program.stmts if isinstance(s.prim, GemmMapReduce)]
        return stmt.prim.block

    small, large = blocks(budget=2**16), blocks(budget=2**26)
    assert small[0] * small[1] < large[0] * large[1]
    assert blocks(budget=2**16, block=(7, 9)) == (7, 9)
    run = lambda budget: fold.run(lambda Q, K, V: fold.gemm_map_reduce(  # noqa: E731
        fold.monoids.logwsum, lambda s, v: {"z": s, "v": v}, Q, K, cols=(V,), budget=budget)["v"], Q, K, V)
    np.testing.assert_allclose(run(2**16), run(2**26), rtol=1e-12, atol=1e-13)  # blocks reassociate the fold


def test_few_columns_give_taller_blocks_within_the_same_budget():
    """With fewer columns than a block's width (k-means' centroids), blocks take more rows instead, about as
    many pairs as a wide problem's blocks under the same budget, rather than a square block's worth of rows."""
    rng = np.random.default_rng(14)
    P, wide, narrow = rng.normal(size=(20000, 8)), rng.normal(size=(20000, 8)), rng.normal(size=(16, 8))

    def block(C, budget=2**20):
        program = fold.trace(lambda P, C: fold.gemm_map_reduce(fold.monoids.min, lambda s: s, P, C, budget=budget), P, C)
        (stmt,) = [s for s in program.stmts if isinstance(s.prim, GemmMapReduce)]
        return stmt.prim.block

    (wide_rows, wide_cols), (rows, cols) = block(wide), block(narrow)
    assert cols == 16 and wide_cols < 20000, (wide_rows, wide_cols, rows, cols)
    assert rows > 4 * wide_rows and 0.5 * wide_rows * wide_cols <= rows * cols <= 2 * wide_rows * wide_cols, \
        (wide_rows, wide_cols, rows, cols)
    assert block(narrow, budget=2**30)[0] == 20000  # never more rows than there are
    got = fold.run(lambda P, C: fold.gemm_map_reduce(fold.monoids.min, lambda s: s, P, C, budget=2**20), P, narrow)
    np.testing.assert_allclose(got, (P @ narrow.T).min(axis=1), rtol=1e-12, atol=1e-12)  # BLAS may round differently


# ------------------------------------------------------------------------------------------ inside a map

@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_inside_a_map_each_row_is_its_own_block_walk(backend):
    """Multi-head attention as a map over heads: each head's gemm_map_reduce (and its gradient's block sum)
    runs once per row of the map, as in a Python loop over heads; K is shared by every head (a captured
    value), Q and V vary. Values and gradients against that loop, jvp against finite differences."""
    layers = load_example("gemm_layers")
    rng = np.random.default_rng(21)
    Q, K, V = rng.normal(size=(3, 5, 4)), rng.normal(size=(6, 4)), rng.normal(size=(3, 6, 2))
    head = lambda q, k, v: layers.attention(q, k, v, block=(2, 4))  # noqa: E731
    heads = lambda Q, K, V: fold.map(lambda q, v: head(q, K, v), Q, V)  # noqa: E731
    ct = rng.normal(size=(3, 5, 2))
    got = fold.jit(heads, backend=backend)(Q, K, V)
    grads = fold.jit(lambda Q, K, V: fold.vjp(heads, Q, K, V)[1](ct), backend=backend)(Q, K, V)
    want = np.stack([fold.run(head, Q[h], K, V[h], backend=backend) for h in range(3)])
    per_head = [fold.jit(lambda q, k, v, c: fold.vjp(head, q, k, v)[1](c), backend=backend)(Q[h], K, V[h], ct[h])
                for h in range(3)]
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(grads[0], np.stack([g[0] for g in per_head]), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(grads[1], sum(g[1] for g in per_head), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(grads[2], np.stack([g[2] for g in per_head]), rtol=1e-12, atol=1e-14)
    check_grads(heads, (Q, K, V))
    empty = fold.jit(heads, backend=backend)(Q[:0], K, V[:0])
    assert empty.shape == (0, 5, 2)


@pytest.mark.parametrize("block", [(1, 1), (2, 2), None], ids=str)
@pytest.mark.parametrize("rule", list(GEMM_RULES))
@pytest.mark.parametrize("name", ["max", "min"])
def test_min_max_gradients_split_a_rows_cotangent_among_its_tied_pairs(name, rule, block):
    """Two identical rows of K (a duplicated key) tie for every row's extreme, yet the function is smooth in
    Q: its gradient is the key, once. D = g [a == c] gave it once per tied pair (twice); the row's cotangent
    is now split among its tied pairs, whatever the blocks, under both gemm rules (min/max take the pairs
    rule), so dQ matches finite differences and the nested form, and the two copies share dK evenly."""
    rng = np.random.default_rng(5)
    sign = 1.0 if name == "max" else -1.0
    Q = rng.uniform(0.5, 1.5, size=(4, 3))
    K = np.concatenate([3.0 * sign * np.ones((1, 3)), 0.1 * rng.normal(size=(2, 3)), 3.0 * sign * np.ones((1, 3))])
    monoid = getattr(fold.monoids, name)
    gemm = lambda Q, K: fold.reduce(fold.monoids.sum, fold.gemm_map_reduce(monoid, lambda s: s, Q, K, block=block))  # noqa: E731
    nested = lambda Q, K: fold.reduce(fold.monoids.sum, fold.map(lambda q: fold.reduce(monoid, K @ q), Q))  # noqa: E731
    with gemm_rule_scope(rule):
        dQ, dK = fold.grad(gemm, argnums=(0, 1))(Q, K)
        check_grads(lambda Q: gemm(Q, K), (Q,))
    nQ, nK = fold.grad(nested, argnums=(0, 1))(Q, K)
    np.testing.assert_allclose(dQ, nQ, rtol=1e-13)
    np.testing.assert_allclose(dQ, np.tile(K[0], (4, 1)), rtol=1e-13)
    np.testing.assert_allclose(dK[0], dK[3], rtol=1e-13)
    np.testing.assert_allclose(dK[0] + dK[3], nK[0] + nK[3], rtol=1e-13)
    np.testing.assert_array_equal(dK[1:3], 0.0)


def test_a_jvp_of_gemm_map_reduce_prints_and_lowers() -> None:
    # the jvp's gemm folds (value, tangent) pairs with an operator that is no monoid of fold.monoids: printing
    # it (what fold.lowered shows) raised AttributeError on its missing monoid
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(5, 3)), rng.normal(size=(7, 3))
    f = lambda q, k: fold.gemm_map_reduce(fold.monoids.logaddexp, lambda s: s, q, k, block=(2, 3))  # noqa: E731
    text = str(fold.trace(lambda q, k, dq, dk: fold.jvp(f, (q, k), (dq, dk))[1], q, k, q, k))
    assert "gemm_map_reduce[operator, block=(2, 3)]" in text, text
    lowered = str(fold.lowered(lambda q, k: fold.jvp(f, (q, k), (q, k))[1], q, k, backend="numba"))
    assert "gemm_map_reduce[operator" in lowered, lowered
