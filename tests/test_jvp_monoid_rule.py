"""The tangent of a reduce whose monoid qualifies for Theorem 2.1: ydot_j = sum_i <D(y, a_i, e_j), adot_i>
(ad/fold_jvp.py), checked rule against rule (the lifted operator, reduce_rule="generic"), against finite
differences, and, through Hessian-vector products, by the symmetry of the Hessian (the dot-product test).
Also what the forward transformation no longer computes: map results nothing reads, and tangents given as
concrete zeros."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold.ad import jvp_program
from fold.errors import FoldTypeError
from fold.dce import dce
from fold.ir import Lit
from fold.primitives import Map, Reduce

M = fold.monoids
rng = np.random.default_rng(5)

CASES = {
    "logaddexp": lambda x: fold.reduce(M.logaddexp, 1.5 * x),
    "cross_entropy": lambda x: fold.reduce(M.cross_entropy, {"p": x, "n": x * x})["p"]
    + 0.3 * fold.reduce(M.cross_entropy, {"p": x, "n": fold.sin(x)})["n"],
    "cross_entropy_dist": lambda x: sum(fold.reduce(M.cross_entropy_dist, {"q": x, "p": 0.5 * x, "n": fold.cos(x)})[k]
                                        * w for k, w in (("q", 1.0), ("p", -0.7), ("n", 0.4))),
    "logwsum": lambda x: fold.reduce(M.logwsum, {"z": x, "v": x * x})["v"],
    "wsum": lambda x: fold.reduce(M.wsum, {"v": fold.sin(x), "w": fold.exp(x)})["v"],
    "pairwise": lambda x: fold.reduce(M.pairwise, (x * x, fold.sin(x)))[0],
    "user_monoid": lambda x: fold.reduce(fold.Monoid(lambda a, b: fold.logaddexp(a, b) * 1.0, -np.inf, commutative=True,
                                                     d=lambda c, a, g: g * fold.exp(a - c), name="mine"), x),
    "rows_in_a_map": lambda X: fold.reduce(M.sum, fold.map(lambda r: fold.reduce(M.logaddexp, r) * fold.sum(r), X)),
}


def _args(case):
    return (rng.normal(size=(6, 9)),) if case == "rows_in_a_map" else (rng.normal(size=11),)


def _reduces(program, lifted: bool) -> int:
    """How many reduces (at any depth) fold (value, tangent) pairs with a lifted operator (no monoid kept)."""
    count = 0
    for stmt in program.stmts:
        if isinstance(stmt.prim, Reduce) and (stmt.prim.monoid is None) == lifted and stmt.prim.num_leaves > 1:
            count += 1
        count += sum(_reduces(b, lifted) for b in stmt.prim.bodies())
    return count


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_monoid_tangent_agrees_with_the_lifted_operator_and_finite_differences(case):
    f = CASES[case]
    (x,) = _args(case)
    v = rng.normal(size=x.shape)
    y, auto = fold.jvp(f, (x,), (v,))
    y_generic, generic = fold.jvp(f, (x,), (v,), reduce_rule="generic")
    np.testing.assert_allclose(y, y_generic, rtol=1e-13)
    np.testing.assert_allclose(auto, generic, rtol=1e-11, atol=1e-12)
    eps = 1e-6
    fd = (np.asarray(f(x + eps * v)) - np.asarray(f(x - eps * v))) / (2 * eps)
    np.testing.assert_allclose(auto, fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", ["logaddexp", "cross_entropy", "rows_in_a_map"])
def test_the_monoid_tangent_folds_no_pairs_and_the_generic_one_does(case):
    program = fold.trace(CASES[case], *_args(case))
    auto, _ = jvp_program(program)
    with fold.ad.reduce_rule_scope("generic"):
        generic, _ = jvp_program(program)
    assert _reduces(auto, lifted=True) == 0, auto
    assert _reduces(generic, lifted=True) >= 1, generic


@pytest.mark.parametrize("case", ["logaddexp", "cross_entropy", "rows_in_a_map"])
def test_hessian_vector_products_through_the_monoid_tangent_are_symmetric(case):
    """<u, H v> = <v, H u>, H from fold.jvp of fold.grad, and H v against differences of gradients."""
    f = CASES[case]
    (x,) = _args(case)
    u, v = rng.normal(size=x.shape), rng.normal(size=x.shape)
    g = fold.grad(f)
    hv, hu = fold.jvp(g, (x,), (v,))[1], fold.jvp(g, (x,), (u,))[1]
    np.testing.assert_allclose(np.vdot(u, hv), np.vdot(v, hu), rtol=1e-10)
    eps = 1e-6
    fd = (np.asarray(g(x + eps * v)) - np.asarray(g(x - eps * v))) / (2 * eps)
    np.testing.assert_allclose(hv, fd, rtol=1e-5, atol=1e-7)


def test_min_max_and_products_keep_the_lifted_operator():
    """D of min and max counts every tied extremum and D of * divides by the element: their tangents stay the
    lifted fold, which at a tie takes one tangent, not the sum of the tied ones."""
    x = np.array([1.0, 3.0, 3.0, 0.5])
    v = np.array([0.0, 1.0, 1.0, 0.0])
    for monoid in (M.max, M.min, M.prod):
        assert _reduces(jvp_program(fold.trace(lambda x: fold.reduce(monoid, x), x))[0], lifted=True) == 1
    assert float(fold.jvp(lambda x: fold.reduce(M.max, x), (x,), (v,))[1]) == 1.0


def test_an_unknown_reduce_rule_is_refused_naming_the_choices():
    with pytest.raises(FoldTypeError, match="'auto', 'generic', 'monoid'.*'fast'"):
        fold.jvp(CASES["logaddexp"], (np.ones(3),), (np.ones(3),), reduce_rule="fast")


def test_a_map_result_nothing_reads_is_not_computed():
    """dce drops a map's unread results from the map and its body (the jvp's primal beside the tangent)."""
    X = rng.normal(size=(5, 4))

    def f(X):
        a, b = fold.map(lambda r: (fold.reduce(M.logaddexp, r), fold.exp(r) * 2.0), X)
        return a

    program = dce(fold.trace(f, X))
    (stmt,) = [s for s in program.stmts if isinstance(s.prim, Map)]
    assert len(stmt.outs) == 1 and len(stmt.prim.body.outputs) == 1, program
    assert not any(s.prim.name == "exp" for s in stmt.prim.body.stmts), program
    np.testing.assert_allclose(fold.jit(f)(X), np.logaddexp.reduce(X, axis=1), rtol=1e-12)


def test_a_tangent_of_concrete_zeros_is_a_symbolic_zero():
    """In a Hessian-vector product with respect to one argument the others' tangents are zeros: the jitted
    program neither holds them as constants nor computes with them; the result is the same."""
    L, T, V = rng.normal(size=(4, 6)), rng.normal(size=(4, 6)), rng.normal(size=(4, 6))

    def f(L, T):
        return fold.reduce(M.sum, fold.map(lambda r, t: fold.reduce(M.logaddexp, r) - fold.reduce(M.sum, r * t), L, T))

    zeros = np.zeros_like(T)
    hvp = lambda L, T: fold.jvp(fold.grad(f), (L, T), (V, zeros))[1]  # noqa: E731
    program = fold.trace(hvp, L, T)
    constants = [a for s in program.stmts for a in s.args if isinstance(a, Lit) and np.shape(a.value) == T.shape]
    assert len(constants) == 1, program  # V alone
    nonzero = lambda L, T: fold.jvp(fold.grad(f), (L, T), (V, zeros + 1e-300))[1]  # noqa: E731
    np.testing.assert_allclose(fold.jit(hvp)(L, T), fold.jit(nonzero)(L, T), rtol=1e-12)
