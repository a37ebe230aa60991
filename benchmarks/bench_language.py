"""The language benchmarks of issue 2 on the numpy backend: map, reduce and scan with user lambdas vs NumPy.

    python -m benchmarks.bench_language            # full sizes (10^7 map, 10^6 reduce/scan)
    python -m benchmarks.bench_language --quick    # 100x smaller: a smoke test

Every fold function is `fold.jit(f, backend="numpy")`, called once before timing (tracing excluded); each
case times fold and its NumPy reference alternately and reports the median of the repeats and their ratio.

1. map of a five-operation elementwise body over 10^7 float64 vs the same NumPy expression   (target 3x)
2. reduce with the user operator `lambda a, b: a * b` over 10^6 vs np.prod                   (target 10x)
3. scan with the same operator over 10^6 vs np.cumprod                                        (target 20x)
   2 and 3 twice: the default path (the interpreter recognises a*b and calls np.multiply.reduce /
   np.cumprod) and the generic tree path (runtime.numpy_impl.folds.USE_UFUNC_FAST_PATHS = False), which is
   the one that shows the machinery. The path each run really took is checked and recorded.
4. for information (no target): reduce and scan of the linear-recurrence operator on pairs,
   ((a1, b1), (a2, b2)) -> (a1*a2, a2*b1 + b2), which no recogniser matches, vs the closed form
   A = cumprod(a), B = A * cumsum(b / A) in NumPy (valid here because every a is near 1).

Writes benchmarks/results/language_numpy.json and .png (language_numpy_quick.* with --quick).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterator

import numpy as np

import fold
import fold.runtime.numpy_impl.folds as folds

from .common import RESULTS_DIR, benchmark_parser, machine, machine_line, parse_benchmark_args, plot_ratios, time_pair, write_json

BACKEND = "numpy"


@contextlib.contextmanager
def ufunc_fast_paths(enabled: bool) -> Iterator[None]:
    """Switch the interpreter's NumPy-ufunc shortcuts for recognised operators on or off, for a block."""
    previous = folds.USE_UFUNC_FAST_PATHS
    folds.USE_UFUNC_FAST_PATHS = enabled
    try:
        yield
    finally:
        folds.USE_UFUNC_FAST_PATHS = previous


def path_taken(fn: Callable[[], Any]) -> str:
    """Run `fn` once and say which fold implementation ran: 'ufunc' (NumPy's own reduction), 'tree' (the
    generic tree reduce/scan) or 'none' (neither), by counting calls into runtime.numpy_impl.folds."""
    counts = {"ufunc": 0, "tree": 0}
    saved = folds._fast_ufunc, folds.tree_reduce, folds.inclusive_scan

    def fast_ufunc(prim):
        u = saved[0](prim)
        counts["ufunc"] += u is not None
        return u

    def counting(f):
        def wrapped(*args, **kwargs):
            counts["tree"] += 1
            return f(*args, **kwargs)
        return wrapped

    folds._fast_ufunc, folds.tree_reduce, folds.inclusive_scan = fast_ufunc, counting(saved[1]), counting(saved[2])
    try:
        fn()
    finally:
        folds._fast_ufunc, folds.tree_reduce, folds.inclusive_scan = saved
    taken = [k for k, v in counts.items() if v]
    return "+".join(taken) if taken else "none"


def max_rel_err(got: Any, want: Any) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), np.finfo(np.float64).tiny)))


