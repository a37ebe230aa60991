"""Programs no benchmark was tuned for, written the way a user might, against NumPy written vectorised.

    python -m benchmarks.bench_variants [--quick] [--repeats N] [--only NAME,...]

The other benchmarks time the programs fold's kernels were built around; these are a step away from them:
row-wise reductions with a shift, a row's normalisation, a dot product per row followed by a transcendental,
a pairwise matrix, a flat expression summed, the k-means gradient for both arguments, per-class sums of
scaled rows (a histogram of a map) (issue 39: speed must come from general mechanisms, and a
program written a little differently must not fall off a cliff). Each case is fold.jit on the numba
backend (warm; its first call reported apart) timed alternately with NumPy in one process; results/
variants.json and variants.png hold the medians and ratios. The results are also checked against NumPy's.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from .common import RESULTS_DIR, benchmark_parser, machine, machine_line, parse_benchmark_args, plot_ratios, \
    time_pair, write_json


def sizes(quick: bool) -> dict[str, int]:
    """n x d points and rows x columns rows (float32)."""
    return dict(n=2000, d=16, k=8, rows=200, cols=64) if quick else dict(n=200_000, d=16, k=32, rows=20_000, cols=256)


def cases(s: dict[str, int]) -> dict[str, tuple[Callable, Callable, tuple]]:
    """name -> (fold program, NumPy program, inputs)."""
    import fold

    M = fold.monoids
    rng = np.random.default_rng(0)
    f32 = np.float32
    X = rng.standard_normal((s["n"], s["d"])).astype(f32)
    C = rng.standard_normal((s["k"], s["d"])).astype(f32)
    w = rng.standard_normal(s["d"]).astype(f32)
    R = rng.standard_normal((s["rows"], s["cols"])).astype(f32)
    cols = float(s["cols"])

    def shifted_logsumexp(r):
        m = fold.reduce(M.max, r)
        return m + fold.log(fold.sum(fold.exp(r - m)))

    def softmax(r):
        e = fold.exp(r - fold.reduce(M.max, r))
        return e / fold.sum(e)

    def layernorm(r):
        c = r - fold.sum(r) / cols
        return c / fold.sqrt(fold.sum(c * c) / cols + 1e-5)

    def np_softmax(R):
        e = np.exp(R - R.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    def np_layernorm(R):
        c = R - R.mean(1, keepdims=True)
        return c / np.sqrt((c * c).mean(1, keepdims=True) + 1e-5)

    labels = rng.integers(0, s["k"], s["n"])

    def kmeans_cost(C, P):
        return fold.reduce(M.sum, fold.map(lambda p: fold.reduce(M.min, fold.map(lambda c: fold.sum((p - c) * (p - c)), C)), P))

    def np_kmeans_grad(C, P):
        # the distances as the cost writes them: the matrix form's float32 rounding picks another nearest
        # centroid for a point in 2 x 10^5 here, and its gradient then differs by 1e-4
        nearest = np.argmin(((P[:, None, :] - C[None]) ** 2).sum(-1), axis=1)
        diff = P - C[nearest]
        g_c = np.zeros_like(C)
        np.add.at(g_c, nearest, -2.0 * diff)
        return g_c, 2.0 * diff

    def np_class_sums(X, w, labels):
        out = np.zeros((s["k"], X.shape[1]), X.dtype)
        np.add.at(out, labels, np.tanh(X @ w)[:, None] * X)
        return out

    return {
        "k-means gradient for points and centroids": (fold.grad(kmeans_cost, argnums=(0, 1)), np_kmeans_grad, (C, X)),
        "class sums of tanh(x . w) x": (
            lambda X, w, labels: fold.reduce_by_index(M.sum, s["k"], labels,
                                                      fold.map(lambda x: fold.tanh(fold.sum(x * w)) * x, X)),
            np_class_sums, (X, w, labels)),
        "logsumexp, max shift": (lambda R: fold.reduce(M.sum, fold.map(shifted_logsumexp, R)),
                                 lambda R: np.sum(R.max(1) + np.log(np.exp(R - R.max(1, keepdims=True)).sum(1))), (R,)),
        "softmax rows": (lambda R: fold.map(softmax, R), np_softmax, (R,)),
        "layernorm rows": (lambda R: fold.map(layernorm, R), np_layernorm, (R,)),
        "k-means, inner map": (
            lambda C, P: fold.reduce(M.sum, fold.map(lambda p: fold.reduce(M.min, fold.map(
                lambda c: fold.sum(fold.map(lambda a, b: (a - b) * (a - b), p, c)), C)), P)),
            lambda C, P: ((P[:, None, :] - C[None]) ** 2).sum(-1).min(1).sum(), (C, X)),
        "pairwise matrix": (lambda C, P: fold.map(lambda p: fold.map(lambda c: fold.sum((p - c) * (p - c)), C), P),
                            lambda C, P: ((P[:, None, :] - C[None]) ** 2).sum(-1), (C, X)),
        "tanh(x . w) summed": (lambda X, w: fold.sum(fold.map(lambda x: fold.tanh(fold.sum(x * w)), X)),
                               lambda X, w: np.tanh(X @ w).sum(), (X, w)),
        "x . w per row": (lambda X, w: fold.map(lambda x: fold.sum(x * w), X), lambda X, w: X @ w, (X, w)),
        "max row norm": (lambda X: fold.reduce(M.max, fold.map(lambda x: fold.sqrt(fold.sum(x * x)), X)),
                         lambda X: np.sqrt((X * X).sum(1)).max(), (X,)),
        "flat exp(a) a + sin(a)": (lambda a: fold.sum(fold.exp(a) * a + fold.sin(a)),
                                   lambda a: (np.exp(a) * a + np.sin(a)).sum(), (R.ravel(),)),
        "log-sigmoid of x . w": (lambda X, w: fold.sum(fold.map(lambda x: fold.log(1.0 + fold.exp(-fold.sum(x * w))), X)),
                                 lambda X, w: np.log1p(np.exp(-(X @ w))).sum(), (X, w)),
    }


def measure(name: str, fold_f: Callable, numpy_f: Callable, args: tuple, repeats: int) -> dict[str, Any]:
    import fold

    jitted = fold.jit(fold_f, backend="numba")
    start = time.perf_counter()
    got = jitted(*args)
    first = time.perf_counter() - start
    got, want = fold.tree_flatten(got)[0], fold.tree_flatten(numpy_f(*args))[0]  # a gradient: several arrays
    scale = 1.0 + max(float(np.max(np.abs(w))) for w in want)
    error = max(float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64))))
                for g, w in zip(got, want, strict=True)) / scale
    timed = time_pair(lambda: jitted(*args), lambda: numpy_f(*args), repeats=repeats)
    return {"case": name, "fold_seconds": timed["fold_seconds"], "numpy_seconds": timed["reference_seconds"],
            "ratio": timed["ratio"], "first_call_seconds": first, "relative_error": error,
            "fold_samples": timed["fold_samples"], "numpy_samples": timed["reference_samples"]}


def main(argv: list[str] | None = None) -> dict:
    parser = benchmark_parser("bench_variants", __doc__, "small sizes (a smoke test)", 9, "timed calls of each")
    parser.add_argument("--only", default="", help="comma-separated case names")
    args = parse_benchmark_args(parser, argv)
    s = sizes(args.quick)
    records = []
    for name, (fold_f, numpy_f, inputs) in cases(s).items():
        if args.only and name not in args.only.split(","):
            continue
        row = measure(name, fold_f, numpy_f, inputs, args.repeats)
        records.append(row)
        print(f"{name:>24}: fold {1e3 * row['fold_seconds']:8.2f} ms, numpy {1e3 * row['numpy_seconds']:8.2f} ms, "
              f"ratio {row['ratio']:5.2f}, first call {row['first_call_seconds']:.1f} s, "
              f"error {row['relative_error']:.1e}", flush=True)
        if row["relative_error"] > 1e-4:
            raise AssertionError(f"{name}: fold and NumPy differ by {row['relative_error']:.1e} (relative)")
    m = machine()
    name = "variants_quick" if args.quick else "variants"
    write_json(RESULTS_DIR / f"{name}.json", {"machine": m, "sizes": s, "records": records})
    plot_ratios(RESULTS_DIR / f"{name}.png",
                [{"name": r["case"], "reference": "NumPy", "ratio": r["ratio"], "target": None} for r in records],
                "programs written a step away from the benchmarks: fold numba (warm) / NumPy vectorised",
                machine_line(m))
    return {"machine": m, "records": records}


if __name__ == "__main__":
    main()
