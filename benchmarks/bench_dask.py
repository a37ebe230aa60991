"""Vocabulary-parallel cross-entropy sharded on Dask (fold.shard) against the single-process numba backend.

On a LocalCluster of worker processes (1 thread each): the mean cross-entropy of logits P C^T against class
indices, forward and gradient (dP, dC), with C (the vocabulary) split over the workers. Reported: time
against fold.jit on numba in this process; each process's peak resident memory over its own baseline
(VmHWM less its RSS after imports; see `benchmarks.common.status_bytes` for why not ru_maxrss), for this
process, one worker running the whole problem unsplit (chunks=1) and each of two workers, with the share of
the vocabulary-scaled bytes (C; C and dC) each of the two holds (target 1/2); bytes Dask moved between
workers against the formula; and a model of the time for 8 to 1024 workers from the measured per-shard
compute and the combine tree's bytes at a stated network bandwidth, checked against the 1- and 2-worker
measurements.

The issue's size (M = 4096, D = 512, vocabulary 262144) is 1.1 TFLOP per forward: about 3 minutes per
forward and 13 per gradient call on this 2-core machine. The default keeps the issue's D and vocabulary (so
C is 1.07 GB and the vocabulary-scaled part dominates each process's memory) with M = 128 (34 GFLOP per
forward); --size M D V sets another, --quick a small one.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from benchmarks.common import (RESULTS_DIR, benchmark_parser, machine, machine_line, median_seconds, parse_benchmark_args,
                               reset_peak_rss, save_figure, status_bytes, write_json)

BANDWIDTH = 10e9   # bytes/s between workers in the model (a 100 Gb/s network, roughly)
LATENCY = 50e-6    # seconds per message in the model
DEFAULT_SIZE = (128, 512, 262144)
MEMORY_NOTE = ("peak RSS over baseline: VmHWM (reset before each function's calls, the first of which compiles) less "
               "the process's VmRSS after importing fold, its numba backend and the shard tasks; not ru_maxrss, which a "
               "worker started by fork + exec inherits from the client. two_workers_vocabulary_share: "
               "1 - (one worker's peak - the worker's peak) / the vocabulary bytes (C forward, C and dC gradient); "
               "target 1/workers")


def _loss(block):
    import fold
    sys.path.insert(0, str(RESULTS_DIR.parent.parent / "examples"))
    from gemm_layers import cross_entropy

    def loss(P, C, t):
        return fold.sum(cross_entropy(P, C, t, block=block)) / P.shape[0]

    return loss


def _baseline_rss(dask_worker=None) -> int:
    """This process's RSS once it has imported what a shard program needs (fold, its numba backend, the
    shard tasks): the baseline its peaks are measured over, so they count the call's data and compiled
    code, not the interpreter, Dask or numba themselves (nor, as ru_maxrss would, the parent's memory)."""
    import gc

    import fold.runtime.dask_backend.tasks  # noqa: F401
    from fold.runtime.backends import get_backend

    get_backend("numba")
    gc.collect()
    return status_bytes("VmRSS") or 0


def _peak_rss(dask_worker=None) -> int:
    """This process's peak RSS (VmHWM) since its last `reset_peak_rss`."""
    return status_bytes("VmHWM") or 0


def _reset_peak(dask_worker=None) -> bool:
    return reset_peak_rss()


def _timed(fn, repeats: int) -> float:
    return float(median_seconds(fn, repeats)[0])


def _sharded_run(n_workers: int, chunks: int, fns: dict, args: tuple, repeats: int) -> dict:
    """Time each function sharded on a fresh LocalCluster of `n_workers`, and each worker's peak RSS over
    its own baseline (VmHWM reset before each function's calls; the first call compiles)."""
    import fold
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, Client(cluster) as client:
        base = client.run(_baseline_rss)
        out: dict = {"baseline_rss": sorted(base.values())}
        for name, fn in fns.items():
            sharded = fold.shard(fn, split={1: 0}, chunks=chunks, client=client)
            if not all(client.run(_reset_peak).values()):
                raise RuntimeError("bench_dask measures peak RSS as VmHWM, which this platform cannot reset")
            seconds = _timed(lambda: sharded(*args), repeats)
            peaks = client.run(_peak_rss)
            out[name] = {"seconds": seconds, "bytes_moved": sharded.last_call.bytes_moved,
                         "combine_bytes": sharded.last_call.combine_bytes, "merges": sharded.last_call.merges,
                         "peak_over_baseline": sorted(peaks[w] - base[w] for w in base)}
        return out


def _single_run(fns: dict, args: tuple, repeats: int, baseline: int) -> dict:
    """Time each function with fold.jit on numba in this process, and this process's peak RSS over
    `baseline` (its RSS after imports, before the inputs were made: the inputs count, as on a worker)."""
    import fold

    out = {}
    for name, fn in fns.items():
        reset_peak_rss()
        call = fold.jit(fn) if name == "forward" else fn
        out[name] = {"seconds": _timed(lambda: call(*args), repeats), "peak_over_baseline": _peak_rss() - baseline}
    return out


def model_seconds(workers: int, compute_1: float, overhead: float, level_bytes: float) -> float:
    """Time on `workers`: a fixed per-call overhead, the one-worker compute split evenly, and a combine tree
    of ceil(log2 workers) levels, each one message of `level_bytes` at LATENCY + bytes / BANDWIDTH."""
    levels = math.ceil(math.log2(workers)) if workers > 1 else 0
    return overhead + compute_1 / workers + levels * (LATENCY + level_bytes / BANDWIDTH)


def vocabulary_bytes(v: int, d: int) -> dict[str, int]:
    """The bytes of one process's memory that scale with the vocabulary, unsplit: C (V x D float64) in the
    forward; C and its cotangent dC in the gradient. Split over w workers, each should hold 1/w of it."""
    return {"forward": v * d * 8, "gradient": 2 * v * d * 8}


def vocabulary_share(one_worker: float, workers: float, vocabulary: float) -> float:
    """Which share of the vocabulary-scaled bytes one of several workers holds, from the peaks over
    baseline: 1 - (one worker's peak - this worker's peak) / the vocabulary bytes. 1/workers when the
    vocabulary part is split evenly and the rest (compiled code, row-sized data) is the same; 1 when every
    worker holds the whole of it."""
    return 1.0 - (one_worker - workers) / vocabulary


def main(argv: list[str] | None = None) -> dict:
    parser = benchmark_parser("bench_dask", __doc__, "a small problem (seconds)", 3, "timed calls per measurement")
    parser.add_argument("--size", type=int, nargs=3, metavar=("M", "D", "V"), default=None,
                        help=f"rows, width and vocabulary (default {DEFAULT_SIZE}; the issue's is 4096 512 262144)")
    args = parse_benchmark_args(parser, argv)
    m, d, v = (256, 64, 8192) if args.quick else tuple(args.size or DEFAULT_SIZE)
    block = (min(m, 1024), 1024 if args.quick else 2048)
    import fold

    baseline = _baseline_rss()  # before the inputs exist: they count in the single process's peak, as on a worker
    rng = np.random.default_rng(0)
    P, C, t = rng.normal(size=(m, d)) * 0.1, rng.normal(size=(v, d)) * 0.1, rng.integers(0, v, size=m)
    loss = _loss(block)
    fns = {"forward": loss, "gradient": fold.value_and_grad(loss, argnums=(0, 1))}
    single = _single_run(fns, (P, C, t), args.repeats, baseline)
    one = _sharded_run(1, 1, fns, (P, C, t), args.repeats)
    two = _sharded_run(2, 2, fns, (P, C, t), args.repeats)
    state = 2 * 8  # cross_entropy's {p, n} per row, float64
    level_bytes = {"forward": m * state, "gradient": m * state + m * 4 * 8 + m * d * 8}  # states; totals broadcast; dP's sum
    vocab = vocabulary_bytes(v, d)
    records, model, memory = [], {}, {}
    for name in fns:
        compute_1 = single[name]["seconds"]
        overhead = max(one[name]["seconds"] - compute_1, 0.0)
        predicted_2 = model_seconds(2, compute_1, overhead, level_bytes[name])
        model[name] = {"compute_1_s": compute_1, "overhead_s": overhead, "level_bytes": level_bytes[name],
                       "predicted_2_workers_s": predicted_2, "measured_2_workers_s": two[name]["seconds"],
                       "curve": {w: model_seconds(w, compute_1, overhead, level_bytes[name]) for w in [1, 2, 8, 16, 32, 64, 128, 256, 512, 1024]}}
        records.append({"name": name, "single_process_s": compute_1, "one_worker_s": one[name]["seconds"],
                        "two_workers_s": two[name]["seconds"], "speedup_two_vs_single": compute_1 / two[name]["seconds"],
                        "bytes_moved": two[name]["bytes_moved"], "combine_formula_bytes": two[name]["combine_bytes"],
                        "formula_note": "combine: rows x state bytes per cross-worker merge (M x 16 forward)"})
        one_peak = one[name]["peak_over_baseline"][0]
        memory[name] = {"single_process": single[name]["peak_over_baseline"], "one_worker_unsplit": one_peak,
                        "two_workers": two[name]["peak_over_baseline"], "vocabulary_bytes_unsplit": vocab[name],
                        "two_workers_vocabulary_share": [vocabulary_share(one_peak, p, vocab[name]) for p in two[name]["peak_over_baseline"]]}
    payload = {"benchmark": "dask", "machine": machine(), "size": {"M": m, "D": d, "vocabulary": v, "block": block},
               "model_assumptions": {"bandwidth_bytes_per_s": BANDWIDTH, "latency_s": LATENCY}, "records": records,
               "peak_rss_over_baseline_bytes": memory,
               "baseline_rss_bytes": {"single_process": baseline, "one_worker": one["baseline_rss"], "two_workers": two["baseline_rss"]},
               "memory_note": MEMORY_NOTE, "model": model}
    write_json(RESULTS_DIR / "dask.json", payload)
    _plot(payload)
    for r in records:
        print(f"{r['name']}: single process {r['single_process_s']:.3f}s, 1 worker {r['one_worker_s']:.3f}s, 2 workers "
              f"{r['two_workers_s']:.3f}s; bytes moved {r['bytes_moved']} (combine formula {r['combine_formula_bytes']})")
    for name, mem in memory.items():
        print(f"{name}: peak RSS over baseline: single process {mem['single_process'] / 1e6:.0f} MB, 1 worker "
              f"{mem['one_worker_unsplit'] / 1e6:.0f} MB, 2 workers {[round(p / 1e6) for p in mem['two_workers']]} MB; "
              f"vocabulary part {mem['vocabulary_bytes_unsplit'] / 1e6:.0f} MB unsplit, share per worker of 2 "
              f"{[round(x, 2) for x in mem['two_workers_vocabulary_share']]} (target 0.5)")
    print(machine_line(payload["machine"]))
    return payload


def _plot(payload: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, mem_ax) = plt.subplots(1, 2, figsize=(11, 4))
    _plot_memory(mem_ax, payload)
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



def _plot_memory(ax, payload: dict) -> None:
    """Bars: peak RSS over baseline per process (single process, one worker unsplit, each of two workers),
    per function; dashes: one worker's peak less half the vocabulary bytes (the target for each of two)."""
    memory = payload["peak_rss_over_baseline_bytes"]
    labels = ["single process", "1 worker", "2 workers: each"]
    for i, (name, mem) in enumerate(memory.items()):
        values = [mem["single_process"], mem["one_worker_unsplit"], max(mem["two_workers"])]
        xs = [x + 0.38 * i for x in range(len(values))]
        ax.bar(xs, [b / 1e6 for b in values], width=0.36, label=name)
        target = (mem["one_worker_unsplit"] - mem["vocabulary_bytes_unsplit"] / 2) / 1e6
        ax.hlines(target, xs[2] - 0.18, xs[2] + 0.18, colors="k", linestyles="--",
                  label="target: 1 worker less half the vocabulary part" if i == 0 else None)
    ax.set_xticks([x + 0.19 for x in range(len(labels))], labels)
    ax.set_ylabel("peak RSS over the process's baseline (MB)")
    ax.legend(fontsize=7)


if __name__ == "__main__":
    main()
