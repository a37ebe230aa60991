"""The monoid library (fold.monoids), fold.check_monoid and fold.compare_rules.

- every built-in monoid passes check_monoid, with scalar fields and with vector fields of size 1 and 5;
- check_monoid catches planted defects (non-associative operators, a wrong identity, D with a wrong sign,
  a wrong factor or a missing term, a non-commutative operator claimed commutative), naming the law;
- -inf identities give no NaN in the operator, in D, or in the jvp/vjp of a reduce (all -inf included);
- each monoid's fold against a plain NumPy formula (Table 1 of the GeMMMapReduce paper);
- generic and monoid reduce rules agree to 1e-10 (float64), and both agree with finite differences, for a
  flat reduce, a reduce per row inside a map, and reduce_by_index;
- a user fold.Monoid works everywhere a built-in one does;
- the documented limits of D are pinned: prod with a zero part, min/max at ties;
- compare_rules reports every rule that applies, with times, memory and program sizes.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable, NamedTuple

import numpy as np
import pytest

import fold
from fold import monoids as M
from fold import ops
from fold.pytree import tree_flatten
from fold.testing import check_grads, check_rules_agree

NINF = -np.inf
VECTOR_MONOIDS = ("wsum", "logwsum", "vsum")  # the built-ins with a vector field v
LOG_MONOIDS = ("logaddexp", "logwsum", "cross_entropy", "cross_entropy_dist")  # identities with -inf
LOG_FIELDS = {"logwsum": ("z",), "cross_entropy": ("p",), "cross_entropy_dist": ("q", "p")}  # the -inf fields


def _rng(*key: Any) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _logsumexp(x: np.ndarray, axis: int = 0) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    return np.squeeze(m, axis) + np.log(np.sum(np.exp(x - m), axis=axis))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x))
    return e / e.sum()


# ------------------------------------------------------------------------------------------ one case per monoid

class MonoidCase(NamedTuple):
    """A built-in monoid with a way to draw n elements (as plain arrays) and to build its elements from them.

    `make(rng, n)` returns the argument arrays (each with leading axis n); `elements(*arrays)` builds the
    monoid's elements from them (called inside a trace, or on NumPy arrays for a single element).
    """

    monoid: fold.Monoid
    make: Callable[[np.random.Generator, int], tuple]
    elements: Callable[..., Any]


def _shape(n: int, d: int | None) -> tuple:
    return (n,) if d is None else (n, d)


def case_for(name: str, d: int | None = None) -> MonoidCase:
    """Random arguments away from the places where a derivative is not defined (zeros for prod, ties for
    min/max, zero weights for wsum)."""
    m = getattr(M, name)
    if name in ("sum", "logaddexp"):
        return MonoidCase(m, lambda rng, n: (rng.normal(size=n),), lambda x: x)
    if name == "prod":
        return MonoidCase(m, lambda rng, n: (rng.uniform(0.5, 1.5, n) * rng.choice([-1.0, 1.0], n),), lambda x: x)
    if name in ("min", "max"):
        return MonoidCase(m, lambda rng, n: (rng.permutation(np.linspace(-2.0, 2.0, n)) + rng.uniform(-0.01, 0.01, n),),
                          lambda x: x)
    if name == "wsum":
        return MonoidCase(m, lambda rng, n: (rng.normal(size=_shape(n, d)), rng.uniform(0.5, 2.0, n)),
                          lambda v, w: {"v": v, "w": w})
    if name == "logwsum":
        return MonoidCase(m, lambda rng, n: (rng.normal(size=n), rng.normal(size=_shape(n, d))),
                          lambda z, v: {"z": z, "v": v})
    if name == "cross_entropy":
        return MonoidCase(m, lambda rng, n: (rng.normal(size=n), rng.normal(size=n)), lambda p, n_: {"p": p, "n": n_})
    if name == "cross_entropy_dist":
        return MonoidCase(m, lambda rng, n: (rng.normal(size=n), rng.normal(size=n), rng.normal(size=n)),
                          lambda q, p, n_: {"q": q, "p": p, "n": n_})
    if name == "vsum":
        return MonoidCase(m, lambda rng, n: (rng.normal(size=_shape(n, d)),), lambda v: {"v": v})
    if name == "pairwise":
        return MonoidCase(m, lambda rng, n: (rng.normal(size=n), rng.normal(size=n)), lambda p, s: (p, s))
    raise KeyError(name)


def example_for(name: str, d: int | None = None) -> Any:
    """One element (zeros) shaped like the monoid's elements: the `example` check_monoid draws from."""
    case = case_for(name, d)
    args = case.make(np.random.default_rng(0), 1)
    return case.elements(*[np.zeros(a.shape[1:]) for a in args])


BUILTIN_NAMES = [m.name for m in M.BUILTIN]
# (name, D): D None means scalar fields; vector sizes 1 and 5 where the monoid has a vector field
SHAPED = [(name, None) for name in BUILTIN_NAMES] + [(name, d) for name in VECTOR_MONOIDS for d in (1, 5)]
SHAPED_IDS = [f"{name}-{'scalar' if d is None else f'D{d}'}" for name, d in SHAPED]


def test_the_library_is_complete() -> None:
    assert set(BUILTIN_NAMES) == {"sum", "prod", "min", "max", "logaddexp", "wsum", "logwsum", "cross_entropy",
                                  "cross_entropy_dist", "vsum", "pairwise"}
    for m in M.BUILTIN:
        assert isinstance(m, fold.Monoid) and m.commutative and m.d is not None, m
        assert m.name in repr(m)


# ------------------------------------------------------------------------------------------ check_monoid: the laws hold

@pytest.mark.parametrize("name, d", SHAPED, ids=SHAPED_IDS)
def test_builtin_monoid_passes_check_monoid(name: str, d: int | None) -> None:
    m = getattr(M, name)
    report = fold.check_monoid(m, example_for(name, d))
    assert report.ok, str(report)
    laws = [r.law for r in report.laws]
    assert laws == ["associativity", "left identity", "right identity", "commutativity", "d"]
    assert all(r.holds for r in report.laws)
    assert "all laws hold" in str(report) and "FAIL" not in str(report)
    fold.check_monoid(m, example_for(name, d), strict=True)  # does not raise


