"""Time one map body that multiplies a captured matrix by each row, as the numba backend runs it.

    PYTHONPATH=. python -m benchmarks.product_forms kmeans N D K f32|f64 [nest]
    PYTHONPATH=. python -m benchmarks.product_forms layer K[xIN] f32|f64 [nest]

`kmeans`: k-means' matrix form (bench_ad.kmeans_matmul) over N points of D dimensions and K centroids: the
primal, the vjp with respect to both arguments and the Hessian-vector product with respect to the points.
`layer`: a map of sum(tanh(W @ x)) over 2^26 / (K x IN) rows, W of K x IN (IN = K unless given): primal and
gradient of both. `nest`:
every product given to the loop nest (both of passes' MAX_NEST_PRODUCT_BYTES limits lifted, the product
kernel's passes off), to compare with the default rule. Prints medians in ms of 11 calls after a second of calls. Run each
line in a fresh process, alternating the trees compared (benchmarks/README.md, session 68).

    PYTHONPATH=. python -m benchmarks.product_forms kmeans N D K f32|f64 [nest] --ab module:NAME=A,B

compares two values of a module's constant in one process instead (benchmarks/setting_ab.py): each
program compiled under both, the calls alternated, medians of 40 each and their ratio (A / B); `--out NAME`
adds them to results/NAME.json and its plot.
"""

from __future__ import annotations

import sys
from typing import Callable

import numpy as np

import fold
import fold.monoids as M
from benchmarks.bench_ad import kmeans_matmul
from benchmarks import setting_ab
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


def kmeans_calls(n: int, d: int, k: int, dtype) -> dict[str, tuple[Callable[[], Callable], tuple]]:
    """{mode: (a maker of the function timed, its arguments)}: a new function per call of the maker, so that
    each jit of it traces and compiles its own program."""
    rng = np.random.default_rng(0)
    X, C, V = (rng.standard_normal(s).astype(dtype) for s in ((n, d), (k, d), (n, d)))

    def hvp():
        grad_points = fold.grad(kmeans_matmul)
        return lambda X, C, V: fold.jvp(grad_points, (X, C), (V, np.zeros_like(C)))[1]

    return {"primal": (lambda: lambda X, C: kmeans_matmul(X, C), (X, C)),
            "grad": (lambda: lambda X, C: fold.vjp(kmeans_matmul, X, C)[1](1.0), (X, C)),
            "hvp": (hvp, (X, C, V))}


def layer_calls(k: int, dtype, inputs: int | None = None) -> dict[str, tuple[Callable[[], Callable], tuple]]:
    """As kmeans_calls, for a map of sum(tanh(W @ x)) over 2^26 / (K x inputs) rows, W of K x inputs (K x K
    by default)."""
    rng = np.random.default_rng(0)
    inputs = inputs or k
    n = max(2 ** 26 // (k * inputs), 1000)
    X = rng.standard_normal((n, inputs)).astype(dtype)
    W = (rng.standard_normal((k, inputs)) / np.sqrt(inputs)).astype(dtype)

    def layer():
        return lambda X, W: fold.reduce(M.sum, fold.map(lambda x: fold.reduce(M.sum, fold.tanh(W @ x)), X))

    return {"primal": (layer, (X, W)), "grad": (lambda: fold.grad(layer(), argnums=(0, 1)), (X, W))}


def timed(calls: dict) -> dict[str, float]:
    """Median ms of each mode's function (jitted on the numba backend)."""
    return {name: _median_ms(fold.jit(make(), backend="numba"), args) for name, (make, args) in calls.items()}


def main(argv: list[str]) -> None:
    dtypes = {"f32": np.float32, "f64": np.float64}
    setting = out = None
    if "--ab" in argv:
        at = argv.index("--ab")
        setting, argv = argv[at + 1], argv[:at] + argv[at + 2:]
    if "--out" in argv:
        at = argv.index("--out")
        out, argv = argv[at + 1], argv[:at] + argv[at + 2:]
    if argv[-1] == "nest":
        _every_product_in_the_nest()
        argv = argv[:-1]
    if argv[0] == "kmeans":
        calls = kmeans_calls(int(argv[1]), int(argv[2]), int(argv[3]), dtypes[argv[4]])
    elif argv[0] == "layer":
        calls = layer_calls(*(int(d) for d in argv[1].split("x")[:1]), dtypes[argv[2]],
                            *(int(d) for d in argv[1].split("x")[1:]))
    else:
        raise SystemExit(__doc__)
    if setting is None:
        print(argv, timed(calls), flush=True)
        return
    makers = {name: (lambda make=make, args=args: _bound(fold.jit(make(), backend="numba"), args))
              for name, (make, args) in calls.items()}
    results = setting_ab.compare_times(makers, setting)
    print(argv, {name: f"{r['a_ms']:.2f} / {r['b_ms']:.2f} ({r['ratio']:.2f})" for name, r in results.items()},
          flush=True)
    if out:
        print("wrote", setting_ab.record(out, setting, results, prefix=" ".join(argv) + " "))


def _bound(f: Callable, args: tuple) -> Callable[[], object]:
    return lambda: f(*args)


if __name__ == "__main__":
    main(sys.argv[1:])
