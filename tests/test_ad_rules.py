"""Rule against rule: reduce_rule "auto" (the specialised rules) vs "generic" vs "monoid", each also against
finite differences and, for + and *, against analytic gradients; the documented tie rules; zero cotangents
for integer and boolean values; and a coverage test of the rule tables."""

from __future__ import annotations

import numpy as np
import pytest

from fold import ad
import fold
from fold.ad.reduce_rules import applicable_rules
from fold.primitives import Reduce
from fold.rules import all_primitive_types
from fold.testing import check_grads, check_rules_agree, check_vjp

RULES = ("auto", "generic", "monoid")


def reduce_rules_of(f, *args) -> list[list[str]]:
    """The reduce rules that apply to each top-level reduce of f's program (auto takes the first)."""
    program = fold.trace(f, *args)
    return [applicable_rules(s.prim) for s in program.stmts if isinstance(s.prim, Reduce)]


def grads_under_each_rule(f, args: tuple, ybar) -> dict:
    out = {}
    for rule in RULES:
        try:
            out[rule] = fold.vjp(f, *args, reduce_rule=rule)[1](ybar)
        except fold.FoldError as err:
            assert rule == "monoid" and "reduce_rule='monoid'" in str(err), err
    return out


def assert_all_close(results: dict, expected: tuple, rtol: float = 1e-10, atol: float = 1e-12) -> None:
    for rule, cts in results.items():
        for got, want in zip(cts, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"reduce_rule={rule}")


# user monoids with d (Theorem 2.1), defined here so the monoid rule is tested on an operator of the user's
user_logaddexp = fold.Monoid(lambda a, b: fold.logaddexp(a, b), -np.inf, commutative=True,
                             d=lambda c, a, g: g * fold.exp(a - c), name="user_logaddexp")
user_prod = fold.Monoid(lambda a, b: a * b, 1.0, commutative=True, d=lambda c, a, g: g * c / a, name="user_prod")
# (1 + a)(1 + b) - 1: commutative, not recognised; dc/da = 1 + b = (1 + c) / (1 + a)
user_shifted_prod = fold.Monoid(lambda a, b: a + b + a * b, 0.0, commutative=True,
                                d=lambda c, a, g: g * (1.0 + c) / (1.0 + a), name="shifted_prod")


def distinct(n, shape=(), seed=0, lo=-2.0, hi=2.0):
    rng = np.random.default_rng(seed)
    size = n * int(np.prod(shape))
    return rng.permutation(np.linspace(lo, hi, size)).reshape((n,) + shape)


# ------------------------------------------------------------------------------------------ rule vs rule

FOLD_CASES = [
    ("sum_monoid", lambda x: fold.reduce(fold.monoids.sum, x * x), lambda: distinct(7, (3,)), ["add", "monoid", "generic"]),
    ("sum_lambda", lambda x: fold.reduce(lambda a, b: a + b, fold.sin(x), identity=0.0), lambda: distinct(7), ["add", "generic"]),
    ("prod_monoid", lambda x: fold.reduce(fold.monoids.prod, x), lambda: distinct(6, (2,), lo=0.5, hi=1.5), ["mul", "monoid", "generic"]),
    ("prod_lambda", lambda x: fold.reduce(lambda a, b: a * b, x, identity=1.0), lambda: distinct(6, lo=-1.5, hi=-0.5), ["mul", "generic"]),
    ("max_monoid", lambda x: fold.reduce(fold.monoids.max, x), lambda: distinct(8, (3,)), ["min/max", "monoid", "generic"]),
    ("min_monoid", lambda x: fold.reduce(fold.monoids.min, fold.exp(x)), lambda: distinct(8), ["min/max", "monoid", "generic"]),
    ("max_lambda", lambda x: fold.reduce(lambda a, b: fold.maximum(a, b), x, identity=-np.inf), lambda: distinct(8), ["min/max", "generic"]),
    ("logaddexp_monoid", lambda x: fold.reduce(fold.monoids.logaddexp, x), lambda: distinct(8, (2,)), ["monoid", "generic"]),
    ("logaddexp_user_monoid", lambda x: fold.reduce(user_logaddexp, x * 3.0), lambda: distinct(8), ["monoid", "generic"]),
    ("prod_user_monoid", lambda x: fold.reduce(user_prod, x), lambda: distinct(5, lo=0.5, hi=1.5), ["mul", "monoid", "generic"]),
    ("shifted_prod_user_monoid", lambda x: fold.reduce(user_shifted_prod, x), lambda: distinct(6, lo=-0.5, hi=0.5), ["monoid", "generic"]),
    ("logwsum_monoid", lambda z, v: fold.reduce(fold.monoids.logwsum, {"z": z, "v": v})["v"],
     lambda: (distinct(6), distinct(6, (3,), seed=1)), ["monoid", "generic"]),
    ("reduce_in_map", lambda x: fold.map(lambda r: fold.reduce(fold.monoids.max, r) + fold.reduce(fold.monoids.prod, r), x),
     lambda: distinct(4, (5,), lo=0.5, hi=1.5), None),
]


