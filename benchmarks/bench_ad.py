"""The AD overhead on the numpy backend: time of the vjp program / time of the primal program (target 4x).

    python -m benchmarks.bench_ad              # full sizes
    python -m benchmarks.bench_ad --quick      # 100x smaller: a smoke test (the targets are set for full sizes)
    python -m benchmarks.bench_ad --profile    # also print where one call of each gradient program spends its time

The primal is `fold.jit(f, backend="numpy")`; the gradient is `fold.jit(lambda *a: fold.ad.vjp_value(f, a, ct))`, so the
gradient program is traced and transformed once and then reused. Both are called once before timing (tracing
and transformation excluded), timed alternately, and the median of the repeats is reported. Before timing, each
gradient is compared with an analytic NumPy gradient on a small size, and again at the timed size.

1. sum of squares, map + reduce, 10^7:       reduce(sum, map(v -> v*v, x))
2. product of a user operator, 10^6:         reduce(lambda a, b: a * b, x, identity=1.0), values near 1,
                                             reduce_rule="generic" (target); "auto" (the * rule) for information,
                                             and for information the generic rule with the ufunc shortcuts off
                                             (primal and gradient both on the generic tree reduce/scan)
3. logsumexp, 10^7:                          reduce(monoids.logaddexp, x) (target); max + log(sum(exp(x - max)))
                                             written with map/reduce for information
4. k-means cost, n=10^5 points, d=16, k=64:  sum over points of min over centroids of ||p - c||^2, vjp w.r.t. the
                                             points and the centroids; (a) map over points of reduce(min) of a map
                                             over centroids, (b) the distance as ||p||^2 - 2 C p + ||c||^2 (matmul)
5. three-deep nest, 100x100x100 = 10^6:      sum_a sum_b tanh(sum_c sin(x_abc) w_c)^2: map of map of map, a reduce
                                             at each level, the weight vector w captured by the outer two maps

Memory: the estimated peak (`fold.memory`) and the measured peak (tracemalloc during one call; NumPy reports
its array allocations to tracemalloc) of the vjp and of the primal, inputs included in both.

Writes benchmarks/results/ad_numpy.json and .png (ad_numpy_quick.* with --quick).
"""

from __future__ import annotations

import cProfile
import collections
import io
import pstats
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import fold
import fold.runtime.interpreter as interpreter

from .bench_language import ufunc_fast_paths
from .common import RESULTS_DIR, benchmark_parser, traced_peak, machine, machine_line, parse_benchmark_args, save_figure, time_pair, write_json

BACKEND = "numpy"
TARGET = 4.0
MAX_REPEATS = 41


@dataclass
class Case:
    name: str
    program: str                                  # which of the five programs (1..5)
    f: Callable[..., Any]
    inputs: Callable[[np.random.Generator, int], tuple]   # (rng, scale) -> arguments; scale 1 = timed size
    gradient: Callable[..., tuple]                 # analytic NumPy gradient of f at the arguments (cotangent 1)
    target: float | None = TARGET
    reduce_rule: str = "auto"
    fast_paths: bool = True                        # runtime.numpy_impl.folds.USE_UFUNC_FAST_PATHS
    rtol: float = 1e-9
    note: str = ""
    extra: dict = field(default_factory=dict)
    floor: Callable[..., Any] | None = None        # the rule's algorithm written directly in NumPy (information)


# ---------------------------------------------------------------------------------------------- the programs

def sum_of_squares(x):
    return fold.reduce(fold.monoids.sum, fold.map(lambda v: v * v, x))


def product(x):
    return fold.reduce(lambda a, b: a * b, x, identity=1.0)


def logsumexp(x):
    return fold.reduce(fold.monoids.logaddexp, x)


def logsumexp_shifted(x):
    m = fold.reduce(fold.monoids.max, x)
    return m + fold.log(fold.reduce(fold.monoids.sum, fold.map(lambda v: fold.exp(v - m), x)))


def kmeans_direct(points, centroids):
    def nearest(p):
        def dist(c):
            diff = p - c
            return fold.sum(diff * diff)
        return fold.reduce(fold.monoids.min, fold.map(dist, centroids))
    return fold.reduce(fold.monoids.sum, fold.map(nearest, points))


