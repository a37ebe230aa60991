"""The numba backend against the numpy reference: same results, kernels where they apply, a warned fallback
where they do not."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import fold
from fold.runtime.numba_backend.lowering import COMPILE_FROM
from fold.runtime.numba_backend.passes import MAX_NEST_PRODUCT_BYTES_FLOAT64, prepare
from helpers import assert_same, both

rng = np.random.default_rng(7)


def compose(f, g):
    (a1, b1), (a2, b2) = f, g
    return a1 * a2, a2 * b1 + b2


def matmul2(a, b):
    return (a[0] * b[0] + a[1] * b[2], a[0] * b[1] + a[1] * b[3], a[2] * b[0] + a[3] * b[2], a[2] * b[1] + a[3] * b[3])


@pytest.mark.parametrize("n", [0, 1, 7, 20_000, 70_001])
def test_user_operator_reduce_and_scan(n):
    a, b = rng.uniform(0.9, 1.1, n), rng.normal(size=n)
    assert_same(*both(lambda a, b: fold.reduce(compose, (a, b), identity=(1.0, 0.0)), a, b))
    for exclusive in (False, True):
        for reverse in (False, True):
            f = lambda a, b: fold.scan(compose, (a, b), identity=(1.0, 0.0), exclusive=exclusive, reverse=reverse)  # noqa: E731
            assert_same(*both(f, a, b), rtol=1e-10)


def test_non_commutative_matrix_product_keeps_order():
    ms = tuple(rng.normal(size=(4, 50_001)) * 0.3 + np.eye(2).reshape(4, 1))
    numpy_result, numba_result = both(lambda *m: fold.reduce(matmul2, m, identity=(1.0, 0.0, 0.0, 1.0)), *ms)
    assert_same(numpy_result, numba_result, rtol=1e-9)


def test_only_operators_known_to_commute_are_folded_in_any_order():
    """The kernels fold a commutative operator's elements in lanes of consecutive elements (vectorised),
    which reorders them: that is for monoids declared commutative and recognised operators, never for a
    user operator that merely happens to commute."""
    from fold.primitives import Reduce
    from fold.runtime.numba_backend.lowering import is_commutative

    def reduce_prim(f, *args):
        (stmt,) = [s for s in fold.trace(f, *args).stmts if isinstance(s.prim, Reduce)]
        return stmt.prim

    x = rng.normal(size=8)
    flip = fold.Monoid(lambda a, b: a + b + 0.0 * a, 0.0, name="not declared commutative")
    assert is_commutative(reduce_prim(lambda x: fold.reduce(fold.monoids.sum, x), x))
    assert is_commutative(reduce_prim(lambda x: fold.reduce(lambda a, b: a * b, x, identity=1.0), x))
    assert is_commutative(reduce_prim(lambda x: fold.reduce(fold.Monoid(lambda a, b: a + b + a * b, 0.0, commutative=True), x), x))
    assert not is_commutative(reduce_prim(lambda x: fold.reduce(flip, x), x))
    assert not is_commutative(reduce_prim(lambda x: fold.reduce(lambda a, b: (a * b + 1.0) - 1.0, x, identity=1.0), x))
    assert not is_commutative(reduce_prim(lambda *m: fold.reduce(matmul2, m, identity=(1.0, 0.0, 0.0, 1.0)), *rng.normal(size=(4, 8))))


def test_histogram_with_user_operator_and_out_of_range_indices():
    idx = rng.integers(-3, 40, 30_000)
    v = rng.normal(size=30_000)
    assert_same(*both(lambda i, v: fold.reduce_by_index(fold.monoids.max, 37, i, v), idx, v))
    assert_same(*both(lambda i, v: fold.reduce_by_index(lambda a, b: a + b, 37, i, v, identity=0.0), idx, v), rtol=1e-9)


def test_map_reduce_is_fused_and_agrees():
    def f(x):
        return fold.reduce(lambda a, b: a + b, fold.map(lambda v: fold.tanh(v * 2.0 + 1.0) * fold.exp(-v) - v, x), identity=0.0)

    x = rng.normal(size=100_003)
    program = prepare(fold.trace(f, x), whole_arrays=True)
    assert [s.prim.name for s in program.stmts] == ["loop_nest"], program  # runtime/loops: the map is not stored
    assert_same(*both(f, x), rtol=1e-9)


def test_segmented_reduce_inside_a_map():
    x = rng.normal(size=(300, 41))
    assert_same(*both(lambda x: fold.map(lambda row: fold.reduce(lambda a, b: fold.maximum(a, b) + 0.0 * b, row, identity=-np.inf), x), x))


def test_gradient_programs_run_unchanged():
    a, b = rng.uniform(0.5, 1.0, 5_000), rng.normal(size=5_000)
    ybar = rng.normal(size=5_000)
    g = lambda a, b: fold.vjp(lambda a, b: fold.scan(compose, (a, b), identity=(1.0, 0.0))[1], a, b)[1](ybar)  # noqa: E731
    assert_same(*both(g, a, b), rtol=1e-9)
    sq = fold.grad(lambda x: fold.reduce(fold.monoids.sum, fold.map(lambda v: v * v, x)))
    assert_same(*both(sq, a))


def matrix_product(a, b):
    return a @ b


def test_operators_of_many_scalars_compile_too(kernel_calls):
    """16 leaves: the kernel's call passes 32 scalars (CPython makes that a *args call; no inlining, still compiled)."""
    xs = tuple(rng.normal(size=100) for _ in range(16))
    g = lambda *xs: fold.reduce(lambda a, b: tuple(u + v - 0.0 * u * v for u, v in zip(a, b)), xs, identity=(0.0,) * 16)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(g, *xs), rtol=1e-10)
    assert kernel_calls == {"reduce": 1}


@pytest.mark.parametrize("n", [1, 5, 40_000])
def test_matrix_elements_compile_as_scalar_components(n, kernel_calls):
    """A 2 x 2 matrix element (non-commutative, vector fields) runs in the kernels, in order, all four scans."""
    xs = np.eye(2) + 0.3 * rng.normal(size=(n, 2, 2)) / np.sqrt(n)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(lambda x: fold.reduce(matrix_product, x, identity=np.eye(2)), xs), rtol=1e-10)
        for exclusive in (False, True):
            for reverse in (False, True):
                f = lambda x, e=exclusive, r=reverse: fold.scan(matrix_product, x, identity=np.eye(2), exclusive=e, reverse=r)  # noqa: E731
                assert_same(*both(f, xs), rtol=1e-10)
    assert kernel_calls == {"reduce": 1, "scan": 4}


def test_records_with_vector_fields_in_reduce_histogram_and_rows(kernel_calls):
    z, v = rng.normal(size=300), rng.normal(size=(300, 3))
    op = lambda p, q: {"z": fold.maximum(p["z"], q["z"]), "v": p["v"] + 2.0 * q["v"] - q["v"]}  # noqa: E731
    ident = {"z": -np.inf, "v": np.zeros(3)}
    idx = rng.integers(0, 7, 300)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(lambda z, v: fold.reduce(op, {"z": z, "v": v}, identity=ident), z, v))
        assert_same(*both(lambda z, v, i: fold.reduce_by_index(op, 7, i, {"z": z, "v": v}, identity=ident), z, v, idx))
        rows = lambda z, v: fold.map(lambda zr, vr: fold.reduce(op, {"z": zr, "v": vr}, identity=ident), z, v)  # noqa: E731
        assert_same(*both(rows, z.reshape(10, 30), v.reshape(10, 30, 3)))  # rows too long to unroll
    assert kernel_calls == {"reduce": 1, "histogram": 1, "segmented_reduce": 1}


def test_maps_with_vector_bodies_and_short_nested_combinators_are_one_kernel(kernel_calls):
    """Rows of small vectors and matrices, with a map (capturing a vector), scans, reduces and a non-commutative
    matrix product over them inside: all unrolled into one compiled loop over the rows."""
    x, w = rng.normal(size=(COMPILE_FROM, 3)), rng.normal(size=3)
    ms = np.eye(2) + 0.3 * rng.normal(size=(COMPILE_FROM, 4, 2, 2))

    def f(x, w, ms):
        def row(r, m):
            scaled = fold.map(lambda a, b: a * b + 1.0, r, w)
            suffix = fold.scan(lambda a, b: a + b + a * b, scaled, identity=0.0, exclusive=True, reverse=True)
            prefix = fold.scan(matrix_product, m, identity=np.eye(2))
            total = fold.reduce(lambda a, b: a + b, scaled, identity=0.0)
            return suffix * total, prefix, fold.reduce(matrix_product, m, identity=np.eye(2))
        return fold.map(row, x, ms)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(f, x, w, ms), rtol=1e-10)
    assert kernel_calls == {"map": 1}


def _scan_case(elements: str, n: int, reverse: bool = False, exclusive: bool = False):
    """(f, args, ct): a scan of a user operator over scalars, non-commutative pairs or 2 x 2 matrices."""
    options = {"reverse": reverse, "exclusive": exclusive}
    if elements == "scalars":
        return (lambda x: fold.scan(lambda a, b: a * b, x, identity=1.0, **options)), (rng.uniform(0.99, 1.01, n),), rng.normal(size=n)
    if elements == "pairs":
        return ((lambda a, b: fold.scan(compose, (a, b), identity=(1.0, 0.0), **options)), (rng.uniform(0.99, 1.01, n), rng.normal(size=n)),
                (rng.normal(size=n), rng.normal(size=n)))
    return ((lambda x: fold.scan(matrix_product, x, identity=np.eye(2), **options)), (np.eye(2) + 0.01 * rng.normal(size=(n, 2, 2)),),
            rng.normal(size=(n, 2, 2)))


@pytest.mark.parametrize("variant", ["inclusive", "reverse", "exclusive"])
@pytest.mark.parametrize("elements", ["scalars", "pairs", "matrices"])
def test_generic_scan_gradient_is_one_map_scan_kernel(elements, variant, kernel_calls):
    """The generic scan vjp (a map making affine maps from the Jacobians, their scan, a map making the
    cotangents) runs as one fused kernel besides the primal scan, whose last pass computes only the vector
    part of the recurrence; it agrees with the statements run one by one on numpy."""
    from fold.runtime.numba_backend.passes import prepare
    from fold.runtime.numba_backend.scan_fusion import FusedMapScan

    f, args, ct = _scan_case(elements, COMPILE_FROM + 5, reverse=variant == "reverse", exclusive=variant == "exclusive")
    g = lambda *a: fold.vjp(f, *a)[1](ct)  # noqa: E731
    (fused,) = [s.prim for s in prepare(fold.trace(g, *args)).stmts if isinstance(s.prim, FusedMapScan)]
    assert fused.post is not None and len(fused.pre) == 1 and fused.live == [1]  # (matrix, vector): the vector alone
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(g, *args), rtol=1e-9, scaled=True)
    assert kernel_calls == {"scan": 1, "map_scan": 1}


def test_maps_around_a_scan_join_its_kernel(kernel_calls):
    """User code: a map capturing a scalar makes the elements, a map reads the (reverse, exclusive) scan
    with another operand; a map alone before a scan, and a scan read by a map alone, fuse too. A map whose
    result is also read elsewhere stays a map."""
    n = COMPILE_FROM + 1
    x, y = rng.uniform(0.5, 1.5, n), rng.normal(size=n)

    def around(x, y, c):
        a, b = fold.map(lambda u, v: (u * c, v - c), x, y)
        pa, pb = fold.scan(compose, (a, b), identity=(1.0, 0.0), reverse=True, exclusive=True)
        return fold.map(lambda p, q, v: p * v + q, pa, pb, y)

    before = lambda x, y: fold.scan(compose, fold.map(lambda u, v: (u, 2.0 * v), x, y), identity=(1.0, 0.0))  # noqa: E731
    after = lambda x, y: fold.map(lambda p, q: p - q, *fold.scan(compose, (x, y), identity=(1.0, 0.0)))  # noqa: E731

    def shared(x, y):
        a = fold.map(lambda u: u * 0.5 + 0.5, x)
        return fold.scan(compose, (a, y), identity=(1.0, 0.0))[1] + a

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(around, x, y, 0.75), rtol=1e-10)
        assert_same(*both(before, x, y), rtol=1e-10)
        assert_same(*both(after, x, y), rtol=1e-10)
        assert kernel_calls == {"map_scan": 3}
        assert_same(*both(shared, x, y), rtol=1e-10)
    assert kernel_calls == {"map_scan": 3, "map": 1, "scan": 1}


