"""The monoid benchmark: the vjp of a reduce under the generic rule vs the Theorem 2.1 monoid shortcut.

    python -m benchmarks.bench_monoid            # n = 10^4, 10^5, 10^6
    python -m benchmarks.bench_monoid --quick    # n = 10^3, 10^4: a smoke test

For three monoids of fold.monoids — logaddexp (scalar elements), logwsum with v in R^16 (attention's online
softmax) and pairwise (the (P, S) sum of all pairwise products) — and two layouts — one reduce over n elements
("flat"), and a reduce per row inside a map over 256 rows of length n/256 ("map") — this measures, in one run:

- time: the median wall time of a warm call of `fold.jit(lambda *a: fold.ad.vjp_value(f, a, ybar, reduce_rule=rule))`
  (traced and compiled before timing), the generic and the monoid rule timed alternately;
- memory: the tracemalloc peak of one such call. The inputs are allocated before tracing starts, so this
  peak is the call's extra memory over its inputs (the returned cotangents included); `fold.memory`'s
  liveness estimate of the same gradient program, less the input bytes, is recorded beside it.

The generic rule stores two exclusive scans of the elements (an O(n) prefix and suffix of whole elements,
e.g. n x 17 floats for logwsum) and differentiates l_i . a_i . r_i per element; the monoid rule is one map of
D(total, a_i, ybar) after the primal reduce. Target at n = 10^6: the monoid rule at least 3x faster than the
generic rule and holding less than half its extra memory.

Writes benchmarks/results/monoid_numpy.json and .png (monoid_numpy_quick.* with --quick).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

import numpy as np

import fold
from fold.pytree import tree_flatten

from .common import RESULTS_DIR, benchmark_parser, traced_peak, machine, machine_line, parse_benchmark_args, save_figure, time_pair, write_json

BACKEND = "numpy"
ROWS = 256
D = 16
TARGET_SPEEDUP = 3.0
TARGET_MEMORY_RATIO = 0.5
TARGET_N = 10**6


# ------------------------------------------------------------------------------------------ the functions

def _lae_flat(x):
    return fold.reduce(fold.monoids.logaddexp, x)


def _lae_map(x):
    return fold.map(lambda row: fold.reduce(fold.monoids.logaddexp, row), x)


def _logwsum_flat(z, v):
    return fold.reduce(fold.monoids.logwsum, {"z": z, "v": v})


def _logwsum_map(z, v):
    return fold.map(lambda zr, vr: fold.reduce(fold.monoids.logwsum, {"z": zr, "v": vr}), z, v)


def _pairwise(w):
    """P = sum_{j<i} w_j w_i, as in examples/pairwise.py: a reduce over the elements (0, w_i)."""
    return fold.reduce(fold.monoids.pairwise, (fold.map(lambda x: x * 0.0, w), w))[0]


def _pairwise_map(w):
    return fold.map(_pairwise, w)


def make_case(monoid: str, layout: str, n: int, rng: np.random.Generator) -> tuple[Callable, tuple, Any]:
    """(f, primals, cotangent) for `monoid` in `layout`: "flat" (one reduce over n) or "map" (a reduce per row
    over ROWS rows of n // ROWS)."""
    lead = (n,) if layout == "flat" else (ROWS, n // ROWS)
    out_lead = () if layout == "flat" else (ROWS,)
    if monoid == "logaddexp":
        f = _lae_flat if layout == "flat" else _lae_map
        return f, (rng.standard_normal(lead),), rng.standard_normal(out_lead)
    if monoid == "logwsum":
        f = _logwsum_flat if layout == "flat" else _logwsum_map
        primals = (3.0 * rng.standard_normal(lead), rng.standard_normal(lead + (D,)))
        return f, primals, {"z": rng.standard_normal(out_lead), "v": rng.standard_normal(out_lead + (D,))}
    if monoid == "pairwise":
        f = _pairwise if layout == "flat" else _pairwise_map
        return f, (rng.standard_normal(lead) / np.sqrt(n),), rng.standard_normal(out_lead)
    raise ValueError(monoid)


# ------------------------------------------------------------------------------------------ measuring

def _nbytes(tree: Any) -> int:
    return int(sum(np.asarray(x).nbytes for x in tree_flatten(tree)[0]))




def max_rel_diff(a: Any, b: Any) -> float:
    worst = 0.0
    for x, y in zip(tree_flatten(a)[0], tree_flatten(b)[0], strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        scale = float(np.max(np.abs(y), initial=0.0))
        worst = max(worst, float(np.max(np.abs(x - y), initial=0.0)) / (scale or 1.0))
    return worst


def measure(monoid: str, layout: str, n: int, repeats: int, rng: np.random.Generator) -> dict[str, Any]:
    """Both rules on one case of nominal size n (the map layout reduces ROWS * (n // ROWS) elements)."""
    f, primals, ybar = make_case(monoid, layout, n, rng)
    input_bytes = _nbytes(primals)
    primal = fold.jit(f, backend=BACKEND)
    grads = {rule: fold.jit(lambda *a, _rule=rule: fold.ad.vjp_value(f, a, ybar, reduce_rule=_rule), backend=BACKEND)
             for rule in ("generic", "monoid")}
    start = time.perf_counter()
    cts = {rule: g(*primals) for rule, g in grads.items()}  # trace, transform and compile (excluded below)
    first_call = time.perf_counter() - start
    diff = max_rel_diff(cts["monoid"], cts["generic"])
    if not diff < 1e-8:
        raise AssertionError(f"{monoid} {layout} n={n}: the monoid and generic rules disagree by {diff:.3g}")
    output_bytes = _nbytes(cts["monoid"])
    del cts
    # two warm-up calls each: the first calls after a large free/allocate pay the page faults
    timing = time_pair(lambda: grads["monoid"](*primals), lambda: grads["generic"](*primals), repeats=repeats,
                       warmup=2)
    primal(*primals)
    primal_seconds = float(np.median([_timed(lambda: primal(*primals)) for _ in range(repeats)]))
    record: dict[str, Any] = {
        "monoid": monoid, "layout": layout, "n_nominal": n,
        "n": int(np.prod(primals[0].shape[:1 if layout == "flat" else 2])),
        "rows": 1 if layout == "flat" else ROWS, "element": _element(monoid),
        "input_bytes": input_bytes, "output_bytes": output_bytes, "primal_seconds": primal_seconds,
        "first_call_seconds": first_call, "max_rel_diff_monoid_vs_generic": diff, "repeats": repeats,
    }
    record["rules"] = {}
    for rule, key in (("generic", "reference"), ("monoid", "fold")):
        program = grads[rule].program(*primals)
        estimate = int(fold.memory(program))
        record["rules"][rule] = {
            "seconds": timing[f"{key}_seconds"], "samples": timing[f"{key}_samples"],
            "extra_bytes": traced_peak(lambda _g=grads[rule]: _g(*primals)),
            "estimated_bytes": estimate, "estimated_extra_bytes": estimate - input_bytes,
            "statements": _statements(program),
        }
    g, m = record["rules"]["generic"], record["rules"]["monoid"]
    record["speedup"] = g["seconds"] / m["seconds"]
    record["memory_ratio"] = m["extra_bytes"] / g["extra_bytes"]
    record["estimated_memory_ratio"] = m["estimated_extra_bytes"] / g["estimated_extra_bytes"]
    if n >= TARGET_N:
        record["target"] = {"speedup": TARGET_SPEEDUP, "memory_ratio": TARGET_MEMORY_RATIO}
        record["passed"] = bool(record["speedup"] >= TARGET_SPEEDUP and record["memory_ratio"] < TARGET_MEMORY_RATIO)
    else:
        record["target"], record["passed"] = None, None
    verdict = "" if record["passed"] is None else ("  PASS" if record["passed"] else "  FAIL")
    print(f"  {monoid:<10}{layout:<5} n={record['n']:<8} generic {g['seconds'] * 1e3:9.2f} ms "
          f"{g['extra_bytes'] / 2**20:8.1f} MiB | monoid {m['seconds'] * 1e3:8.2f} ms {m['extra_bytes'] / 2**20:7.1f} MiB"
          f" | {record['speedup']:5.2f}x faster, {record['memory_ratio']:.2f} of the memory"
          f" (estimate {record['estimated_memory_ratio']:.2f}){verdict}  [diff {diff:.1e}]", flush=True)
    return record


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _element(monoid: str) -> str:
    return {"logaddexp": "f64", "logwsum": f"{{z: f64, v: f64[{D}]}}", "pairwise": "(P: f64, S: f64)"}[monoid]


def _statements(program) -> int:
    from fold.ir import count_statements

    return int(count_statements(program))


# ------------------------------------------------------------------------------------------ the plot

def plot(path, records: list[dict[str, Any]], title: str) -> Any:
    """Time (top row) and extra memory (bottom row) against n, log-log, one column per monoid; both rules,
    solid for the flat reduce and dashed for the reduce per row inside a map."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written", file=sys.stderr)
        return None
    monoids = list(dict.fromkeys(r["monoid"] for r in records))
    fig, axes = plt.subplots(2, len(monoids), figsize=(4.6 * len(monoids), 7.5), squeeze=False)
    colors = {"generic": "tab:red", "monoid": "tab:blue"}
    styles = {"flat": "-", "map": "--"}
    for col, name in enumerate(monoids):
        for layout in ("flat", "map"):
            rows = sorted((r for r in records if r["monoid"] == name and r["layout"] == layout), key=lambda r: r["n"])
            if not rows:
                continue
            ns = [r["n"] for r in rows]
            for rule in ("generic", "monoid"):
                label = f"{rule}, {'one reduce' if layout == 'flat' else f'map of {ROWS} reduces'}"
                axes[0][col].plot(ns, [r["rules"][rule]["seconds"] for r in rows], styles[layout], color=colors[rule],
                                  marker="o", label=label)
                axes[1][col].plot(ns, [r["rules"][rule]["extra_bytes"] / 2**20 for r in rows], styles[layout],
                                  color=colors[rule], marker="o", label=label)
            top = rows[-1]
            axes[0][col].annotate(f"{top['speedup']:.1f}x", (top["n"], top["rules"]["monoid"]["seconds"]), fontsize=8,
                                  xytext=(4, -10 if layout == "flat" else 4), textcoords="offset points")
            axes[1][col].annotate(f"{top['memory_ratio']:.2f}", (top["n"], top["rules"]["monoid"]["extra_bytes"] / 2**20),
                                  fontsize=8, xytext=(4, -10 if layout == "flat" else 4), textcoords="offset points")
        element = next(r["element"] for r in records if r["monoid"] == name)
        axes[0][col].set_title(f"{name}  {element}", fontsize=10)
        for row, ylabel in ((0, "vjp time, median (s)"), (1, "extra memory, tracemalloc peak (MiB)")):
            ax = axes[row][col]
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("n (elements reduced)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", linewidth=0.3)
        axes[0][col].legend(fontsize=7)
    return save_figure(fig, path, title)


# ------------------------------------------------------------------------------------------ main

def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = benchmark_parser("bench_monoid", __doc__, "n = 10^3, 10^4 (a smoke test)", 7, "timed repeats per rule (median reported)")
    args = parse_benchmark_args(parser, argv)
    sizes = (10**3, 10**4) if args.quick else (10**4, 10**5, 10**6)
    info = machine()
    line = machine_line(info)
    print(f"bench_monoid (numpy backend{', quick' if args.quick else ''}): {line}", flush=True)
    rng = np.random.default_rng(20240517)
    records = []
    for monoid in ("logaddexp", "logwsum", "pairwise"):
        for layout in ("flat", "map"):
            for n in sizes:
                records.append(measure(monoid, layout, n, args.repeats, rng))
    for r in records:
        r["machine"] = line
    suffix = "_quick" if args.quick else ""
    payload = {
        "benchmark": "monoid", "backend": BACKEND, "quick": args.quick, "repeats": args.repeats,
        "statistic": "median wall seconds of a warm jitted vjp (trace/compile excluded), the two rules interleaved; "
                     "extra_bytes = tracemalloc peak of one call, inputs allocated before tracing (so not counted), "
                     "returned cotangents included; estimated_extra_bytes = fold.memory(gradient program) - input bytes",
        "targets": {"n": TARGET_N, "speedup_at_least": TARGET_SPEEDUP, "memory_ratio_below": TARGET_MEMORY_RATIO},
        "machine": info, "results": records,
    }
    json_path = write_json(RESULTS_DIR / f"monoid_numpy{suffix}.json", payload)
    png_path = plot(RESULTS_DIR / f"monoid_numpy{suffix}.png", records,
                    f"vjp of reduce: generic rule vs monoid rule (Theorem 2.1), numpy backend\n{line}")
    targeted = [r for r in records if r["passed"] is not None]
    failed = [f"{r['monoid']} {r['layout']}" for r in targeted if not r["passed"]]
    if targeted:
        print(f"  {len(targeted) - len(failed)}/{len(targeted)} targets met at n = 10^6 "
              f"(speedup >= {TARGET_SPEEDUP:g}x and memory ratio < {TARGET_MEMORY_RATIO:g})"
              + (f"; missed: {', '.join(failed)}" if failed else ""))
    print(f"  wrote {json_path}" + (f" and {png_path}" if png_path else ""), flush=True)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
