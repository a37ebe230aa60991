"""`fold.check_monoid`: test a monoid's laws on random elements drawn with hypothesis.

Laws: associativity, identity on both sides (the identity itself included: e . e = e, so that an operator
that makes NaN of a -inf identity is caught), commutativity (if claimed), and — where `d` is given — that
d(a . b, a, g) equals the vjp of the operator with respect to `a`, for random cotangents g. Each law is
evaluated on a whole batch of elements at once (a map), and the report keeps the worst counterexample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fold.errors import FoldTypeError, MonoidLawError, StructureError
from fold.monoid import Monoid, identity_leaves
from fold.pytree import leaf_paths, tree_flatten


@dataclass
class LawResult:
    law: str
    holds: bool
    worst_error: float = 0.0
    counterexample: dict = field(default_factory=dict)


@dataclass
class MonoidReport:
    monoid: str
    laws: list[LawResult]
    tolerance: float
    checker: str = "check_monoid"

    @property
    def ok(self) -> bool:
        return all(law.holds for law in self.laws)

    def __getitem__(self, law: str) -> LawResult:
        return next(result for result in self.laws if result.law == law)

    def __str__(self) -> str:
        lines = [f"{self.checker}({self.monoid}): {'all laws hold' if self.ok else 'LAWS FAIL'} (tolerance {self.tolerance:g})"]
        for r in self.laws:
            lines.append(f"  {r.law:<16} {'ok  ' if r.holds else 'FAIL'}  worst relative error {r.worst_error:.3g}")
            if not r.holds:
                for name, value in r.counterexample.items():
                    lines.append(f"      {name} = {np.array2string(np.asarray(value), precision=6, threshold=8)}")
        return "\n".join(lines)


def _rel_error(x: list, y: list) -> np.ndarray:
    """Per-sample worst relative error between two lists of batched leaves (NaN vs NaN counts as equal)."""
    errors = []
    for a, b in zip(x, y, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        both_nan = np.isnan(a) & np.isnan(b)
        same_inf = np.isinf(a) & (a == b)
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: judged by the masks below
            err = np.abs(a - b) / (1.0 + np.abs(b))
        err = np.where(both_nan | same_inf, 0.0, np.where(np.isnan(err), np.inf, err))
        errors.append(err.reshape(err.shape[0], -1).max(axis=1) if err.ndim > 1 else err)
    return np.max(np.stack(errors), axis=0)


def check_monoid(m: Monoid, example: Any, *, strict: bool = False, samples: int = 64, seed: int = 0,
                 tolerance: float | None = None, low: float = -3.0, high: float = 3.0) -> MonoidReport:
    """Check the laws of monoid `m` on random elements shaped like `example` (a pytree of arrays).

    Returns a report (`report.ok`; printing it shows each law and the worst counterexample). With
    `strict=True` a failing law raises `fold.MonoidLawError` carrying the report.

    >>> import numpy as np, fold
    >>> fold.check_monoid(fold.monoids.logaddexp, np.zeros(())).ok
    True
    """
    try:
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st
        from hypothesis.extra.numpy import arrays
    except ImportError as err:  # pragma: no cover - hypothesis is a test extra
        raise FoldTypeError("fold.check_monoid draws its random elements with hypothesis, which is not installed: "
                            "it comes with fold's `test` extra (pip install 'fold[test]'), or pip install "
                            "hypothesis") from err
    if not isinstance(m, Monoid):
        raise FoldTypeError(f"fold.check_monoid: expected a fold.Monoid, got {type(m).__name__}")
    leaves, treedef = tree_flatten(example)
    expected = tree_flatten(m.identity)[1]
    if treedef != expected:
        raise StructureError(f"fold.check_monoid: the example has structure {treedef}, but the elements of monoid "
                             f"{m.name} have structure {expected} (its identity's)")
    leaves = [np.asarray(x) for x in leaves]
    dtype = np.result_type(*[x.dtype for x in leaves])
    tol = tolerance if tolerance is not None else (1e-9 if dtype == np.float64 else 1e-4)
    worst: dict[str, LawResult] = {}
    differentiable = all(x.dtype.kind == "f" for x in leaves)  # d is a derivative: only of float elements
    laws = (["associativity", "left identity", "right identity"] + (["commutativity"] if m.commutative else [])
            + (["d"] if m.d is not None and differentiable else []))
    for law in laws:
        worst[law] = LawResult(law, True)
    checker = _LawChecker(m, treedef, leaves)

    def record(law: str, errors: np.ndarray, named: dict) -> None:
        i = int(np.argmax(errors))
        if errors[i] > worst[law].worst_error or (np.isnan(errors[i])):
            worst[law] = LawResult(law, bool(errors[i] <= tol), float(errors[i]),
                                   {k: checker.sample(v, i) for k, v in named.items()})

    def elements(dtype: np.dtype):
        """Draws of one scalar of `dtype` in [low, high] (integers: the integers there; bools: both)."""
        if dtype.kind == "b":
            return st.booleans()
        if dtype.kind in "iu":
            return st.integers(int(np.ceil(low)), int(np.floor(high)))
        return st.floats(low, high, width=dtype.itemsize * 8)

    leaf_strategy = st.tuples(*[arrays(x.dtype, (samples,) + x.shape, elements=elements(x.dtype)) for x in leaves] * 4)

    @settings(max_examples=8, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(leaf_strategy)
    def run(drawn):
        k = len(leaves)
        a, b, c, g = (checker.domain(list(drawn[i * k:(i + 1) * k])) for i in range(4))
        g = list(drawn[3 * k: 4 * k])
        ab_c = checker.op(checker.op(a, b), c)
        a_bc = checker.op(a, checker.op(b, c))
        record("associativity", _rel_error(ab_c, a_bc), {"a": a, "b": b, "c": c})
        e = checker.identity()
        record("left identity", _rel_error(checker.op(e, a), a), {"a": a})
        record("right identity", _rel_error(checker.op(a, e), a), {"a": a})
        # the identity is an element too: e . e = e catches an operator that turns a -inf identity into NaN
        record("left identity", _rel_error(checker.op(e, e), e), {"a": e})
        if m.commutative:
            record("commutativity", _rel_error(checker.op(a, b), checker.op(b, a)), {"a": a, "b": b})
        if "d" in worst:
            total = checker.op(a, b)
            record("d", _rel_error(checker.d(total, a, g), checker.op_vjp(a, b, g)), {"a": a, "b": b, "g": g})

    run()
    report = MonoidReport(m.name, [worst[law] for law in laws], tol)
    if strict and not report.ok:
        failing = ", ".join(r.law for r in report.laws if not r.holds)
        raise MonoidLawError(f"monoid {m.name} breaks: {failing}\n{report}", report)
    return report


class _LawChecker:
    """The monoid's operator, identity, d and operator-vjp, each evaluated on batches of elements."""

    def __init__(self, m: Monoid, treedef, leaves: list[np.ndarray]):
        import fold

        self.m, self.treedef, self.leaves = m, treedef, leaves
        self.paths = leaf_paths(treedef)
        tree = treedef.unflatten
        flat = lambda t: tree_flatten(t)[0]  # noqa: E731
        self._op = fold.jit(lambda a, b: flat(fold.map(lambda x, y: m.op(x, y), tree(a), tree(b))))
        self._d = fold.jit(lambda c, a, g: flat(fold.map(lambda x, y, z: m.d(x, y, z), tree(c), tree(a), tree(g)))) if m.d else None
        self._domain = fold.jit(lambda a: flat(fold.map(m.domain, tree(a)))) if m.domain else None
        self._vjp = fold.jit(lambda a, b, g: list(fold.ad.vjp_value(lambda x: flat(fold.map(lambda p, q: m.op(p, q), tree(x), tree(b))), (a,), g)[0]))
        self._n = None

    def domain(self, a: list) -> list:
        self._n = a[0].shape[0]
        return list(self._domain(a)) if self._domain else a

    def op(self, a: list, b: list) -> list:
        return list(self._op(a, b))

    def identity(self) -> list:
        from fold.dtypes import ShapedArray

        elems = [ShapedArray(x.shape, x.dtype) for x in self.leaves]
        return [np.broadcast_to(e, (self._n,) + e.shape) for e in identity_leaves("check_monoid", self.m.identity, self.treedef, elems)]

    def d(self, c: list, a: list, g: list) -> list:
        return list(self._d(c, a, g))

    def op_vjp(self, a: list, b: list, g: list) -> list:
        return list(self._vjp(a, b, g))

    def sample(self, batch: list, i: int) -> Any:
        return self.treedef.unflatten([np.asarray(x)[i] for x in batch])