@pytest.mark.parametrize("n", [1, 2, 100])
def test_small_fused_scans_are_compiled_once_their_numpy_time_adds_up(kernel_calls, monkeypatch, n):
    """Below COMPILE_FROM rows a fused scan runs the statements it replaced (on NumPy: log2(n) batched
    steps) until it has spent TIER_UP_SECONDS there, then its kernel, with the same results and no warning:
    the scan's gradient (map_scan) and the generic reduce gradient (scan_pair_map)."""
    from fold.runtime.numba_backend import lowering

    f, args, ct = _scan_case("pairs", n)
    pair_reduce = lambda a, b: fold.reduce(compose, (a, b), identity=(1.0, 0.0))  # noqa: E731
    programs = [lambda *a: fold.vjp(f, *a)[1](ct), lambda *a: fold.vjp(pair_reduce, *a, reduce_rule="generic")[1]((1.0, -2.0))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for g in programs:
            assert_same(*both(g, *args), rtol=1e-10)
        assert not {"map_scan", "scan_pair_map"} & set(kernel_calls)  # one call each: far from a quarter second
        monkeypatch.setattr(lowering, "TIER_UP_SECONDS", 0.0)
        for g in programs:
            assert_same(*both(g, *args), rtol=1e-10)
    assert kernel_calls.get("map_scan", 0) >= 1 and kernel_calls.get("scan_pair_map") == 1, kernel_calls


@pytest.mark.parametrize("elements", ["scalars", "pairs", "matrices"])
def test_generic_reduce_gradient_is_one_scan_pair_kernel(elements, kernel_calls):
    """The generic reduce vjp (two exclusive scans read by one map) is rewritten into one kernel that agrees
    with the three statements on numpy, for a scalar operator, a non-commutative pair and 2 x 2 matrices."""
    n = COMPILE_FROM + 3
    if elements == "scalars":
        f, args, ct = (lambda x: fold.reduce(lambda a, b: a * b, x, identity=1.0)), (rng.uniform(0.99, 1.01, n),), 1.5
    elif elements == "pairs":
        f, args, ct = (lambda a, b: fold.reduce(compose, (a, b), identity=(1.0, 0.0))), (rng.uniform(0.99, 1.01, n), rng.normal(size=n)), (1.0, -2.0)
    else:
        f, args, ct = (lambda x: fold.reduce(matrix_product, x, identity=np.eye(2))), (np.eye(2) + 0.01 * rng.normal(size=(n, 2, 2)),), rng.normal(size=(2, 2))
    g = lambda *a: fold.vjp(f, *a, reduce_rule="generic")[1](ct)  # noqa: E731
    from fold.runtime.numba_backend.scan_pair_fusion import FusedScanPairMap, fuse_scan_pairs
    assert [type(s.prim) for s in fuse_scan_pairs(fold.trace(g, *args)).stmts if isinstance(s.prim, FusedScanPairMap)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(g, *args), rtol=1e-9)
    assert kernel_calls == {"scan_pair_map": 1}


@pytest.mark.parametrize("op,kernel", [(fold.monoids.prod, "reduce"), (fold.monoids.max, "reduce"), (fold.monoids.min, "reduce"),
                                       (fold.monoids.logaddexp, "logsumexp"), (fold.monoids.sum, None)],
                         ids=["prod", "max", "min", "logaddexp", "sum"])
def test_recognised_reductions_of_large_inputs_run_in_parallel(op, kernel, kernel_calls):
    """*, min, max and logaddexp of many elements: NumPy's single-threaded reduction is beaten by a parallel
    kernel (same value to rounding); + keeps NumPy's pairwise sum. Small inputs keep NumPy throughout."""
    from fold.kernels.cpu import host

    n = 2 * host.MIN_CHUNK + 1
    x = rng.uniform(0.999, 1.001, n) if op is fold.monoids.prod else rng.normal(scale=20.0, size=n)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(lambda x: fold.reduce(op, x), x), rtol=1e-12)
        assert_same(*both(lambda x: fold.reduce(op, x), x[:1000]))
    parallel = kernel is not None and host.num_chunks(n, None) > 1
    assert kernel_calls == ({kernel: 1} if parallel else {})


