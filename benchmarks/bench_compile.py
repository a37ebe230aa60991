"""Compile time: how long the first call of a `fold.jit` program takes on the numba backend, kernels and all.

    python -m benchmarks.bench_compile              # every case, each configuration twice (about 10 minutes)
    python -m benchmarks.bench_compile --quick      # the first-order programs, once each (a smoke test)
    python -m benchmarks.bench_compile --only hvp   # cases whose name contains the text

A first call traces the program, transforms it (AD, fusion), generates its kernels and has Numba compile
them; fold then keeps them in memory and on disk, so this is paid once per program and machine. It is still
the first thing a user meets, and a program that takes minutes to compile is one nobody runs twice. Each
case runs in a fresh process with a fresh, empty kernel cache (FOLD_CACHE_DIR and NUMBA_CACHE_DIR), so nothing
compiled before is reused, and the process's Numba and NumPy imports are done before the clock starts.

Cases: bench_numba's programs 1a-4 (primal and the vjp), at its --quick sizes (10^5 elements; k-means at
10^4 points), and second derivatives, the jvp of the vjp (Hessian-vector products) of a reduction under the
generic rule and under the monoid rule (Theorem 2.1): logsumexp as a fold of `monoids.logaddexp`, and
`monoids.logwsum` with v in R^5 (record elements of 6 leaves; the hvp's elements have 12). Second derivatives
are where the operators grow: the generic rule's gradient of a 12-leaf operator is an operator of 24-scalar
arguments and some 90 statements, which a scan kernel calls at 18 sites.

Columns, per configuration: `compile_seconds` (Jitted.compile_seconds: tracing, transformation and every
kernel's compilation), the first call's wall time, and the warm call's (median of repeats) at that size,
so that a configuration that compiles faster but runs slower shows it. Configurations:

- `default`: fold as it is;
- `inline_all`: every operator of at most MAX_INLINED_PARAMETERS scalars inlined by Numba at each call site
  whatever its size (FOLD_MAX_INLINED_STATEMENTS=1000000), the behaviour before session 34;
- `numba_copy_propagation`: Numba's own copy propagation kept (FOLD_KEEP_NUMBA_COPY_PROPAGATION=1), not
  the one kernels/cpu/copy_propagation.py installs in its place, the behaviour before session 47.

bench_natural's programs written the natural way (nested maps: loop nests, fold's largest kernels) are
cases too: gradient and Hessian-vector product at small sizes; and a map body of 100, 400 and 1200
elementwise statements summed per row (one loop nest), to show how compile time grows with a kernel's length.

The configurations alternate case by case (default first, then the others, then again with --repeats 2),
and each ratio configuration / default is of the medians. `--configurations a,b` runs those alone (and
default). No targets. Writes `results/compile.{json,png}` (`compile_quick.*` with --quick; `--out NAME`
writes `results/NAME.*`).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

from .common import RESULTS_DIR, benchmark_parser, machine, machine_line, parse_benchmark_args, plot_ratios, write_json

CONFIGURATIONS = {"default": {}, "inline_all": {"FOLD_MAX_INLINED_STATEMENTS": "1000000"},
                  "numba_copy_propagation": {"FOLD_KEEP_NUMBA_COPY_PROPAGATION": "1"}}
WORKER_TIMEOUT = 1800
WARM_REPEATS = 5


def _bench_numba_cases() -> dict[str, Callable[[], tuple[Callable, tuple]]]:
    """name -> a builder of (function to jit, arguments), for bench_numba's programs 1a-4, primal and vjp."""
    from . import bench_numba

    out: dict[str, Callable[[], tuple[Callable, tuple]]] = {}
    for case in bench_numba.cases(quick=True):
        if case.f is None:
            continue

        def primal(case=case):
            return case.f, case.inputs(np.random.default_rng(0), True)

        def vjp(case=case):
            import fold
            rng = np.random.default_rng(0)
            args = case.inputs(rng, True)
            ct = case.cotangent(rng, args)
            return (lambda *xs: fold.ad.vjp_value(case.f, xs, ct, reduce_rule=case.reduce_rule)), args

        out[f"{case.name} primal"] = primal
        out[f"{case.name} vjp"] = vjp
    return out