def kmeans_matmul(points, centroids):
    cc = fold.map(lambda c: fold.sum(c * c), centroids)

    def nearest(p):
        return fold.reduce(fold.monoids.min, fold.sum(p * p) - 2.0 * fold.matmul(centroids, p) + cc)
    return fold.reduce(fold.monoids.sum, fold.map(nearest, points))


def nested(x, w):
    def inner(xab):                       # (C,): a map over c, reduced
        return fold.tanh(fold.reduce(fold.monoids.sum, fold.map(lambda v, wc: fold.sin(v) * wc, xab, w)))

    def middle(xa):                       # (B, C): a map over b, squared and reduced
        return fold.reduce(fold.monoids.sum, fold.map(inner, xa) ** 2)
    return fold.reduce(fold.monoids.sum, fold.map(middle, x))


# ---------------------------------------------------------------------------------------------- analytic gradients

def _softmax(x):
    e = np.exp(x - np.max(x))
    return e / np.sum(e)


def _prod_grad(x):
    zeros = np.flatnonzero(x == 0)
    if zeros.size == 0:
        return (np.prod(x) / x,)
    g = np.zeros_like(x)
    if zeros.size == 1:
        g[zeros[0]] = np.prod(np.delete(x, zeros[0]))
    return (g,)


def _generic_prod_floor(x):
    """The generic rule's algorithm in plain NumPy: exclusive prefix and suffix products, then l * r."""
    left, right = np.empty_like(x), np.empty_like(x)
    left[0] = right[-1] = 1.0
    np.multiply.accumulate(x[:-1], out=left[1:])
    np.multiply.accumulate(x[:0:-1], out=right[-2::-1])
    return left * right


def _kmeans_grad(points, centroids):
    d2 = (points * points).sum(1)[:, None] - 2.0 * points @ centroids.T + (centroids * centroids).sum(1)[None, :]
    nearest = np.argmin(d2, axis=1)
    diff = points - centroids[nearest]                      # (n, d)
    g_points = 2.0 * diff
    g_centroids = np.zeros_like(centroids)
    np.add.at(g_centroids, nearest, -2.0 * diff)
    return g_points, g_centroids


def _nested_grad(x, w):
    t = np.tanh(np.sin(x) @ w)                              # (A, B)
    u = 2.0 * t * (1.0 - t * t)                             # d/ds tanh(s)^2
    return u[:, :, None] * np.cos(x) * w, np.einsum("ab,abc->c", u, np.sin(x))


# ---------------------------------------------------------------------------------------------- inputs