def measure(name: str, n: int, ours: Callable[[], Any], reference: Callable[[], Any], reference_name: str,
            target: float | None, repeats: int, *, path: str, check: Callable[[], float], rtol: float,
            note: str = "") -> dict[str, Any]:
    err = check()
    if not err <= rtol:
        raise AssertionError(f"{name}: fold and {reference_name} disagree: max relative error {err:.3g} > {rtol:g}")
    t = time_pair(ours, reference, repeats=repeats)
    record = {
        "name": name, "n": n, "path": path, "reference": reference_name,
        "fold_seconds": t["fold_seconds"], "reference_seconds": t["reference_seconds"], "ratio": t["ratio"],
        "fold_ns_per_element": 1e9 * t["fold_seconds"] / n,
        "target": target, "passed": None if target is None else bool(t["ratio"] <= target),
        "max_rel_err": err, "rtol": rtol, "repeats": repeats,
        "fold_samples": t["fold_samples"], "reference_samples": t["reference_samples"],
    }
    if note:
        record["note"] = note
    verdict = "info" if target is None else ("PASS" if record["passed"] else "FAIL")
    shown_target = "-" if target is None else f"{target:g}x"
    print(f"  {name:<26} n={n:<9} fold {t['fold_seconds'] * 1e3:9.3f} ms  {reference_name:<22} "
          f"{t['reference_seconds'] * 1e3:9.3f} ms  ratio {t['ratio']:7.2f}x  target {shown_target:>4}  {verdict}"
          f"  [{path}; {record['fold_ns_per_element']:.1f} ns/elem; err {err:.1e}]", flush=True)
    return record