def test_check_monoid_in_float32() -> None:
    report = fold.check_monoid(M.logwsum, {"z": np.zeros((), np.float32), "v": np.zeros(3, np.float32)})
    assert report.ok, str(report)
    assert report.tolerance > 1e-7  # a float32 tolerance


# ------------------------------------------------------------------------------------------ check_monoid: planted defects

def _lae_d(factor: float, sign: float):
    return lambda c, a, g: sign * factor * g * ops.exp(a - c)


def _logwsum_d_without_inner(c, a, g):
    """logwsum's D without the <g_v, a_v - c_v> term in abar_z: one field's influence ignored."""
    weight = ops.exp(a["z"] - c["z"])
    return {"z": g["z"] * weight, "v": weight * g["v"]}


def _wsum_d_without_inner(c, a, g):
    return {"v": g["v"] * a["w"] / c["w"], "w": g["w"]}


def _pairwise_d_without_cross(c, a, g):
    """pairwise's D without the g_P (c_S - a_S) term: ignores how P depends on S."""
    return (g[0], g[1])


def _ce_dist_d_wrong_p(c, a, g):
    """cross_entropy_dist's D with the (a_n - c_n) term of abar_p signed wrong."""
    wq, wp = ops.exp(a["q"] - c["q"]), ops.exp(a["p"] - c["p"])
    return {"q": g["q"] * wq, "p": (g["p"] - g["n"] * (a["n"] - c["n"])) * wp, "n": g["n"] * wp}


def _matmul2(x, y):
    """2x2 matrices [[x0, x1], [x2, x3]] as tuples of four scalars: associative, not commutative."""
    return (x[0] * y[0] + x[1] * y[2], x[0] * y[1] + x[1] * y[3], x[2] * y[0] + x[3] * y[2], x[2] * y[1] + x[3] * y[3])


SCALAR = np.zeros(())

DEFECTS = {
    # name: (monoid, example, the laws that must fail, the laws that must hold)
    "subtraction": (fold.Monoid(lambda a, b: a - b, 0.0, name="sub"), SCALAR,
                    {"associativity", "left identity"}, {"right identity"}),
    "plain average": (fold.Monoid(lambda a, b: (a + b) / 2, 0.0, commutative=True, name="average"), SCALAR,
                      {"associativity"}, {"commutativity"}),
    "sum with identity 1": (fold.Monoid(lambda a, b: a + b, 1.0, commutative=True, d=lambda c, a, g: g, name="sum1"),
                            SCALAR, {"left identity", "right identity"}, {"associativity", "commutativity", "d"}),
    "logaddexp with identity 0": (fold.Monoid(M.logaddexp.op, 0.0, commutative=True, d=M.logaddexp.d, name="lae0"),
                                  SCALAR, {"left identity", "right identity"}, {"associativity", "commutativity", "d"}),
    "D with sign wrong": (fold.Monoid(M.logaddexp.op, NINF, commutative=True, d=_lae_d(1.0, -1.0), name="lae-sign"),
                          SCALAR, {"d"}, {"associativity", "left identity", "right identity", "commutativity"}),
    "D with factor 2": (fold.Monoid(M.logaddexp.op, NINF, commutative=True, d=_lae_d(2.0, 1.0), name="lae-2x"),
                        SCALAR, {"d"}, {"associativity", "left identity", "right identity", "commutativity"}),
    "prod D with factor 2": (fold.Monoid(M.prod.op, 1.0, commutative=True, d=lambda c, a, g: 2.0 * g * c / a,
                                         domain=M.prod.domain, name="prod-2x"),
                             SCALAR, {"d"}, {"associativity", "commutativity"}),
    "logwsum D ignoring a_v - c_v": (fold.Monoid(M.logwsum.op, M.logwsum.identity, commutative=True,
                                                 d=_logwsum_d_without_inner, name="logwsum-no-inner"),
                                     {"z": SCALAR, "v": np.zeros(5)}, {"d"}, {"associativity", "commutativity"}),
    "logwsum D ignoring a_v - c_v (D=1)": (fold.Monoid(M.logwsum.op, M.logwsum.identity, commutative=True,
                                                       d=_logwsum_d_without_inner, name="logwsum-no-inner"),
                                           {"z": SCALAR, "v": np.zeros(1)}, {"d"}, {"associativity"}),
    "wsum D ignoring a_v - c_v": (fold.Monoid(M.wsum.op, M.wsum.identity, commutative=True, d=_wsum_d_without_inner,
                                              domain=M.wsum.domain, name="wsum-no-inner"),
                                  {"v": np.zeros(3), "w": SCALAR}, {"d"}, {"associativity"}),
    "pairwise D ignoring the cross term": (fold.Monoid(M.pairwise.op, (0.0, 0.0), commutative=True,
                                                       d=_pairwise_d_without_cross, name="pairwise-no-cross"),
                                           (SCALAR, SCALAR), {"d"}, {"associativity", "commutativity"}),
    "cross_entropy_dist D with a sign wrong": (fold.Monoid(M.cross_entropy_dist.op, M.cross_entropy_dist.identity,
                                                           commutative=True, d=_ce_dist_d_wrong_p, name="ced-sign"),
                                               {"q": SCALAR, "p": SCALAR, "n": SCALAR}, {"d"}, {"associativity"}),
    "matrix product claimed commutative": (fold.Monoid(_matmul2, (1.0, 0.0, 0.0, 1.0), commutative=True, name="matmul2"),
                                           (SCALAR,) * 4, {"commutativity"},
                                           {"associativity", "left identity", "right identity"}),
}


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_check_monoid_catches_planted_defect(defect: str) -> None:
    m, example, failing, holding = DEFECTS[defect]
    report = fold.check_monoid(m, example)
    assert not report.ok, str(report)
    failed = {r.law for r in report.laws if not r.holds}
    assert failing <= failed, (failing, str(report))
    assert not holding & failed, (holding, str(report))
    text = str(report)
    assert "LAWS FAIL" in text and m.name in text
    for law in failing:
        result = report[law]
        assert result.worst_error > report.tolerance
        assert result.counterexample, law  # the worst elements are kept ...
        line = next(line for line in text.splitlines() if line.strip().startswith(law))
        assert "FAIL" in line  # ... and the failing law is named in the printout
    for law in holding:
        assert report[law].holds, law

    with pytest.raises(fold.MonoidLawError) as info:
        fold.check_monoid(m, example, strict=True)
    carried = info.value.report
    assert carried is not None and not carried.ok
    assert {r.law for r in carried.laws if not r.holds} == failed
    assert all(law in str(info.value) for law in failing) and m.name in str(info.value)
    assert isinstance(info.value, fold.FoldError)