@pytest.mark.parametrize("name, f, make, expected_rules", FOLD_CASES, ids=[c[0] for c in FOLD_CASES])
def test_reduce_rules_agree_with_each_other_and_with_finite_differences(name, f, make, expected_rules) -> None:
    args = make() if isinstance(make(), tuple) else (make(),)
    if expected_rules is not None:
        assert reduce_rules_of(f, *args) == [expected_rules]
    results = check_rules_agree(f, args, rtol=1e-9, atol=1e-12)
    assert set(results) >= {"auto", "generic"}
    if expected_rules is not None and "monoid" in expected_rules:
        assert "monoid" in results
    for rule in results:
        check_vjp(f, args, reduce_rule=rule)
    check_grads(f, args)  # jvp against finite differences (the vjps were tied to it just above)


def test_rule_choice_under_auto() -> None:
    """auto takes the first applicable rule of the ordered list: specialised, then monoid, then generic."""
    x = distinct(4)
    assert reduce_rules_of(lambda v: fold.reduce(lambda a, b: a + b + a * b, v, identity=0.0), x)[0] == ["generic"]
    assert reduce_rules_of(lambda v: fold.reduce(fold.monoids.logaddexp, v), x)[0][0] == "monoid"
    assert reduce_rules_of(lambda v: fold.reduce(fold.monoids.sum, v), x)[0][0] == "add"
    noncommutative = fold.Monoid(lambda a, b: a + b + 0.0 * a * b, 0.0, d=lambda c, a, g: g)  # not declared commutative
    assert reduce_rules_of(lambda v: fold.reduce(noncommutative, v), x)[0] == ["generic"]


# ------------------------------------------------------------------------------------------ products with zeros


def product_grad(x: np.ndarray) -> np.ndarray:
    """d(prod x)/dx_i = product of the others, computed without division."""
    return np.array([np.prod(np.delete(x, i, axis=0), axis=0) for i in range(len(x))])


@pytest.mark.parametrize("zeros", [(), (2,), (0,), (5,), (1, 4), (0, 5), (0, 2, 3)], ids=lambda z: f"zeros_at_{z}")
@pytest.mark.parametrize("op", ["monoid", "lambda"])
def test_product_with_zeros_against_analytic(zeros: tuple, op: str) -> None:
    x = np.linspace(0.6, 1.6, 6) * np.array([1, -1, 1, 1, -1, 1])
    x[list(zeros)] = 0.0
    f = (lambda v: fold.reduce(fold.monoids.prod, v)) if op == "monoid" else (lambda v: fold.reduce(lambda a, b: a * b, v, identity=1.0))
    ybar = np.array(1.7)
    expected = 1.7 * product_grad(x)
    for rule in ("auto", "generic"):
        (ct,) = fold.vjp(f, x, reduce_rule=rule)[1](ybar)
        assert np.all(np.isfinite(ct)), (rule, ct)
        np.testing.assert_allclose(ct, expected, rtol=1e-12, atol=1e-15, err_msg=rule)
    assert np.count_nonzero(expected) == {0: 6, 1: 1}.get(len(zeros), 0)
    # forward mode is exact with zeros too
    xdot = np.arange(1.0, 7.0)
    np.testing.assert_allclose(fold.jvp(f, (x,), (xdot,))[1], expected / 1.7 @ xdot, rtol=1e-12, atol=1e-15)