def _vector(n, low=None, high=None):
    def make(rng, scale):
        m = max(n // scale, 8)
        return (rng.standard_normal(m) if low is None else rng.uniform(low, high, m),)
    return make


def _kmeans_inputs(rng, scale):
    n, d, k = max(10**5 // scale, 200), 16, 64
    return rng.standard_normal((n, d)), rng.standard_normal((k, d))


def _nested_inputs(rng, scale):
    a = b = c = 100
    if scale > 1:
        a, b, c = max(a // scale, 2), 20, 20
    return rng.standard_normal((a, b, c)), rng.standard_normal(c)


PROD_ZEROS = {"zero_positions": [(3,), (3, 5)]}


def cases() -> list[Case]:
    near_one = _vector(10**6, 0.999, 1.001)
    return [
        Case("1 sum of squares", "1", sum_of_squares, _vector(10**7), lambda x: (2.0 * x,)),
        Case("2 prod a*b, generic rule", "2", product, near_one, _prod_grad, reduce_rule="generic", extra=PROD_ZEROS,
             floor=_generic_prod_floor,
             note="the scans of the generic rule are recognised as * and run as np.multiply.accumulate; the "
                  "primal is np.multiply.reduce; 'floor' is the rule's algorithm (exclusive prefix and suffix "
                  "products, their product) written directly in NumPy, timed against the same primal"),
        Case("2 prod a*b, auto (* rule)", "2", product, near_one, _prod_grad, target=None, extra=PROD_ZEROS),
        Case("2 prod a*b, generic, tree", "2", product, near_one, _prod_grad, target=None, reduce_rule="generic",
             fast_paths=False, extra=PROD_ZEROS, note="ufunc shortcuts off: the primal is the generic tree reduce, the gradient "
                                    "two generic tree scans and a map"),
        Case("3 logsumexp (logaddexp)", "3", logsumexp, _vector(10**7), lambda x: (_softmax(x),)),
        Case("3 logsumexp, max-shifted", "3", logsumexp_shifted, _vector(10**7), lambda x: (_softmax(x),),
             target=None),
        Case("4a k-means, map/map", "4", kmeans_direct, _kmeans_inputs, _kmeans_grad, rtol=1e-8),
        Case("4b k-means, matmul", "4", kmeans_matmul, _kmeans_inputs, _kmeans_grad, rtol=1e-8),
        Case("5 nested map^3", "5", nested, _nested_inputs, _nested_grad),
    ]


# ---------------------------------------------------------------------------------------------- measuring

def max_err(got, want) -> float:
    """Largest error, relative to the largest magnitude of the wanted array (gradients pass through zero)."""
    errs = []
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g.shape != w.shape:
            return float("inf")
        errs.append(float(np.max(np.abs(g - w))) / max(float(np.max(np.abs(w))), np.finfo(np.float64).tiny))
    return max(errs)




def statement_profile(fn: Callable[[], Any], top: int = 10) -> list[dict[str, Any]]:
    """One call of `fn` with every interpreted statement timed (exclusive of the statements nested inside it).

    Statements are grouped by their nesting path (e.g. 'map > matmul') and output shapes (batch axes first).
    """
    original = interpreter._run_step  # every statement of eval_program's plans runs through it
    stats: dict = collections.defaultdict(lambda: [0.0, 0, 0])
    stack: list[list] = []

    def timed(step, values, depth):
        path = " > ".join([s[0] for s in stack] + [step.prim.name])
        stack.append([step.prim.name, 0.0])
        start = time.perf_counter()
        try:
            outs = original(step, values, depth)
        finally:
            spent = time.perf_counter() - start
            _, inner = stack.pop()
            if stack:
                stack[-1][1] += spent
        entry = stats[(path, " ".join(str(list(o.shape)) for o in outs))]
        entry[0] += spent - inner
        entry[1] += 1
        entry[2] += sum(o.nbytes for o in outs)
        return outs

    interpreter._run_step = timed
    try:
        start = time.perf_counter()
        fn()
        total = time.perf_counter() - start
    finally:
        interpreter._run_step = original
    rows = sorted(stats.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"statement": path, "out_shapes": shapes, "seconds": t, "share": t / total, "count": c,
             "out_bytes": b} for (path, shapes), (t, c, b) in rows]


def print_cprofile(fn: Callable[[], Any], top: int = 12) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    print("\n".join("      " + line for line in text.getvalue().splitlines() if line.strip()))


def run_case(case: Case, rng: np.random.Generator, scale: int, repeats: int, profile: bool) -> dict[str, Any]:
    ct = 1.0
    primal = fold.jit(case.f, backend=BACKEND)

    def vjp_fn(*args):
        return fold.ad.vjp_value(case.f, args, ct, reduce_rule=case.reduce_rule)

    gradient = fold.jit(vjp_fn, backend=BACKEND)
    with ufunc_fast_paths(case.fast_paths):
        # correctness first, on a small size, so that a fast wrong gradient cannot pass
        small = case.inputs(rng, 1000)
        small_err = max_err(gradient(*small), case.gradient(*small))
        for zeros in case.extra.get("zero_positions", ()):  # the product's gradient where some elements are 0
            x = small[0].copy()
            x[list(zeros)] = 0.0
            small_err = max(small_err, max_err(gradient(x), case.gradient(x)))
        if not small_err <= case.rtol:
            raise AssertionError(f"{case.name}: gradient differs from the analytic one at n={small[0].size}: "
                                 f"max error {small_err:.3g} > {case.rtol:g}")
        args = case.inputs(rng, scale)
        n = int(sum(a.size for a in args))
        err = max_err(gradient(*args), case.gradient(*args))  # also traces and transforms: warm from here on
        if not err <= case.rtol:
            raise AssertionError(f"{case.name}: gradient differs from the analytic one: max error {err:.3g}")
        start = time.perf_counter()
        primal(*args), gradient(*args)
        pair = time.perf_counter() - start
        # short cases get more repeats (up to about 2 s of timing), so a burst of load elsewhere moves the median less
        repeats = max(repeats, min(MAX_REPEATS, int(2.0 / max(pair, 1e-6))))
        t = time_pair(lambda: gradient(*args), lambda: primal(*args), repeats=repeats)
        est_primal, est_vjp = fold.memory(case.f, *args), fold.memory(vjp_fn, *args)
        in_bytes = sum(a.nbytes for a in args)
        meas_primal = traced_peak(lambda: primal(*args)) + in_bytes
        meas_vjp = traced_peak(lambda: gradient(*args)) + in_bytes
        ratio = t["fold_seconds"] / t["reference_seconds"]
        floor = None
        if case.floor is not None:
            if max_err((case.floor(*args),), case.gradient(*args)) > case.rtol:
                raise AssertionError(f"{case.name}: the NumPy floor computes something else")
            ft = time_pair(lambda: case.floor(*args), lambda: primal(*args), repeats=repeats)
            floor = {"seconds": ft["fold_seconds"], "primal_seconds": ft["reference_seconds"],
                     "ratio": ft["fold_seconds"] / ft["reference_seconds"]}
        missed = case.target is not None and ratio > case.target
        breakdown = statement_profile(lambda: gradient(*args)) if (missed or profile) else None
        primal_breakdown = statement_profile(lambda: primal(*args), top=5) if (missed or profile) else None
        if profile:
            print(f"    cProfile of one call of the gradient of {case.name}:")
            print_cprofile(lambda: gradient(*args))
    record = {
        "name": case.name, "program": case.program, "n": n, "shapes": [list(a.shape) for a in args],
        "reduce_rule": case.reduce_rule, "ufunc_fast_paths": case.fast_paths,
        "primal_seconds": t["reference_seconds"], "vjp_seconds": t["fold_seconds"], "ratio": ratio,
        "ratio_of_minimums": min(t["fold_samples"]) / min(t["reference_samples"]),  # less sensitive to load
        "target": case.target, "passed": None if case.target is None else not missed,
        "estimated_peak_bytes": {"primal": est_primal, "vjp": est_vjp, "ratio": est_vjp / est_primal},
        "measured_peak_bytes": {"primal": meas_primal, "vjp": meas_vjp, "ratio": meas_vjp / meas_primal},
        "input_bytes": in_bytes,
        "max_err_small": small_err, "max_err": err, "rtol": case.rtol, "repeats": repeats,
        "vjp_samples": t["fold_samples"], "primal_samples": t["reference_samples"],
    }
    if floor is not None:
        record["numpy_floor"] = floor
    if case.note:
        record["note"] = case.note
    if breakdown is not None:
        record["vjp_statement_profile"] = breakdown
        record["primal_statement_profile"] = primal_breakdown
    verdict = "info" if case.target is None else ("PASS" if record["passed"] else "FAIL")
    print(f"  {case.name:<28} n={n:<9} primal {t['reference_seconds'] * 1e3:9.3f} ms  vjp {t['fold_seconds'] * 1e3:9.3f} ms"
          f"  ratio {ratio:6.2f}x (of minimums {record['ratio_of_minimums']:5.2f}x)  {verdict:<4}  memory est {est_vjp / 2**20:8.1f}/{est_primal / 2**20:8.1f} MiB"
          f" = {est_vjp / est_primal:5.2f}x  measured {meas_vjp / 2**20:8.1f}/{meas_primal / 2**20:8.1f} MiB"
          f" = {meas_vjp / meas_primal:5.2f}x  [err {err:.1e}]", flush=True)
    if floor is not None:
        print(f"      the same algorithm in plain NumPy: {floor['seconds'] * 1e3:.3f} ms = {floor['ratio']:.2f}x the primal",
              flush=True)
    if breakdown is not None:
        for row in breakdown[:6]:
            print(f"      {row['seconds'] * 1e3:8.2f} ms {100 * row['share']:5.1f}%  x{row['count']:<3} "
                  f"{row['statement']:<32} -> {row['out_shapes']}", flush=True)
    return record


# ---------------------------------------------------------------------------------------------- the plot

def plot(path, records: list[dict[str, Any]], title: str, subtitle: str):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError:
        print("matplotlib is not installed: no plot written", file=sys.stderr)
        return None
    names = [r["name"] for r in records]
    xs = np.arange(len(records))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(max(11.0, 1.5 * len(records) + 4), 5.5))
    ratios = [r["ratio"] for r in records]
    colors = ["0.6" if r["target"] is None else ("tab:green" if r["passed"] else "tab:red") for r in records]
    ax.bar(xs, ratios, color=colors, edgecolor="black", linewidth=0.5)
    ax.axhline(TARGET, color="black", linestyle="--", linewidth=1.2)
    ax.axhline(1.0, color="black", linewidth=0.5)
    for x, r in zip(xs, ratios):
        ax.annotate(f"{r:.2f}x", (x, r), ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_ylim(min(0.8, min(ratios) / 1.5), max(ratios + [TARGET]) * 2.0)
    ax.set_ylabel("vjp time / primal time (log scale)")
    ax.set_title("AD overhead (time)", fontsize=10)
    ax.legend(handles=[Patch(color="tab:green", label="target met"), Patch(color="tab:red", label="target missed"),
                       Patch(color="0.6", label="information"),
                       Line2D([], [], color="black", linestyle="--", label=f"target {TARGET:g}x")],
              fontsize=8, loc="upper left")
    est = [r["estimated_peak_bytes"]["ratio"] for r in records]
    meas = [r["measured_peak_bytes"]["ratio"] for r in records]
    bx.bar(xs - 0.2, est, width=0.4, color="tab:blue", edgecolor="black", linewidth=0.5, label="estimated (fold.memory)")
    bx.bar(xs + 0.2, meas, width=0.4, color="tab:orange", edgecolor="black", linewidth=0.5, label="measured (tracemalloc)")
    for x, e, m in zip(xs, est, meas):
        bx.annotate(f"{e:.1f}", (x - 0.2, e), ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
        bx.annotate(f"{m:.1f}", (x + 0.2, m), ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
    bx.axhline(1.0, color="black", linewidth=0.5)
    bx.set_ylim(0, max(est + meas) * 1.25)
    bx.set_ylabel("vjp peak bytes / primal peak bytes (inputs included)")
    bx.set_title("AD overhead (peak memory)", fontsize=10)
    bx.legend(fontsize=8, loc="upper left")
    for a in (ax, bx):
        a.set_xticks(xs)
        a.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
    return save_figure(fig, path, title + "\n" + subtitle, dpi=120)


# ---------------------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = benchmark_parser("bench_ad", __doc__, "100x smaller sizes (a smoke test)", 7,
                              f"timed repeats per function at least (median reported); fast cases get more, up to {MAX_REPEATS}, to fill about 2 s")
    parser.add_argument("--profile", action="store_true",
                        help="print a cProfile and a per-statement profile of one call of every gradient")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this text")
    args = parse_benchmark_args(parser, argv)
    scale = 100 if args.quick else 1
    info = machine()
    line = machine_line(info)
    print(f"bench_ad (numpy backend{', quick' if args.quick else ''}): {line}", flush=True)
    rng = np.random.default_rng(20240503)
    records = []
    for case in cases():
        if args.only in case.name:
            records.append(run_case(case, rng, scale, args.repeats, args.profile))
    for r in records:
        r["machine"] = line
    suffix = "_quick" if args.quick else ""
    payload = {"benchmark": "ad", "backend": BACKEND, "quick": args.quick, "repeats": args.repeats,
               "targets_apply": not args.quick, "target": TARGET,
               "statistic": "median wall seconds, warm (trace/transform excluded), vjp and primal interleaved "
                            "(pass/fail on the ratio of the medians; the ratio of the minimums is kept too); "
                            "peak bytes include the inputs",
               "gradient": "fold.jit(lambda *a: fold.ad.vjp_value(f, a, 1.0, reduce_rule=...)) vs fold.jit(f)",
               "machine": info, "results": records}
    json_path = write_json(RESULTS_DIR / f"ad_numpy{suffix}.json", payload)
    png_path = plot(RESULTS_DIR / f"ad_numpy{suffix}.png", records, "fold numpy backend: vjp / primal", line)
    targeted = [r for r in records if r["target"] is not None]
    failed = [r["name"] for r in targeted if not r["passed"]]
    print(f"  {len(targeted) - len(failed)}/{len(targeted)} targets met" + (f"; missed: {', '.join(failed)}" if failed else "")
          + (" (--quick: the targets are set for the full sizes)" if args.quick else ""))
    print(f"  wrote {json_path}" + (f" and {png_path}" if png_path else ""), flush=True)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