def test_small_maps_with_vector_bodies_stay_batched_numpy(kernel_calls):
    """Below COMPILE_FROM rows compiling such a map would cost more than it could save: no kernel, no warning."""
    x = rng.normal(size=(COMPILE_FROM - 1, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(lambda x: fold.map(lambda r: fold.exp(r) * r[0], x), x))
    assert kernel_calls == {}


def test_long_nested_rows_and_large_values_are_left_to_numpy():
    from fold.runtime.numba_backend.codegen import MAX_STATEMENTS, MAX_UNROLLED_ROWS, compile_problem

    def body_of(f, *args):
        return fold.trace(f, *args).stmts[0].prim.body

    long_rows = body_of(lambda x: fold.map(lambda r: fold.reduce(lambda a, b: a + b, r, identity=0.0), x),
                        np.ones((4, MAX_UNROLLED_ROWS + 1)))
    assert compile_problem(long_rows) == f"it nests a combinator over {MAX_UNROLLED_ROWS + 1} rows (at most {MAX_UNROLLED_ROWS} are unrolled)"
    wide = body_of(lambda x: fold.map(lambda r: fold.exp(r) * r, x), np.ones((2, 4, 100)))
    assert compile_problem(wide) == "it holds a value of shape (4, 100), more than 64 scalars"

    def chain(u):
        for _ in range(10):
            u = fold.sin(u) * u
        return u

    deep = body_of(lambda x: fold.map(lambda r: fold.map(lambda v: fold.map(chain, v), r), x), np.ones((2, 8, 8)))
    problem = compile_problem(deep)
    assert problem.startswith("it unrolls to") and problem.endswith(f"more than {MAX_STATEMENTS}")


def test_too_large_elements_fall_back_with_one_warning(monkeypatch):
    from fold.runtime.numba_backend import lowering
    from fold.runtime.numba_backend.codegen import MAX_COMPONENTS

    monkeypatch.setattr(lowering, "_warned", set())
    v = rng.normal(size=(16, MAX_COMPONENTS + 1))
    f = lambda v: fold.reduce(lambda p, q: p + 2.0 * q - q, v, identity=np.zeros(v.shape[1]))  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        numba_result = fold.jit(f, backend="numba")(v)
        fold.jit(f, backend="numba")(v[:8])
    messages = [str(w.message) for w in caught if "runs on the numpy backend" in str(w.message)]
    assert len(messages) == 1 and "reduce" in messages[0] and str(MAX_COMPONENTS) in messages[0], messages
    assert_same(fold.jit(f, backend="numpy")(v), numba_result)


def test_compile_time_is_reported_apart_from_run_time():
    f = fold.jit(lambda x: fold.scan(lambda a, b: (a * b) * 1.25 - 0.25 * a * b, x, identity=1.0), backend="numba")
    x = rng.normal(size=50)
    f(x)
    first = f.compile_seconds
    assert first > 0.0
    f(x)
    assert f.compile_seconds == first  # a second call compiles nothing


def test_numba_compile_time_is_charged_to_the_program_that_compiles():
    """The backend's own clock (Numba's compile events) counts a kernel compiled during a program's call, and
    only for that program: a constant no other test uses makes sure the kernel is new to the disk cache too."""
    from fold.runtime.backends import get_backend

    unique = float(np.random.default_rng().integers(1, 2**40)) + 0.5
    x = rng.normal(size=COMPILE_FROM)
    backend = get_backend("numba")
    compiling = backend.compile(fold.trace(lambda x: fold.reduce(lambda a, b: a * b + unique * (a * b - a * b), x, identity=1.0), x))
    bystander = backend.compile(fold.trace(lambda x: x * 2.0, x))
    bystander([x])
    untouched = bystander.compile_seconds
    compiling([x])
    first = compiling.compile_seconds
    assert first > 0.0 and bystander.compile_seconds == untouched
    compiling([x])
    assert compiling.compile_seconds == first


_CACHE_SCRIPT = """
import sys, numpy as np, fold
from fold.kernels.cpu import codegen
op = {op}
f = fold.jit(lambda x: fold.scan(op, x, identity=1.0), backend="numba")
x = np.linspace(0.5, 1.5, 64)
np.testing.assert_allclose(f(x), np.cumprod(x), rtol=1e-12)
print(sum(k.stats.cache_hits[s] for k in codegen._KERNELS.values() for s in k.stats.cache_hits),
      sum(k.stats.cache_misses[s] for k in codegen._KERNELS.values() for s in k.stats.cache_misses))
"""


def _run_cached(tmp_path, op_text: str, cache_dir: str | None = None) -> tuple[int, int]:
    import os
    import subprocess
    import sys

    cache_dir = str(tmp_path / "cache") if cache_dir is None else cache_dir
    env = dict(os.environ, FOLD_CACHE_DIR=cache_dir, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    script = _CACHE_SCRIPT.format(op=op_text)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    hits, misses = map(int, out.stdout.split())
    return hits, misses


def test_kernels_are_cached_on_disk_between_processes(tmp_path):
    """The second process loads the kernel Numba compiled in the first; an operator with other text gets a
    kernel of its own (a cached kernel is never reused for different code)."""
    assert _run_cached(tmp_path, "lambda a, b: a * b") == (0, 1)
    assert _run_cached(tmp_path, "lambda a, b: a * b") == (1, 0)
    assert _run_cached(tmp_path, "lambda a, b: a * b * 1.0") == (0, 1)
    assert any(p.name.startswith("fold_gen_") for p in (tmp_path / "cache" / "kernels").iterdir())


_VECTOR_CACHE_SCRIPT = """
import numpy as np, fold
from fold.kernels.cpu import codegen, lanes
from fold.runtime.numba_backend.lowering import COMPILE_FROM
f = fold.jit(lambda x: fold.map(lambda v: fold.exp(-v) * fold.sin(v), x), backend="numba")
x = np.linspace(-3.0, 3.0, COMPILE_FROM + 7)
np.testing.assert_allclose(f(x), np.exp(-x) * np.sin(x), rtol=1e-14)
((key, kernel),) = [(key, k) for key, k in codegen._KERNELS.items() if key[0] == "map"]
print(lanes.lane_form(key[1]) is not None, sum(kernel.stats.cache_hits.values()), sum(kernel.stats.cache_misses.values()))
"""


def test_kernels_calling_vector_math_are_cached_on_disk_too(tmp_path):
    """A map kernel whose mapper has a lane form (libmvec calls) is loaded from disk by a second process,
    the library loaded before the cached code is linked, with the same results."""
    from fold.kernels.cpu import vector_math

    env = dict(os.environ, FOLD_CACHE_DIR=str(tmp_path / "cache"), NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    runs = [subprocess.run([sys.executable, "-c", _VECTOR_CACHE_SCRIPT], env=env, capture_output=True, text=True)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr[-3000:]
    assert [r.stdout.split() for r in runs] == [[str(vector_math.AVAILABLE), "0", "1"], [str(vector_math.AVAILABLE), "1", "0"]]


def test_backend_is_chosen_by_name_context_and_environment(monkeypatch):
    assert "numba" in fold.available_backends()
    f = fold.jit(lambda x: fold.reduce(compose, (x, x), identity=(1.0, 0.0)))
    with fold.use_backend("numba"):
        assert_same(f(np.ones(5)), (np.ones(()), np.asarray(5.0)))
    monkeypatch.setenv("FOLD_BACKEND", "numba")
    assert_same(fold.run(lambda x: fold.reduce(compose, (x, x), identity=(1.0, 0.0)), np.ones(3)), (1.0, 3.0))
    with pytest.raises(fold.FoldTypeError, match="unknown backend"):
        fold.jit(lambda x: x, backend="tpu")(np.ones(2))


def test_an_empty_cache_dir_turns_the_disk_cache_off(tmp_path):
    """FOLD_CACHE_DIR="": kernels compile in memory in every process, and nothing is written."""
    for _ in range(2):
        hits, _misses = _run_cached(tmp_path, "lambda a, b: a * b", cache_dir="")
        assert hits == 0
    assert not (tmp_path / "cache").exists()
    assert not any((tmp_path / "numba").rglob("*.nbi")) if (tmp_path / "numba").exists() else True



# ---------------------------------------------------------------- elementwise runs and gemm blocks

def _softmax_rows(x, r):
    """Array code outside any map: a row maximum, a broadcast per-row value, a chain of elementwise statements."""
    m = fold.map(lambda row: fold.reduce(fold.monoids.max, row), x)
    z = x - fold.reshape(m, (x.shape[0], 1)) + fold.reshape(r, (x.shape[0], 1))
    e = fold.exp(z)
    total = fold.sum(e, axis=1)
    w = e / fold.reshape(total, (x.shape[0], 1))
    return fold.where(w > 0.001, w, 0.0), fold.convert(z < 0.0, np.dtype("float32")), total


def test_elementwise_runs_become_one_statement_writing_only_what_is_used_later():
    from fold.runtime.numba_backend.elementwise_fusion import FusedElementwise, fuse_elementwise

    x, r = np.ones((5, 7)), np.ones(5)
    program = fold.trace(_softmax_rows, x, r)
    fused = fuse_elementwise(program)
    regions = [s for s in fused.stmts if isinstance(s.prim, FusedElementwise)]
    # the sum reads exp(z), so it ends the first run (-, +, exp); the second is /, >, where, <, convert
    assert [[st.prim.name for st in s.prim.region.stmts] for s in regions] == [
        ["sub", "add", "exp"], ["div", "gt", "where", "lt", "convert"]], str(fused)
    first, second = regions
    assert [v.aval.shape for v in first.outs] == [(5, 7), (5, 7)]  # z (read by the second region) and e; not x - m
    assert all(v.aval.shape == () for v in first.prim.body.inputs + first.prim.body.outputs)
    produced = {v for s in fused.stmts for v in s.outs}
    assert {v for v in fused.outputs if isinstance(v, fold.ir.Var)} <= produced
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(_softmax_rows, x, r))


def test_a_jitted_program_leaves_runs_too_small_to_compile_unfused():
    """A jitted program's shapes are its arrays': a run smaller than COMPILE_FROM elements would only decline
    to the statements it replaced, so it is not fused, while a map body's (rows on top) and a large run are."""
    from fold.runtime.backends import get_backend
    from fold.runtime.numba_backend.elementwise_fusion import FusedElementwise
    from fold.runtime.numba_backend.passes import prepare

    f = lambda x: fold.where(x > 0.0, fold.exp(-x) * x, fold.sin(x) + 1.0)  # noqa: E731

    def fused_runs(program):
        return sum(isinstance(s.prim, FusedElementwise) for s in program.stmts)

    small, large = rng.normal(size=COMPILE_FROM - 1), rng.normal(size=COMPILE_FROM)
    backend = get_backend("numba")
    assert fused_runs(backend.compile(fold.trace(f, small)).program) == 0
    assert fused_runs(backend.compile(fold.trace(f, large)).program) == 1
    assert fused_runs(prepare(fold.trace(f, small))) == 1  # as a map body: its rows multiply the size
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(f, small))


@pytest.mark.parametrize("shape", [(COMPILE_FROM // 100 + 1, 100), (COMPILE_FROM + 1,)], ids=["2-D", "1-D"])
def test_elementwise_runs_of_large_arrays_are_one_parallel_kernel(shape, kernel_calls):
    x = rng.normal(size=shape)
    if len(shape) == 2:
        r = rng.normal(size=shape[0])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert_same(*both(_softmax_rows, x, r))
        # the two runs, the first with the row sums of its exponentials; the row maximum (a map folding its
        # rows) is a loop nest
        assert kernel_calls == {"map_with_row_sums": 1, "map": 1}, kernel_calls
        assert prepare(fold.trace(_softmax_rows, x, r), whole_arrays=True).stmts[0].prim.name == "loop_nest"
    else:
        f = lambda x: fold.where(x > 0.0, fold.exp(-x) * x, fold.sin(x) + 1.0)  # noqa: E731
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert_same(*both(f, x))
        assert kernel_calls == {"map": 1}


@pytest.mark.parametrize("layer", ["attention", "causal_attention", "cross_entropy"])
def test_gemm_blocks_run_their_elementwise_work_in_kernels(layer, kernel_calls):
    """gemm_map_reduce's block programs (forward and gradient) get the backend's fusions: with blocks of at
    least COMPILE_FROM pairs their elementwise runs are kernels, with the same results as the numpy backend."""
    from examples import gemm_layers

    m, n, f = 128, COMPILE_FROM // 32, 16
    P, C = rng.normal(size=(m, f)), rng.normal(size=(n, f))
    block = (64, n // 2)  # 2 x 2 blocks of COMPILE_FROM pairs
    if layer == "cross_entropy":
        t = rng.integers(0, n, m)
        fn = lambda P, C: gemm_layers.cross_entropy(P, C, t, block=block)  # noqa: E731
        args, ct = (P, C), rng.normal(size=m)
    else:
        V = rng.normal(size=(n, 8))
        fn = lambda Q, K, V: getattr(gemm_layers, layer)(Q, K, V, block=block)  # noqa: E731
        args, ct = (P[:, :], C, V), rng.normal(size=(m, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(fn, *args), rtol=1e-10)
        forward_kernels = _elementwise_kernels(kernel_calls)
        assert_same(*both(lambda *a: fold.vjp(fn, *a)[1](ct), *args), rtol=1e-9)
    assert forward_kernels >= 2 and _elementwise_kernels(kernel_calls) > forward_kernels, kernel_calls


def _elementwise_kernels(kernel_calls: dict) -> int:
    """The calls of kernels that run elementwise runs and write them: maps, with or without row sums."""
    return kernel_calls.get("map", 0) + kernel_calls.get("map_with_row_sums", 0)


def test_repeated_and_identity_views_are_merged():
    """share_views: two broadcasts of one value become one, an identity reshape disappears, and the
    program computes the same."""
    from fold.primitives import BroadcastTo
    from fold.runtime.interpreter import eval_program
    from fold.runtime.numba_backend.shared_views import share_views

    x, r = rng.normal(size=(5, 7)), rng.normal(size=5)

    def f(x, r):
        a = fold.broadcast_to(fold.reshape(r, (5, 1)), (5, 7))
        b = fold.broadcast_to(fold.reshape(r, (5, 1)), (5, 7))
        return fold.reshape(x * a, (5, 7)) + fold.exp(b)

    program = fold.trace(f, x, r)
    shared = share_views(program)
    names = [s.prim.name for s in shared.stmts]
    assert names.count("broadcast") == 1 and names.count("reshape") == 1, names
    assert sum(isinstance(s.prim, BroadcastTo) for s in program.stmts) == 2
    np.testing.assert_array_equal(eval_program(shared, [x, r])[0], eval_program(program, [x, r])[0])


def test_views_left_unread_by_merging_are_dropped():
    """A reshape round trip (16,) -> (16, 1) -> (16,) reads the vector itself after share_views; the first
    reshape, read by nothing any more, goes too (it kept the product stored: k-means' gradient wrote its
    scaled centroids for it)."""
    from fold.runtime.numba_backend.shared_views import share_views

    v, w = rng.normal(size=16), rng.normal(size=16)
    program = fold.trace(lambda v, w: fold.reshape(fold.reshape(v * w, (16, 1)), (16,)) + w, v, w)
    names = [s.prim.name for s in share_views(program).stmts]
    assert names == ["mul", "add"], names


def test_nested_map_returning_an_operand_is_unnested():
    """A map over rows of a scalar map that returns one of its operands as it is (d = g of a sum monoid, the
    per-row cotangent) is still written as elementwise statements over the (rows, columns) block."""
    from fold.primitives import Map
    from fold.runtime.interpreter import eval_program
    from fold.runtime.numba_backend.unnest import unnest_maps

    x, g = rng.normal(size=(6, 40)), rng.normal(size=6)
    program = fold.trace(lambda x, g: fold.map(lambda row, gi: fold.map(lambda v: (fold.exp(v) * gi, gi), row), x, g), x, g)
    unnested = unnest_maps(program)
    assert not any(isinstance(s.prim, Map) for s in unnested.stmts), str(unnested)
    for a, b in zip(eval_program(unnested, [x, g]), eval_program(program, [x, g]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-15)
        assert a.shape == (6, 40)


@pytest.mark.parametrize("shape", [(300, 300), (5, 0), (0, 40), (6, 40)])
def test_nested_map_of_a_body_on_literals_keeps_its_shape(shape):
    """An inner body statement that reads literals alone (tanh 0.5) computes one value, which the unnested
    statements broadcast to the block: the numba backend once returned it 0-d for a (300, 300) map."""
    def f(x):
        return fold.map(lambda row: fold.map(lambda v: (fold.tanh(0.5), v * fold.tanh(0.25) + 1.0), row), x)

    x = rng.normal(size=shape)
    for a, b in zip(*both(f, x), strict=True):
        assert a.shape == b.shape == shape
        np.testing.assert_allclose(a, b, rtol=1e-15)
    np.testing.assert_allclose(fold.jit(f, backend="numba")(x)[0], np.full(shape, np.tanh(0.5)), rtol=1e-15)
    deep = lambda x: fold.map(lambda r: fold.map(lambda e: fold.map(lambda q: fold.tanh(0.5), r), r), x)  # noqa: E731
    small = x[:20, :30]
    assert fold.jit(deep, backend="numba")(small).shape == small.shape + small.shape[1:]


def test_gemm_pairs_backward_is_one_kernel_of_few_inputs():
    """Cross-entropy's backward block under the pairs rule: its fields and D pair by pair are one elementwise
    kernel, each view of the row and column data passed once, so that the kernel keeps its lane form (at most
    codegen.MAX_LANE_PARAMETERS inputs) and reads each view once."""
    from fold import ad
    from examples import gemm_layers
    from fold.primitives import GemmBlockSum
    from fold.runtime.numba_backend.codegen import MAX_LANE_PARAMETERS
    from fold.runtime.numba_backend.elementwise_fusion import FusedElementwise
    from fold.runtime.numba_backend.passes import prepare

    P, C, t = rng.normal(size=(256, 16)), rng.normal(size=(512, 16)), rng.integers(0, 512, 256)
    program = fold.trace(lambda P, C: gemm_layers.cross_entropy(P, C, t, block=(128, 256)), P, C)
    with ad.gemm_rule_scope("pairs"):
        grad_program, _ = ad.vjp_program(program)
    (backward,) = [s.prim for s in grad_program.stmts if isinstance(s.prim, GemmBlockSum)]
    block = prepare(backward.blocks[0][1], whole_arrays=True)
    (kernel,) = [s for s in block.stmts if isinstance(s.prim, FusedElementwise)]
    assert len(kernel.args) <= MAX_LANE_PARAMETERS, [str(a) for a in kernel.args]
    assert len(set(kernel.args)) == len(kernel.args)


def _softmax_and_row_sums(x):
    """Softmax by rows, written out: its exponentials are read by their row sums and by the division."""
    m = fold.map(lambda row: fold.reduce(fold.monoids.max, row), x)
    e = fold.exp(x - fold.reshape(m, (x.shape[0], 1)))
    total = fold.sum(e, axis=1)
    return e / fold.reshape(total, (x.shape[0], 1)), total


@pytest.mark.parametrize("where", ["top level", "map body"])
def test_a_row_sum_joins_the_run_whose_value_it_sums(where, kernel_calls):
    """A sum over the last axis of a run's value joins the run: the run stores what is read later (the
    exponentials, read by the division too) and sums the value row by row in the same pass. At the top
    level over a matrix's rows; in a batched map body over the batch."""
    from fold.runtime.numba_backend.elementwise_fusion import FusedElementwise
    from fold.runtime.numba_backend.passes import prepare

    x = rng.normal(size=(COMPILE_FROM // 100 + 3, 100)) * 10.0
    if where == "top level":
        f, prepared = _softmax_and_row_sums, prepare(fold.trace(_softmax_and_row_sums, x), whole_arrays=True)
    else:
        def f(x):
            def softmax(row):
                e = fold.exp(row - fold.reduce(fold.monoids.max, row))
                total = fold.sum(e)
                return e / total, total
            return fold.map(softmax, x)
        (body,) = fold.trace(f, x).stmts[0].prim.bodies()
        prepared = prepare(body)
    summed = [s for s in prepared.stmts if isinstance(s.prim, FusedElementwise) and s.prim.row_sum is not None]
    assert len(summed) == 1, str(prepared)
    (run,) = summed
    assert [st.prim.name for st in run.prim.region.stmts][-2:] == ["exp", "sum"]
    assert [v.aval.ndim for v in run.outs] == ([2, 1] if where == "top level" else [1, 0])  # the exponentials, the sums
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(f, x), rtol=1e-12)
    if where == "top level":
        assert kernel_calls.get("map_with_row_sums") == 1, kernel_calls
    else:  # the map folds its rows: the whole map is a loop nest, which runs the body prepared above only if it declines
        assert [s.prim.name for s in prepare(fold.trace(f, x), whole_arrays=True).stmts] == ["loop_nest"]


def test_a_row_sum_alone_reading_a_run_stores_nothing_else(kernel_calls):
    """sum(a * b, axis=1) at the top level: the product is never stored, only its row sums."""
    from fold.runtime.numba_backend.elementwise_fusion import FusedElementwise
    from fold.runtime.numba_backend.passes import prepare

    a, b = rng.normal(size=(COMPILE_FROM // 64 + 1, 64)), rng.normal(size=(COMPILE_FROM // 64 + 1, 64))
    f = lambda a, b: fold.sum(a * b, axis=1) * 2.0  # noqa: E731
    prepared = prepare(fold.trace(f, a, b), whole_arrays=True)
    (run,) = [s for s in prepared.stmts if isinstance(s.prim, FusedElementwise)]
    assert run.prim.row_sum is not None and [v.aval.shape for v in run.outs] == [(a.shape[0],)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(f, a, b), rtol=1e-12)
    assert kernel_calls.get("map_with_row_sums") == 1, kernel_calls
    integer = lambda i: fold.sum(i * 3, axis=1)  # noqa: E731 (integer sums: exact in any order)
    i = rng.integers(-50, 50, size=a.shape)
    got, want = both(integer, i)
    np.testing.assert_array_equal(got, want)
    # sin has no F64x4 form: the kernel runs it through the body's lane form (four elements per libmvec call)
    # and sums the lanes in four accumulators; integers (no libmvec call) one element at a time
    sines = lambda a: fold.sum(fold.sin(a) * 2.0, axis=1)  # noqa: E731
    for g, arg in ((sines, a), (integer, i)):
        runs = [s for s in prepare(fold.trace(g, arg), whole_arrays=True).stmts if isinstance(s.prim, FusedElementwise)]
        assert [s.prim.row_sum is not None for s in runs] == [True], runs
    kernel_calls.clear()
    assert_same(*both(sines, a), rtol=1e-12)
    assert kernel_calls.get("map_with_row_sums") == 1, kernel_calls


def test_a_run_reading_an_earlier_run_merges_with_it(kernel_calls):
    """Attention's backward shape: p = exp(s - lse) (read by a product too), then dp - delta from work of
    another shape, then ds = p * (dp - delta): one run writing p and ds, the per-row delta moved before it.
    A run that needs a value computed from the first run's (through the product) stays apart."""
    from fold.runtime.numba_backend.elementwise_fusion import FusedElementwise
    from fold.runtime.numba_backend.passes import prepare

    rows, cols = COMPILE_FROM // 128 + 1, 128
    s, dp, lse = rng.normal(size=(rows, cols)), rng.normal(size=(rows, cols)), rng.normal(size=rows)
    g, o = rng.normal(size=(rows, 2 * cols)), rng.normal(size=(rows, 2 * cols))  # a run of its own: large enough

    def backward(s, dp, lse, g, o, v):
        p = fold.exp(s - fold.reshape(lse, (rows, 1)))
        dv = fold.matmul(fold.transpose(p), g)
        delta = fold.sum(g * o, axis=1)
        ds = p * (dp - fold.reshape(delta, (rows, 1))) * 0.5
        return ds, dv

    def dependent(s, dp, lse, g, o, v):
        p = fold.exp(s - fold.reshape(lse, (rows, 1)))
        q = fold.matmul(p, v)  # (rows, cols): from p
        return p * q + dp, p

    v = rng.normal(size=(cols, cols))
    args = (s, dp, lse, g, o, v)
    merged = prepare(fold.trace(backward, *args), whole_arrays=True)
    runs = [st for st in merged.stmts if isinstance(st.prim, FusedElementwise) and st.outs[0].aval.ndim == 2]
    assert len(runs) == 1 and len(runs[0].outs) == 2, str(merged)  # p (for the product) and ds
    kept = prepare(fold.trace(dependent, *args), whole_arrays=True)
    assert sum(isinstance(st.prim, FusedElementwise) for st in kept.stmts) == 2, str(kept)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(backward, *args), rtol=1e-12)
        assert_same(*both(dependent, *args), rtol=1e-12)


def test_maps_returning_their_elements_run_no_kernel(kernel_calls):
    """map(lambda r: r, x) and map(lambda a, b: b, (x, y)) compute nothing (gemm_map_reduce's identity
    row and column maps are such): the arrays are passed through, as on the numpy backend, with no copy
    kernel; a body that returns a captured value or computes is still compiled."""
    x, y = rng.normal(size=(COMPILE_FROM + 1, 8)), rng.normal(size=(COMPILE_FROM + 1, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(lambda x: fold.map(lambda r: r, x), x))
        assert_same(*both(lambda x, y: fold.map(lambda a, b: (b, a), x, y), x, y))
        assert kernel_calls == {}, kernel_calls
        assert_same(*both(lambda x: fold.map(lambda r: r * 2.0, x), x))
    assert kernel_calls == {"map": 1}, kernel_calls


def test_a_reduce_that_alone_reads_a_run_joins_it(kernel_calls):
    """reduce(min, <elementwise run>) is one map_reduce kernel; when the run's value is also read elsewhere
    the reduce stays a statement of its own (the value must then exist whole)."""
    from fold.runtime.numba_backend.elementwise_fusion import FusedElementwise, fuse_elementwise

    def alone(x, y):
        return fold.reduce(fold.monoids.min, fold.exp(x) - y * 2.0)

    def shared(x, y):
        d = fold.exp(x) - y * 2.0
        return fold.reduce(fold.monoids.min, d), d > 0.0

    x, y = rng.normal(size=COMPILE_FROM + 5), rng.normal(size=COMPILE_FROM + 5)
    regions = [s.prim for s in fuse_elementwise(fold.trace(alone, x, y)).stmts if isinstance(s.prim, FusedElementwise)]
    assert [p.reduce is not None for p in regions] == [True]
    shared_stmts = fuse_elementwise(fold.trace(shared, x, y)).stmts
    assert [type(s.prim).__name__ for s in shared_stmts].count("Reduce") == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(alone, x, y))
        assert kernel_calls == {"map_reduce": 1}
        assert_same(*both(shared, x, y))
    from fold.kernels.cpu import host

    parallel_min = {"reduce": 1} if host.num_chunks(x.shape[0], None) > 1 else {}
    assert kernel_calls == {"map_reduce": 1, "map": 1, **parallel_min}  # shared: the run writes d, then min reads it


@pytest.mark.parametrize("zeros", [0, 1, 2])
def test_folds_recompute_the_cheap_values_they_share(zeros, kernel_calls):
    """The prod monoid's gradient tests a == 0 once and reads the test three times: to count the zeros, to
    multiply the non-zero factors and to divide by each. Each fold gets its own copy of the cheap statements
    it reads and joins them as a map_reduce kernel; the division is one map kernel. No array of n values is
    written but the gradient."""
    from fold.runtime.numba_backend.elementwise_fusion import FusedElementwise
    from fold.runtime.numba_backend.passes import prepare

    n = COMPILE_FROM + 9
    a = rng.uniform(0.999, 1.001, n)
    a[rng.choice(n, zeros, replace=False)] = 0.0

    def grad(a):
        return fold.vjp(lambda a: fold.reduce(lambda p, q: p * q, a, identity=1.0), a)[1](1.0)

    prepared = prepare(fold.trace(grad, a), whole_arrays=True)
    kinds = [("fold" if s.prim.reduce is not None else "map") if isinstance(s.prim, FusedElementwise) else s.prim.name
             for s in prepared.stmts if s.prim.name != "broadcast"]  # broadcasts are views, never written
    assert kinds == ["fold", "fold", "eq", "eq", "map"], str(prepared)  # eq: tests of the count, on scalars
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(grad, a), rtol=1e-9)
    assert kernel_calls == {"map_reduce": 2, "map": 1}


def test_a_fold_copies_no_statement_that_reads_a_costly_shared_value():
    """Where the cheap statements a fold reads start from an exponential that other statements read too, a
    copy would still read the exponential from memory: the program is left as it is."""
    from fold.runtime.numba_backend.fold_producers import private_fold_producers

    def f(x):
        e = fold.exp(x)
        return fold.sum(e * 2.0 + 1.0), e * 3.0

    def g(x):
        t = x * 2.0
        return fold.sum(t + 1.0), t - 1.0

    x = rng.normal(size=50)
    costly = fold.trace(f, x)
    assert private_fold_producers(costly) is costly
    cheap = private_fold_producers(fold.trace(g, x))
    assert [s.prim.name for s in cheap.stmts] == ["mul", "mul", "add", "sum", "sub"], str(cheap)  # t, then the copy
    assert_same(*both(g, x))


# captured float64 matrices past the size a loop nest multiplies (passes.MAX_NEST_PRODUCT_BYTES_FLOAT64): the
# bodies below run batched, on the backend's kernels (smaller ones run in the nest)
CENTROIDS = MAX_NEST_PRODUCT_BYTES_FLOAT64 // (16 * 8) + 32
COLUMNS = MAX_NEST_PRODUCT_BYTES_FLOAT64 // (12 * 8) + 15


def kmeans_cost(p, c):
    """The k-means cost with a matrix product for the distances: sum over points of min_j |p - c_j|^2."""
    cc = fold.map(lambda v: fold.sum(v * v), c)
    nearest = lambda q: fold.reduce(fold.monoids.min, fold.sum(q * q) - 2.0 * fold.matmul(c, q) + cc)  # noqa: E731
    return fold.reduce(fold.monoids.sum, fold.map(nearest, p))


def test_bodies_capturing_a_large_value_run_their_elementwise_work_in_kernels(kernel_calls):
    """A map whose body cannot be one scalar function (it multiplies by a captured matrix of CENTROIDS x 16) runs
    batched, with the backend's fusions inside the body: its products, distances and minimum are one
    product_fold kernel (the products never stored); the gradient's folds and scatter-adds are kernels too, and
    its nearest centroid (the min's first position) is found in the products' registers as well."""
    points, centroids = rng.normal(size=(COMPILE_FROM // 64 + 7, 16)), rng.normal(size=(CENTROIDS, 16))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(kmeans_cost, points, centroids))
        assert kernel_calls == {"product_fold": 1}
        assert_same(*both(lambda p, c: fold.vjp(kmeans_cost, p, c)[1](1.0), points, centroids))
    # the gradient: the distances' minimum and its first position are one product kernel (first_extremes.py), and
    # its one-hot cotangents are scatter-adds (runtime/numba_backend/one_hots.py), not (points, 64) arrays
    # summed by column: the count per centroid a histogram kernel, the scaled points' sums a loop nest's bins
    assert kernel_calls["product_first_extreme"] == 1 and kernel_calls["histogram"] == 1, kernel_calls
    assert "column_sums" not in kernel_calls, kernel_calls


@pytest.fixture
def gathered_maps(monkeypatch):
    """The `rows` each kernels.cpu.map call gets (None: no input gathered), to tell a gather read in place."""
    from fold.kernels import cpu

    seen: list = []
    original = cpu.map

    def spy(*args, rows=None, **kwargs):
        seen.append(None if rows is None else [r is not None for r in rows])
        return original(*args, rows=rows, **kwargs)

    monkeypatch.setattr(cpu, "map", spy)
    return seen


def test_k_means_gradient_reads_its_nearest_centroids_in_place(kernel_calls, gathered_maps):
    """From COMPILE_FROM rows: the points' gradient 2 (p - c[nearest]) reads c's rows in place (one map kernel
    with a gathered input, gather_fusion.py), and the centroids' gradient folds the scaled points straight
    into their bins (a loop nest whose state is the (CENTROIDS, 16) bins: the scaled (points, 16) copy is never
    made); the count of points per centroid is the histogram kernel's."""
    from fold.runtime.loops import LoopNest, kernel_of

    points, centroids = rng.normal(size=(COMPILE_FROM + 5, 16)), rng.normal(size=(CENTROIDS, 16))
    gradient = lambda p, c: fold.vjp(kmeans_cost, p, c)[1](1.0)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(gradient, points, centroids))
    program = prepare(fold.trace(gradient, points, centroids), whole_arrays=True)
    binned = [kernel_of(s.prim) for s in program.stmts
              if isinstance(s.prim, LoopNest) and s.prim.program.stmts[-1].prim.name == "reduce_by_index"]
    assert [[st.shape for st in k.outer.states] for k in binned] == [[(CENTROIDS, 16)]], program
    assert kernel_calls["histogram"] == 1, kernel_calls
    assert any(r is not None and sum(r) == 1 for r in gathered_maps), gathered_maps


def test_a_gathered_operand_of_a_run_is_read_in_place(gathered_maps):
    """t[i] * x + 1 over whole arrays: the run's kernel reads row i[r] of t (no (n, 16) copy), with the same
    results, gradient and errors as the numpy backend; a gather that is also an output is stored as before."""
    n = COMPILE_FROM // 16 + 5
    t, x = rng.normal(size=(64, 16)), rng.normal(size=(n, 16))
    i = rng.integers(0, 64, n)
    f = lambda t, i, x: t[i] * x + 1.0  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(f, t, i, x))
        assert gathered_maps == [[True, False]]
        assert_same(*both(lambda t, i, x: fold.vjp(lambda t, x: f(t, i, x), t, x)[1](np.ones((n, 16))), t, i, x))
        gathered_maps.clear()
        assert_same(*both(lambda t, i, x: (lambda g: (g, g * x + 1.0))(t[i]), t, i, x))
        assert gathered_maps == [None]  # the gathered rows are stored for the output: the run reads them
        gathered_maps.clear()
        from_the_end = i - 64  # the same rows, counted from the end as NumPy counts negative indices
        expected = (t[i] * x + 1.0, fold.vjp(lambda t, x: f(t, i, x), t, x)[1](np.ones((n, 16))))
        for backend in ("numpy", "numba"):
            run = fold.jit(lambda t, i, x: (f(t, i, x), fold.vjp(lambda t, x: f(t, i, x), t, x)[1](np.ones((n, 16)))),
                           backend=backend)
            assert_same(run(t, from_the_end, x), expected)
        assert any(r is not None and any(r) for r in gathered_maps), gathered_maps  # read in place
    bad = i.copy()
    bad[7] = 64
    for backend in ("numpy", "numba"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the kernel's driver rejects the index without a fallback warning
            with pytest.raises(fold.errors.FoldIndexError, match="gather: index 64 is out of range for an axis of size 64"):
                fold.jit(f, backend=backend)(t, bad, x)


def test_a_sum_of_a_run_is_folded_in_its_kernel(kernel_calls):
    """fold.sum over an elementwise run, even of one statement, joins it: at the top level one map_reduce,
    in a batched map body (k-means' |p|^2 beside its distances, which cpu.product_fold folds)
    one segmented reduce per row; the products are never stored. Integer sums too (exact either way: wrap-around arithmetic is associative)."""
    n = COMPILE_FROM + 3
    x, y = rng.normal(size=n), rng.normal(size=n)
    points, centroids = rng.normal(size=(COMPILE_FROM // 16 + 7, 16)), rng.normal(size=(CENTROIDS, 16))

    def cost(p, c):
        nearest = lambda q: fold.reduce(fold.monoids.min, fold.sum(q * q) - 2.0 * fold.matmul(c, q))  # noqa: E731
        return fold.reduce(fold.monoids.sum, fold.map(nearest, p))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(lambda x, y: fold.sum(x * y), x, y), scaled=True)
        assert kernel_calls == {"map_reduce": 1}
        kernel_calls.clear()
        assert_same(*both(cost, points, centroids), scaled=True)
        assert kernel_calls == {"segmented_reduce": 1, "product_fold": 1}
        kernel_calls.clear()
        i = rng.integers(-1000, 1000, size=n)
        numpy_result, numba_result = both(lambda i: fold.sum(i * i), i)
        assert numba_result == numpy_result == int(np.sum(i * i))
        assert kernel_calls == {"map_reduce": 1}


def test_row_folds_in_a_batched_body_run_on_the_segmented_kernel(kernel_calls):
    """In a map body that runs batched (it multiplies by a captured matrix), a recognised max (or min, *)
    of each row and a fold.sum of each row are segmented kernels over (rows, columns), not NumPy's
    single-threaded reductions along the last axis."""
    x, w = rng.normal(size=(COMPILE_FROM // 32, 16)), rng.normal(size=(CENTROIDS, 16))

    def f(x):
        return fold.map(lambda row: (fold.reduce(fold.monoids.max, fold.matmul(w, row)), fold.sum(fold.matmul(w, row))), x)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(f, x), scaled=True)
    assert kernel_calls == {"segmented_reduce": 2}


def test_batched_bodies_with_wide_values_and_narrow_results_run_in_blocks_of_rows(kernel_calls, monkeypatch):
    """Per point CENTROIDS sines of distances, one minimum (no F64x4 form for sin: the products are stored).
    Where n rows of the distances exceed twice the block budget, the body runs on blocks of rows (each
    block's kernels once; the last, short block on NumPy); the results are those of the numpy backend.
    k-means' cost itself, whose products product_fold folds, holds nothing wide: one call, no blocks.
    The gradient's body returns CENTROIDS-wide values per row: not blocked. Values made from captured ones alone
    (the transposed centroids) and broadcasts (views) do not count as wide."""
    from fold.primitives import Map
    from fold.runtime.numba_backend import lowering

    monkeypatch.setattr(lowering, "BLOCK_BYTES", 1 << 20)
    rows = lowering.MIN_BLOCK_ROWS
    points, centroids = rng.normal(size=(3 * rows + 5, 16)), rng.normal(size=(CENTROIDS, 16))

    def cost(p, c):
        nearest = lambda q: fold.reduce(fold.monoids.min, fold.sum(q * q) - 2.0 * fold.matmul(c, q))  # noqa: E731
        return fold.reduce(fold.monoids.sum, fold.map(nearest, p))

    def sine_cost(p, c):
        nearest = lambda q: fold.reduce(fold.monoids.min, fold.sin(fold.sum(q * q) - 2.0 * fold.matmul(c, q)))  # noqa: E731
        return fold.reduce(fold.monoids.sum, fold.map(nearest, p))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(sine_cost, points, centroids), scaled=True)
        assert kernel_calls == {"segmented_reduce": 6}  # |p|^2 and the minimum, in each of 3 full blocks
        kernel_calls.clear()
        assert_same(*both(cost, points, centroids), scaled=True)
        assert kernel_calls == {"segmented_reduce": 1, "product_fold": 1}
        assert_same(*both(lambda p, c: fold.vjp(cost, p, c)[1](1.0), points, centroids), scaled=True)

    def body_of(f, *args):
        return next(s.prim for s in fold.trace(f, *args).stmts if isinstance(s.prim, Map))

    n = 10**6
    narrow = body_of(lambda p: fold.map(lambda q: fold.sum(fold.matmul(centroids, q)), p), points)
    wide = body_of(lambda p: fold.map(lambda q: fold.matmul(centroids, q), p), points)
    constant = body_of(lambda p, c: fold.map(lambda q: fold.sum(q) + fold.sum(fold.transpose(c)), p), points, centroids)
    assert lowering.block_rows(narrow.body, narrow.num_consts, n) == max(rows, (1 << 20) // (CENTROIDS * 8))
    assert lowering.block_rows(narrow.body, narrow.num_consts, 1000) == 1000
    assert lowering.block_rows(wide.body, wide.num_consts, n) == n
    assert lowering.block_rows(constant.body, constant.num_consts, n) == n


def test_arrays_closed_over_are_operands_of_elementwise_kernels(kernel_calls):
    """A NumPy array the traced function closes over (a literal of some shape) inside an elementwise run is
    read by the run's kernel like any other operand, at the top level and in a batched body."""
    x, bias, w = rng.normal(size=(COMPILE_FROM // 40 + 3, 40)), rng.normal(size=40), rng.normal(size=(40, 80))
    top = lambda x: fold.exp(x * 0.5 + bias) - bias  # noqa: E731
    in_body = lambda x: fold.map(lambda row: fold.sum(fold.sin(row @ w + 1.0) * w[0]), x)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(top, x))
        assert kernel_calls == {"map": 1}
        kernel_calls.clear()
        assert_same(*both(in_body, x), scaled=True)
        assert kernel_calls == {"segmented_reduce": 1}


def test_matrix_vector_products_folded_in_a_body_run_on_the_product_fold_kernel(kernel_calls):
    """A fold that alone reads a captured matrix times the row (either order), through elementwise work
    with per-row, per-column, full (rows, m) or scalar operands, runs as cpu.product_fold: the
    numpy backend's results, one kernel call. Per-row matrices, float32 and an operator not known to
    commute keep the statements (results right, no product_fold)."""
    from fold.runtime.numba_backend.passes import prepare
    from fold.runtime.numba_backend.product_fold_fusion import ProductFold

    rows = COMPILE_FROM // COLUMNS + 5  # more products per row than one scalar function holds (a batched body)
    x, w = rng.normal(size=(rows, 12)), rng.normal(size=(12, COLUMNS))
    bias, r = rng.normal(size=COLUMNS), rng.normal(size=(rows, COLUMNS))
    wt, weights = np.ascontiguousarray(w.T), rng.normal(size=3)
    fused = {
        "row @ matrix + bias, max": (lambda x: fold.map(lambda q: fold.reduce(fold.monoids.max, q @ w + bias), x), (x,)),
        "exp of a full operand, sum": (lambda x, r: fold.map(
            lambda q, ri: fold.sum(fold.exp(fold.matmul(wt, q) * ri - 1.0)), x, r), (x, r)),
        "a computed scalar, min": (lambda x, v: fold.map(
            lambda q: fold.reduce(fold.monoids.min, fold.matmul(wt, q) * fold.sum(v)), x), (x, weights)),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name, (f, args) in fused.items():
            kernel_calls.clear()
            assert_same(*both(f, *args), scaled=True)
            assert kernel_calls.get("product_fold") == 1, (name, kernel_calls)

        per_row = rng.normal(size=(rows, COLUMNS, 12))
        kept = {
            "per-row matrices": (lambda x, m: fold.map(lambda q, mi: fold.reduce(fold.monoids.min, fold.matmul(mi, q)), x, m),
                                 (x, per_row)),
            "float32": (lambda x: fold.map(lambda q: fold.reduce(fold.monoids.max, q @ w.astype(np.float32)), x),
                        (x.astype(np.float32),)),
        }
        for name, (f, args) in kept.items():
            kernel_calls.clear()
            assert_same(*both(f, *args), rtol=1e-5 if name == "float32" else 1e-12, scaled=True)
            assert "product_fold" not in kernel_calls, (name, kernel_calls)

        for commutative in (False, True):
            plus = fold.Monoid(lambda a, b: a + b * 1.0, 0.0, commutative=commutative, name="plus")
            f = lambda x: fold.map(lambda q: fold.reduce(plus, fold.matmul(wt, q) * 2.0), x)  # noqa: E731
            body = next(st.prim.body for st in fold.trace(f, x).stmts if isinstance(st.prim, fold.primitives.Map))
            assert any(isinstance(st.prim, ProductFold) for st in prepare(body).stmts) == commutative
            kernel_calls.clear()
            assert_same(*both(f, x), scaled=True)
            assert ("product_fold" in kernel_calls) == commutative, kernel_calls


def test_maps_of_scalar_maps_over_matrices_are_elementwise_kernels(kernel_calls):
    """map(row -> map(v -> f(v, per-row, per-column, scalar)), X) over a wide matrix is elementwise over
    (rows, columns): written as broadcasts and elementwise statements, it runs as one kernel."""
    from fold.primitives import Map
    from fold.runtime.numba_backend.passes import prepare

    rows, cols = COMPILE_FROM // 40 + 3, 40
    x, r, c = rng.normal(size=(rows, cols)), rng.normal(size=rows), rng.normal(size=cols)

    def f(x, r, c):
        s = fold.exp(r[0] * 0.0)  # a captured scalar (1.0), computed
        return fold.map(lambda row, ri: fold.map(lambda v, cj: fold.sin(v * ri + cj) * s, row, c), x, r)

    prepared = prepare(fold.trace(f, x, r, c))
    assert not any(isinstance(st.prim, Map) for st in prepared.stmts), str(prepared)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(f, x, r, c))
    assert kernel_calls == {"map": 1}


_ALLOCATOR_SCRIPT = """
import numpy as np
from fold.runtime.numba_backend.allocator import keep_freed_memory


def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20  # MiB


applied = keep_freed_memory()
r0 = resident()
a = np.ones(8 * 2**20); del a  # 64 MiB, written, freed
r1 = resident()
b = np.ones(8 * 2**20)  # 64 MiB again
print(applied, r1 - r0, resident() - r1)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc/self/statm")
@pytest.mark.parametrize("setting", ["default", "off", "on"])
def test_freed_memory_stays_in_the_process_and_is_reused(setting):
    """With the numba backend's opt-in malloc policy (FOLD_KEEP_FREED_MEMORY=1) a freed 64 MiB array stays
    resident and the next one reuses its pages (nothing new is faulted in); by default, and with 0, malloc is
    left as it is (returned, then faulted in again): a library does not change its host process's malloc."""
    env = {k: v for k, v in os.environ.items() if k != "FOLD_KEEP_FREED_MEMORY"}
    env.update({"off": {"FOLD_KEEP_FREED_MEMORY": "0"}, "on": {"FOLD_KEEP_FREED_MEMORY": "1"}}.get(setting, {}))
    out = subprocess.run([sys.executable, "-c", _ALLOCATOR_SCRIPT], env=env, capture_output=True, text=True, check=True).stdout.split()
    applied, kept, grown = out[0] == "True", float(out[1]), float(out[2])
    if setting != "on":
        assert not applied and kept < 16 and grown > 48, out
    else:
        assert applied and kept > 48 and grown < 16, out


_BLAS_SCRIPT = """
import ctypes
import numpy as np
import fold
from fold.runtime.numba_backend.blas_threads import loaded_openblas

a = np.arange(64.0).reshape(8, 8)
before = a @ a  # OpenBLAS's threads are running
libs = [ctypes.CDLL(p) for p in loaded_openblas()]
fold.jit(lambda x: x * 2.0, backend="numba")(np.ones(3))  # the backend's first use
after = a @ a  # the threads started again
print(len(libs), *[lib.openblas_thread_timeout() for lib in libs], np.array_equal(before, after))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps lists the loaded libraries")
@pytest.mark.parametrize("setting", ["default", "on", "user", "off"])
def test_openblas_threads_wait_briefly_once_the_backend_runs(setting):
    """With FOLD_QUIET_BLAS=1 the numba backend shortens the wait of every loaded OpenBLAS's idle threads to
    2^14 cycles (they spun for 2^28 against the kernels after each product); by default, with 0, and where
    the user set a wait, OpenBLAS is left alone (0: OpenBLAS's compiled default): under other load the short
    wait cost 30-100x on products with a long inner dimension. Products agree before and after a restart."""
    from fold.runtime.numba_backend.blas_threads import TIMEOUT_EXPONENT

    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_THREAD_TIMEOUT", "FOLD_QUIET_BLAS")}
    env.update({"user": {"OPENBLAS_THREAD_TIMEOUT": "20", "FOLD_QUIET_BLAS": "1"}, "off": {"FOLD_QUIET_BLAS": "0"},
                "on": {"FOLD_QUIET_BLAS": "1"}}.get(setting, {}))
    out = subprocess.run([sys.executable, "-c", _BLAS_SCRIPT], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    count, timeouts, agree = int(out[0]), [int(t) for t in out[1:-1]], out[-1] == "True"
    if count == 0:
        pytest.skip("NumPy here is not linked to OpenBLAS")
    want = {"default": 0, "on": TIMEOUT_EXPONENT, "user": 20, "off": 0}[setting]
    assert agree and timeouts == [want] * count, out


def test_a_statement_reading_a_run_waits_and_the_run_goes_on_past_it():
    """sum(a) reads the run but the statements after it do not need the sum: they stay in the run, and the
    sum runs after it; a statement that needs the sum ends the run."""
    from fold.runtime.numba_backend.elementwise_fusion import FusedElementwise, fuse_elementwise

    def f(x):
        a = fold.exp(x) * 2.0
        s = fold.sum(a)
        b = -a + 1.0
        return s, b * s + 1.0

    x = rng.normal(size=COMPILE_FROM + 1)
    fused = fuse_elementwise(fold.trace(f, x))
    names = [[st.prim.name for st in s.prim.region.stmts] if isinstance(s.prim, FusedElementwise) else s.prim.name for s in fused.stmts]
    assert names == [["exp", "mul", "neg", "add"], "sum", "broadcast", ["mul", "add"]], names
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # b = 1 - 2 exp(x) cancels near x = -log 2, and b * s is large: exp's last-ulp differences (libmvec
        # here, within 4 ulp) show up relative to the terms, not to a result near zero
        assert_same(*both(f, x), scaled=True)


TRANSCENDENTAL_BODIES = {
    "exp": lambda x, y: fold.exp(x), "expm1": lambda x, y: fold.expm1(x), "log": lambda x, y: fold.log(x),
    "log1p": lambda x, y: fold.log1p(x), "sin": lambda x, y: fold.sin(x), "cos": lambda x, y: fold.cos(x),
    "tanh": lambda x, y: fold.tanh(x), "sigmoid": lambda x, y: fold.sigmoid(x),
    "logaddexp": lambda x, y: fold.logaddexp(x, y),
}


@pytest.mark.parametrize("op", sorted(TRANSCENDENTAL_BODIES))
def test_transcendental_maps_run_four_elements_per_vector_call(op, kernel_calls):
    """A body calling exp, log, sin, ... gets a lane form (kernels.cpu.lanes) calling libmvec four lanes at a
    time, and agrees with NumPy: special values exactly (the NaNs, infinities and signed zeros where NumPy
    has them), the rest within a few ulp. At the top level, inside a fused sum, and per row."""
    from fold.kernels.cpu import lanes, vector_math
    from fold.runtime.numba_backend.codegen import compile_scalar_program

    n = COMPILE_FROM + 3
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-300, -1.0, -0.5, 700.0, 710.0, -745.5, 3.0, 1e300, -1e300]
    x = np.concatenate([specials, rng.normal(scale=10.0, size=n - len(specials))])
    y = np.concatenate([specials[::-1], rng.normal(scale=10.0, size=n - len(specials))])
    body = TRANSCENDENTAL_BODIES[op]
    f = lambda x, y: fold.map(body, x, y)  # noqa: E731
    program = fold.trace(f, x, y)
    (stmt,) = [s for s in program.stmts if isinstance(s.prim, fold.primitives.Map)]
    assert (lanes.lane_form(compile_scalar_program(stmt.prim.body)) is not None) == vector_math.AVAILABLE
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        want, got = both(f, x, y)
        assert kernel_calls == {"map": 1}
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        exact = ~np.isfinite(want) | (want == 0)
        np.testing.assert_array_equal(got[exact], want[exact])
        # logaddexp(x, y) = hi + log1p(...) may cancel: its error is relative to the larger argument
        scale = np.maximum(np.abs(x), np.abs(y))[~exact] if op == "logaddexp" else 0.0
        error = np.abs(got[~exact] - want[~exact]) / np.maximum(np.abs(want[~exact]), scale)
        assert error.max() <= 4e-15, (x[~exact][np.argmax(error)], error.max())
        finite_x, finite_y = np.nan_to_num(x[20:], posinf=3.0, neginf=-3.0), y[20:]
        summed = lambda x, y: fold.sum(fold.map(lambda a, b: body(a, b) * 1.0, x, y))  # noqa: E731
        assert_same(*both(summed, np.abs(finite_x), np.abs(finite_y)), rtol=1e-12, scaled=True)
        rows = lambda x, y: fold.map(lambda r, s: fold.sum(fold.map(body, r, s)), x, y)  # noqa: E731
        r, s = np.abs(rng.normal(scale=3.0, size=(2, COMPILE_FROM // 50 + 1, 50)))
        assert_same(*both(rows, r, s), rtol=1e-12, scaled=True)


def test_scalar_helpers_keep_numpys_answers_at_the_edges(kernel_calls):
    """Cases a fuzzing review found compiled differently from NumPy: logaddexp of two equal infinities (inf
    - inf made NaN, in the scalar helper and in the lane form), a float % whose quotient is large (a - (a //
    b) * b lost the remainder; NumPy's comes from fmod), x % inf, integer x % 0 and INT64_MIN % -1 (NumPy:
    0), INT64_MIN // -1 (NumPy wraps to INT64_MIN, a compiled // gave 0), and an integer ** a negative
    integer (NumPy refuses: the compiled ** gave 0, so such a body is not compiled). Each in a map body
    compiled at any size, and in a fused run or kernel from COMPILE_FROM."""
    n = COMPILE_FROM + 3
    x, y = np.full(n, np.inf), np.full(n, np.inf)
    x[:4], y[:4] = [-np.inf, np.inf, 0.0, np.nan], [-np.inf, -np.inf, np.inf, np.inf]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for f in (lambda x, y: fold.map(lambda a, b: fold.logaddexp(a, b), x, y),  # lane form
                  lambda x, y: fold.logaddexp(x, y) + 1.0,  # fused elementwise run
                  lambda x, y: fold.map(lambda a, b: fold.logaddexp(a * 1.0, b) * 2.0, x, y)):
            want, got = both(f, x, y)
            np.testing.assert_array_equal(got, want)
            assert got[0] == -np.inf and np.isnan(got[3]) and np.all(got[4:] == np.inf)
        want, got = both(lambda x: fold.scan(fold.monoids.logaddexp, x), np.array([0.0, np.inf, 1.0, np.inf, 2.0]))
        np.testing.assert_array_equal(got, want)
        assert kernel_calls.get("scan") == 1
        a = np.array([1e12, 1e17, 3.0, -3.0, 7.5, 0.0, -7.0, 5.0])
        b = np.array([2 * np.pi, 3.0, np.inf, np.inf, -2.0, -1.0, 3.0, 0.0])
        with np.errstate(invalid="ignore"):
            expected = np.remainder(a, b)
        for f in (lambda a, b: fold.map(lambda u, v: u % v, a, b), lambda a, b: a % b * 1.0):
            got = fold.jit(f, backend="numba")(np.tile(a, n // 8 + 1), np.tile(b, n // 8 + 1))[:8]
            np.testing.assert_array_equal(got, expected)
            assert np.signbit(got[5])  # 0 % -1.0 is -0.0, with the divisor's sign
        i, j = np.array([17, np.iinfo(np.int64).min, -7, 7]), np.array([0, -1, 3, -3])
        for f in (lambda i, j: fold.map(lambda u, v: u % v, i, j), lambda i, j: i % j + 0):
            got = fold.jit(f, backend="numba")(np.tile(i, n // 4 + 1), np.tile(j, n // 4 + 1))[:4]
            np.testing.assert_array_equal(got, [0, 0, 2, -2])
        for f in (lambda i, j: fold.map(lambda u, v: u // v, i, j), lambda i, j: i // j + 0):
            got = fold.jit(f, backend="numba")(np.tile(i, n // 4 + 1), np.tile(j, n // 4 + 1))[:4]
            np.testing.assert_array_equal(got, [0, np.iinfo(np.int64).min, -3, -3])  # NumPy: the minimum wraps
    power = lambda i, j: fold.map(lambda u, v: u ** v, i, j)  # noqa: E731
    for backend in ("numpy", "numba"):
        with pytest.raises(fold.FoldRuntimeError, match="Integers to negative integer powers are not allowed"):
            fold.jit(power, backend=backend)(np.array([2, 3]), np.array([-1, 2]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        squares = fold.jit(lambda i: fold.map(lambda u: u ** 2, i), backend="numba")(np.arange(n))
    np.testing.assert_array_equal(squares, np.arange(n) ** 2)


def test_zero_width_rows_run_without_a_warning():
    """Rows of no elements give a map nothing to compile: it runs as on numpy, silently (it once declined
    with a warning: a kernel of m = 0 inputs, a scan unrolled over 0 elements)."""
    X = np.zeros((COMPILE_FROM + 1, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for f in (lambda X: fold.map(lambda r: fold.reduce(fold.monoids.max, r * 2.0), X),
                  lambda X: fold.map(lambda r: fold.scan(lambda a, b: a + b + a * b, r, identity=0.0), X),
                  lambda X: fold.map(lambda r: (r * 2.0, fold.sum(r) + 1.0), X)):
            assert_same(*both(f, X))
    P, C = np.zeros((5, 0)), np.zeros((3, 0))  # the inner dimension 0 in a map body's product
    want, got = both(lambda P, C: fold.map(lambda p: fold.matmul(C, p), P), P, C)
    np.testing.assert_array_equal(got, np.zeros((5, 3)))
    np.testing.assert_array_equal(want, np.zeros((5, 3)))


def test_lane_forms_only_where_a_vector_call_pays():
    """No lane form for a body without transcendentals, or for a body of so many scalars that a kernel's
    call of its lane form could not be inlined; a lane form that returns an input and a value made from a
    literal as they are still agrees."""
    from fold.kernels.cpu import lanes, vector_math
    from fold.runtime.numba_backend.codegen import compile_scalar_program

    def lane_form_of(f, *args):
        (stmt,) = [s for s in fold.trace(f, *args).stmts if isinstance(s.prim, fold.primitives.Map)]
        return lanes.lane_form(compile_scalar_program(stmt.prim.body))

    x = rng.normal(size=COMPILE_FROM + 5)
    assert lane_form_of(lambda x: fold.map(lambda v: v * 2.0 + 1.0, x), x) is None
    wide = rng.normal(size=(1000, 8))
    assert lane_form_of(lambda w: fold.map(lambda r: fold.exp(r), w), wide) is None  # 8 parameters
    mixed = lambda x: fold.map(lambda v: (fold.exp(v), v, 2.0 + 0.0 * v, fold.sin(v) * fold.cos(v)), x)  # noqa: E731
    assert (lane_form_of(mixed, x) is not None) == vector_math.AVAILABLE
    assert_same(*both(mixed, x), rtol=1e-14)


@pytest.mark.parametrize("op", ["exp", "expm1", "log", "log1p", "sin", "cos", "tanh"])
def test_float32_transcendentals_run_four_elements_per_vector_call(op, kernel_calls):
    """float32 bodies call libmvec's float32 variants: the same special values as NumPy, the rest within
    libmvec's 4 ulp of the float64 result rounded to float32."""
    from fold.kernels.cpu import lanes, vector_math
    from fold.runtime.numba_backend.codegen import compile_scalar_program

    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, -0.5, 88.0, 89.0, -104.0, 3.0], np.float32)
    x = np.concatenate([specials, rng.normal(scale=10.0, size=COMPILE_FROM).astype(np.float32)])
    body = TRANSCENDENTAL_BODIES[op]
    f = lambda x: fold.map(lambda v: body(v, v), x)  # noqa: E731
    (stmt,) = [s for s in fold.trace(f, x).stmts if isinstance(s.prim, fold.primitives.Map)]
    assert (lanes.lane_form(compile_scalar_program(stmt.prim.body)) is not None) == vector_math.AVAILABLE
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        want, got = both(f, x)
    assert kernel_calls == {"map": 1} and got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    exact = ~np.isfinite(want) | (want == 0)
    np.testing.assert_array_equal(got[exact], want[exact])
    with np.errstate(all="ignore"):
        exact_result = fold.jit(f, backend="numpy")(x.astype(np.float64)).astype(np.float32)
    ulps = np.abs(got[~exact] - exact_result[~exact]) / np.spacing(np.abs(exact_result[~exact]))
    assert ulps.max() <= 4, (x[~exact][np.argmax(ulps)], ulps.max())


def test_top_level_sums_over_the_first_axis_run_on_the_column_kernel(kernel_calls):
    """fold.sum(x, axis=0) of a tall float matrix (a gradient's sum over a batch) is kernels.cpu.column_sums
    on two threads, not NumPy's one; small, integer or non-contiguous inputs stay with NumPy."""
    x = rng.normal(size=(COMPILE_FROM // 8 + 3, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(lambda x: fold.sum(x, axis=0), x), scaled=True)
        assert kernel_calls == {"column_sums": 1}
        kernel_calls.clear()
        assert_same(*both(lambda x: fold.sum(x, axis=0), x[:100]))
        i = rng.integers(-5, 5, size=x.shape)
        numpy_result, numba_result = both(lambda i: fold.sum(i, axis=0), i)
        np.testing.assert_array_equal(numba_result, i.sum(axis=0))
        assert kernel_calls == {}


def test_top_level_sums_over_the_last_axis_run_on_the_row_kernel(kernel_calls):
    """fold.sum(x, axis=1) of a large float matrix (softmax's row sums in a gemm block) is the segmented
    kernel, its rows folded on F64x4 lanes: within reassociation of NumPy's sums."""
    x = rng.normal(size=(COMPILE_FROM // 64 + 3, 67))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*both(lambda x: fold.sum(x, axis=1), x), scaled=True)
        assert kernel_calls == {"segmented_reduce": 1}
        np.testing.assert_allclose(fold.jit(lambda x: fold.sum(x, axis=1), backend="numba")(x), x.sum(axis=1),
                                   rtol=1e-12, atol=1e-12)


def _scaled_operands(program) -> list[tuple]:
    """The shapes of the prepared program's matrix-product operands that are a value times a literal."""
    from fold.ir import Lit
    from fold.primitives import Elementwise, MatMul
    from fold.runtime.numba_backend.passes import prepare

    prepared = prepare(program)
    scaled = {s.outs[0] for s in prepared.stmts if isinstance(s.prim, Elementwise) and s.prim.op == "mul"
              and any(isinstance(a, Lit) for a in s.args)}
    return [a.aval.shape for s in prepared.stmts if isinstance(s.prim, MatMul) for a in s.args if a in scaled]


@pytest.mark.parametrize("lhs, rhs, scaled", [((3, 4), (4, 50), (3, 4)), ((50, 4), (4, 3), (4, 3))])
@pytest.mark.parametrize("scale", [0.5, 0.3])
def test_a_scaled_matrix_product_scales_its_smaller_operand(lhs, rhs, scaled, scale):
    """(A @ B) * c runs as (A * c) @ B or A @ (B * c), whichever operand is smaller: exactly the same
    result for a power of two, the same to rounding otherwise."""
    a, b = rng.normal(size=lhs), rng.normal(size=rhs)
    f = lambda a, b: fold.matmul(a, b) * scale  # noqa: E731
    assert _scaled_operands(fold.trace(f, a, b)) == [scaled]
    assert_same(*both(f, a, b), rtol=0.0 if scale == 0.5 else 1e-14)


def test_a_product_read_twice_or_scaled_by_a_computed_value_keeps_its_scaling():
    """Only a product whose one reader multiplies it by a scalar literal is rewritten."""
    a, b, w = rng.normal(size=(3, 4)), rng.normal(size=(4, 50)), rng.normal(size=50)
    cases = {
        "read twice": lambda a, b: (lambda p: p * 0.5 + p)(fold.matmul(a, b)),
        "computed scale": lambda a, b: fold.matmul(a, b) * fold.sum(a),
        "per-column literal": lambda a, b: fold.matmul(a, b) * w,
    }
    for name, f in cases.items():
        assert _scaled_operands(fold.trace(f, a, b)) == [], name
        assert_same(*both(f, a, b))


def test_attention_blocks_scale_the_queries_not_the_scores():
    """attention's s / sqrt(F) over a bi x bj block is read by the row maximum and the exponentials: the
    backend scales the bi x F queries instead, in the forward blocks and in the gradient's."""
    from examples import gemm_layers

    Q, K, V = rng.normal(size=(40, 16)), rng.normal(size=(60, 16)), rng.normal(size=(60, 8))
    fn = lambda Q, K, V: gemm_layers.attention(Q, K, V, block=(20, 30))  # noqa: E731
    # the gradient alone (fold.vjp also computes the output, a third gemm of blocks)
    program = fold.trace(lambda Q, K, V: fold.ad.vjp_value(fn, (Q, K, V), np.ones((40, 8))), Q, K, V)
    blocks = [p for s in program.stmts if hasattr(s.prim, "blocks") for _, p in s.prim.blocks]
    assert len(blocks) == 2
    for block in blocks:
        assert _scaled_operands(block) == [(20, 16)], str(block)
    assert_same(*both(fn, Q, K, V))


_F32_SUMS = {
    "fused map and sum": (lambda x: fold.reduce(fold.monoids.sum, x * 1.5), (1_000_000,),
                          lambda x: 1.5 * x.sum(), "map_reduce"),
    "user + over a map": (lambda x: fold.reduce(lambda a, b: a + b, x * 1.5, identity=0.0), (1_000_000,),
                          lambda x: 1.5 * x.sum(), "map_reduce"),
    "a map's sum": (lambda x: fold.reduce(fold.monoids.sum, fold.map(lambda v: fold.exp(v), x)), (1_000_000,),
                    lambda x: np.exp(x).sum(), "loop_nest"),
    "matrix row sums": (lambda x: fold.sum(x, 1), (2, 500_000), lambda x: x.sum(1), "segmented_reduce"),
    "matrix column sums": (lambda x: fold.sum(x, 0), (500_000, 2), lambda x: x.sum(0), "column_sums"),
    "row sums of a map": (lambda x: fold.map(lambda r: fold.reduce(fold.monoids.sum, r * 1.5), x), (2, 500_000),
                          lambda x: 1.5 * x.sum(1), "loop_nest"),
    "a run and its row sums": (lambda x: (lambda e: (e, fold.sum(e, 1)))(x * 0.5 + 0.25), (4, 250_000),
                               lambda x: (x * 0.5 + 0.25, (x * 0.5 + 0.25).sum(1)), "map_with_row_sums"),
}


@pytest.mark.parametrize("case", list(_F32_SUMS))
def test_float32_sums_lose_no_more_accuracy_than_numpys(case, kernel_calls):
    """A float32 running total over 10^6 near-equal terms drifted by 1e-3 relative; the kernels sum float32
    in float64 (wide_folds.py), so they stay within float32 rounding of the exact sum, as NumPy's pairwise sum does."""
    f, shape, exact, kernel = _F32_SUMS[case]
    x = np.full(shape, 0.8153, np.float32)
    got = fold.jit(f, backend="numba")(x)
    want = exact(x.astype(np.float64))
    for g, w in zip(fold.tree_flatten(got)[0], fold.tree_flatten(want)[0], strict=True):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=2e-7)
    _assert_ran(kernel, kernel_calls, f, x)


def _assert_ran(kernel: str, kernel_calls: dict, f, x) -> None:
    """`kernel` (of kernels.cpu) ran, or f(x) is one loop nest (runtime/loops: a kernel of its own)."""
    if kernel == "loop_nest":
        prepared = prepare(fold.trace(f, x), whole_arrays=True)
        names = [s.prim.name for s in prepared.stmts]
        assert names[-1] == "loop_nest" and set(names[:-1]) <= {"reshape"}, prepared  # reshape: a view of x
    else:
        assert kernel_calls.get(kernel, 0) >= 1


def _user_plus(a, b):  # + as the recogniser does not see it: a user's operator, folded by the kernels as written
    return a + b + 0.0 * a * b


def _user_times(a, b):
    return a * b + 0.0 * a


def _recurrence(a, b):  # ((a1, b1), (a2, b2)) -> (a1 a2, a2 b1 + b2): x_i = a_i x_{i-1} + b_i, not commutative
    return a[0] * b[0], b[0] * a[1] + b[1]


_BINS = np.arange(1_000_000) % 3
_NEAR_ONE = 1.0 + 2.0 ** -20  # a float32 exactly, so the exact products are powers of it

# name -> (f, its input's value, f's exact value from the float64 input, the kernel that must run): 10^6
# equal float32 values, where a float32 running value drifts furthest
_F32_FOLDS = {
    "user reduce": (lambda x: fold.reduce(_user_plus, x, identity=0.0), 0.8153, np.sum, "reduce"),
    "product": (lambda x: fold.reduce(lambda a, b: a * b, x, identity=1.0), _NEAR_ONE, np.prod, "reduce"),
    "user scan": (lambda x: fold.scan(_user_plus, x, identity=0.0), 0.8153, np.cumsum, "scan"),
    "reverse exclusive scan": (lambda x: fold.scan(_user_plus, x, identity=0.0, reverse=True, exclusive=True), 0.8153,
                               lambda x: np.append(np.cumsum(x[::-1])[::-1][1:], 0.0), "scan"),
    "linear recurrence": (lambda x: fold.scan(_recurrence, (x * 0.0 + 1.0, x), identity=(1.0, 0.0))[1], 0.8153,
                          np.cumsum, "scan"),
    "reduce by index": (lambda x: fold.reduce_by_index(_user_plus, 3, _BINS, x, identity=0.0), 0.8153,
                        lambda x: np.bincount(_BINS, x, 3), "histogram"),
    "row folds": (lambda x: fold.map(lambda r: fold.reduce(_user_plus, r, identity=0.0), x.reshape(2, -1)), 0.8153,
                  lambda x: x.reshape(2, -1).sum(1), "loop_nest"),
    "map then fold": (lambda x: fold.reduce(_user_plus, fold.map(lambda v: v * 2.0, x), identity=0.0), 0.8153,
                      lambda x: 2.0 * x.sum(), "loop_nest"),
    "map, scan, map": (lambda x: fold.map(lambda v: v * 4.0, fold.scan(_user_plus, fold.map(lambda v: v * 2.0, x), identity=0.0)),
                       0.8153, lambda x: 8.0 * np.cumsum(x), "map_scan"),
    "generic gradient": (fold.grad(lambda x: fold.reduce(_user_times, x, identity=1.0), reduce_rule="generic"), _NEAR_ONE,
                         lambda x: np.prod(x) / x, "scan_pair_map"),
}


@pytest.mark.parametrize("case", list(_F32_FOLDS))
def test_float32_folds_are_carried_in_float64(case, kernel_calls):
    """A kernel's float32 running value drifted with length: a user's + scanned over 10^6 values of 0.8153
    ended 1e-3 off. The kernels carry float32 folds in float64 (wide_folds.py): each result is the exact
    one rounded to float32 once (the numpy backend's tree of float32 combines stays within about 1e-7)."""
    f, value, exact, kernel = _F32_FOLDS[case]
    x = np.full(1_000_000, value, np.float32)
    got = fold.jit(f, backend="numba")(x)
    want = exact(x.astype(np.float64))
    assert got.dtype == np.float32
    # a gradient's mapper rounds the prefix and the suffix to float32, then multiplies: three roundings
    np.testing.assert_allclose(got, want, rtol=4e-7 if "gradient" in case else 1e-7)
    _assert_ran(kernel, kernel_calls, f, x)


@pytest.mark.parametrize("reverse,exclusive", [(False, False), (True, True)])
def test_a_long_cumulative_sum_runs_the_scan_kernel(reverse, exclusive, kernel_calls):
    """A + scan from COMPILE_FROM elements runs the parallel scan kernel (3x NumPy's single-threaded cumsum);
    a shorter one stays with cumsum, which costs no compilation."""
    from fold.runtime.numba_backend.lowering import COMPILE_FROM

    f = fold.jit(lambda x: fold.scan(fold.monoids.sum, x, reverse=reverse, exclusive=exclusive), backend="numba")
    short = rng.normal(size=COMPILE_FROM - 1)
    want = np.cumsum(short[::-1])[::-1] - short if reverse else np.cumsum(short)
    np.testing.assert_allclose(f(short), want, rtol=1e-12, atol=1e-9)
    assert kernel_calls.get("scan", 0) == 0
    x = rng.normal(size=300_001)
    want = np.cumsum(x[::-1])[::-1] - x if reverse else np.cumsum(x)
    np.testing.assert_allclose(f(x), want, rtol=1e-12, atol=1e-9)
    assert kernel_calls["scan"] == 1


def test_a_widened_sum_body_is_built_once_per_body():
    """The float64 copy of a summed body is what compile_scalar_program memoises: a new copy per call would
    regenerate the kernel's module source on every call (a float32 sum of 2^16 took 119 us a call, not 41)."""
    from fold.runtime.numba_backend.wide_folds import widened_last_output

    body = fold.trace(lambda v: fold.exp(v) * 2.0, np.zeros((), np.float32))
    widened = widened_last_output(body)
    assert widened is widened_last_output(body)
    assert widened.out_avals[-1].dtype == np.float64 and body.out_avals[-1].dtype == np.float32


def test_only_short_operators_are_inlined_at_each_call_site():
    """Numba inlines an `inline="always"` function once per call site, and a generic-rule gradient's kernel
    calls its operator at 18: an operator of more than MAX_INLINED_STATEMENTS written-out statements is an
    ordinary call instead (the Hessian-vector product of a logwsum fold, v in R^5: its combine has 90), and
    a kernel calling it still computes the same."""
    from fold.runtime.numba_backend.codegen import MAX_INLINED_PARAMETERS, MAX_INLINED_STATEMENTS, compile_scalar_program

    def chain(a, b, steps):
        for _ in range(steps):
            a = a * 0.5 + b
        return a

    def inlined(steps: int) -> bool:
        program = fold.trace(lambda a, b: chain(a, b, steps), np.float64(1.0), np.float64(2.0))
        return compile_scalar_program(program).targetoptions.get("inline") == "always"

    assert MAX_INLINED_PARAMETERS >= 2
    assert inlined(MAX_INLINED_STATEMENTS // 2 - 1)      # two statements a step
    assert not inlined(MAX_INLINED_STATEMENTS // 2 + 1)
    long_op = lambda a, b: chain(a, b, MAX_INLINED_STATEMENTS) * 0.0 + a * b  # noqa: E731
    x = 1.0 + 1e-3 * rng.normal(size=COMPILE_FROM + 5)
    for f in (lambda x: fold.reduce(long_op, x, identity=1.0), lambda x: fold.scan(long_op, x, identity=1.0),
              lambda x: fold.grad(lambda x: fold.reduce(long_op, x, identity=1.0))(x)):
        want, got = both(f, x)
        np.testing.assert_allclose(got, want, rtol=1e-10)


def test_stop_gradient_in_an_operator_compiles(kernel_calls):
    """stop_gradient is its argument's value: an operator or map body using it is compiled like any other
    (it was declined: 'its operator cannot be compiled: it uses stop_gradient')."""
    x = np.linspace(0.0, 1.0, COMPILE_FROM)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fold.jit(lambda x: fold.reduce(lambda a, b: a + fold.stop_gradient(b) * 1.0, x, identity=0.0),
                       backend="numba")(x)
    assert kernel_calls.get("reduce", 0) >= 1
    assert_same(got, fold.jit(lambda x: fold.reduce(lambda a, b: a + b * 1.0, x, identity=0.0), backend="numpy")(x))


@pytest.mark.parametrize("saving", [False, True])
def test_a_loops_elementwise_step_runs_as_one_fused_kernel_per_iteration(saving, monkeypatch):
    # Horner's rule over a large matrix state (a vector state becomes a map of a loop over scalars, run in a
    # nest: test_loop_maps.py): the body, prepared as a program on whole arrays, is one elementwise kernel
    # (and so is the forward loop of its gradient, which saves the states)
    from fold.runtime.numba_backend import lowering

    prepared = []
    original = lowering.numpy_impls.get

    def spying(prim):
        if prim.name in ("loop", "loop_saving"):
            prepared.append(prim.body)
        return original(prim)

    monkeypatch.setattr(lowering.numpy_impls, "get", spying)
    c, x = rng.normal(size=6), rng.uniform(-1, 1, (4, COMPILE_FROM))

    def value(c, x):
        return fold.sum(fold.loop(lambda i, acc: acc * x + c[i], x * 0.0, c.shape[0]) ** 2)

    f = fold.grad(value) if saving else value
    got = fold.jit(f, backend="numba")(c, x)
    want = fold.jit(f, backend="numpy")(c, x)
    np.testing.assert_allclose(got, want, rtol=1e-10)
    assert any(s.prim.name == "elementwise" for body in prepared for s in body.stmts), prepared


@pytest.mark.parametrize("row_sums", [False, True])
def test_a_one_element_operand_of_a_fused_run_is_a_scalar_of_its_kernel(row_sums, monkeypatch):
    # a 0-d argument, or a value broadcast from one element (a sum's cotangent): passed as a constant, not
    # read through a view with zero strides, which kept the loop from vectorising (2.5x slower)
    from fold.kernels import cpu

    name = "map_with_row_sums" if row_sums else "map"
    seen = []
    original = getattr(cpu, name)

    def spying(mapper, m, k, inputs, **kwargs):
        seen.append((m, len(kwargs.get("consts", ()))))
        return original(mapper, m, k, inputs, **kwargs)

    monkeypatch.setattr(cpu, name, spying)
    x, s = rng.normal(size=(COMPILE_FROM // 100 + 1, 100)), np.asarray(1.5)
    if row_sums:
        def f(x, s):
            e = fold.exp(x * s)
            return e / fold.reshape(fold.sum(e, axis=1), (x.shape[0], 1)), fold.sum(e, axis=1)
    else:
        f = fold.grad(lambda x, s: fold.sum(fold.maximum(x, 0.0) ** 2 * s))
    assert_same(*both(f, x, s), rtol=1e-12)
    assert seen and all(consts >= 1 for _, consts in seen), seen
