"""Products with a long inner dimension under load: fold's process-wide BLAS setting, on and off.

    python -m benchmarks.bench_load              # n = 100,000 points, 5 repeats (about 1-2 minutes on 2 cores)
    python -m benchmarks.bench_load --quick      # n = 50,000, 3 repeats

FOLD_QUIET_BLAS=1 makes OpenBLAS's idle threads sleep after 2^14 cycles instead of 2^28 (runtime/
numba_backend/blas_threads.py). On an idle machine that let fold's kernels have the cores after each
product; with another process busy on the machine it was a cliff: a thread that sleeps at once must be woken
for every product and wait for a core, and products with a long inner dimension and a small result took
0.3-0.7 s instead of 1-10 ms. This benchmark is the evidence for the setting being opt-in. Each case runs in
a fresh process (the setting is read once per process) with FOLD_QUIET_BLAS=0 (the default) and =1, idle and
beside a busy process (one Python loop spinning on a core), and reports the median time of each:

- `long inner product`: fold.matmul of a (64 x n) by an (n x 16) matrix (a 64 x 16 result);
- `k-means HVP`: the Hessian-vector product (jvp of grad) of benchmarks/bench_numba.py's k-means cost, whose
  distances come from a matrix product, n points in 16 dimensions, 64 centroids; its gradient holds a
  product with inner dimension n.

The ratio plotted is (time with FOLD_QUIET_BLAS=1) / (time with the default), idle and under load: above 1
is what the default saves. No targets. Writes `results/load.{json,png}` (`load_quick.*` with --quick).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .common import RESULTS_DIR, benchmark_parser, machine, machine_line, parse_benchmark_args, plot_ratios, write_json

ROOT = Path(__file__).resolve().parents[1]

# One process: times each case (median of argv[2] repeats after a warm-up) and prints the medians as JSON.
CHILD = r"""
import json, sys
import numpy as np
import fold
from benchmarks.bench_numba import kmeans_matmul
from benchmarks.common import median_seconds

n, repeats = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
a, b = rng.standard_normal((64, n)), rng.standard_normal((n, 16))
points, centroids = rng.standard_normal((n, 16)), rng.standard_normal((64, 16))
product = fold.jit(lambda x, y: fold.matmul(x, y))
grad = fold.grad(kmeans_matmul, argnums=1)
hvp = fold.jit(lambda p, c, t: fold.jvp(lambda c_: grad(p, c_), (c,), (t,))[1])
cases = {"long inner product": lambda: product(a, b),
         "k-means HVP": lambda: hvp(points, centroids, np.ones_like(centroids))}
out = {}
for name, fn in cases.items():
    out[name] = median_seconds(fn, repeats)[0]
print(json.dumps(out))
"""

SETTINGS = ("0", "1")


def _busy() -> subprocess.Popen:
    """Another process keeping one core busy (the 'artificial load')."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _run(n: int, repeats: int, quiet_blas: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_THREAD_TIMEOUT",)}
    env.update(FOLD_QUIET_BLAS=quiet_blas, FOLD_BACKEND="numba")
    done = subprocess.run([sys.executable, "-c", CHILD, str(n), str(repeats)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"bench_load child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("bench_load", __doc__, "n = 50,000 and 3 repeats", 5, "timed calls per case")
    args = parse_benchmark_args(parser, argv)
    n = 50_000 if args.quick else 100_000
    m = machine()
    print(machine_line(m))
    _run(n, 1, "0")  # compiles into the disk cache: the timed processes load it
    timings: dict[str, dict[str, dict[str, float]]] = {}
    start = time.perf_counter()
    for load in ("idle", "loaded"):
        busy = _busy() if load == "loaded" else None
        try:
            timings[load] = {s: _run(n, args.repeats, s) for s in SETTINGS}
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
    records: list[dict[str, Any]] = []
    for load, per_setting in timings.items():
        for case in per_setting["0"]:
            default, quiet = per_setting["0"][case], per_setting["1"][case]
            records.append({"name": f"{case}, {load}", "reference": "FOLD_QUIET_BLAS=0 (default)",
                            "seconds_default": default, "seconds_quiet_blas": quiet, "ratio": quiet / default,
                            "target": None})
            print(f"{case:<20} {load:<7} default {default * 1e3:9.2f} ms   FOLD_QUIET_BLAS=1 {quiet * 1e3:9.2f} ms"
                  f"   ratio {quiet / default:6.2f}x")
    stem = "load_quick" if args.quick else "load"
    payload = {"machine": m, "n": n, "repeats": args.repeats, "seconds": round(time.perf_counter() - start, 1),
               "records": records}
    print(write_json(RESULTS_DIR / f"{stem}.json", payload))
    plot_ratios(RESULTS_DIR / f"{stem}.png", records, "time with FOLD_QUIET_BLAS=1 / default, idle and beside a "
                "busy process", machine_line(m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