def _naive_logwsum_op(x, y):
    """logwsum written without guards: exp(-inf - -inf) = NaN when both parts are the identity."""
    z = ops.logaddexp(x["z"], y["z"])
    return {"z": z, "v": x["v"] * ops.exp(x["z"] - z) + y["v"] * ops.exp(y["z"] - z)}


def test_check_monoid_names_an_example_of_the_wrong_structure() -> None:
    for example, got in ((SCALAR, r"\*"), ({"z": SCALAR, "w": np.zeros(3)}, r"\{'w': \*, 'z': \*\}")):
        with pytest.raises(fold.StructureError, match=rf"fold\.check_monoid: the example has structure {got}, but the "
                                                      r"elements of monoid logwsum have structure \{'v': \*, 'z': \*\}"):
            fold.check_monoid(M.logwsum, example)


def test_check_monoid_catches_an_identity_that_becomes_nan() -> None:
    """e . e = e is part of the identity law: a -inf identity the operator turns into NaN is caught (such an
    operator is fine on finite elements, and gives NaN in any fold with two -inf entries)."""
    m = fold.Monoid(_naive_logwsum_op, {"z": NINF, "v": 0.0}, commutative=True, name="naive_logwsum")
    report = fold.check_monoid(m, {"z": SCALAR, "v": np.zeros(3)})
    assert not report.ok and not report["left identity"].holds, str(report)
    assert report["associativity"].holds and report["commutativity"].holds
    assert report["left identity"].counterexample["a"]["z"] == NINF  # the identity itself is the witness
    out = fold.run(lambda z, v: fold.reduce(m, {"z": z, "v": v}), np.array([NINF, NINF, 1.0]), np.ones((3, 3)))
    assert np.isnan(out["v"]).any()  # what the report warns about
    with pytest.raises(fold.MonoidLawError, match="left identity"):
        fold.check_monoid(m, {"z": SCALAR, "v": np.zeros(3)}, strict=True)


def test_check_monoid_counterexample_breaks_the_law() -> None:
    """The reported worst counterexample really is one: re-evaluating the law on it shows the error."""
    report = fold.check_monoid(DEFECTS["plain average"][0], SCALAR)
    ce = report["associativity"].counterexample
    a, b, c = (float(ce[k]) for k in "abc")
    avg = lambda x, y: (x + y) / 2  # noqa: E731
    err = abs(avg(avg(a, b), c) - avg(a, avg(b, c))) / (1 + abs(avg(a, avg(b, c))))
    assert err == pytest.approx(report["associativity"].worst_error, rel=1e-6)


def test_check_monoid_rejects_a_non_monoid() -> None:
    with pytest.raises(fold.FoldTypeError, match="fold.Monoid"):
        fold.check_monoid(lambda a, b: a + b, SCALAR)


# ------------------------------------------------------------------------------------------ -inf identities

def _identity_of(name: str, d: int | None = None) -> Any:
    """The monoid's identity as arrays shaped like one element."""
    example = example_for(name, d)
    id_leaves, _ = tree_flatten(getattr(M, name).identity)
    ex_leaves, treedef = tree_flatten(example)
    return treedef.unflatten([np.broadcast_to(np.asarray(i, np.float64), e.shape).copy() for i, e in zip(id_leaves, ex_leaves, strict=True)])


def _finite_element(name: str, d: int | None, seed: int) -> Any:
    case = case_for(name, d)
    args = case.make(np.random.default_rng(seed), 1)
    return case.elements(*[a[0] for a in args])


def _no_nan(tree: Any) -> bool:
    return all(not np.any(np.isnan(np.asarray(x))) for x in tree_flatten(tree)[0])


def _assert_tree_equal(got: Any, want: Any) -> None:
    g, gd = tree_flatten(got)
    w, wd = tree_flatten(want)
    assert gd == wd
    for x, y in zip(g, w, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-13, atol=0)


LOG_SHAPED = [(name, None) for name in LOG_MONOIDS] + [("logwsum", 5)]
LOG_IDS = [f"{n}-{'scalar' if d is None else f'D{d}'}" for n, d in LOG_SHAPED]


@pytest.mark.parametrize("name, d", LOG_SHAPED, ids=LOG_IDS)
def test_minus_inf_identity_in_operator_and_d(name: str, d: int | None) -> None:
    m = getattr(M, name)
    e = _identity_of(name, d)
    x = _finite_element(name, d, 1)
    op = lambda a, b: m.op(a, b)  # noqa: E731
    # op(e, e) = e, op(e, x) = x = op(x, e), exactly and without NaN
    _assert_tree_equal(fold.run(op, e, e), e)
    _assert_tree_equal(fold.run(op, e, x), x)
    _assert_tree_equal(fold.run(op, x, e), x)
    # D at an empty total (c = e, a = e): the cotangent of an identity part is 0 in the log fields, and no NaN
    g = _finite_element(name, d, 2)
    abar = fold.run(lambda c, a, g_: m.d(c, a, g_), e, e, g)
    assert _no_nan(abar), abar
    # D of an identity part in a non-empty total: that part has no influence on the log fields
    abar = fold.run(lambda c, a, g_: m.d(c, a, g_), x, e, g)
    assert _no_nan(abar), abar
    log_fields = {"logaddexp": None, "logwsum": ["z", "v"], "cross_entropy": ["p"], "cross_entropy_dist": ["q", "p", "n"]}[name]
    if log_fields is None:
        assert float(abar) == 0.0
    else:
        for k in log_fields:
            assert np.all(np.asarray(abar[k]) == 0.0), (k, abar)
    # the jvp and vjp of the operator itself at identities: no NaN
    t = _finite_element(name, d, 3)
    for a, b in ((e, e), (e, x), (x, e)):
        assert _no_nan(fold.jvp(op, (a, b), (t, t))[1])
        assert _no_nan(fold.vjp(op, a, b)[1](g))
    # and D agrees with the operator's own vjp where the total is not empty
    vjp_a = fold.vjp(op, e, x)[1](g)[0]
    d_a = fold.run(lambda c, a, g_: m.d(c, a, g_), fold.run(op, e, x), e, g)
    _assert_tree_equal(d_a, vjp_a)


