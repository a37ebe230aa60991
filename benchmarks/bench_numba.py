"""The numba backend (issue 6, "Lower folds to compiled Numba kernels on the CPU"): fold's numba backend vs its
numpy backend and vs JAX jit on the CPU, primal and vjp, float64.

    python -m benchmarks.bench_numba              # full sizes (10^7 elements; k-means n = 10^6; bench_gemm's sizes)
    python -m benchmarks.bench_numba --quick      # about 100x smaller: a smoke test (the targets are set for full sizes)
    python -m benchmarks.bench_numba --only scan  # the cases whose name contains this text

Every program runs as `fold.jit(f, backend="numba")`, `fold.jit(f, backend="numpy")` and, where JAX is
importable (imported lazily; otherwise its columns are null and the JSON says why), `jax.jit` on the CPU with
`jax_enable_x64`. Gradients are `fold.jit(lambda *a: fold.ad.vjp_value(f, a, ct, reduce_rule=...))` and
`jax.jit(lambda *a: jax.vjp(g, *a)[1](ct))` with the same cotangent `ct`.

- Compile time: the first call of each callable is timed on its own. For fold-numba the compile time reported
  is `Jitted.compile_seconds` (tracing, fusion, and the Numba compilation of the kernels not compiled earlier
  in this process, where the backend reports it), with the first call's wall time beside it; for JAX it is
  the first call (tracing and XLA compilation) less the median run. The run is made in a child process whose
  kernel caches (FOLD_CACHE_DIR and NUMBA_CACHE_DIR) are fresh empty folders, so first calls compile rather
  than load; `--disk-cache` runs in this process with the caches as configured.
- Agreement: before timing, every result is checked against the numpy backend's (a JAX result that differs
  is recorded and not timed; a fold-numba result that differs is an error).
- Run time: all callables of a case (the three primals and the three gradients, and for the fusion cases the
  bandwidth bound) are timed in interleaved rounds after their first call, and the median of the rounds is
  reported; JAX outputs are waited for with `block_until_ready`. Fast cases get more rounds (to fill about
  `--fill` seconds, up to 41). Numba's parallel kernels suffer most from other load on the machine (every
  thread waits for the slowest): the load average at start and end is recorded.

Programs (n = 10^7 unless said; --quick: 10^5):

1. reduce and scan with user operators (lambdas, so the backends see a user operator; the reduce gradient
   under reduce_rule="generic", two scans, as the operators have no D; the scan gradient by the generic scan
   rule): (a) a * b on values 1 + 1e-4 randn (the product stays near 1); (b) the pairwise-products operator
   (P1, S1) (P2, S2) -> (P1 + P2 + S1 S2, S1 + S2) on (0, w), w uniform in [0, 1); (c) the 2x2 matrix product
   on 4 leaves (non-commutative), matrices I + 1e-4 randn. JAX: scans by `jax.lax.associative_scan`; the
   reduces of (a) and (b) by `jax.lax.reduce` with the same Python operator as its computation (JAX
   differentiates it), that of (c) by the last element of `jax.lax.associative_scan`: XLA's reduce may combine
   in any order, and the gradient JAX 0.10 derives for lax.reduce with this non-commutative operator is wrong
   (its primal happened to be right).
   fold recognises `a * b` as a multiplication: the reduce then runs as `np.multiply.reduce` on the numpy
   backend and as the parallel fold kernel on the numba backend (which does so for large *, min, max and
   logaddexp reductions, where NumPy's reduction is single-threaded), and on the numpy backend the scan is
   `np.multiply.accumulate`; for information the numpy backend is also timed with those shortcuts off
   (`numpy_tree`: the generic tree reduce/scan).
2. map + reduce fusion: reduce(sum, map(body, x)) with a transcendental body sin(v) * v + exp(-v) (5 ops:
   compute bound) and a cheap body ((v * 2 + 1) * v - 3) * v (5 ops: memory bound), x randn. Against the
   memory-bandwidth bound measured in the same rounds: the time to read x once, by np.sum(x) and by a
   parallel Numba sum written here (prange); the bound is the faster of the two, and fold-numba / bound is
   the ratio judged (target 1.2; it is meant for the cheap body, the transcendental one is reported too).
3. logsumexp: reduce(monoids.logaddexp, x), x randn, gradient under reduce_rule="auto" (the monoid shortcut);
   JAX: jax.nn.logsumexp (max-shifted).
4. the k-means cost, n = 10^6 points (--quick: 10^4), d = 16, k = 64: sum over points of min over centroids of
   ||p||^2 - 2 <c, p> + ||c||^2 (the matmul form of benchmarks/bench_ad.py), gradient w.r.t. points and
   centroids.
5. gemm_map_reduce attention and cross-entropy (examples/gemm_layers.py) at benchmarks/bench_gemm.py's sizes
   (its inputs, cast to float64), forward and forward+backward (one gradient program returning the output and
   the cotangents, as bench_gemm); JAX: the naive materialised formulas, skipped where they would need more
   than 8 GiB (counting bench_gemm's M x N matrices per layer, float64).

Agreement before timing: the largest |error| of every output leaf relative to the largest |value| of that
leaf of the numpy backend's result, at most `rtol`: 1e-8 by default; 1e-6 for the reassociated reductions and
scans of products (1a, 1c) and for k-means (a sum of 10^6 minima of differences of large terms).

Targets (issue 6; judged only at full size): at least 5x faster than the numpy backend on the user-operator
reduces and scans (program 1, primal and vjp); fusion within 1.2x of the bandwidth bound; no slower than JAX
jit on any program JAX can express; AD overhead (vjp time / primal time) at most 3x on each program, for
fold-numba (JAX's is reported too). Statements the numba backend could not compile run on the numpy backend
with a warning: the warnings of each program's first call are captured and recorded ("fallbacks"), with the
number of calls of each kernels.cpu driver during one warm call ("kernels").

For the gradients of program 1 the memory traffic no gradient avoids is timed in the same rounds
("gradient_traffic": each input read twice, since its fold or scan must finish before any cotangent is
known; an array cotangent read once; the gradient written once; one parallel Numba sum and one parallel
writing loop per input leaf, computing nothing else). For a one-leaf element (1a) its time over the numba
primal's is the least AD overhead a memory-bound primal allows: where that is near 3, the AD target is out
of reach on this machine whatever the kernels do. For several leaves it is an estimate (a kernel reading
all leaves in one pass can beat it).

Writes benchmarks/results/numba.json and numba.png (numba_quick.* with --quick).
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

import fold
import fold.kernels.cpu  # noqa: F401  (sets fold's OpenMP thread policy before bandwidth_sum starts Numba's threads)

from .bench_language import ufunc_fast_paths
from .common import (RESULTS_DIR, benchmark_parser, interleaved, machine, machine_line, mem_available, parse_benchmark_args,
                     save_figure, write_json)

BACKENDS = ("numpy", "numba")
SPEEDUP_TARGET = 5.0        # numpy backend time / numba backend time, at least (program 1)
BOUND_TARGET = 1.2          # fused map-reduce time / time to read the input once, at most (program 2)
JAX_TARGET = 1.0            # numba time / JAX time, at most (every program JAX expresses)
AD_TARGET = 3.0             # vjp time / primal time, at most (every program)
JAX_MEMORY_LIMIT = 8 * 2**30
JAX_NOTES = {
    "matmul2_reduce": "jax.lax.reduce is not used: XLA's reduce may combine in any order, and the vjp JAX 0.10 "
                      "derives for lax.reduce with this non-commutative operator is wrong (the primal was right): "
                      "the last element of lax.associative_scan instead",
    "logsumexp": "jax.nn.logsumexp is the max-shifted formula, not a fold of logaddexp",
    "attention": "naive: the M x N scores are materialised",
    "cross_entropy": "naive: the M x N logits are materialised",
}
MAX_REPEATS = 41
DEFAULT_RTOL = 1e-8


# ---------------------------------------------------------------------------------------------- JAX, lazily

_JAX: dict[str, Any] = {}


def jax_modules() -> tuple[Any, Any, Any] | None:
    """(jax, jax.numpy, jax.lax) with float64 enabled, or None (the reason in _JAX['error'])."""
    if "jax" not in _JAX:
        try:
            import jax
            import jax.numpy as jnp
            from jax import lax

            jax.config.update("jax_enable_x64", True)
            with contextlib.suppress(Exception):  # too late if JAX's backends were started elsewhere: fine
                jax.config.update("jax_platforms", "cpu")
            _JAX.update(jax=jax, jnp=jnp, lax=lax, version=jax.__version__, devices=[str(d) for d in jax.devices()])
        except Exception as err:  # not installed (fine: its columns are null), or broken
            _JAX.update(jax=None, error=f"{type(err).__name__}: {err}")
    if _JAX["jax"] is None:
        return None
    return _JAX["jax"], _JAX["jnp"], _JAX["lax"]


# ---------------------------------------------------------------------------------------------- the programs

def _mul(a, b):
    return a * b


def _pairwise(a, b):
    (p1, s1), (p2, s2) = a, b
    return (p1 + p2 + s1 * s2, s1 + s2)


def _matmul2(x, y):
    (a1, b1, c1, d1), (a2, b2, c2, d2) = x, y
    return (a1 * a2 + b1 * c2, a1 * b2 + b1 * d2, c1 * a2 + d1 * c2, c1 * b2 + d1 * d2)


def prod_reduce(x):
    return fold.reduce(lambda a, b: a * b, x, identity=1.0)


def prod_scan(x):
    return fold.scan(lambda a, b: a * b, x, identity=1.0)


def pairwise_reduce(p, s):
    return fold.reduce(lambda a, b: _pairwise(a, b), (p, s), identity=(0.0, 0.0))


def pairwise_scan(p, s):
    return fold.scan(lambda a, b: _pairwise(a, b), (p, s), identity=(0.0, 0.0))


def matmul2_reduce(a, b, c, d):
    return fold.reduce(lambda x, y: _matmul2(x, y), (a, b, c, d), identity=(1.0, 0.0, 0.0, 1.0))


def matmul2_scan(a, b, c, d):
    return fold.scan(lambda x, y: _matmul2(x, y), (a, b, c, d), identity=(1.0, 0.0, 0.0, 1.0))


def fused_transcendental(x):
    return fold.reduce(fold.monoids.sum, fold.map(lambda v: fold.sin(v) * v + fold.exp(-v), x))


def fused_cheap(x):
    return fold.reduce(fold.monoids.sum, fold.map(lambda v: ((v * 2.0 + 1.0) * v - 3.0) * v, x))


def logsumexp(x):
    return fold.reduce(fold.monoids.logaddexp, x)


def kmeans_matmul(points, centroids):
    cc = fold.map(lambda c: fold.sum(c * c), centroids)

    def nearest(p):
        return fold.reduce(fold.monoids.min, fold.sum(p * p) - 2.0 * fold.matmul(centroids, p) + cc)
    return fold.reduce(fold.monoids.sum, fold.map(nearest, points))


# the JAX counterparts (built on first use, so that JAX is imported only where it is installed)

def jax_programs(name: str) -> tuple[Callable, str] | None:
    mods = jax_modules()
    if mods is None:
        return None
    jax, jnp, lax = mods

    def lax_reduce(op, identity):
        def f(*xs):
            out = lax.reduce(xs if len(xs) > 1 else xs[0], identity if len(xs) > 1 else identity[0], op, (0,))
            return tuple(out) if len(xs) > 1 else out
        return f

    def assoc_scan(op):
        def f(*xs):
            out = lax.associative_scan(op, xs if len(xs) > 1 else xs[0])
            return tuple(out) if len(xs) > 1 else out
        return f

    def assoc_scan_last(op):
        def f(*xs):
            return tuple(y[-1] for y in lax.associative_scan(op, xs))
        return f

    def kmeans(points, centroids):
        d2 = (jnp.sum(points * points, axis=1)[:, None] - 2.0 * points @ centroids.T
              + jnp.sum(centroids * centroids, axis=1)[None, :])
        return jnp.sum(jnp.min(d2, axis=1))

    def attention(Q, K, V):
        s = Q @ K.T * (1.0 / np.sqrt(Q.shape[1]))
        return jax.nn.softmax(s, axis=1) @ V

    def cross_entropy(P, C, targets):
        logits = P @ C.T
        return jax.nn.logsumexp(logits, axis=1) - jnp.take_along_axis(logits, targets[:, None], axis=1)[:, 0]

    table = {
        "prod_reduce": (lax_reduce(_mul, (1.0,)), "jax.lax.reduce(x, 1.0, lambda a, b: a * b)"),
        "prod_scan": (assoc_scan(_mul), "jax.lax.associative_scan(lambda a, b: a * b, x)"),
        "pairwise_reduce": (lax_reduce(_pairwise, (0.0, 0.0)), "jax.lax.reduce((p, s), (0, 0), pairwise operator)"),
        "pairwise_scan": (assoc_scan(_pairwise), "jax.lax.associative_scan(pairwise operator, (p, s))"),
        # not jax.lax.reduce: XLA may combine in any order (the gradient JAX derives for it was wrong for this
        # non-commutative operator in JAX 0.10, though the primal happened to be right)
        "matmul2_reduce": (assoc_scan_last(_matmul2), "jax.lax.associative_scan(2x2 product, (a, b, c, d))[-1]"),
        "matmul2_scan": (assoc_scan(_matmul2), "jax.lax.associative_scan(2x2 product, (a, b, c, d))"),
        "fused_transcendental": (lambda x: jnp.sum(jnp.sin(x) * x + jnp.exp(-x)), "jnp.sum(jnp.sin(x) * x + jnp.exp(-x))"),
        "fused_cheap": (lambda x: jnp.sum(((x * 2.0 + 1.0) * x - 3.0) * x), "jnp.sum(((x * 2 + 1) * x - 3) * x)"),
        "logsumexp": (jax.nn.logsumexp, "jax.nn.logsumexp(x)"),
        "kmeans": (kmeans, "jnp: sum(min(|p|^2 - 2 P C^T + |c|^2, axis=1))"),
        "attention": (attention, "naive: softmax(Q K^T / sqrt(F)) V, materialised"),
        "cross_entropy": (cross_entropy, "naive: logsumexp(P C^T) - (P C^T)[i, t_i], materialised"),
    }
    return table[name]


# ---------------------------------------------------------------------------------------------- the cases

@dataclass
class Case:
    name: str
    program: str                                     # "1a" .. "5"
    f: Callable[..., Any] | None                     # the fold program (None: gemm layers, built separately)
    jax_name: str
    inputs: Callable[[np.random.Generator, bool], tuple]
    cotangent: Callable[[np.random.Generator, tuple], Any]
    reduce_rule: str = "generic"
    user_operator: bool = False                      # the 5x target vs the numpy backend applies
    numpy_tree: bool = False                         # also time the numpy backend with its ufunc shortcuts off
    bound: bool = False                              # also time reading the input once (program 2)
    rtol: float = DEFAULT_RTOL
    gemm: tuple[str, dict] | None = None             # (layer, sizes) for program 5
    note: str = ""


def _n(quick: bool, full: int = 10**7) -> int:
    return full // 100 if quick else full


def _near_one(rng, quick):
    return (1.0 + 1e-4 * rng.standard_normal(_n(quick)),)


def _pairs(rng, quick):
    n = _n(quick)
    return np.zeros(n), rng.uniform(0.0, 1.0, n)


def _matrices(rng, quick):
    n = _n(quick)
    e = lambda: 1e-4 * rng.standard_normal(n)  # noqa: E731
    return 1.0 + e(), e(), e(), 1.0 + e()


def _randn(rng, quick):
    return (rng.standard_normal(_n(quick)),)


def _kmeans_inputs(rng, quick):
    n = 10**4 if quick else 10**6
    return rng.standard_normal((n, 16)), rng.standard_normal((64, 16))


def _scalar_ct(k: int = 1):
    values = (1.0, 0.5, -0.25, 2.0)[:k]
    return lambda rng, args: values[0] if k == 1 else tuple(values)


def _array_ct(rng, args):
    cts = tuple(rng.standard_normal(args[0].shape[0]) for _ in args)
    return cts[0] if len(cts) == 1 else cts


USER_OP_NOTE = ("the gradient of the reduce is the generic rule (two exclusive scans of the operator, then a map "
                "of the operator's vjp)")


def cases(quick: bool) -> list[Case]:
    from .bench_gemm import FULL_CASES, QUICK_CASES

    out = [
        Case("1a reduce a*b", "1a", prod_reduce, "prod_reduce", _near_one, _scalar_ct(), user_operator=True,
             numpy_tree=True, rtol=1e-6,
             note="a*b is recognised: the numpy backend runs the primal as np.multiply.reduce, the numba backend as "
                  "its parallel fold kernel (see 'kernels'); " + USER_OP_NOTE),
        Case("1a scan a*b", "1a", prod_scan, "prod_scan", _near_one, _array_ct, user_operator=True, numpy_tree=True,
             rtol=1e-6, note="the numpy backend runs the primal as np.multiply.accumulate (recognised)"),
        Case("1b reduce pairwise", "1b", pairwise_reduce, "pairwise_reduce", _pairs, _scalar_ct(2), user_operator=True,
             note=USER_OP_NOTE),
        Case("1b scan pairwise", "1b", pairwise_scan, "pairwise_scan", _pairs, _array_ct, user_operator=True),
        Case("1c reduce 2x2 matmul", "1c", matmul2_reduce, "matmul2_reduce", _matrices, _scalar_ct(4),
             user_operator=True, rtol=1e-6, note=USER_OP_NOTE),
        Case("1c scan 2x2 matmul", "1c", matmul2_scan, "matmul2_scan", _matrices, _array_ct, user_operator=True,
             rtol=1e-6),
        Case("2 fused sin*v+exp(-v)", "2", fused_transcendental, "fused_transcendental", _randn, _scalar_ct(),
             reduce_rule="auto", bound=True, note="transcendental body: compute bound"),
        Case("2 fused cheap 5-op", "2", fused_cheap, "fused_cheap", _randn, _scalar_ct(), reduce_rule="auto",
             bound=True, note="arithmetic body: memory bound"),
        Case("3 logsumexp", "3", logsumexp, "logsumexp", _randn, _scalar_ct(), reduce_rule="auto",
             note="logaddexp is recognised: the numpy backend runs the primal as max + log(sum(exp(x - max))) in "
                  "NumPy, the numba backend as the same formula in a parallel two-pass kernel (see 'kernels')"),
        Case("4 k-means (matmul)", "4", kmeans_matmul, "kmeans", _kmeans_inputs, _scalar_ct(), reduce_rule="auto",
             rtol=1e-6),
    ]
    for layer, sizes, _ in (QUICK_CASES if quick else FULL_CASES):
        if layer in ("attention", "cross_entropy"):
            label = " ".join(f"{k}={v}" for k, v in sizes.items())
            out.append(Case(f"5 {layer} {label}", "5", None, layer, None, None, reduce_rule="auto",
                            gemm=(layer, sizes), note="forward / forward+backward; float64 (bench_gemm: float32)"))
    return out


# ---------------------------------------------------------------------------------------------- helpers

def leaves(tree: Any) -> list[np.ndarray]:
    if isinstance(tree, (tuple, list)):
        return [leaf for t in tree for leaf in leaves(t)]
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in leaves(tree[k])]
    return [np.asarray(tree)]


def max_err(got: Any, want: Any) -> float:
    """Largest |error| of any leaf, relative to the largest |value| of that leaf of `want`."""
    got, want = leaves(got), leaves(want)
    if len(got) != len(want):
        return float("inf")
    errs = [0.0]
    for g, w in zip(got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g.shape != w.shape:
            return float("inf")
        if w.size:
            errs.append(float(np.max(np.abs(g - w))) / max(float(np.max(np.abs(w))), np.finfo(np.float64).tiny))
    return max(errs)


def without_fast_paths(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run():
        with ufunc_fast_paths(False):
            return fn()
    return run


def _clear_warned() -> None:
    """The numba backend warns once per (primitive, reason) in a process; forget that, so that every program's
    first call reports its own fallbacks."""
    try:
        from fold.runtime.numba_backend import lowering
    except Exception:  # noqa: BLE001 - the backend moved: the first program to fall back still warns
        return
    warned = getattr(lowering, "_warned", None)
    if isinstance(warned, set):
        warned.clear()


def first_call(fn: Callable[[], Any], capture: bool = False) -> tuple[Any, float, list[str]]:
    """Call `fn` once, timed; with `capture`, the warnings it raises (numba fallbacks) are recorded."""
    if capture:
        _clear_warned()
    with warnings.catch_warnings(record=True) as caught:
        if capture:
            warnings.simplefilter("always")
        start = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - start
    # the numba backend's "<primitive> runs on the numpy backend (<why>)"; other warnings are passed on
    messages = list(dict.fromkeys(str(w.message) for w in caught if "numpy backend" in str(w.message))) if capture else []
    for w in caught:
        if str(w.message) not in messages:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return out, seconds, messages


KERNEL_DRIVERS = ("reduce", "map_reduce", "segmented_reduce", "scan", "histogram", "map", "scan_pair_map", "logsumexp",
                  "column_sums", "map_scan")


def kernels_used(fn: Callable[[], Any]) -> dict[str, int] | str:
    """Calls of each kernels.cpu driver during one call of `fn` (the statements that ran as Numba kernels)."""
    try:
        import fold.kernels.cpu as cpu
    except Exception as err:  # noqa: BLE001
        return f"fold.kernels.cpu not importable: {type(err).__name__}"
    counts = dict.fromkeys(KERNEL_DRIVERS, 0)
    saved = {name: getattr(cpu, name) for name in KERNEL_DRIVERS if hasattr(cpu, name)}

    def counting(name, original):
        def wrapped(*args, **kwargs):
            counts[name] += 1
            return original(*args, **kwargs)
        return wrapped

    for name, original in saved.items():
        setattr(cpu, name, counting(name, original))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    finally:
        for name, original in saved.items():
            setattr(cpu, name, original)
    return {k: v for k, v in counts.items() if v}


_bandwidth_sum = None


def bandwidth_sum() -> Callable[[np.ndarray], float]:
    """A parallel Numba sum (prange): the time to read an array once, at the speed of all threads."""
    global _bandwidth_sum
    if _bandwidth_sum is None:
        import numba

        @numba.njit(parallel=True, fastmath=True, cache=False)  # fastmath: a vectorised sum, the fastest read
        def parallel_sum(x):
            acc = 0.0
            for i in numba.prange(x.shape[0]):
                acc += x[i]
            return acc

        parallel_sum(np.ones(8))  # compile (and start Numba's threads) before any fold program is timed
        _bandwidth_sum = parallel_sum
    return _bandwidth_sum


_traffic_kernels = None


def gradient_traffic(args: tuple, ct: Any) -> Callable[[], Any]:
    """The memory traffic no gradient of a user-operator reduce or scan avoids, as a function to time: each
    input read twice (its fold or scan must finish before any element's cotangent is known), an array
    cotangent read once, the gradient written once; per input leaf, one parallel Numba sum and one parallel
    loop writing the gradient, nothing else computed. For one leaf (1a) that is the least AD overhead a
    memory-bound primal allows; for several, a kernel reading all leaves in one pass can beat it (1b's
    gradient did in session 28's run), so it is an estimate there, not a bound."""
    global _traffic_kernels
    if _traffic_kernels is None:
        import numba

        @numba.njit(parallel=True, fastmath=True, cache=False)
        def write_from_two(x, c, out):
            for i in numba.prange(x.shape[0]):
                out[i] = x[i] + c[i]

        @numba.njit(parallel=True, fastmath=True, cache=False)
        def write_from_one(x, out):
            for i in numba.prange(x.shape[0]):
                out[i] = x[i] * 2.0

        _traffic_kernels = (write_from_two, write_from_one)
    write_from_two, write_from_one = _traffic_kernels
    psum = bandwidth_sum()
    cts = [np.asarray(c) for c in (ct if isinstance(ct, tuple) else (ct,))]
    arrays = [c for c in cts if c.ndim]
    outs = [np.empty_like(a) for a in args]

    def run() -> float:
        total = 0.0
        for j, (x, out) in enumerate(zip(args, outs)):
            total += psum(x)
            if j < len(arrays):
                write_from_two(x, arrays[j], out)
            else:
                write_from_one(x, out)
        return total

    return run


# ---------------------------------------------------------------------------------------------- one case

def _gemm_setup(case: Case, rng) -> tuple[tuple, Any, dict[str, Callable], dict[str, Callable], int]:
    """(args, cotangent, fold primal per backend, fold forward+backward per backend, naive JAX bytes)."""
    from fold.ad import vjp_program
    from examples import gemm_layers as L
    from fold.inline import inline_program

    from .bench_gemm import NAIVE_MATRICES, make_inputs

    layer, sizes = case.gemm
    x = {k: (v.astype(np.float64) if v.dtype.kind == "f" else v) for k, v in make_inputs(layer, sizes).items()}
    if layer == "attention":
        args, ct, f = (x["Q"], x["K"], x["V"]), x["G"], L.attention
    else:
        args, ct, f = (x["P"], x["C"], x["targets"]), x["g"], L.cross_entropy
    primal, both = {}, {}
    grad_program = None
    for backend in BACKENDS:
        primal[backend] = fold.jit(f, backend=backend)
        if grad_program is None:
            grad_program, _ = vjp_program(fold.trace(f, *args), with_primal_outputs=True)
        gp = grad_program
        both[backend] = fold.jit(lambda *a, _gp=gp: inline_program(_gp, list(a)), backend=backend)
    m, n = sizes["M"], sizes["N"]
    jax_bytes = NAIVE_MATRICES[layer] * m * n * 8 + sum(a.nbytes for a in args)
    return args, ct, primal, both, jax_bytes


def run_case(case: Case, rng: np.random.Generator, quick: bool, repeats: int, fill: float,
             max_case_seconds: float) -> list[dict[str, Any]]:
    print(f"  {case.name} ...", flush=True)
    skipped: dict[str, str] = {}
    jax_info = jax_programs(case.jax_name)
    if case.gemm is not None:
        args, ct, primal_jits, vjp_jits, jax_bytes = _gemm_setup(case, rng)
        ct_tree = ct
        if jax_info is not None and jax_bytes > JAX_MEMORY_LIMIT:
            skipped["jax"] = (f"the naive formulas would need about {jax_bytes / 2**30:.1f} GiB "
                              f"(> {JAX_MEMORY_LIMIT / 2**30:.0f} GiB)")
            jax_info = None
    else:
        args = case.inputs(rng, quick)
        ct_tree = case.cotangent(rng, args)
        rule = case.reduce_rule

        def vjp_fn(*a, _f=case.f, _ct=ct_tree, _rule=rule):
            return fold.ad.vjp_value(_f, a, _ct, reduce_rule=_rule)

        primal_jits = {b: fold.jit(case.f, backend=b) for b in BACKENDS}
        vjp_jits = {b: fold.jit(vjp_fn, backend=b) for b in BACKENDS}
    n = int(sum(a.size for a in args))
    available = mem_available()
    est = {}
    if case.gemm is None:
        est = {"primal": int(fold.memory(case.f, *args)), "vjp": int(fold.memory(vjp_jits["numpy"].f, *args))}
        if available is not None and est["vjp"] > 0.7 * available:
            for b in BACKENDS:
                skipped[f"{b}_vjp"] = (f"fold.memory estimates {est['vjp'] / 2**30:.1f} GiB for the numpy backend's "
                                       f"gradient, {available / 2**30:.1f} GiB available")

    vjp_args = args if case.gemm is None else args + (ct_tree,)  # the gemm gradient program takes the cotangent
    fns: dict[str, Callable[[], Any]] = {}
    for b in BACKENDS:
        fns[b] = (lambda j=primal_jits[b]: j(*args))
        if f"{b}_vjp" not in skipped:
            fns[f"{b}_vjp"] = (lambda j=vjp_jits[b]: j(*vjp_args))
    if case.numpy_tree:
        fns["numpy_tree"] = without_fast_paths(fns["numpy"])
        if "numpy_vjp" in fns:
            fns["numpy_tree_vjp"] = without_fast_paths(fns["numpy_vjp"])
    jax_form = None
    if jax_info is not None:
        jax = _JAX["jax"]
        jf, jax_form = jax_info
        jargs = tuple(jax.numpy.asarray(a) for a in args)
        jct = jax.tree_util.tree_map(lambda c: jax.numpy.asarray(np.asarray(c, np.float64)), ct_tree)
        jfwd = jax.jit(jf)
        if case.gemm is not None and case.gemm[0] == "cross_entropy":
            targets = jargs[2]
            jgrad = jax.jit(lambda P, C, t, g: (lambda out, pull: (out, pull(g)))(*jax.vjp(lambda P_, C_: jf(P_, C_, t), P, C)))
            fns["jax"] = lambda: jax.block_until_ready(jfwd(*jargs))
            fns["jax_vjp"] = lambda: jax.block_until_ready(jgrad(jargs[0], jargs[1], targets, jct))
        elif case.gemm is not None:
            jgrad = jax.jit(lambda Q, K, V, g: (lambda out, pull: (out, pull(g)))(*jax.vjp(jf, Q, K, V)))
            fns["jax"] = lambda: jax.block_until_ready(jfwd(*jargs))
            fns["jax_vjp"] = lambda: jax.block_until_ready(jgrad(*jargs, jct))
        else:
            jgrad = jax.jit(lambda *a: jax.vjp(jf, *a)[1](jct))
            fns["jax"] = lambda: jax.block_until_ready(jfwd(*jargs))
            fns["jax_vjp"] = lambda: jax.block_until_ready(jgrad(*jargs))
    elif "jax" not in skipped:
        skipped["jax"] = "JAX is not importable: " + _JAX.get("error", "?")
    if case.bound:
        x = args[0]
        psum = bandwidth_sum()
        fns["bound_np_sum"] = lambda: np.sum(x)
        fns["bound_numba_sum"] = lambda: psum(x)
    if case.user_operator and "numba_vjp" in fns:
        fns["bound_traffic_vjp"] = gradient_traffic(args, ct_tree)

    # first calls: compile times, fallbacks, results
    outputs, first, fallbacks, errors_raised = {}, {}, {}, {}
    for key, fn in list(fns.items()):
        if key.startswith("jax"):
            try:
                out, seconds, _ = first_call(fn)
            except Exception as err:  # JAX cannot express or differentiate it: say so, keep going
                skipped[key] = f"JAX failed: {type(err).__name__}: {str(err)[:300]}"
                continue
        else:
            try:
                out, seconds, messages = first_call(fn, capture=key.startswith("numba"))
            except Exception as err:  # a fold failure: recorded (its targets count as missed), the rest still runs
                errors_raised[key] = f"{type(err).__name__}: {str(err)[:600]}"
                print(f"      {key} FAILED: {errors_raised[key][:300]}", flush=True)
                fns.pop(key)
                continue
            if messages:
                fallbacks[key] = messages
        outputs[key], first[key] = out, seconds
    for key in [k for k in skipped if k in fns]:
        del fns[key]
    # agreement with the numpy backend (a gradient program of gemm returns the output first, then cotangents)
    errors: dict[str, float] = {}
    for key, out in outputs.items():
        if key.startswith("bound") or key in ("numpy", "numpy_vjp"):
            continue
        ref_key = "numpy_vjp" if key.endswith("_vjp") else "numpy"
        if ref_key not in outputs:  # nothing to check it against: not timed
            skipped.setdefault(key, "not checked (no numpy backend result): not timed")
            fns.pop(key, None)
            continue
        want = outputs[ref_key]
        got = out
        if case.gemm is not None and key == "jax_vjp":  # (out, (cotangents of the float inputs))
            want = leaves(want)
            want = want[: 1 + (3 if case.gemm[0] == "attention" else 2)]
            got = [got[0], *got[1]]
        errors[key] = max_err(got, want)
        if key.startswith("jax") and not errors[key] <= case.rtol:
            skipped[key] = (f"JAX's result differs from fold's (numpy backend) by {errors[key]:.3g} relative "
                            f"(> {case.rtol:g}): not timed")
            fns.pop(key, None)
            continue
        if not errors[key] <= case.rtol:
            raise AssertionError(f"{case.name}: {key} differs from the numpy backend: max error {errors[key]:.3g} "
                                 f"> {case.rtol:g}")
    if case.bound:
        want = float(outputs["bound_np_sum"])
        errors["bound_numba_sum"] = abs(float(outputs["bound_numba_sum"]) - want) / abs(want)
    kernels = {key: kernels_used(fns[key]) for key in ("numba", "numba_vjp") if key in fns}
    del outputs
    gc.collect()
    # how many rounds: enough to fill about `fill` seconds, at least `repeats` unless that passes max_case_seconds
    start = time.perf_counter()
    for fn in fns.values():
        fn()
    round_seconds = time.perf_counter() - start
    rounds = max(repeats, min(MAX_REPEATS, int(fill / max(round_seconds, 1e-9))))
    if rounds * round_seconds > max_case_seconds:
        rounds = max(1, min(rounds, int(max_case_seconds / max(round_seconds, 1e-9))))
    samples = interleaved(fns, rounds)
    med = {k: statistics.median(v) for k, v in samples.items()}

    def get(key):
        return med.get(key)

    def ratio(a, b):
        return None if a is None or b is None else a / b

    fold_compile = {f"{b}{s}": (primal_jits if not s else vjp_jits)[b].compile_seconds
                    for b in BACKENDS for s in ("", "_vjp")}
    records = []
    for kind, suffix in (("primal", ""), ("vjp", "_vjp")):
        numba_s, numpy_s, jax_s = get("numba" + suffix), get("numpy" + suffix), get("jax" + suffix)
        r = {
            "name": f"{case.name} {kind}", "case": case.name, "program": case.program, "kind": kind, "n": n,
            "shapes": [list(a.shape) for a in args],
            "reduce_rule": case.reduce_rule if kind == "vjp" else None,
            "seconds": {"numpy": numpy_s, "numba": numba_s, "jax": jax_s},
            "first_call_seconds": {k.removesuffix(suffix): v for k, v in first.items()
                                   if (k.endswith("_vjp") if suffix else not k.endswith("_vjp")) and not k.startswith("bound")},
            "fold_compile_seconds": {b: fold_compile[b + suffix] for b in BACKENDS},
            # fold's own account (tracing + Numba compilation, where the backend reports it) and, for JAX,
            # the first call less the median run
            "compile_seconds": {
                "numba": fold_compile["numba" + suffix],
                "jax": None if first.get("jax" + suffix) is None or jax_s is None else max(0.0, first["jax" + suffix] - jax_s),
            },
            "first_call_minus_median_seconds": {
                b: first[b + suffix] - med[b + suffix] for b in ("numpy", "numba", "jax")
                if b + suffix in first and b + suffix in med},
            "speedup_vs_numpy_backend": ratio(numpy_s, numba_s),
            "numba_over_jax": ratio(numba_s, jax_s),
            "jax_form": jax_form, "jax_note": JAX_NOTES.get(case.jax_name),
            "max_err": {k.removesuffix(suffix): v for k, v in errors.items()
                        if (k.endswith("_vjp") if suffix else not k.endswith("_vjp"))},
            "rtol": case.rtol,
            "fallbacks": fallbacks.get("numba" + suffix, []),
            "kernels": kernels.get("numba" + suffix),
            "skipped": {k: v for k, v in skipped.items() if k == "jax" or k.endswith("_vjp") == bool(suffix)},
            "failed": {k.removesuffix(suffix): v for k, v in errors_raised.items() if k.endswith("_vjp") == bool(suffix)},
            "rounds": rounds,
            "samples": {k.removesuffix(suffix): v for k, v in samples.items()
                        if (k.endswith("_vjp") if suffix else not k.endswith("_vjp")) and not k.startswith("bound")},
        }
        if est:
            r["fold_memory_estimate_bytes"] = est[kind]
        if case.numpy_tree:
            r["seconds"]["numpy_tree"] = get("numpy_tree" + suffix)
            r["speedup_vs_numpy_tree"] = ratio(get("numpy_tree" + suffix), numba_s)
        if kind == "vjp":
            r["ad_overhead"] = {b: ratio(get(b + "_vjp"), get(b)) for b in ("numba", "numpy", "jax")}
            if get("bound_traffic_vjp") is not None:
                r["gradient_traffic"] = {
                    "what": "each input read twice, an array cotangent once, the gradient written once (Numba loops)",
                    "seconds": get("bound_traffic_vjp"), "over_numba_primal": ratio(get("bound_traffic_vjp"), get("numba")),
                    "numba_vjp_over_traffic": ratio(numba_s, get("bound_traffic_vjp")),
                    "samples": samples["bound_traffic_vjp"]}
        if kind == "primal" and case.bound:
            bound = min(get("bound_np_sum"), get("bound_numba_sum"))
            r["bandwidth_bound"] = {
                "np_sum_seconds": get("bound_np_sum"), "numba_parallel_sum_seconds": get("bound_numba_sum"),
                "bound_seconds": bound, "input_bytes": int(args[0].nbytes),
                "bound_gb_per_s": args[0].nbytes / bound / 1e9,
                "numba_over_bound": ratio(numba_s, bound),
                "numba_over_np_sum": ratio(numba_s, get("bound_np_sum")),
                "numba_over_numba_sum": ratio(numba_s, get("bound_numba_sum")),
                "samples": {"np_sum": samples["bound_np_sum"], "numba_parallel_sum": samples["bound_numba_sum"]}}
        if case.note:
            r["note"] = case.note
        r["targets"] = targets_of(case, r)
        records.append(r)
        print_row(r)
    return records


def targets_of(case: Case, r: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets that apply to this row, each with its value and whether it is met."""
    out = []

    numba_failed = "numba" in r["failed"]

    def add(name, value, target, at_most):
        passed = None if value is None else (value <= target if at_most else value >= target)
        if numba_failed:
            passed = False  # fold-numba raised: no time, and the target is missed
        out.append({"target": name, "value": value, "limit": target, "at_most": at_most, "passed": passed})

    if case.user_operator:
        add("speedup vs numpy backend >= 5x", r["speedup_vs_numpy_backend"], SPEEDUP_TARGET, False)
    if "bandwidth_bound" in r:
        add("fused time / bandwidth bound <= 1.2x", r["bandwidth_bound"]["numba_over_bound"], BOUND_TARGET, True)
    if r["seconds"]["jax"] is not None or (numba_failed and "jax" in r["first_call_seconds"]):
        add("numba / JAX jit <= 1x", r["numba_over_jax"], JAX_TARGET, True)
    if r["kind"] == "vjp":
        add("AD overhead vjp / primal <= 3x (numba)", r["ad_overhead"]["numba"], AD_TARGET, True)
    return out


# ---------------------------------------------------------------------------------------------- printing

def _ms(s):
    return "       -" if s is None else f"{s * 1e3:8.2f}"


def _x(v, width=6):
    return " " * (width - 1) + "-" if v is None else f"{v:{width}.2f}"


def header() -> str:
    return (f"  {'program':<40} {'n':>9} {'numpy ms':>8} {'numba ms':>8} {'jax ms':>8} {'np/nb':>6} {'nb/jax':>6}"
            f" {'vjp/pr':>6} {'jx v/p':>6} {'nb 1st s':>8} {'jax 1st s':>9}  targets")


def print_row(r: dict[str, Any]) -> None:
    ad = r.get("ad_overhead", {})
    verdicts = " ".join(("ok" if t["passed"] else ("MISS" if t["passed"] is False else "?"))
                        + f"[{t['target'].split(' ')[0] if not t['target'].startswith('AD') else 'AD'}"
                        + f"{'' if t['value'] is None else ' %.2f' % t['value']}]" for t in r["targets"])
    first = r["first_call_seconds"]
    nb1 = first.get("numba")
    jx1 = first.get("jax")
    line = (f"  {r['name']:<40} {r['n']:>9} {_ms(r['seconds']['numpy'])} {_ms(r['seconds']['numba'])}"
            f" {_ms(r['seconds']['jax'])} {_x(r['speedup_vs_numpy_backend'])} {_x(r['numba_over_jax'])}"
            f" {_x(ad.get('numba'))} {_x(ad.get('jax'))} {'-' if nb1 is None else f'{nb1:8.2f}':>8}"
            f" {'-' if jx1 is None else f'{jx1:9.2f}':>9}  {verdicts}")
    print(line, flush=True)
    if "bandwidth_bound" in r:
        b = r["bandwidth_bound"]
        print(f"      read-once bound: np.sum {_ms(b['np_sum_seconds'])} ms, numba parallel sum "
              f"{_ms(b['numba_parallel_sum_seconds'])} ms ({b['bound_gb_per_s']:.1f} GB/s); fold-numba / bound "
              f"{b['numba_over_bound']:.2f}x", flush=True)
    if "gradient_traffic" in r:
        g = r["gradient_traffic"]
        print(f"      gradient's memory traffic (inputs read twice, array cotangent once, gradient written once): "
              f"{_ms(g['seconds'])} ms = {g['over_numba_primal']:.2f}x the numba primal (one pass per leaf); "
              f"fold-numba vjp / traffic {g['numba_vjp_over_traffic']:.2f}x", flush=True)
    if r.get("seconds", {}).get("numpy_tree") is not None:
        print(f"      numpy backend with the ufunc shortcuts off (generic tree): {_ms(r['seconds']['numpy_tree'])} ms, "
              f"numpy_tree / numba {r['speedup_vs_numpy_tree']:.2f}x", flush=True)
    if r["fallbacks"]:
        print("      numba fallbacks: " + "; ".join(r["fallbacks"]), flush=True)
    if r["failed"]:
        print("      failed: " + "; ".join(f"{k}: {v[:200]}" for k, v in r["failed"].items()), flush=True)
    if r["skipped"]:
        print("      skipped: " + "; ".join(f"{k}: {v}" for k, v in r["skipped"].items()), flush=True)


# ---------------------------------------------------------------------------------------------- the plot

def plot(path, records: list[dict[str, Any]], title: str):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError:
        print("matplotlib is not installed: no plot written", file=sys.stderr)
        return None

    def color(passed):
        return "0.6" if passed is None else ("tab:green" if passed else "tab:red")

    def target_of(r, prefix):
        return next((t for t in r["targets"] if t["target"].startswith(prefix)), None)

    def panel(ax, rows, values, target_prefix, ylabel, title_, limit_line=None, labels=None):
        xs = np.arange(len(rows))
        vals = [v if v is not None else np.nan for v in values]
        cols = []
        for r in rows:
            t = target_of(r, target_prefix) if target_prefix else None
            cols.append(color(None if t is None else t["passed"]))
        ax.bar(xs, vals, color=cols, edgecolor="black", linewidth=0.5)
        for x, v in zip(xs, vals):
            if np.isfinite(v):
                ax.annotate(f"{v:.2f}", (x, v), ha="center", va="bottom", fontsize=7, xytext=(0, 2),
                            textcoords="offset points")
            else:
                ax.annotate("n/a", (x, 1.0), ha="center", va="bottom", fontsize=7)
        if limit_line is not None:
            ax.axhline(limit_line, color="black", linestyle="--", linewidth=1.2)
        ax.axhline(1.0, color="black", linewidth=0.5)
        finite = [v for v in vals if np.isfinite(v)] or [1.0]
        ax.set_yscale("log")
        ax.set_ylim(min(0.5, min(finite) / 1.5), max(finite + [limit_line or 1.0]) * 2.5)
        ax.set_xticks(xs)
        ax.set_xticklabels(labels or [r["name"] for r in rows], rotation=40, ha="right", fontsize=7)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_title(title_, fontsize=9)

    fig, axes = plt.subplots(2, 2, figsize=(max(12.0, 0.45 * len(records) + 6), 10.0))
    panel(axes[0][0], records, [r["speedup_vs_numpy_backend"] for r in records], "speedup",
          "numpy backend time / numba backend time (log)", "speedup vs the numpy backend (target >= 5x on program 1)",
          SPEEDUP_TARGET)
    panel(axes[0][1], records, [r["numba_over_jax"] for r in records], "numba / JAX",
          "numba time / JAX jit time (log)", "vs JAX jit on the CPU (target <= 1x)", JAX_TARGET)
    vjps = [r for r in records if r["kind"] == "vjp"]
    panel(axes[1][0], vjps, [r["ad_overhead"]["numba"] for r in vjps], "AD", "vjp time / primal time (log)",
          "AD overhead, fold numba (target <= 3x); x = JAX's", AD_TARGET, labels=[r["case"] for r in vjps])
    jx = [r["ad_overhead"]["jax"] for r in vjps]
    axes[1][0].plot(np.arange(len(vjps)), [v if v is not None else np.nan for v in jx], "kx", markersize=7)
    fused = [r for r in records if "bandwidth_bound" in r]
    if fused:
        panel(axes[1][1], fused, [r["bandwidth_bound"]["numba_over_bound"] for r in fused], "fused",
              "fused map-reduce time / read-once time (log)", "fusion vs the bandwidth bound (target <= 1.2x)",
              BOUND_TARGET, labels=[r["case"] for r in fused])
    else:
        axes[1][1].axis("off")
    axes[0][0].legend(handles=[Patch(color="tab:green", label="target met"), Patch(color="tab:red", label="target missed"),
                               Patch(color="0.6", label="no target (information)"),
                               Line2D([], [], color="black", linestyle="--", label="target")], fontsize=7, loc="upper left")
    return save_figure(fig, path, title, dpi=110)


# ---------------------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = benchmark_parser("bench_numba", __doc__, "about 100x smaller sizes (a smoke test)", 5,
                              f"timed rounds at least (median reported); fast cases get more, up to {MAX_REPEATS}")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this text")
    parser.add_argument("--fill", type=float, default=2.0, help="seconds of timed rounds a fast case fills")
    parser.add_argument("--max-case-seconds", type=float, default=300.0,
                        help="fewer rounds (at least one) where --repeats rounds of a case would take longer")
    parser.add_argument("--numba-threads", type=int, default=None,
                        help="numba.set_num_threads(N) before anything runs (default: Numba's own, one per core); "
                             "fewer threads suffer less from other load on a shared machine")
    parser.add_argument("--disk-cache", action="store_true",
                        help="keep fold's disk cache of compiled kernels (FOLD_CACHE_DIR); by default a fresh empty "
                             "one is used, so that first calls measure compilation, not cache loads")
    args = parse_benchmark_args(parser, argv)
    if args.disk_cache:
        return _main(args, {"kernel_cache": "fold's and Numba's disk caches as configured (first calls may load "
                                            "kernels compiled before)", "FOLD_CACHE_DIR": os.environ.get("FOLD_CACHE_DIR"),
                            "NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR")})
    if os.environ.get(_FRESH_CACHE_CHILD):
        return _main(args, {"kernel_cache": "fresh, empty FOLD_CACHE_DIR and NUMBA_CACHE_DIR, set before this process "
                                            "started: first calls compile every kernel not compiled earlier in the "
                                            "process, fold's fixed kernels (logsumexp's, column sums) included",
                            "FOLD_CACHE_DIR": os.environ.get("FOLD_CACHE_DIR"),
                            "NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR")})
    return _in_fresh_process(sys.argv[1:] if argv is None else list(argv), args.quick)


_FRESH_CACHE_CHILD = "FOLD_BENCH_NUMBA_FRESH_CACHE"


def _in_fresh_process(argv: list[str], quick: bool) -> dict[str, Any]:
    """The benchmark run in a child process whose FOLD_CACHE_DIR and NUMBA_CACHE_DIR are fresh empty folders
    (removed after). A child, because Numba fixes where a `cache=True` kernel is cached when its module is
    imported, and this module imports fold (and its fixed kernels) before the arguments are parsed."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fold_bench_numba_") as tmp:
        env = {**os.environ, "FOLD_CACHE_DIR": os.path.join(tmp, "fold"), "NUMBA_CACHE_DIR": os.path.join(tmp, "numba"),
               _FRESH_CACHE_CHILD: "1"}
        done = subprocess.run([sys.executable, "-m", "benchmarks.bench_numba", *argv], env=env, check=False,
                              cwd=Path(__file__).resolve().parent.parent)
    if done.returncode != 0:
        raise SystemExit(done.returncode)
    return json.loads((RESULTS_DIR / f"numba{'_quick' if quick else ''}.json").read_text())


def _main(args: Any, cache: dict[str, Any]) -> dict[str, Any]:
    if args.numba_threads is not None:
        import numba

        numba.set_num_threads(args.numba_threads)
    info = machine()
    info["numba_threads"] = _numba_threads()
    mods = jax_modules()
    info["jax"] = _JAX.get("version") if mods else None
    info["jax_devices"] = _JAX.get("devices")
    info["mem_total_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    line = machine_line(info) + f", Numba threads {info['numba_threads']}, JAX {info['jax'] or 'not installed'}"
    print(f"bench_numba (float64{', quick' if args.quick else ''}): {line}", flush=True)
    if mods is None:
        print(f"  JAX is not importable ({_JAX.get('error')}): its columns are null", flush=True)
    load = (info.get("loadavg_at_start") or [0.0])[0]
    if info.get("usable_cores") and load > 0.5 * info["usable_cores"]:
        print(f"  note: load average {load:.2f} on {info['usable_cores']} usable cores: other work slows Numba's "
              "parallel kernels (every thread waits for the slowest) more than the single-threaded numpy backend",
              flush=True)
    bandwidth_sum()  # Numba's compiler and thread pool started before the first compile time is taken
    rng = np.random.default_rng(20240606)
    print(header(), flush=True)
    records: list[dict[str, Any]] = []
    failures: dict[str, str] = {}
    for case in cases(args.quick):
        if args.only not in case.name:
            continue
        try:
            records.extend(run_case(case, rng, args.quick, args.repeats, args.fill, args.max_case_seconds))
        except Exception as err:  # one failing program is reported; the others still run
            import traceback

            traceback.print_exc()
            failures[case.name] = f"{type(err).__name__}: {err}"
            print(f"  {case.name}: FAILED ({failures[case.name][:300]})", flush=True)
        gc.collect()
    info["loadavg_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    judged = [(r["name"], t) for r in records for t in r["targets"] if t["passed"] is not None]
    missed = [f"{name}: {t['target']} ({'failed' if t['value'] is None else format(t['value'], '.2f')})"
              for name, t in judged if not t["passed"]]
    suffix = "_quick" if args.quick else ""
    payload = {
        "benchmark": "numba", "dtype": "float64", "quick": args.quick, "repeats": args.repeats,
        "targets_apply": not args.quick,
        "targets": {"speedup_vs_numpy_backend_at_least": SPEEDUP_TARGET, "applies_to": "program 1 (user operators)",
                    "fused_over_bandwidth_bound_at_most": BOUND_TARGET,
                    "numba_over_jax_at_most": JAX_TARGET, "jax_applies_to": "every program JAX expresses",
                    "ad_overhead_at_most": AD_TARGET, "ad_applies_to": "every program, fold numba"},
        "targets_met": len(judged) - len(missed), "targets_judged": len(judged), "targets_missed": missed,
        "statistic": "median wall seconds of warm calls; all callables of a case (numpy, numba, JAX; primal and "
                     "vjp; the read-once bound) timed in interleaved rounds; first_call_seconds = the first call "
                     "(trace + compile + run), compile_seconds = first call - median; fold_compile_seconds = "
                     "Jitted.compile_seconds (tracing and the backend's compilation; Numba kernels included where "
                     "the backend reports them)",
        "jax": ({"version": _JAX.get("version"), "devices": _JAX.get("devices"), "x64": True,
                 "expresses": "every program here: user-operator reduces of commutative operators with "
                              "jax.lax.reduce (JAX differentiates it), scans and the non-commutative 2x2 reduce with "
                              "jax.lax.associative_scan; not timed where its naive formulas would need more than "
                              f"{JAX_MEMORY_LIMIT / 2**30:.0f} GiB (see each result's 'skipped')",
                 "cannot_differentiate_correctly": "jax.lax.reduce with a non-commutative operator (the 2x2 "
                                                   "matrix product): its vjp is wrong, so 1c uses associative_scan",
                 "skipped": {r["name"]: r["skipped"]["jax"] for r in records if "jax" in r["skipped"]}} if mods else
                {"available": False, "reason": _JAX.get("error")}),
        "kernel_cache": cache,
        "fallbacks": {r["name"]: r["fallbacks"] for r in records if r["fallbacks"]},
        "fold_failures": {f"{r['name']} ({k})": v for r in records for k, v in r["failed"].items()},
        "failures": failures, "machine": info, "machine_line": line, "results": records,
    }
    json_path = write_json(RESULTS_DIR / f"numba{suffix}.json", payload)
    title = f"fold numba backend vs numpy backend and JAX jit (CPU, float64){' - quick' if args.quick else ''}\n{line}"
    png_path = plot(RESULTS_DIR / f"numba{suffix}.png", records, title) if records else None
    print(f"  {len(judged) - len(missed)}/{len(judged)} targets met" + (f"; missed: {'; '.join(missed)}" if missed else "")
          + (" (--quick: the targets are set for the full sizes)" if args.quick else ""))
    if failures:
        print(f"  failed: {', '.join(failures)}")
    print(f"  wrote {json_path}" + (f" and {png_path}" if png_path else ""), flush=True)
    return payload


def _numba_threads() -> int | None:
    try:
        import numba

        return int(numba.get_num_threads())
    except Exception:  # noqa: BLE001
        return None


if __name__ == "__main__":
    main(sys.argv[1:])