def _hvp_case(monoid_name: str, rule: str, n: int = 10**5) -> Callable[[], tuple[Callable, tuple]]:
    """The jvp of the vjp of a reduction of `monoid_name`'s elements (a Hessian-vector product)."""
    def build():
        import fold
        from fold import monoids

        rng = np.random.default_rng(0)
        if monoid_name == "logaddexp":
            args = (rng.standard_normal(n),)

            def f(x):
                return fold.reduce(monoids.logaddexp, x)
            ct: Any = 1.0
        else:
            args = (rng.standard_normal(n), rng.standard_normal((n, 5)))

            def f(log_w, v):
                return fold.reduce(monoids.logwsum, {"z": log_w, "v": v})
            ct = {"z": 1.0, "v": np.ones(5)}
        k = len(args)
        tangents = tuple(rng.standard_normal(a.shape) for a in args)

        def hvp(*xs_and_ts):
            return fold.jvp(lambda *xs: fold.ad.vjp_value(f, xs, ct, reduce_rule=rule), xs_and_ts[:k], xs_and_ts[k:])[1]
        return hvp, args + tangents
    return build


def _natural_case(case: str, mode: str) -> Callable[[], tuple[Callable, tuple]]:
    """bench_natural's program `case` written with nested maps, its gradient or Hessian-vector product."""
    def build():
        import fold
        from . import bench_natural

        args = bench_natural.inputs(case, bench_natural.sizes(True)[case])
        f = bench_natural.fold_natural(case)
        g = fold.grad(f)
        if mode == "grad":
            return g, args
        tangent = np.random.default_rng(1).normal(size=args[0].shape).astype(args[0].dtype)
        zeros = tuple(np.zeros_like(a) for a in args[1:])
        return (lambda *a: fold.jvp(g, a, (tangent,) + zeros)[1]), args
    return build


NATURAL_CASES = ("kmeans", "cross_entropy", "three_deep")


def _long_body_case(steps: int) -> Callable[[], tuple[Callable, tuple]]:
    """A row-wise sum of a map body of 4 * `steps` elementwise statements (tanh, two products, a sum per
    step) over 2000 x 16 float64: one loop nest whose kernel's length follows the body's."""
    def build():
        import fold

        def body(r):
            y = r
            for j in range(steps):
                y = fold.tanh(y) * 0.5 + r * (0.01 * (j + 1))
            return fold.sum(y)

        return (lambda X: fold.sum(fold.map(body, X))), (np.random.default_rng(0).normal(size=(2000, 16)),)
    return build


LONG_BODY_STEPS = (25, 100, 300)


def all_cases() -> dict[str, Callable[[], tuple[Callable, tuple]]]:
    cases = _bench_numba_cases()
    for monoid_name in ("logaddexp", "logwsum"):
        for rule in ("generic", "monoid"):
            cases[f"hvp {monoid_name} {rule}"] = _hvp_case(monoid_name, rule)
    for case in NATURAL_CASES:
        for mode in ("grad", "hvp"):
            cases[f"natural {case} {mode}"] = _natural_case(case, mode)
    for steps in LONG_BODY_STEPS:
        cases[f"long body {4 * steps} statements"] = _long_body_case(steps)
    return cases


QUICK_CASES = ("1a reduce a*b primal", "1a reduce a*b vjp", "1b scan pairwise vjp", "hvp logaddexp generic")


# ---------------------------------------------------------------------------------------------- the worker

def worker(name: str) -> dict[str, Any]:
    """One case's first call and warm calls, in this process (whose environment holds the configuration)."""
    import fold
    from fold.pytree import tree_flatten

    fn, args = all_cases()[name]()
    jitted = fold.jit(fn, backend="numba")
    start = time.perf_counter()
    out = jitted(*args)
    first = time.perf_counter() - start
    warm = []
    for _ in range(WARM_REPEATS):
        start = time.perf_counter()
        jitted(*args)
        warm.append(time.perf_counter() - start)
    reference = fold.jit(fn, backend="numpy")(*args)
    error = max((float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                 / max(float(np.max(np.abs(np.asarray(b, np.float64)))), 1e-300)
                 for a, b in zip(tree_flatten(out)[0], tree_flatten(reference)[0], strict=True)), default=0.0)
    return {"compile_seconds": jitted.compile_seconds, "first_call_seconds": first,
            "warm_seconds": statistics.median(warm), "warm_samples": warm, "max_rel_err_vs_numpy": error}