def check_operator(op: Any, identity: Any, sample: Any, *, strict: bool = False, samples: int = 64,
                   tolerance: float | None = None) -> MonoidReport:
    """Check that `op` is associative and `identity` an identity of it, on elements drawn from `sample`.

    `sample` is a pytree of arrays whose leading axis holds example elements (your data, or a part of it):
    hypothesis draws triples of them for associativity and single ones for the identity, so the laws are
    tested on the range the fold will meet, not on a fixed interval. Returns the report of `check_monoid`;
    with `strict=True` a failing law raises `fold.MonoidLawError` naming the law, the elements and the error.

    >>> import numpy as np, fold
    >>> fold.check_operator(lambda p, q: p + q + p * q * q, 0.0, np.linspace(-2.0, 2.0, 50)).ok
    False
    """
    try:
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st
        from hypothesis.extra.numpy import arrays
    except ImportError as err:  # pragma: no cover - hypothesis is a test extra
        raise FoldTypeError("fold.check_operator needs hypothesis (pip install 'fold[test]')") from err
    if isinstance(op, Monoid) or not callable(op):
        raise FoldTypeError(f"fold.check_operator: op must be a two-argument callable (for a fold.Monoid use "
                            f"fold.check_monoid), got {type(op).__name__}")
    leaves, treedef = tree_flatten(sample)
    leaves = [np.asarray(x) for x in leaves]
    if not leaves or any(x.ndim == 0 or x.shape[0] != leaves[0].shape[0] for x in leaves) or leaves[0].shape[0] == 0:
        raise StructureError("fold.check_operator: sample must be arrays with one leading axis of the same, "
                             f"non-zero length (the example elements), got shapes {[x.shape for x in leaves]}")
    name = getattr(op, "__name__", type(op).__name__)
    m = Monoid(op, identity, commutative=False, name=name)
    dtype = np.result_type(*[x.dtype for x in leaves])
    tol = tolerance if tolerance is not None else (1e-9 if dtype == np.float64 else 1e-4)
    laws = ["associativity", "left identity", "right identity"]
    worst = {law: LawResult(law, True) for law in laws}
    checker = _LawChecker(m, treedef, [x[0] for x in leaves])
    count = leaves[0].shape[0]

    def record(law: str, errors: np.ndarray, named: dict) -> None:
        i = int(np.argmax(errors))
        if errors[i] > worst[law].worst_error or np.isnan(errors[i]):
            worst[law] = LawResult(law, bool(errors[i] <= tol), float(errors[i]),
                                   {k: checker.sample(v, i) for k, v in named.items()})

    picks = arrays(np.intp, (3, samples), elements=st.integers(0, count - 1))

    @settings(max_examples=8, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(picks)
    def run(rows):
        a, b, c = ([x[r] for x in leaves] for r in rows)
        checker._n = samples
        record("associativity", _rel_error(checker.op(checker.op(a, b), c), checker.op(a, checker.op(b, c))),
               {"a": a, "b": b, "c": c})
        e = checker.identity()
        record("left identity", _rel_error(checker.op(e, a), a), {"a": a})
        record("right identity", _rel_error(checker.op(a, e), a), {"a": a})

    run()
    report = MonoidReport(f"{name}, identity {identity!r}", [worst[law] for law in laws], tol, "check_operator")
    if strict and not report.ok:
        failing = ", ".join(r.law for r in report.laws if not r.holds)
        raise MonoidLawError(f"operator {name} with identity {identity!r} breaks: {failing}\n{report}", report)
    return report