def test_product_with_zeros_per_column_inside_rows() -> None:
    """Columns with no zero, one zero and two zeros in one reduce over (n, 3) elements."""
    x = np.linspace(0.5, 1.5, 15).reshape(5, 3)
    x[2, 1] = 0.0
    x[1, 2] = x[4, 2] = 0.0
    ybar = np.array([1.0, 2.0, 3.0])
    for rule in ("auto", "generic"):
        (ct,) = fold.vjp(lambda v: fold.reduce(fold.monoids.prod, v), x, reduce_rule=rule)[1](ybar)
        np.testing.assert_allclose(ct, ybar * product_grad(x), rtol=1e-12, atol=1e-15, err_msg=rule)


@pytest.mark.parametrize("op", ["monoid", "lambda"])
def test_product_histogram_with_zeros_against_analytic(op: str) -> None:
    """Bins with no zero, one zero and two zeros, of (n, 2) elements, and a value outside every bin."""
    x = np.linspace(0.5, 1.5, 18).reshape(9, 2)
    x[0, 0] = x[3, 1] = x[4, 1] = 0.0
    idx = np.array([0, 0, 1, 1, 1, 2, 2, 2, 7])
    ybar = np.arange(1.0, 9.0).reshape(4, 2)
    expected = np.zeros_like(x)
    for b in range(4):
        rows = np.flatnonzero(idx == b)
        if rows.size:
            expected[rows] = ybar[b] * product_grad(x[rows])
    m = fold.monoids.prod if op == "monoid" else (lambda a, b: a * b)
    f = (lambda v: fold.reduce_by_index(m, 4, idx, v)) if op == "monoid" else (lambda v: fold.reduce_by_index(m, 4, idx, v, identity=1.0))
    for rule in ("auto", "generic"):
        (ct,) = fold.vjp(f, x, reduce_rule=rule)[1](ybar)
        np.testing.assert_allclose(ct, expected, rtol=1e-12, atol=1e-15, err_msg=rule)


