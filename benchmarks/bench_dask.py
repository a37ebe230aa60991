"""Vocabulary-parallel cross-entropy sharded on Dask (fold.shard) against the single-process numba backend.

On a LocalCluster of worker processes (1 thread each): the mean cross-entropy of logits P C^T against class
indices, forward and gradient (dP, dC), with C (the vocabulary) split over the workers. Reported: time
against fold.jit on numba in this process; each worker's peak resident memory against one worker running
the whole problem unsplit (chunks=1); bytes Dask moved between workers against the formula; and a model of
the time for 8 to 1024 workers from the measured per-shard compute and the combine tree's bytes at a
stated network bandwidth, checked against the 1- and 2-worker measurements.

The issue's size (M = 4096, D = 512, vocabulary 262144) is 1.1 TFLOP per forward: minutes per gradient on
this 2-core machine, so the default is scaled to M = 1024, D = 256, vocabulary 65536 (and --quick smaller).
"""

from __future__ import annotations

import math
import sys

import numpy as np

from benchmarks.common import (RESULTS_DIR, benchmark_parser, machine, machine_line, median_seconds, parse_benchmark_args,
                               save_figure, write_json)

BANDWIDTH = 10e9   # bytes/s between workers in the model (a 100 Gb/s network, roughly)
LATENCY = 50e-6    # seconds per message in the model


def _loss(block):
    import fold
    sys.path.insert(0, str(RESULTS_DIR.parent.parent / "examples"))
    from gemm_layers import cross_entropy

    def loss(P, C, t):
        return fold.sum(cross_entropy(P, C, t, block=block)) / P.shape[0]

    return loss


def _peak_rss(dask_worker=None) -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _timed(fn, repeats: int) -> float:
    return float(median_seconds(fn, repeats)[0])


def _sharded_run(n_workers: int, chunks: int, fns: dict, args: tuple, repeats: int) -> dict:
    import fold
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, Client(cluster) as client:
        out = {}
        for name, fn in fns.items():
            sharded = fold.shard(fn, split={1: 0}, chunks=chunks, client=client)
            out[name] = {"seconds": _timed(lambda: sharded(*args), repeats), "bytes_moved": sharded.last_call.bytes_moved,
                         "combine_bytes": sharded.last_call.combine_bytes, "merges": sharded.last_call.merges}
        out["peak_rss_per_worker"] = sorted(client.run(_peak_rss).values())
        return out


def model_seconds(workers: int, compute_1: float, overhead: float, level_bytes: float) -> float:
    """Time on `workers`: a fixed per-call overhead, the one-worker compute split evenly, and a combine tree
    of ceil(log2 workers) levels, each one message of `level_bytes` at LATENCY + bytes / BANDWIDTH."""
    levels = math.ceil(math.log2(workers)) if workers > 1 else 0
    return overhead + compute_1 / workers + levels * (LATENCY + level_bytes / BANDWIDTH)


def main(argv: list[str] | None = None) -> dict:
    parser = benchmark_parser("bench_dask", __doc__, "a small problem (seconds)", 3, "timed calls per measurement")
    args = parse_benchmark_args(parser, argv)
    m, d, v, block = (256, 64, 8192, (256, 1024)) if args.quick else (1024, 256, 65536, (1024, 2048))
    import fold

    rng = np.random.default_rng(0)
    P, C, t = rng.normal(size=(m, d)) * 0.1, rng.normal(size=(v, d)) * 0.1, rng.integers(0, v, size=m)
    loss = _loss(block)
    fns = {"forward": loss, "gradient": fold.value_and_grad(loss, argnums=(0, 1))}
    single = {name: _timed(lambda fn=fn: fold.jit(fn)(P, C, t) if name == "forward" else fn(P, C, t), args.repeats) for name, fn in fns.items()}
    one = _sharded_run(1, 1, fns, (P, C, t), args.repeats)
    two = _sharded_run(2, 2, fns, (P, C, t), args.repeats)
    state = 2 * 8  # cross_entropy's {p, n} per row, float64
    level_bytes = {"forward": m * state, "gradient": m * state + m * 4 * 8 + m * d * 8}  # states; totals broadcast; dP's sum
    records, model = [], {}
    for name in fns:
        compute_1 = single[name]
        overhead = max(one[name]["seconds"] - compute_1, 0.0)
        predicted_2 = model_seconds(2, compute_1, overhead, level_bytes[name])
        model[name] = {"compute_1_s": compute_1, "overhead_s": overhead, "level_bytes": level_bytes[name],
                       "predicted_2_workers_s": predicted_2, "measured_2_workers_s": two[name]["seconds"],
                       "curve": {w: model_seconds(w, compute_1, overhead, level_bytes[name]) for w in [1, 2, 8, 16, 32, 64, 128, 256, 512, 1024]}}
        records.append({"name": name, "single_process_s": single[name], "one_worker_s": one[name]["seconds"],
                        "two_workers_s": two[name]["seconds"], "speedup_two_vs_single": single[name] / two[name]["seconds"],
                        "bytes_moved": two[name]["bytes_moved"], "combine_formula_bytes": two[name]["combine_bytes"],
                        "formula_note": "combine: rows x state bytes per cross-worker merge (M x 16 forward)"})
    payload = {"benchmark": "dask", "machine": machine(), "size": {"M": m, "D": d, "vocabulary": v, "block": block},
               "model_assumptions": {"bandwidth_bytes_per_s": BANDWIDTH, "latency_s": LATENCY}, "records": records,
               "peak_rss_per_worker_bytes": {"one_worker_unsplit": one["peak_rss_per_worker"], "two_workers": two["peak_rss_per_worker"]},
               "model": model}
    write_json(RESULTS_DIR / "dask.json", payload)
    _plot(payload)
    for r in records:
        print(f"{r['name']}: single process {r['single_process_s']:.3f}s, 1 worker {r['one_worker_s']:.3f}s, 2 workers "
              f"{r['two_workers_s']:.3f}s; bytes moved {r['bytes_moved']} (combine formula {r['combine_formula_bytes']})")
    print("peak RSS per worker:", payload["peak_rss_per_worker_bytes"])
    print(machine_line(payload["machine"]))
    return payload


def _plot(payload: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, mod in payload["model"].items():
        ws = [int(w) for w in mod["curve"]]
        ax.plot(ws, list(mod["curve"].values()), marker=".", label=f"{name}: model")
        r = next(r for r in payload["records"] if r["name"] == name)
        ax.scatter([1, 2], [r["one_worker_s"], r["two_workers_s"]], marker="x", s=60, label=f"{name}: measured")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("workers")
    ax.set_ylabel("seconds per call")
    ax.legend(fontsize=7)
    s = payload["size"]
    save_figure(fig, RESULTS_DIR / "dask.png",
                f"vocabulary-parallel cross-entropy on Dask, M={s['M']} D={s['D']} V={s['vocabulary']}; model at "
                f"{payload['model_assumptions']['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s, "
                f"{payload['model_assumptions']['latency_s'] * 1e6:.0f} us per level\n{machine_line(payload['machine'])}")


if __name__ == "__main__":
    main()