def _log_reduce_case(name: str, d: int | None, n: int, neg_inf: np.ndarray):
    """(f, args, cotangent) for a reduce whose log fields are -inf where `neg_inf`."""
    case = case_for(name, d)
    args = list(case.make(_rng("inf", name, d, n), n))
    log_positions = {"logaddexp": [0], "logwsum": [0], "cross_entropy": [0], "cross_entropy_dist": [0, 1]}[name]
    for i in log_positions:
        args[i] = np.where(neg_inf, NINF, args[i])
    f = lambda *xs: fold.reduce(case.monoid, case.elements(*xs))  # noqa: E731
    out = fold.run(f, *args)
    ct = fold.tree_map(lambda x: np.ones_like(np.asarray(x)), out)
    return f, tuple(args), ct, out


@pytest.mark.parametrize("name, d", LOG_SHAPED, ids=LOG_IDS)
def test_minus_inf_entries_in_reduce_jvp_and_vjp(name: str, d: int | None) -> None:
    neg_inf = np.array([True, False, True, False, False, True])
    f, args, ct, out = _log_reduce_case(name, d, 6, neg_inf)
    assert _no_nan(out) and np.all(np.isfinite(np.asarray(tree_flatten(out)[0][0])))
    grads = {rule: fold.vjp(f, *args, reduce_rule=rule)[1](ct) for rule in ("auto", "generic", "monoid")}
    for rule, g in grads.items():
        assert _no_nan(g), (rule, g)
        # the -inf entries have no influence on the total: their log-field cotangent is exactly 0
        assert np.all(np.asarray(g[0])[neg_inf] == 0.0), (rule, g[0])
        for a, b in zip(tree_flatten(g)[0], tree_flatten(grads["generic"])[0], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    tangents = tuple(np.where(np.isfinite(a), 1.0, 0.0) * _rng("t", name).normal(size=a.shape) for a in args)
    ydot = fold.jvp(f, args, tangents)[1]
    assert _no_nan(ydot), ydot
    # dot-product identity <ybar, J xdot> = <J^T ybar, xdot>, -inf entries included
    lhs = sum(float(np.vdot(np.asarray(a), np.asarray(b))) for a, b in zip(tree_flatten(ct)[0], tree_flatten(ydot)[0], strict=True))
    rhs = sum(float(np.vdot(np.asarray(a), np.asarray(b))) for a, b in zip(grads["monoid"], tangents, strict=True))
    assert lhs == pytest.approx(rhs, rel=1e-10, abs=1e-12)
    # the same as the gradient of the reduce over the finite entries only
    kept = tuple(a[~neg_inf] for a in args)
    reduced = fold.vjp(f, *kept, reduce_rule="monoid")[1](ct)
    for g_full, g_kept in zip(grads["monoid"], reduced, strict=True):
        np.testing.assert_allclose(np.asarray(g_full)[~neg_inf], g_kept, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name, d", LOG_SHAPED, ids=LOG_IDS)
def test_minus_inf_entries_second_derivatives(name: str, d: int | None) -> None:
    """jvp of vjp (Hessian-vector products) with -inf entries: no NaN, and the same under both rules."""
    neg_inf = np.array([False, True, False, False, True])
    f, args, ct, _ = _log_reduce_case(name, d, 5, neg_inf)
    rng = _rng("hvp", name, d)
    tangents = tuple(np.where(np.isfinite(a), 1.0, 0.0) * rng.normal(size=a.shape) for a in args)
    hvp = {rule: fold.jvp(lambda *xs, _r=rule: fold.vjp(f, *xs, reduce_rule=_r)[1](ct), args, tangents)[1]
           for rule in ("generic", "monoid")}
    assert _no_nan(hvp["generic"]) and _no_nan(hvp["monoid"]), hvp
    for a, b in zip(hvp["monoid"], hvp["generic"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name, d", LOG_SHAPED, ids=LOG_IDS)
def test_all_minus_inf_reduce_has_no_nan(name: str, d: int | None) -> None:
    neg_inf = np.ones(5, bool)
    f, args, ct, out = _log_reduce_case(name, d, 5, neg_inf)
    assert _no_nan(out), out
    log_totals = [out] if name == "logaddexp" else [out[k] for k in LOG_FIELDS[name]]
    assert all(np.all(np.asarray(t) == NINF) for t in log_totals), out
    if name == "logwsum":
        assert np.all(np.asarray(out["v"]) == 0.0)  # the empty weighted mean is the identity's v
    for rule in ("auto", "generic", "monoid"):
        g = fold.vjp(f, *args, reduce_rule=rule)[1](ct)
        assert _no_nan(g), (rule, g)
        assert all(np.all(np.isfinite(np.asarray(x))) for x in g), (rule, g)
    # the monoid rule: D is 0 where the total is -inf (documented in fold.monoids)
    assert np.all(np.asarray(fold.vjp(f, *args, reduce_rule="monoid")[1](ct)[0]) == 0.0)
    tangents = tuple(np.ones_like(a) for a in args)
    assert _no_nan(fold.jvp(f, args, tangents)[1])


def test_minus_inf_with_large_magnitudes() -> None:
    """Log-space folds stay exact at magnitudes where exp overflows, next to -inf entries."""
    z = np.array([1000.0, NINF, 1000.0 + np.log(3.0), -1000.0])
    v = np.array([[1.0, 0.0], [5.0, 5.0], [0.0, 1.0], [7.0, 7.0]])
    out = fold.run(lambda z, v: fold.reduce(M.logwsum, {"z": z, "v": v}), z, v)
    np.testing.assert_allclose(out["z"], 1000.0 + np.log(4.0), rtol=1e-15)
    np.testing.assert_allclose(out["v"], [0.25, 0.75], rtol=1e-12)
    lae = fold.run(lambda x: fold.reduce(M.logaddexp, x), z)
    np.testing.assert_allclose(lae, 1000.0 + np.log(4.0), rtol=1e-15)
    g = fold.vjp(lambda x: fold.reduce(M.logaddexp, x), z, reduce_rule="monoid")[1](1.0)[0]
    np.testing.assert_allclose(g, [0.25, 0.0, 0.75, 0.0], atol=1e-15)


# ------------------------------------------------------------------------------------------ forward semantics vs NumPy

def _fold_of(name: str, *args: np.ndarray) -> Any:
    case = case_for(name)
    return fold.run(lambda *xs: fold.reduce(case.monoid, case.elements(*xs)), *args)


def test_forward_scalar_monoids() -> None:
    rng = _rng("fwd-scalar")
    x = rng.normal(size=37)
    np.testing.assert_allclose(_fold_of("sum", x), np.sum(x), rtol=1e-13)
    p = rng.uniform(0.5, 1.5, 37)
    np.testing.assert_allclose(_fold_of("prod", p), np.prod(p), rtol=1e-13)
    assert float(_fold_of("min", x)) == np.min(x) and float(_fold_of("max", x)) == np.max(x)
    np.testing.assert_allclose(_fold_of("logaddexp", x), _logsumexp(x), rtol=1e-13)


@pytest.mark.parametrize("d", [None, 1, 5])
def test_forward_wsum_is_np_average(d: int | None) -> None:
    rng = _rng("fwd-wsum", d)
    v, w = rng.normal(size=_shape(23, d)), rng.uniform(0.1, 3.0, 23)
    out = fold.run(lambda v, w: fold.reduce(M.wsum, {"v": v, "w": w}), v, w)
    np.testing.assert_allclose(out["v"], np.average(v, axis=0, weights=w), rtol=1e-12)
    np.testing.assert_allclose(out["w"], w.sum(), rtol=1e-13)
    # zero total weight: the identity's v (0), not NaN
    empty = fold.run(lambda v, w: fold.reduce(M.wsum, {"v": v, "w": w}), v, np.zeros(23))
    assert np.all(empty["v"] == 0.0) and float(empty["w"]) == 0.0


@pytest.mark.parametrize("d", [None, 1, 5])
def test_forward_logwsum_is_softmax_weighted_mean(d: int | None) -> None:
    rng = _rng("fwd-logwsum", d)
    z, v = 3.0 * rng.normal(size=31), rng.normal(size=_shape(31, d))
    out = fold.run(lambda z, v: fold.reduce(M.logwsum, {"z": z, "v": v}), z, v)
    np.testing.assert_allclose(out["z"], _logsumexp(z), rtol=1e-13)
    np.testing.assert_allclose(out["v"], np.tensordot(_softmax(z), v, axes=1), rtol=1e-12, atol=1e-14)


def test_forward_cross_entropy_against_class_index() -> None:
    """Table 1: H_j = {p: logit_j, n: [t == j] logit_j}; fold gives p - n = logsumexp(logits) - logits[t]."""
    rng = _rng("fwd-ce")
    logits, t = rng.normal(size=19), 7
    out = _fold_of("cross_entropy", logits, np.where(np.arange(19) == t, logits, 0.0))
    loss = float(out["p"] - out["n"])
    np.testing.assert_allclose(out["p"], _logsumexp(logits), rtol=1e-13)
    np.testing.assert_allclose(loss, -np.log(_softmax(logits)[t]), rtol=1e-12)


def test_forward_cross_entropy_between_distributions() -> None:
    """Table 1: H_j = {q: student logit s_j, p: teacher logit t_j, n: s_j}; the fold gives q = lse(s),
    p = lse(t), n = sum_j softmax(t)_j s_j, and Y = q - n is the cross-entropy of softmax(s) against the
    target distribution softmax(t): -sum_j softmax(t)_j log softmax(s)_j."""
    rng = _rng("fwd-ce-dist")
    s, t = 2.0 * rng.normal(size=29), 2.0 * rng.normal(size=29)
    out = _fold_of("cross_entropy_dist", s, t, s)
    np.testing.assert_allclose(out["q"], _logsumexp(s), rtol=1e-13)
    np.testing.assert_allclose(out["p"], _logsumexp(t), rtol=1e-13)
    np.testing.assert_allclose(out["n"], _softmax(t) @ s, rtol=1e-12)
    reference = -np.sum(_softmax(t) * np.log(_softmax(s)))
    np.testing.assert_allclose(float(out["q"] - out["n"]), reference, rtol=1e-12)


@pytest.mark.parametrize("d", [None, 1, 5])
def test_forward_vsum(d: int | None) -> None:
    v = _rng("fwd-vsum", d).normal(size=_shape(17, d))
    np.testing.assert_allclose(fold.run(lambda v: fold.reduce(M.vsum, {"v": v}), v)["v"], v.sum(axis=0), rtol=1e-13)


def test_forward_pairwise() -> None:
    w = _rng("fwd-pairwise").normal(size=41)
    p, s = _fold_of("pairwise", np.zeros(41), w)
    np.testing.assert_allclose(p, (w.sum() ** 2 - (w * w).sum()) / 2, rtol=1e-12)
    np.testing.assert_allclose(s, w.sum(), rtol=1e-13)
    brute = sum(w[i] * w[j] for i in range(41) for j in range(i))
    np.testing.assert_allclose(p, brute, rtol=1e-12)


@pytest.mark.parametrize("name, d", SHAPED, ids=SHAPED_IDS)
def test_scan_matches_prefix_reduces(name: str, d: int | None) -> None:
    case = case_for(name, d)
    args = case.make(_rng("scan", name, d), 9)
    scanned = fold.run(lambda *xs: fold.scan(case.monoid, case.elements(*xs)), *args)
    for i in (0, 4, 8):
        prefix = fold.run(lambda *xs: fold.reduce(case.monoid, case.elements(*xs)), *[a[: i + 1] for a in args])
        for s, r in zip(tree_flatten(scanned)[0], tree_flatten(prefix)[0], strict=True):
            np.testing.assert_allclose(np.asarray(s)[i], r, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------------------------------ gradients: rule against rule, and finite differences

RULE_TOL = dict(rtol=1e-10, atol=1e-12)


def _assert_monoid_rule_ran(results: dict) -> None:
    assert set(results) == {"auto", "generic", "monoid"}, set(results)


@pytest.mark.parametrize("name, d", SHAPED, ids=SHAPED_IDS)
def test_reduce_generic_and_monoid_rules_agree(name: str, d: int | None) -> None:
    case = case_for(name, d)
    args = case.make(_rng("reduce", name, d), 11)
    f = lambda *xs: fold.reduce(case.monoid, case.elements(*xs))  # noqa: E731
    f.__name__ = f"reduce[{name}]"
    _assert_monoid_rule_ran(check_rules_agree(f, args, **RULE_TOL))
    check_grads(f, args)
    for rule in ("generic", "monoid"):
        fold.testing.check_vjp(f, args, reduce_rule=rule)


@pytest.mark.parametrize("name, d", SHAPED, ids=SHAPED_IDS)
def test_reduce_per_row_in_a_map_rules_agree(name: str, d: int | None) -> None:
    case = case_for(name, d)
    rows = [case.make(_rng("map", name, d, r), 7) for r in range(4)]
    args = tuple(np.stack(column) for column in zip(*rows, strict=True))
    f = lambda *xs: fold.map(lambda *row: fold.reduce(case.monoid, case.elements(*row)), *xs)  # noqa: E731
    f.__name__ = f"map(reduce[{name}])"
    _assert_monoid_rule_ran(check_rules_agree(f, args, **RULE_TOL))
    check_grads(f, args)


@pytest.mark.parametrize("name, d", SHAPED, ids=SHAPED_IDS)
def test_reduce_by_index_rules_agree(name: str, d: int | None) -> None:
    case = case_for(name, d)
    args = case.make(_rng("rbi", name, d), 12)
    # every bin gets a value (an empty log-space bin would be -inf, and finite differences of -inf are NaN);
    # one index out of range, which is ignored
    idx = np.array([0, 2, 1, 0, 2, 2, 1, 0, 3, 3, -1, 1])
    f = lambda *xs: fold.reduce_by_index(case.monoid, 4, idx, case.elements(*xs))  # noqa: E731
    f.__name__ = f"reduce_by_index[{name}]"
    results = check_rules_agree(f, args, **RULE_TOL)
    _assert_monoid_rule_ran(results)
    for leaf in results["monoid"]:
        assert np.all(np.asarray(leaf)[10] == 0.0)  # the ignored value has no influence
    check_grads(f, args)


def test_reduce_by_index_empty_log_bin_has_no_nan() -> None:
    rng = _rng("rbi-empty")
    z, v = rng.normal(size=6), rng.normal(size=(6, 3))
    idx = np.array([0, 2, 0, 2, 2, 0])  # bin 1 is empty: it holds the identity {z: -inf, v: 0}
    f = lambda z, v: fold.reduce_by_index(M.logwsum, 3, idx, {"z": z, "v": v})  # noqa: E731
    out = fold.run(f, z, v)
    assert out["z"][1] == NINF and np.all(out["v"][1] == 0.0)
    ct = {"z": np.ones(3), "v": np.ones((3, 3))}
    grads = {rule: fold.vjp(f, z, v, reduce_rule=rule)[1](ct) for rule in ("auto", "generic", "monoid")}
    for g in grads.values():
        assert _no_nan(g)
        for a, b in zip(g, grads["generic"], strict=True):
            np.testing.assert_allclose(a, b, **RULE_TOL)


# ------------------------------------------------------------------------------------------ a user-defined monoid

def _hypot_d(c, a, g):
    """d hypot(a, b) / da = a / c, and 0 for an empty total (c = 0)."""
    positive = c > 0
    return ops.where(positive, g * a / ops.where(positive, c, 1.0), 0.0)


HYPOT = fold.Monoid(lambda a, b: ops.sqrt(a * a + b * b), 0.0, commutative=True, d=_hypot_d, name="hypot",
                    domain=lambda a: ops.abs(a) + 0.1)


def _softmax_mean_op(x, y):
    """A user's own online softmax-weighted mean with its own field names: {logit, value}."""
    m = ops.maximum(x["logit"], y["logit"])
    wx, wy = ops.exp(x["logit"] - m), ops.exp(y["logit"] - m)
    return {"logit": m + ops.log(wx + wy), "value": (wx * x["value"] + wy * y["value"]) / (wx + wy)}


def _softmax_mean_d(c, a, g):
    w = ops.exp(a["logit"] - c["logit"])
    return {"logit": (g["logit"] + ops.sum(g["value"] * (a["value"] - c["value"]))) * w, "value": w * g["value"]}


# identity with a very negative finite logit: the operator above is written without the -inf guards
SOFTMAX_MEAN = fold.Monoid(_softmax_mean_op, {"logit": -1e300, "value": 0.0}, commutative=True, d=_softmax_mean_d,
                           name="softmax_mean")


def test_user_monoid_passes_check_monoid() -> None:
    assert fold.check_monoid(HYPOT, SCALAR, strict=True).ok
    assert fold.check_monoid(SOFTMAX_MEAN, {"logit": SCALAR, "value": np.zeros(4)}, strict=True).ok
    # and with a defect, the user's monoid is caught as a built-in one is
    broken = fold.Monoid(HYPOT.op, 0.0, commutative=True, d=lambda c, a, g: g * c / a, domain=HYPOT.domain, name="hypot-bad")
    report = fold.check_monoid(broken, SCALAR)
    assert not report.ok and not report["d"].holds and report["associativity"].holds


def test_user_monoid_everywhere() -> None:
    rng = _rng("user")
    x = rng.uniform(0.5, 2.0, 10)
    # reduce
    np.testing.assert_allclose(fold.run(lambda x: fold.reduce(HYPOT, x), x), np.sqrt((x * x).sum()), rtol=1e-13)
    # scan
    np.testing.assert_allclose(fold.run(lambda x: fold.scan(HYPOT, x), x), np.sqrt(np.cumsum(x * x)), rtol=1e-13)
    # reduce_by_index
    idx = np.array([0, 1, 0, 2, 1, 1, 0, 2, 2, 0])
    want = np.array([np.sqrt((x[idx == b] ** 2).sum()) for b in range(3)])
    np.testing.assert_allclose(fold.run(lambda x: fold.reduce_by_index(HYPOT, 3, idx, x), x), want, rtol=1e-13)
    # vjp with every rule, and finite differences
    for f in (lambda x: fold.reduce(HYPOT, x), lambda x: fold.scan(HYPOT, x),
              lambda x: fold.reduce_by_index(HYPOT, 3, idx, x),
              lambda x: fold.map(lambda r: fold.reduce(HYPOT, r), x.reshape(2, 5))):
        results = check_rules_agree(f, (x,), **RULE_TOL)
        assert set(results) == {"auto", "generic", "monoid"}
        check_grads(f, (x,))
    # the monoid rule uses the user's d: the same numbers as the closed form x_i / ||x||
    g = fold.vjp(lambda x: fold.reduce(HYPOT, x), x, reduce_rule="monoid")[1](1.0)[0]
    np.testing.assert_allclose(g, x / np.sqrt((x * x).sum()), rtol=1e-13)
    assert "hypot" in str(fold.trace(lambda x: fold.reduce(HYPOT, x), x))


def test_user_record_monoid_everywhere() -> None:
    rng = _rng("user-record")
    z, v = rng.normal(size=9), rng.normal(size=(9, 3))
    elems = lambda z, v: {"logit": z, "value": v}  # noqa: E731
    out = fold.run(lambda z, v: fold.reduce(SOFTMAX_MEAN, elems(z, v)), z, v)
    np.testing.assert_allclose(out["value"], _softmax(z) @ v, rtol=1e-12)
    idx = np.array([0, 1, 1, 0, 1, 0, 0, 1, 1])
    for f in (lambda z, v: fold.reduce(SOFTMAX_MEAN, elems(z, v)),
              lambda z, v: fold.scan(SOFTMAX_MEAN, elems(z, v)),
              lambda z, v: fold.reduce_by_index(SOFTMAX_MEAN, 2, idx, elems(z, v))):
        results = check_rules_agree(f, (z, v), **RULE_TOL)
        assert set(results) == {"auto", "generic", "monoid"}
        check_grads(f, (z, v))
    # the same gradient as the built-in logwsum
    ct = {"logit": 0.3, "value": np.array([1.0, -2.0, 0.5])}
    mine = fold.vjp(lambda z, v: fold.reduce(SOFTMAX_MEAN, elems(z, v)), z, v, reduce_rule="monoid")[1](ct)
    builtin = fold.vjp(lambda z, v: fold.reduce(M.logwsum, {"z": z, "v": v}), z, v, reduce_rule="monoid")[1]({"z": 0.3, "v": ct["value"]})
    for a, b in zip(mine, builtin, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13)


def test_monoid_rule_without_d_or_commutativity_is_an_error() -> None:
    x = np.arange(1.0, 5.0)
    no_d = fold.Monoid(lambda a, b: a * b, 1.0, commutative=True, name="my_prod")
    with pytest.raises(fold.FoldError, match="my_prod.*no d"):
        fold.vjp(lambda x: fold.reduce(no_d, x), x, reduce_rule="monoid")[1](1.0)
    not_comm = fold.Monoid(lambda a, b: a * b, 1.0, d=lambda c, a, g: g * c / a, name="my_prod2")
    with pytest.raises(fold.FoldError, match="my_prod2.*not commutative"):
        fold.vjp(lambda x: fold.reduce(not_comm, x), x, reduce_rule="monoid")[1](1.0)
    # the other rules still apply to both
    for m in (no_d, not_comm):
        np.testing.assert_allclose(fold.vjp(lambda x: fold.reduce(m, x), x, reduce_rule="generic")[1](1.0)[0], 24.0 / x)


# ------------------------------------------------------------------------------------------ documented limits of D, pinned

def test_prod_monoid_rule_with_a_zero_part_is_undefined_auto_is_exact() -> None:
    """D = g c / a is undefined at a zero part (0 / 0): the monoid rule gives NaN there (documented in
    fold.monoids); "auto" uses the specialised * rule, which is exact with zeros."""
    x = np.array([2.0, 0.0, 3.0, -1.5])
    f = lambda x: fold.reduce(M.prod, x)  # noqa: E731
    exact = np.array([0.0, 2.0 * 3.0 * -1.5, 0.0, 0.0])
    np.testing.assert_array_equal(fold.vjp(f, x, reduce_rule="auto")[1](1.0)[0], exact)
    np.testing.assert_array_equal(fold.vjp(f, x, reduce_rule="generic")[1](1.0)[0], exact)
    monoid = fold.vjp(f, x, reduce_rule="monoid")[1](1.0)[0]
    assert not np.all(np.isfinite(monoid[1])), monoid  # NaN (or inf): D is not defined at a zero part
    np.testing.assert_array_equal(monoid[[0, 2, 3]], 0.0)  # c = 0, so the other parts get g * 0 / a_i = 0
    # two zeros: every cotangent is 0 under auto
    two = np.array([0.0, 4.0, 0.0])
    np.testing.assert_array_equal(fold.vjp(f, two, reduce_rule="auto")[1](1.0)[0], 0.0)


@pytest.mark.parametrize("name", ["max", "min"])
def test_extremum_monoid_rule_at_ties_double_counts_auto_picks_lowest_index(name: str) -> None:
    """D = g [a == c]: at a tie every tied part gets the whole cotangent (documented: the derivative does not
    exist there), so the total is counted twice; "auto" gives it to the lowest index, as Futhark does."""
    x = np.array([1.0, 3.0, -2.0, 3.0, 2.0])
    x = x if name == "max" else -x
    f = lambda x: fold.reduce(getattr(M, name), x)  # noqa: E731
    np.testing.assert_array_equal(fold.vjp(f, x, reduce_rule="auto")[1](2.5)[0], [0.0, 2.5, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(fold.vjp(f, x, reduce_rule="monoid")[1](2.5)[0], [0.0, 2.5, 0.0, 2.5, 0.0])
    # without ties the rules agree
    y = x.copy()
    y[3] -= 0.5 if name == "max" else -0.5
    results = check_rules_agree(f, (y,), **RULE_TOL)
    _assert_monoid_rule_ran(results)


# ------------------------------------------------------------------------------------------ compare_rules

def _check_comparison(result: Any, rules: set[str]) -> None:
    assert set(result.runs) == rules, set(result.runs)
    text = str(result)
    for rule, run in result.runs.items():
        assert run.rule == rule and rule in text
        assert run.seconds > 0
        assert run.estimated_bytes > 0 and run.measured_bytes > 0
        assert run.program_size > 0
        assert run.reduce_rules_used
    assert result.max_rel_diff < 1e-10 and result.max_abs_diff < 1e-10
    assert "largest difference" in text


def test_compare_rules_logwsum() -> None:
    rng = _rng("compare-logwsum")
    z, v = rng.normal(size=50), rng.normal(size=(50, 4))
    f = lambda z, v: fold.reduce(M.logwsum, {"z": z, "v": v})  # noqa: E731
    result = fold.compare_rules(f, (z, v), {"z": 1.0, "v": np.ones(4)}, repeats=2)
    _check_comparison(result, {"auto", "generic", "monoid"})
    assert result["monoid"].reduce_rules_used == ["monoid"] and result["generic"].reduce_rules_used == ["generic"]
    assert result["auto"].reduce_rules_used == ["monoid"]  # auto takes the shortcut for a qualifying monoid
    # the shortcut's program is smaller (one map, no scans), and the cotangents are those of vjp
    assert result["monoid"].program_size < result["generic"].program_size
    want = fold.vjp(f, z, v, reduce_rule="generic")[1]({"z": 1.0, "v": np.ones(4)})
    for a, b in zip(result["monoid"].cotangents, want, strict=True):
        np.testing.assert_allclose(a, b, **RULE_TOL)


def test_compare_rules_pairwise() -> None:
    w = _rng("compare-pairwise").normal(size=40)
    f = lambda w: fold.reduce(M.pairwise, (fold.map(lambda x: x * 0.0, w), w))[0]  # noqa: E731
    result = fold.compare_rules(f, (w,), 1.0, repeats=2)
    _check_comparison(result, {"auto", "generic", "monoid"})
    np.testing.assert_allclose(result["monoid"].cotangents[0], w.sum() - w, rtol=1e-12)


def test_compare_rules_runs_gemm_map_reduce_under_both_of_its_rules() -> None:
    rng = _rng("compare-gemm")
    Q, K, V, G = (rng.normal(size=(12, 4)) for _ in range(4))

    def attention(Q, K, V):
        return fold.gemm_map_reduce(M.logwsum, lambda s, v: {"z": s, "v": v}, Q, K, cols=(V,), block=(4, 5))["v"]

    result = fold.compare_rules(attention, (Q, K, V), G, repeats=2)
    _check_comparison(result, {"auto", "generic", "monoid", "gemm-blocks"})
    assert "gemm pairs" in result["auto"].reduce_rules_used and "gemm blocks" in result["gemm-blocks"].reduce_rules_used
    assert result["gemm-blocks"].program_size > result["auto"].program_size  # the block totals recomputed
    want = fold.vjp(attention, Q, K, V)[1](G)
    for a, b in zip(result["gemm-blocks"].cotangents, want, strict=True):
        np.testing.assert_allclose(a, b, **RULE_TOL)


def test_compare_rules_plain_lambda_has_no_monoid_rule() -> None:
    x = _rng("compare-lambda").uniform(0.5, 1.5, 20)
    f = lambda x: fold.reduce(lambda a, b: a * b + a + b, x, identity=0.0)  # noqa: E731
    result = fold.compare_rules(f, (x,), 1.0, repeats=2)
    assert set(result.runs) == {"auto", "generic"}
    assert "monoid" not in [line.split()[0] for line in str(result).splitlines()[2:-1]]
    assert result.max_rel_diff < 1e-10


def test_check_monoid_draws_integer_and_boolean_elements() -> None:
    """Elements of an integer or boolean monoid are drawn as integers in [low, high] and as booleans (floats
    could not be stored); d, a derivative, is not judged on them."""
    count = fold.Monoid(lambda a, b: a + b, 0, commutative=True, name="count")
    assert fold.check_monoid(count, np.zeros((), np.int64)).ok
    assert fold.check_monoid(fold.Monoid(lambda a, b: a | b, False, commutative=True, name="any"), np.zeros(3, bool)).ok
    mixed = fold.Monoid(lambda a, b: (a[0] + b[0], fold.maximum(a[1], b[1])), (0.0, -np.inf), commutative=True)
    assert fold.check_monoid(mixed, (np.zeros(()), np.zeros((), np.int32))).ok
    minus = fold.check_monoid(fold.Monoid(lambda a, b: a - b, 0, name="minus"), np.zeros((), np.int64))
    assert not minus["associativity"].holds and not minus["left identity"].holds
    with_d = fold.Monoid(lambda a, b: a + b, 0, commutative=True, d=lambda c, a, g: g, name="sum with d")
    assert [r.law for r in fold.check_monoid(with_d, np.zeros((), np.int32)).laws] == [
        "associativity", "left identity", "right identity", "commutativity"]
