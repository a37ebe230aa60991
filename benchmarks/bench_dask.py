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

The inputs stay on the workers between calls (fold.shard's resident inputs): the first call sends them,
the timed ones (after it) only hash them. Per function the first call's time and bytes sent are reported,
and for the last call where its time went: the client's phases (`CallReport.phases`), per worker the
seconds its tasks spent computing and fetching from other workers (the scheduler's task stream), and the
CPU seconds of the client and of each worker over that call (and of the single process over one call):
what other load on the machine does not inflate.

The issue's size (M = 4096, D = 512, vocabulary 262144) is 1.1 TFLOP per forward: from the M = 512 run
(12 s forward, 45 s gradient in one process, loaded), about 1.6 minutes per forward and 6 per gradient call
on this 2-core machine, and an hour for the whole benchmark. The default keeps the issue's D and vocabulary (so
C is 1.07 GB and the vocabulary-scaled part dominates each process's memory) with M = 128 (34 GFLOP per
forward); --size M D V sets another, --quick a small one, --out the results' name, --note a line about
the machine stored with them.
"""

from __future__ import annotations

import math
import sys
import time

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


def _cpu_seconds(dask_worker=None) -> float:
    """This process's CPU seconds (all its threads, user and system): what other load does not inflate."""
    return time.process_time()


def _peak_rss(dask_worker=None) -> int:
    """This process's peak RSS (VmHWM) since its last `reset_peak_rss`."""
    return status_bytes("VmHWM") or 0


def _reset_peak(dask_worker=None) -> bool:
    return reset_peak_rss()


def _timed(fn, repeats: int, warmup: int = 1) -> float:
    return float(median_seconds(fn, repeats, warmup)[0])


def _task_seconds(stream: list, prefix: str) -> dict:
    """Per worker, the seconds the call's tasks spent computing and fetching their inputs from other
    workers, from the scheduler's task stream (`distributed.get_task_stream`)."""
    out: dict = {}
    for task in stream:
        if not str(task["key"]).startswith(prefix):
            continue
        per = out.setdefault(task["worker"], {"compute": 0.0, "transfer": 0.0, "other": 0.0})
        for ss in task["startstops"]:
            kind = ss["action"] if ss["action"] in ("compute", "transfer") else "other"
            per[kind] += ss["stop"] - ss["start"]
    return {w: out[w] for w in sorted(out)}


def _sharded_run(n_workers: int, chunks: int, fns: dict, args: tuple, repeats: int) -> dict:
    """Time each function sharded on a fresh LocalCluster of `n_workers`, and each worker's peak RSS over
    its own baseline (VmHWM reset before each function's calls; the first call compiles and sends the
    inputs, the later ones find them resident). The last call's breakdown: the client's phases, and per
    worker the task stream's compute and transfer seconds."""
    import fold
    from distributed import Client, LocalCluster, get_task_stream

    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, Client(cluster) as client:
        base = client.run(_baseline_rss)
        out: dict = {"baseline_rss": sorted(base.values())}
        for name, fn in fns.items():
            sharded = fold.shard(fn, split={1: 0}, chunks=chunks, client=client)
            if not all(client.run(_reset_peak).values()):
                raise RuntimeError("bench_dask measures peak RSS as VmHWM, which this platform cannot reset")
            start = time.perf_counter()
            sharded(*args)
            first = {"seconds": time.perf_counter() - start, "bytes_sent": sharded.last_call.bytes_sent,
                     "phases": sharded.last_call.phases}
            seconds = _timed(lambda: sharded(*args), repeats, warmup=0)
            with get_task_stream(client) as stream:
                cpu_before, client_cpu = client.run(_cpu_seconds), time.process_time()
                sharded(*args)
                client_cpu, cpu_after = time.process_time() - client_cpu, client.run(_cpu_seconds)
            last = sharded.last_call
            peaks = client.run(_peak_rss)
            out[name] = {"seconds": seconds, "first_call": first, "bytes_moved": last.bytes_moved,
                         "bytes_sent": last.bytes_sent, "bytes_hashed": last.bytes_hashed,
                         "combine_bytes": last.combine_bytes, "merges": last.merges,
                         "breakdown_call": {"seconds": last.seconds, "client_phases": last.phases,
                                            "worker_task_seconds": _task_seconds(stream.data, last.prefix),
                                            "cpu_seconds": {"client": client_cpu, "workers": [cpu_after[w] - cpu_before[w]
                                                                                              for w in sorted(cpu_before)]}},
                         "peak_over_baseline": sorted(peaks[w] - base[w] for w in base)}
            sharded.release()
        return out


def _single_run(fns: dict, args: tuple, repeats: int, baseline: int) -> dict:
    """Time each function with fold.jit on numba in this process, and this process's peak RSS over
    `baseline` (its RSS after imports, before the inputs were made: the inputs count, as on a worker)."""
    import fold

    out = {}
    for name, fn in fns.items():
        reset_peak_rss()
        call = fold.jit(fn) if name == "forward" else fn
        seconds = _timed(lambda: call(*args), repeats)
        cpu = time.process_time()
        call(*args)
        out[name] = {"seconds": seconds, "cpu_seconds": time.process_time() - cpu, "peak_over_baseline": _peak_rss() - baseline}
    return out


def model_of(one_worker_call: dict, level_bytes: float, measured_2: float) -> dict:
    """The model's terms from one call on one single-threaded worker: its tasks' compute seconds (the work a
    worker's core does, split among workers) and the rest of that call's time (client, scheduling, gathering:
    fixed). Not the single process's time: that process runs numba on every core, so the difference between
    it and one worker is mostly one thread against several, not overhead."""
    compute_1 = sum(w["compute"] for w in one_worker_call["worker_task_seconds"].values())
    overhead = max(one_worker_call["seconds"] - compute_1, 0.0)
    return {"compute_1_s": compute_1, "overhead_s": overhead, "level_bytes": level_bytes,
            "predicted_2_workers_s": model_seconds(2, compute_1, overhead, level_bytes), "measured_2_workers_s": measured_2,
            "curve": {w: model_seconds(w, compute_1, overhead, level_bytes) for w in [1, 2, 8, 16, 32, 64, 128, 256, 512, 1024]}}


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
    parser.add_argument("--note", default="", help="a line about the machine or its load, stored with the results")
    parser.add_argument("--out", default="dask", help="the results' file name under results/ (.json and .png)")
    args = parse_benchmark_args(parser, argv)
    m, d, v = (256, 64, 8192) if args.quick else tuple(args.size or DEFAULT_SIZE)
    block = (min(m, 1024), 1024 if args.quick else 2048)
    import fold

    machine_info = machine()
    if args.note:
        machine_info["note"] = args.note
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
        model[name] = model_of(one[name]["breakdown_call"], level_bytes[name], two[name]["seconds"])
        compute_1 = single[name]["seconds"]
        records.append({"name": name, "single_process_s": compute_1, "one_worker_s": one[name]["seconds"],
                        "two_workers_s": two[name]["seconds"], "speedup_two_vs_single": compute_1 / two[name]["seconds"],
                        "bytes_moved": two[name]["bytes_moved"], "combine_formula_bytes": two[name]["combine_bytes"],
                        "formula_note": "combine: rows x state bytes per cross-worker merge (M x 16 forward)",
                        "first_call_s": {"one_worker": one[name]["first_call"]["seconds"],
                                         "two_workers": two[name]["first_call"]["seconds"]},
                        "bytes_sent_first_call": two[name]["first_call"]["bytes_sent"],
                        "bytes_sent_later_calls": two[name]["bytes_sent"], "bytes_hashed_per_call": two[name]["bytes_hashed"],
                        "breakdown": {"one_worker": one[name]["breakdown_call"], "two_workers": two[name]["breakdown_call"]},
                        "single_process_cpu_s": single[name]["cpu_seconds"]})
        one_peak = one[name]["peak_over_baseline"][0]
        memory[name] = {"single_process": single[name]["peak_over_baseline"], "one_worker_unsplit": one_peak,
                        "two_workers": two[name]["peak_over_baseline"], "vocabulary_bytes_unsplit": vocab[name],
                        "two_workers_vocabulary_share": [vocabulary_share(one_peak, p, vocab[name]) for p in two[name]["peak_over_baseline"]]}
    payload = {"benchmark": "dask", "machine": machine_info, "size": {"M": m, "D": d, "vocabulary": v, "block": block},
               "model_assumptions": {"bandwidth_bytes_per_s": BANDWIDTH, "latency_s": LATENCY}, "records": records,
               "peak_rss_over_baseline_bytes": memory,
               "baseline_rss_bytes": {"single_process": baseline, "one_worker": one["baseline_rss"], "two_workers": two["baseline_rss"]},
               "memory_note": MEMORY_NOTE, "model": model}
    payload["machine"]["loadavg_at_end"] = list(__import__("os").getloadavg())
    write_json(RESULTS_DIR / f"{args.out}.json", payload)
    _plot(payload, args.out)
    for r in records:
        print(f"{r['name']}: single process {r['single_process_s']:.3f}s, 1 worker {r['one_worker_s']:.3f}s, 2 workers "
              f"{r['two_workers_s']:.3f}s; bytes moved {r['bytes_moved']} (combine formula {r['combine_formula_bytes']}); "
              f"sent {r['bytes_sent_first_call']} bytes on the first call, {r['bytes_sent_later_calls']} on later ones")
        for config, b in r["breakdown"].items():
            phases = {k: round(v, 2) for k, v in b["client_phases"].items()}
            tasks = {w[-5:]: {k: round(v, 2) for k, v in t.items()} for w, t in b["worker_task_seconds"].items()}
            cpu = b["cpu_seconds"]
            print(f"  {config}: {b['seconds']:.2f}s; client phases {phases}; worker task seconds {tasks}; CPU seconds: "
                  f"client {cpu['client']:.2f}, workers {[round(x, 2) for x in cpu['workers']]}")
        print(f"  single process: CPU seconds {r['single_process_cpu_s']:.2f}")
    for name, mem in memory.items():
        print(f"{name}: peak RSS over baseline: single process {mem['single_process'] / 1e6:.0f} MB, 1 worker "
              f"{mem['one_worker_unsplit'] / 1e6:.0f} MB, 2 workers {[round(p / 1e6) for p in mem['two_workers']]} MB; "
              f"vocabulary part {mem['vocabulary_bytes_unsplit'] / 1e6:.0f} MB unsplit, share per worker of 2 "
              f"{[round(x, 2) for x in mem['two_workers_vocabulary_share']]} (target 0.5)")
    print(machine_line(payload["machine"]))
    return payload


def _plot(payload: dict, out: str = "dask") -> None:
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
    save_figure(fig, RESULTS_DIR / f"{out}.png",
                f"vocabulary-parallel cross-entropy on Dask, M={s['M']} D={s['D']} V={s['vocabulary']}; model at "
                f"{payload['model_assumptions']['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s, "
                f"{payload['model_assumptions']['latency_s'] * 1e6:.0f} us per level\n{machine_line(payload['machine'])}"
                + (f"\n{payload['machine']['note']}" if payload["machine"].get("note") else ""))



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
