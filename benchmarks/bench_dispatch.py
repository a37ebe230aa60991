"""Per-call latency at small sizes: how long a warm `fold.jit` call takes when the arrays are tiny.

    python -m benchmarks.bench_dispatch              # the sizes below, 25 rounds
    python -m benchmarks.bench_dispatch --quick      # the same sizes, 5 rounds

At these sizes the arithmetic takes microseconds, so the time is what a call costs around it: flattening
the arguments, finding the compiled program, walking its statements, choosing and calling each kernel. It
matters to a user who calls a small program many times (a training step on a small model, a solver's inner
iteration). fold's numba and numpy backends and, where installed, JAX jit (its C++ dispatch) run the same
programs on the same float64 inputs:

- sum of squares, reduce(sum, x * x), n = 1000, and its vjp; the same with the square a map's lambda,
  reduce(sum, map(lambda v: v * v, x)), which the numba backend runs as one fused map-reduce kernel;
- logsumexp, reduce(monoids.logaddexp, x), n = 1000;
- the k-means cost of benchmarks/bench_numba.py, 256 points, d = 16, k = 64;
- gemm_map_reduce attention (examples/gemm_layers.py), M = N = 32, F = D = 16, forward and forward+backward
  (one gradient program returning the output and the cotangents, as in bench_numba);
- the vjps of two user-operator folds of bench_numba at n = 1000: the pairwise (P, S) reduce (the generic
  rule: both exclusive scans read by one map) and the scan of 2 x 2 matrices (the generic scan rule), where
  each statement is a kernel, not a NumPy pass.

Each function is first called for a second (the steady state of a function called many times: a small
fused scan is compiled once its NumPy reference has cost a quarter of a second, runtime/numba_backend/
lowering.py's TIER_UP_SECONDS). Then each round times a batch of calls of each function in turn
(interleaved), and the median over the rounds of the time per call is reported, in microseconds. No targets: the ratios are for information. Writes
`results/dispatch.{json,png}` (`dispatch_quick.*` with --quick).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import numpy as np

import fold
from fold.pytree import tree_flatten

from .bench_numba import jax_modules, jax_programs, kmeans_matmul, matmul2_scan, pairwise_reduce
from .common import RESULTS_DIR, benchmark_parser, machine, machine_line, parse_benchmark_args, plot_ratios, write_json

CALLS_PER_BATCH = 20
WARM_SECONDS = 1.0  # calls of each function before the timed rounds
BACKENDS = ("numba", "numpy")


def sum_of_squares(x):
    return fold.reduce(fold.monoids.sum, x * x)


def logsumexp(x):
    return fold.reduce(fold.monoids.logaddexp, x)


def _cases(rng: np.random.Generator) -> list[dict[str, Any]]:
    """Each case: name, inputs, fold program per backend, and the JAX function (built lazily) with its form."""
    from fold.ad import vjp_program
    from examples import gemm_layers as L
    from fold.inline import inline_program

    x = rng.normal(size=1000)
    points, centroids = rng.normal(size=(256, 16)), rng.normal(size=(64, 16))
    Q, K, V, G = (rng.normal(size=(32, 16)) for _ in range(4))
    attention_grad, _ = vjp_program(fold.trace(L.attention, Q, K, V), with_primal_outputs=True)

    def jit_all(f: Callable) -> dict[str, Callable]:
        return {b: fold.jit(f, backend=b) for b in BACKENDS}

    def jax_vjp(name: str, ct: Any) -> Callable:
        return lambda jnp, jax: lambda *xs: jax.vjp(jax_programs(name)[0], *xs)[1](ct)

    p, s = rng.uniform(0.9, 1.1, 1000), rng.normal(size=1000)
    matrices = (1.0 + 0.01 * rng.normal(size=1000), 0.01 * rng.normal(size=1000), 0.01 * rng.normal(size=1000),
                1.0 + 0.01 * rng.normal(size=1000))
    pair_ct, matrix_ct = (1.0, -2.0), tuple(rng.normal(size=1000) for _ in range(4))

    return [
        {"name": "sum of squares n=1000", "args": (x,), "fold": jit_all(sum_of_squares),
         "jax": lambda jnp, jax: lambda x: jnp.sum(x * x)},
        {"name": "sum of a mapped lambda n=1000", "args": (x,),
         "fold": jit_all(lambda x: fold.reduce(fold.monoids.sum, fold.map(lambda v: v * v, x))),
         "jax": lambda jnp, jax: lambda x: jnp.sum(x * x)},
        {"name": "sum of squares vjp n=1000", "args": (x,),
         "fold": jit_all(lambda x: fold.ad.vjp_value(sum_of_squares, (x,), 1.0)),
         "jax": lambda jnp, jax: lambda x: jax.vjp(lambda x: jnp.sum(x * x), x)[1](1.0)},
        {"name": "logsumexp n=1000", "args": (x,), "fold": jit_all(logsumexp),
         "jax": lambda jnp, jax: jax.nn.logsumexp},
        {"name": "k-means 256x16, k=64", "args": (points, centroids), "fold": jit_all(kmeans_matmul),
         "jax": lambda jnp, jax: lambda p, c: jnp.sum(jnp.min(
             jnp.sum(p * p, axis=1)[:, None] - 2.0 * p @ c.T + jnp.sum(c * c, axis=1)[None, :], axis=1))},
        {"name": "attention 32x32x16", "args": (Q, K, V), "fold": jit_all(L.attention),
         "jax": lambda jnp, jax: lambda q, k, v: jax.nn.softmax(q @ k.T / np.sqrt(16.0), axis=1) @ v},
        {"name": "attention vjp 32x32x16", "args": (Q, K, V, G),
         "fold": jit_all(lambda *a: inline_program(attention_grad, list(a))),
         "jax": lambda jnp, jax: lambda q, k, v, g: jax.vjp(
             lambda q, k, v: jax.nn.softmax(q @ k.T / np.sqrt(16.0), axis=1) @ v, q, k, v)[1](g), "jax_skips": 1},
        {"name": "pairwise reduce vjp n=1000", "args": (p, s),
         "fold": jit_all(lambda p, s: fold.ad.vjp_value(pairwise_reduce, (p, s), pair_ct)),
         "jax": jax_vjp("pairwise_reduce", pair_ct)},
        {"name": "2x2 matrix scan vjp n=1000", "args": matrices,
         "fold": jit_all(lambda *m: fold.ad.vjp_value(matmul2_scan, m, matrix_ct)),
         "jax": jax_vjp("matmul2_scan", matrix_ct)},
    ]


def _call_for(fn: Callable[[], Any], seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn()


def _batch(fn: Callable[[], Any], calls: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(calls):
            fn()
    return run


def _jax_call(jitted: Callable, args: tuple) -> Callable[[], Any]:
    def call() -> Any:  # block, so that JAX's asynchronous dispatch does not leave the work untimed
        out = jitted(*args)
        for leaf in (out if isinstance(out, tuple) else (out,)):
            leaf.block_until_ready()
        return out
    return call


def run_case(case: dict[str, Any], rounds: int) -> dict[str, Any]:
    args = case["args"]
    fns = {b: (lambda j=case["fold"][b]: j(*args)) for b in BACKENDS}
    mods = jax_modules()
    if mods is not None:
        jax, jnp, _ = mods
        jargs = tuple(jnp.asarray(a) for a in args)
        fns["jax"] = _jax_call(jax.jit(case["jax"](jnp, jax)), jargs)
    first = {}
    for key, fn in fns.items():  # trace, compile, and check that the backends agree
        start = time.perf_counter()
        first[key] = fn()
        first[key + "_first_call_seconds"] = time.perf_counter() - start
    ref = [np.asarray(v) for v in tree_flatten(first["numpy"])[0]]
    for key in fns:
        if key == "numpy":
            continue
        # the attention gradient program returns the output first; JAX's vjp, only the cotangents
        expected = ref[case.get("jax_skips", 0):] if key == "jax" else ref
        got = tree_flatten(first[key])[0]
        assert len(got) == len(expected), (case["name"], key, len(got), len(expected))
        for a, b in zip(expected, got, strict=True):
            np.testing.assert_allclose(np.asarray(b), a, rtol=1e-8, atol=1e-10, err_msg=f"{case['name']}: {key}")
    for fn in fns.values():  # steady state: statements that compile once hot (lowering.TIER_UP_SECONDS) have
        _call_for(fn, WARM_SECONDS)
    batches = {k: _batch(fn, CALLS_PER_BATCH) for k, fn in fns.items()}
    samples: dict[str, list[float]] = {k: [] for k in batches}
    for _ in range(rounds):
        for key, batch in batches.items():
            start = time.perf_counter()
            batch()
            samples[key].append((time.perf_counter() - start) / CALLS_PER_BATCH)
    micro = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    record = {"name": case["name"], "microseconds_per_call": micro,
              "numba_over_numpy": micro["numba"] / micro["numpy"],
              "numba_over_jax": micro["numba"] / micro["jax"] if "jax" in micro else None,
              "first_call_seconds": {k: first[k + "_first_call_seconds"] for k in fns},
              "samples_microseconds": {k: [s * 1e6 for s in v] for k, v in samples.items()}}
    print(f"  {case['name']:28s} " + "  ".join(f"{k} {v:9.1f} us" for k, v in micro.items()), flush=True)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("bench_dispatch", __doc__, "5 rounds instead of 25 (same sizes)", 25,
                              "rounds of interleaved batches (default 25)")
    args = parse_benchmark_args(parser, argv)
    rounds = 5 if args.quick else args.repeats
    m = machine()
    print(f"bench_dispatch: {machine_line(m)}", flush=True)
    rng = np.random.default_rng(0)
    results = [run_case(case, rounds) for case in _cases(rng)]
    mods = jax_modules()
    payload = {"benchmark": "per-call latency at small sizes (warm fold.jit calls)", "dtype": "float64",
               "quick": args.quick, "rounds": rounds, "calls_per_batch": CALLS_PER_BATCH,
               "statistic": "median over rounds of (batch time / calls per batch)",
               "jax": None if mods is None else mods[0].__version__, "machine": m, "results": results}
    stem = "dispatch_quick" if args.quick else "dispatch"
    path = write_json(RESULTS_DIR / f"{stem}.json", payload)
    records = []
    for r in results:
        records.append({"name": r["name"], "reference": "numpy backend", "ratio": r["numba_over_numpy"]})
        if r["numba_over_jax"] is not None:
            records.append({"name": r["name"], "reference": "JAX jit", "ratio": r["numba_over_jax"]})
    plot_ratios(RESULTS_DIR / f"{stem}.png", records, "per-call latency at small sizes: fold numba / reference",
                machine_line(m))
    print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