@pytest.mark.parametrize("gemm_rule", ad.GEMM_RULES)
def test_product_gemm_with_zeros_against_analytic(gemm_rule: str, monkeypatch) -> None:
    """Rows of the product with no zero, one zero and two zeros: prod's d divides by the part, so the
    gradient goes through the nested reduce's * rule (with a warning about its M x N intermediates)."""
    lhs = np.array([[1.0, 0.5], [0.0, 1.0], [0.0, 0.0]])
    rhs = np.array([[1.0, 1.0], [2.0, 0.5], [0.0, 3.0]])
    ybar = np.array([1.0, 2.0, 3.0])
    s = lhs @ rhs.T
    s_bar = ybar[:, None] * np.array([product_grad(row) for row in s])
    monkeypatch.setattr("fold.ad.gemm_rules._warned", set())  # the warning is given once per monoid
    with ad.gemm_rule_scope(gemm_rule), pytest.warns(UserWarning, match="divides by each part"):
        cl, cr = fold.vjp(lambda a, b: fold.gemm_map_reduce(fold.monoids.prod, lambda t: t, a, b), lhs, rhs)[1](ybar)
    np.testing.assert_allclose(cl, s_bar @ rhs, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(cr, s_bar.T @ lhs, rtol=1e-12, atol=1e-15)


def test_sum_against_analytic() -> None:
    x = distinct(5, (2,))
    ybar = np.array([0.5, -2.0])
    for rule in RULES:
        (ct,) = fold.vjp(lambda v: fold.reduce(fold.monoids.sum, v), x, reduce_rule=rule)[1](ybar)
        np.testing.assert_allclose(ct, np.broadcast_to(ybar, x.shape), rtol=1e-14, err_msg=rule)


# ------------------------------------------------------------------------------------------ scan rules


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_scan_add_specialised_vs_generic(exclusive: bool, reverse: bool) -> None:
    x = distinct(7, (2,))
    f = lambda v: fold.scan(fold.monoids.sum, fold.sin(v), exclusive=exclusive, reverse=reverse)  # noqa: E731
    results = check_rules_agree(f, (x,), rules=("auto", "generic"), rtol=1e-10, atol=1e-12)
    assert set(results) == {"auto", "generic"}
    check_grads(f, (x,))


# ------------------------------------------------------------------------------------------ reduce_by_index rules

RBI_IDX = np.array([0, 2, 2, 1, 5, 2, -1, 0, 3, 1])


@pytest.mark.parametrize("name, op, make", [
    ("sum", fold.monoids.sum, lambda: distinct(10, (2,))),
    ("max", fold.monoids.max, lambda: distinct(10, (2,))),
    ("min", fold.monoids.min, lambda: distinct(10)),
    ("logaddexp", fold.monoids.logaddexp, lambda: distinct(10)),
    ("user_monoid_with_d", user_shifted_prod, lambda: distinct(10, lo=-0.5, hi=0.5)),
    ("user_lambda", None, lambda: distinct(10, lo=-0.5, hi=0.5)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_reduce_by_index_rules_agree(name, op, make) -> None:
    x = make()
    if op is None:
        f = lambda v: fold.reduce_by_index(lambda a, b: a + b + a * b, 4, RBI_IDX, v, identity=0.0)  # noqa: E731
    else:
        f = lambda v: fold.reduce_by_index(op, 4, RBI_IDX, v * 1.5)  # noqa: E731
    results = check_rules_agree(f, (x,), rtol=1e-9, atol=1e-12)
    assert ("monoid" in results) == (op is not None)
    for rule in results:
        check_vjp(f, (x,), reduce_rule=rule)
    check_grads(f, (x,))
    for cts in results.values():  # indices 5 and -1 are outside [0, 4): no cotangent
        assert not np.any(cts[0][(RBI_IDX < 0) | (RBI_IDX >= 4)])


# ------------------------------------------------------------------------------------------ ties, pinned


TIED = np.array([1.0, 3.0, 0.5, 3.0, 2.0, 3.0])  # max 3.0 at indices 1, 3, 5
TIED_MIN = -TIED


@pytest.mark.parametrize("rule", ["auto", "generic"])
@pytest.mark.parametrize("kind", ["max", "min"])
def test_reduce_ties_go_to_the_lowest_index(rule: str, kind: str) -> None:
    x = TIED if kind == "max" else TIED_MIN
    for f in (lambda v: fold.reduce(getattr(fold.monoids, kind), v),
              lambda v: fold.reduce(lambda a, b: getattr(fold, kind + "imum")(a, b), v, identity=-np.inf if kind == "max" else np.inf)):
        (ct,) = fold.vjp(f, x, reduce_rule=rule)[1](np.array(2.5))
        np.testing.assert_array_equal(ct, [0.0, 2.5, 0.0, 0.0, 0.0, 0.0])
    # forward mode agrees: the tangent is the lowest tied index's
    assert float(fold.jvp(f, (x,), (np.arange(1.0, 7.0),))[1]) == 2.0


def _statements(program):
    for s in program.stmts:
        yield s
        for body in s.prim.bodies():
            yield from _statements(body)


@pytest.mark.parametrize("kind", ["max", "min"])
def test_a_rows_extremum_gradient_is_one_value_scattered_at_the_first_index(kind: str) -> None:
    """In a map's body the min/max rule's cotangent of a row is a histogram of one entry (the first index,
    the cotangent), not a mask as long as the row; a row holding NaN (its extremum NaN, equal to nothing)
    gets none. A whole program's array keeps the mask, elementwise with the rest of its gradient."""
    from fold.primitives import Elementwise, ReduceByIndex

    def masks(program):
        return [s for s in _statements(program)
                if isinstance(s.prim, Elementwise) and s.prim.op == "where" and s.args[1].aval.dtype.kind == "f"]

    row = lambda v: fold.reduce(getattr(fold.monoids, kind), v)  # noqa: E731
    rows = lambda X: fold.sum(fold.map(row, X))  # noqa: E731
    X = np.stack([TIED if kind == "max" else TIED_MIN, np.where(np.arange(6) == 2, np.nan, TIED)])
    program = fold.trace(lambda X: fold.vjp(rows, X)[1](np.array(2.5)), X)
    (scatter,) = [s for s in _statements(program) if isinstance(s.prim, ReduceByIndex)]
    assert scatter.args[-1].aval.shape == (1,) and scatter.outs[0].aval.shape == (6,)
    assert not masks(program), program
    for backend in ("numpy", "numba"):
        (ct,) = fold.jit(lambda X: fold.vjp(rows, X)[1](np.array(2.5)), backend=backend)(X)
        np.testing.assert_array_equal(ct, [[0.0, 2.5, 0.0, 0.0, 0.0, 0.0], np.zeros(6)])
    whole = fold.trace(lambda v: fold.vjp(row, v)[1](np.array(2.5)), X[0])
    assert masks(whole) and not any(isinstance(s.prim, ReduceByIndex) for s in _statements(whole))


@pytest.mark.parametrize("rule", ["auto", "generic"])
def test_reduce_ties_per_column(rule: str) -> None:
    x = np.array([[1.0, 5.0], [2.0, 5.0], [2.0, 4.0], [0.0, 5.0]])
    (ct,) = fold.vjp(lambda v: fold.reduce(fold.monoids.max, v), x, reduce_rule=rule)[1](np.array([1.0, 10.0]))
    np.testing.assert_array_equal(ct, [[0.0, 10.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])


def test_reduce_ties_under_the_monoid_rule_give_every_tied_part_the_cotangent() -> None:
    """Documented in fold/monoids.py: D of max is [a == c], so at ties each tied part gets g (not a subgradient;
    `auto` and `generic` give it to the lowest index instead)."""
    (ct,) = fold.vjp(lambda v: fold.reduce(fold.monoids.max, v), TIED, reduce_rule="monoid")[1](np.array(2.5))
    np.testing.assert_array_equal(ct, [0.0, 2.5, 0.0, 2.5, 0.0, 2.5])


@pytest.mark.parametrize("rule", ["auto", "generic"])
def test_reduce_by_index_ties_go_to_the_lowest_index(rule: str) -> None:
    idx = np.array([1, 0, 1, 1, 0, 2])
    v = np.array([4.0, 2.0, 1.0, 4.0, 2.0, 7.0])  # bin 0: tie at 1 and 4; bin 1: tie at 0 and 3
    for op in (fold.monoids.max, fold.monoids.min):
        (ct,) = fold.vjp(lambda v: fold.reduce_by_index(op, 3, idx, v), v, reduce_rule=rule)[1](np.array([1.0, 10.0, 100.0]))
        expected = [10.0, 1.0, 0.0, 0.0, 0.0, 100.0] if op is fold.monoids.max else [0.0, 1.0, 10.0, 0.0, 0.0, 100.0]
        np.testing.assert_array_equal(ct, expected, err_msg=f"{op.name} {rule}")


@pytest.mark.parametrize("rule", ["auto", "generic"])
def test_scan_max_ties_go_to_the_lowest_index(rule: str) -> None:
    x = np.array([2.0, 2.0, 1.0, 2.0, 3.0, 3.0])
    ybar = np.array([1.0, 10.0, 100.0, 1000.0, 1e4, 1e5])
    (ct,) = fold.vjp(lambda v: fold.scan(fold.monoids.max, v), x, reduce_rule=rule)[1](ybar)
    np.testing.assert_array_equal(ct, [1111.0, 0.0, 0.0, 0.0, 1.1e5, 0.0])


def test_elementwise_max_min_ties_go_to_the_first_argument() -> None:
    x = np.array([1.0, 2.0, 3.0])
    y = np.array([1.0, 5.0, 3.0])
    for op in (fold.maximum, fold.minimum):
        cx, cy = fold.vjp(op, x, y)[1](np.ones(3))
        first_wins = np.array([1.0, 1.0 if op is fold.minimum else 0.0, 1.0])
        np.testing.assert_array_equal(cx, first_wins)
        np.testing.assert_array_equal(cy, 1.0 - first_wins)
        np.testing.assert_array_equal(fold.jvp(op, (x, y), (np.ones(3), np.zeros(3)))[1], first_wins)
    (cx,) = fold.vjp(lambda v: fold.maximum(v, v), x)[1](np.ones(3))  # both arguments the same value
    np.testing.assert_array_equal(cx, np.ones(3))


# ------------------------------------------------------------------------------------------ integers and booleans


def mixed(x, n, b, i32):
    scaled = x * fold.convert(n, "float64") + fold.convert(i32, "float64")
    return fold.where(b, scaled, -scaled), n * 2, b


def test_integer_and_boolean_inputs_get_zero_cotangents_of_their_dtype() -> None:
    x = np.array([0.5, -1.0, 2.0])
    n = np.array([1, 2, 3], dtype=np.int64)
    b = np.array([True, False, True])
    i32 = np.array([7, 8, 9], dtype=np.int32)
    cts = fold.vjp(mixed, x, n, b, i32)[1]((np.ones(3), np.zeros(3, np.int64), np.zeros(3, bool)))
    np.testing.assert_allclose(cts[0], np.where(b, 1.0, -1.0) * n)
    for ct, arg in zip(cts, (x, n, b, i32), strict=True):
        assert ct.dtype == arg.dtype and ct.shape == arg.shape, (ct.dtype, arg.dtype)
    for ct in cts[1:]:
        assert not np.any(ct)


def test_integer_and_boolean_outputs_get_zero_tangents_of_their_dtype() -> None:
    x = np.array([0.5, -1.0, 2.0])
    n = np.array([1, 2, 3], dtype=np.int64)
    b = np.array([True, False, True])
    i32 = np.array([7, 8, 9], dtype=np.int32)
    tx, tn, tb = fold.jvp(mixed, (x, n, b, i32), (np.ones(3), np.zeros(3, np.int64), np.zeros(3, bool), np.zeros(3, np.int32)))[1]
    np.testing.assert_allclose(tx, np.where(b, 1.0, -1.0) * n)
    assert tn.dtype == np.int64 and tb.dtype == bool and not np.any(tn) and not np.any(tb)


_MIXED_IDX = np.array([0, 1, 0, 1, 1])
MIXED_RECORDS = {  # records with a float32 field beside a float64 one (attention on float32 scores, float64 values)
    "reduce logwsum": (lambda z, v: fold.reduce(fold.monoids.logwsum, {"z": z, "v": v})["v"], (5,), (5, 2)),
    "reduce wsum": (lambda w, v: fold.reduce(fold.monoids.wsum, {"v": v, "w": w})["v"], (5,), (5, 2)),
    "reduce_by_index logwsum": (lambda z, v: fold.reduce_by_index(fold.monoids.logwsum, 2, _MIXED_IDX, {"z": z, "v": v})["v"],
                                (5,), (5, 2)),
    "gemm attention": (lambda q, v: fold.gemm_map_reduce(fold.monoids.logwsum, lambda s, v: {"z": s, "v": v}, q,
                                                         np.linspace(-1.0, 1.0, 15).reshape(5, 3).astype(np.float32),
                                                         cols=(v,), block=(2, 3))["v"], (4, 3), (5, 2)),
}


@pytest.mark.parametrize("gemm_rule", ad.GEMM_RULES)
@pytest.mark.parametrize("rule", ["auto", "monoid", "generic"])
@pytest.mark.parametrize("name", list(MIXED_RECORDS))
def test_records_of_float32_and_float64_fields_get_cotangents_of_their_own_dtypes(name, rule, gemm_rule) -> None:
    """The monoids' D promotes a float32 field's cotangent to float64 when another field is float64; the
    cotangent must come back in its primal's dtype, with the values of the all-float64 gradient."""
    f, small_shape, v_shape = MIXED_RECORDS[name]
    rng = np.random.default_rng(3)
    small = rng.uniform(0.1, 1.0, small_shape).astype(np.float32)
    v = rng.normal(size=v_shape)
    out = np.asarray(fold.run(f, small, v))
    ct = rng.normal(size=out.shape)
    with ad.gemm_rule_scope(gemm_rule):
        got = fold.vjp(f, small, v, reduce_rule=rule)[1](ct)
        want = fold.vjp(f, small.astype(np.float64), v, reduce_rule="generic")[1](ct)
    assert [g.dtype for g in got] == [np.float32, np.float64]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


def test_integer_state_in_loops_and_records() -> None:
    def f(x, k):
        def body(i, s):
            return {"v": s["v"] * 0.9 + fold.sin(s["v"]), "count": s["count"] + 1}

        out = fold.loop(body, {"v": x, "count": k}, 4, checkpoint=3)
        return out["v"] * fold.convert(out["count"], "float64")

    x, k = np.array([0.3, -0.4]), np.array(2, dtype=np.int64)
    check_grads(f, (x, k))
    cx, ck = fold.vjp(f, x, k)[1](np.ones(2))
    assert ck.dtype == np.int64 and ck == 0


# ------------------------------------------------------------------------------------------ coverage

# primitives with no entry in a table, each with its reason (none is truly not applicable at the moment)
EXEMPT: dict[str, dict[type, str]] = {"jvp": {}, "vjp": {}}
# entries that are missing and should not be: a strict xfail each, so adding the rule turns it into a failure
MISSING: dict[tuple[str, str], str] = {}


def _coverage_params():
    for table_name in ("jvp", "vjp"):
        for prim in all_primitive_types():
            key = (table_name, prim.__name__)
            marks = [pytest.mark.xfail(strict=True, reason=MISSING[key])] if key in MISSING else []
            yield pytest.param(table_name, prim, marks=marks, id=f"{table_name}-{prim.__name__}")


@pytest.mark.parametrize("table_name, prim", list(_coverage_params()))
def test_every_primitive_has_a_rule(table_name: str, prim: type) -> None:
    table = {"jvp": ad.jvp_rules, "vjp": ad.vjp_rules}[table_name]
    if prim in EXEMPT[table_name]:
        assert prim not in table, f"{prim.__name__} is exempt from {table_name} but it has a rule: drop the exemption"
        return
    assert prim in table, f"no {table_name} rule for {prim.__name__}"


def test_every_primitive_is_exercised_by_a_gradient_test() -> None:
    """Each primitive type appears in some program the gradient tables trace (or their gradient programs)."""
    import test_ad_grads as table

    seen: set = set()

    def walk(program):
        for stmt in program.stmts:
            seen.add(type(stmt.prim))
            for body in stmt.prim.bodies():
                walk(body)

    for case in table.ELEMENTWISE + table.STRUCTURAL + table.COMBINATORS:
        program = fold.trace(case.fn, *case.args(np.random.default_rng(0)))
        walk(program)
        walk(ad.vjp_program(program)[0])
    missing = [p.__name__ for p in all_primitive_types() if p not in seen and p.__name__ not in MISSING]
    assert not missing, missing


# ------------------------------------------------------------------------------------------ stop_gradient

def test_stop_gradient_is_the_identity_with_zero_derivative():
    x = np.array([1.0, -2.0, 3.0])
    f = lambda x: fold.reduce(fold.monoids.sum, x * fold.stop_gradient(x))  # noqa: E731
    assert float(fold.run(f, x)) == pytest.approx(14.0)
    np.testing.assert_allclose(fold.grad(f)(x), x)  # d/dx of x * c is c, not 2x
    np.testing.assert_allclose(fold.jvp(f, (x,), (np.ones(3),))[1], x.sum())
    np.testing.assert_array_equal(fold.stop_gradient(x), x)  # eagerly, outside a trace
    assert "stop_gradient" in str(fold.trace(f, x))
