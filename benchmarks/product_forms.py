"""Time one map body that multiplies a captured matrix by each row, as the numba backend runs it.

    PYTHONPATH=. python -m benchmarks.product_forms kmeans N D K f32|f64 [nest]
    PYTHONPATH=. python -m benchmarks.product_forms layer K f32|f64 [nest]

`kmeans`: k-means' matrix form (bench_ad.kmeans_matmul) over N points of D dimensions and K centroids: the
primal, the vjp with respect to both arguments and the Hessian-vector product with respect to the points.
`layer`: a map of sum(tanh(W @ x)) over 2^26 / K^2 rows, W of K x K: primal and gradient of both. `nest`:
every product given to the loop nest (both of passes' MAX_NEST_PRODUCT_BYTES limits lifted, the product
kernel's passes off), to compare with the default rule. Prints medians in ms of 11 calls after a second of calls. Run each
line in a fresh process, alternating the trees compared (benchmarks/README.md, session 68).
"""

from __future__ import annotations

import sys

import numpy as np

import fold
import fold.monoids as M
from benchmarks.bench_ad import kmeans_matmul
from benchmarks.common import median_seconds, warm_up
from fold.runtime.numba_backend import passes


def _median_ms(f, args, calls: int = 11) -> float:
    warm_up(lambda: f(*args))
    return round(1e3 * median_seconds(lambda: f(*args), repeats=calls, warmup=0)[0], 2)


def _every_product_in_the_nest() -> None:
    passes.MAX_NEST_PRODUCT_BYTES = passes.MAX_NEST_PRODUCT_BYTES_FLOAT64 = 1 << 40
    passes.sparse_one_hots = lambda program: program
    passes.mark_first_extremes = lambda program: program
    passes.fuse_product_folds = lambda program: program
    passes.absorb_gathers = lambda program, rows_ndim: program


def kmeans(n: int, d: int, k: int, dtype) -> dict[str, float]:
    rng = np.random.default_rng(0)
    X, C, V = (rng.standard_normal(s).astype(dtype) for s in ((n, d), (k, d), (n, d)))
    grad_points = fold.grad(kmeans_matmul)
    calls = {"primal": (fold.jit(kmeans_matmul, backend="numba"), (X, C)),
             "grad": (fold.jit(lambda X, C: fold.vjp(kmeans_matmul, X, C)[1](1.0), backend="numba"), (X, C)),
             "hvp": (fold.jit(lambda X, C, V: fold.jvp(grad_points, (X, C), (V, np.zeros_like(C)))[1],
                              backend="numba"), (X, C, V))}
    return {name: _median_ms(f, args) for name, (f, args) in calls.items()}


def layer(k: int, dtype) -> dict[str, float]:
    rng = np.random.default_rng(0)
    n = max(2 ** 26 // (k * k), 1000)
    X, W = rng.standard_normal((n, k)).astype(dtype), (rng.standard_normal((k, k)) / np.sqrt(k)).astype(dtype)

    def f(X, W):
        return fold.reduce(M.sum, fold.map(lambda x: fold.reduce(M.sum, fold.tanh(W @ x)), X))

    calls = {"primal": fold.jit(f, backend="numba"), "grad": fold.jit(fold.grad(f, argnums=(0, 1)), backend="numba")}
    return {name: _median_ms(g, (X, W)) for name, g in calls.items()}


def main(argv: list[str]) -> None:
    dtypes = {"f32": np.float32, "f64": np.float64}
    if argv[-1] == "nest":
        _every_product_in_the_nest()
        argv = argv[:-1]
    if argv[0] == "kmeans":
        print(argv, kmeans(int(argv[1]), int(argv[2]), int(argv[3]), dtypes[argv[4]]), flush=True)
    elif argv[0] == "layer":
        print(argv, layer(int(argv[1]), dtypes[argv[2]]), flush=True)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