def run_worker(name: str, configuration: str) -> dict[str, Any]:
    """The case in a fresh process with a fresh kernel cache, under the configuration's environment."""
    with tempfile.TemporaryDirectory(prefix="fold_compile_bench_") as cache:
        # NUMBA_CACHE_DIR too: fold's fixed kernels (logsumexp's, kernels/cpu) are cached by Numba beside their files
        env = {**os.environ, **CONFIGURATIONS[configuration], "FOLD_CACHE_DIR": cache, "NUMBA_CACHE_DIR": cache}
        start = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-m", "benchmarks.bench_compile", "--worker", name],
                                  env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            return {"failed": f"ran past {WORKER_TIMEOUT} s"}
        if done.returncode != 0:
            return {"failed": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result["process_seconds"] = time.perf_counter() - start
        return result


# ---------------------------------------------------------------------------------------------- the run

def _summary(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--worker"]:
        print(json.dumps(worker(argv[1])))
        return {}
    parser = benchmark_parser("bench_compile", __doc__, "the first-order cases only, each configuration once", 2,
                              "runs of each case per configuration (default 2)")
    parser.add_argument("--only", default=None, help="run the cases whose name contains this text")
    parser.add_argument("--configurations", default=None,
                        help="comma-separated configurations to compare with default (default: all)")
    parser.add_argument("--out", default=None, help="results/<OUT>.{json,png} (default: compile or compile_quick)")
    args = parse_benchmark_args(parser, argv)
    repeats = 1 if args.quick else args.repeats
    names = [n for n in (QUICK_CASES if args.quick else all_cases()) if args.only is None or args.only in n]
    others = [c for c in CONFIGURATIONS if c != "default"
              and (args.configurations is None or c in args.configurations.split(","))]
    configurations = ["default"] + others
    records = []
    for name in names:
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configurations}
        for _ in range(repeats):
            for configuration in configurations:
                runs[configuration].append(run_worker(name, configuration))
        record: dict[str, Any] = {"name": name, "runs": runs}
        for configuration, rs in runs.items():
            record[configuration] = {key: _summary(rs, key) for key in
                                     ("compile_seconds", "first_call_seconds", "warm_seconds", "max_rel_err_vs_numpy")}
            record[configuration]["failed"] = [r["failed"] for r in rs if "failed" in r]
        line = f"{name:36s} compile {record['default']['compile_seconds'] or float('nan'):7.2f} s"
        for other in others:
            for key in ("compile", "warm"):
                base, value = record["default"][f"{key}_seconds"], record[other][f"{key}_seconds"]
                record[f"{key}_ratio_{other}_over_default"] = value / base if base and value else None
            line += f"  {other} {record[other]['compile_seconds'] or float('nan'):7.2f} s"
        records.append(record)
        print(line, flush=True)
    m = machine()
    payload = {"benchmark": "compile", "quick": args.quick, "repeats": repeats,
               "configurations": {c: CONFIGURATIONS[c] for c in configurations},
               "machine": m, "machine_line": machine_line(m), "results": records}
    stem = args.out or ("compile_quick" if args.quick else "compile")
    write_json(RESULTS_DIR / f"{stem}.json", payload)
    bars = [{"name": f"{r['name']} ({other})", "ratio": r[f"compile_ratio_{other}_over_default"], "reference": None}
            for r in records for other in others if r[f"compile_ratio_{other}_over_default"]]
    if bars:
        plot_ratios(RESULTS_DIR / f"{stem}.png", bars, "compile time, configuration / default (first call, fresh kernel cache)",
                    machine_line(m))
    return payload


if __name__ == "__main__":
    main()