def bench_map(n: int, repeats: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    xs = rng.standard_normal(n)
    f = fold.jit(lambda xs: fold.map(lambda x: fold.tanh(x * 2.0 + 1.0) * fold.exp(-x) - x, xs), backend=BACKEND)
    body = f.program(xs).stmts[0].prim.body
    ops = [s.prim.op for s in body.stmts]

    def reference():
        return np.tanh(xs * 2.0 + 1.0) * np.exp(-xs) - xs

    f(xs)  # trace and compile, excluded from the timings
    return [measure("map: 5-op elementwise", n, lambda: f(xs), reference, "numpy expression", 3.0, repeats,
                    path="map", check=lambda: max_rel_err(f(xs), reference()), rtol=1e-12,
                    note=f"tanh(x*2+1)*exp(-x)-x: the traced body has {len(ops)} elementwise statements "
                         f"({' '.join(ops)}), unary minus included")]


def bench_prod(n: int, repeats: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    # values near 1, so that neither the product nor any prefix under- or overflows
    xs = rng.uniform(0.999, 1.001, n)
    red = fold.jit(lambda v: fold.reduce(lambda a, b: a * b, v, identity=1.0), backend=BACKEND)
    scn = fold.jit(lambda v: fold.scan(lambda a, b: a * b, v, identity=1.0), backend=BACKEND)
    records = []
    for fast, label in ((True, "default"), (False, "generic")):
        with ufunc_fast_paths(fast):
            red(xs), scn(xs)
            records.append(measure(f"reduce a*b ({label})", n, lambda: red(xs), lambda: np.prod(xs), "np.prod",
                                   10.0, repeats, path=path_taken(lambda: red(xs)),
                                   check=lambda: max_rel_err(red(xs), np.prod(xs)), rtol=1e-9))
            records.append(measure(f"scan a*b ({label})", n, lambda: scn(xs), lambda: np.cumprod(xs), "np.cumprod",
                                   20.0, repeats, path=path_taken(lambda: scn(xs)),
                                   check=lambda: max_rel_err(scn(xs), np.cumprod(xs)), rtol=1e-9))
    return records


def _recurrence(p, q):
    (a1, b1), (a2, b2) = p, q
    return a1 * a2, a2 * b1 + b2  # x -> a1 x + b1, then x -> a2 x + b2


def _sequential_recurrence(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    A, B = np.empty_like(a), np.empty_like(b)
    ca, cb = 1.0, 0.0
    for i in range(a.shape[0]):
        ca, cb = ca * a[i], a[i] * cb + b[i]
        A[i], B[i] = ca, cb
    return A, B


def bench_recurrence(n: int, repeats: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    a = rng.uniform(0.999, 1.001, n)
    b = rng.standard_normal(n)
    red = fold.jit(lambda a, b: fold.reduce(_recurrence, (a, b), identity=(1.0, 0.0)), backend=BACKEND)
    scn = fold.jit(lambda a, b: fold.scan(_recurrence, (a, b), identity=(1.0, 0.0)), backend=BACKEND)

    def closed_scan():
        A = np.cumprod(a)
        return A, A * np.cumsum(b / A)

    def closed_reduce():
        A = np.cumprod(a)
        return A[-1], A[-1] * np.sum(b / A)

    def scaled_err(got: Any, want: Any) -> float:
        # B passes near zero, so its error is measured relative to its largest magnitude
        want = np.asarray(want)
        return float(np.max(np.abs(np.asarray(got) - want))) / float(np.max(np.abs(want)))

    def check_scan() -> float:
        got, want = scn(a, b), closed_scan()
        k = min(n, 10_000)  # also against the plain sequential loop on a prefix
        seq = _sequential_recurrence(a[:k], b[:k])
        return max(max_rel_err(got[0], want[0]), scaled_err(got[1], want[1]),
                   max_rel_err(got[0][:k], seq[0]), scaled_err(got[1][:k], seq[1]))

    def check_reduce() -> float:
        got, want = red(a, b), closed_reduce()
        scale = float(np.max(np.abs(closed_scan()[1])))
        return max(max_rel_err(got[0], want[0]), abs(float(got[1]) - float(want[1])) / scale)

    red(a, b), scn(a, b)
    note = ("operator ((a1,b1),(a2,b2)) -> (a1*a2, a2*b1+b2): not recognisable, so the default path is the "
            "generic tree; reference is the closed form A=cumprod(a), B=A*cumsum(b/A), which exists only "
            "for this particular operator (and is accurate only while the a's stay near 1); the error of B is relative to max|B|")
    return [
        measure("reduce linrec (default)", n, lambda: red(a, b), closed_reduce, "numpy closed form", None, repeats,
                path=path_taken(lambda: red(a, b)), check=check_reduce, rtol=1e-9, note=note),
        measure("scan linrec (default)", n, lambda: scn(a, b), closed_scan, "numpy closed form", None, repeats,
                path=path_taken(lambda: scn(a, b)), check=check_scan, rtol=1e-9, note=note),
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = benchmark_parser("bench_language", __doc__, "100x smaller sizes (a smoke test)", 7,
                              "timed repeats per function (median reported; >= 5)")
    args = parse_benchmark_args(parser, argv)
    scale = 100 if args.quick else 1
    n_map, n_fold = 10**7 // scale, 10**6 // scale
    info = machine()
    print(f"bench_language (numpy backend{', quick' if args.quick else ''}): {machine_line(info)}", flush=True)
    rng = np.random.default_rng(20240502)
    records = bench_map(n_map, args.repeats, rng) + bench_prod(n_fold, args.repeats, rng) \
        + bench_recurrence(n_fold, args.repeats, rng)
    line = machine_line(info)
    for r in records:
        r["machine"] = line
    suffix = "_quick" if args.quick else ""
    payload = {"benchmark": "language", "backend": BACKEND, "quick": args.quick, "repeats": args.repeats,
               "targets_apply": not args.quick,
               "statistic": "median wall seconds, warm (trace/compile excluded), fold and reference interleaved",
               "machine": info, "results": records}
    json_path = write_json(RESULTS_DIR / f"language_numpy{suffix}.json", payload)
    png_path = plot_ratios(RESULTS_DIR / f"language_numpy{suffix}.png", records,
                           f"fold numpy backend vs NumPy (n = {n_map:.0e} map, {n_fold:.0e} reduce/scan)", line)
    targeted = [r for r in records if r["target"] is not None]
    failed = [r["name"] for r in targeted if not r["passed"]]
    print(f"  {len(targeted) - len(failed)}/{len(targeted)} targets met" + (f"; missed: {', '.join(failed)}" if failed else "")
          + (" (--quick: the targets are set for the full sizes; at 100x smaller sizes the per-call Python "
             "overhead of the tree's log2(n) levels dominates)" if args.quick else ""))
    print(f"  wrote {json_path}" + (f" and {png_path}" if png_path else ""), flush=True)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
