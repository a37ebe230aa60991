"""Small helpers shared by the benchmarks: timing, a description of the machine, JSON and plots.

Timings are wall-clock (`time.perf_counter`), warm (each function is called before it is timed, so tracing
and compilation are excluded) and summarised by the median of the repeats. `time_pair` interleaves the two
functions it compares, so that a load that comes and goes (another process on the machine) hits both alike
and the ratio of the medians is measured in the same run.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def median_seconds(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1) -> tuple[float, list[float]]:
    """The median wall time of `fn()` over `repeats` calls, after `warmup` untimed calls; and all samples."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), samples


# A fresh process's first calls after the first can run several times slower than later ones, for reasons
# outside the program. bench_natural's logsumexp HVP in a fresh worker (FOLD_KEEP_FREED_MEMORY=0,
# MALLOC_MMAP_THRESHOLD_=65536) on the 2-core Firecracker VM: calls 2-7 took 85-112 ms, the later ones 20-35
# ms, with the same 19 huge-page faults in each call; the slow calls spent 65-93 ms in the kernel against 4-20
# (most likely the host backing the guest's memory as it is first touched).
WARM_SECONDS = 1.0


def warm_up(fn: Callable[[], Any], seconds: float = WARM_SECONDS) -> float:
    """Call `fn` once, then again until `seconds` have passed, so that the calls timed next run in the steady
    state a long-running program sees; the first call's seconds (tracing and compiling included)."""
    start = time.perf_counter()
    fn()
    warm = time.perf_counter()
    while time.perf_counter() - warm < seconds:
        fn()
    return warm - start


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Time every callable once per round, in a fixed order, for `repeats` rounds: the samples of each.

    Interleaving spreads slow drifts of the machine (other load, frequency) evenly over the callables."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[key].append(time.perf_counter() - start)
    return samples


def time_pair(ours: Callable[[], Any], reference: Callable[[], Any], repeats: int = 5,
              warmup: int = 1) -> dict[str, Any]:
    """Time `ours` and `reference` alternately (`repeats` times each, after `warmup` calls of each).

    Returns the medians, their ratio (ours / reference) and the raw samples.
    """
    for _ in range(warmup):
        ours()
        reference()
    samples = interleaved({"ours": ours, "reference": reference}, repeats)
    a, b = samples["ours"], samples["reference"]
    ma, mb = statistics.median(a), statistics.median(b)
    return {"fold_seconds": ma, "reference_seconds": mb, "ratio": ma / mb,
            "fold_samples": a, "reference_samples": b}


def mem_available() -> int | None:
    """The kernel's estimate of memory available to a new process (bytes), or None where /proc has none."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # not installed, or broken: the benchmark still runs
        return None


def machine() -> dict[str, Any]:
    """CPU model, core counts, library versions, date and load: enough to tell two results files apart."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    try:
        load = list(os.getloadavg())
    except (AttributeError, OSError):
        load = None
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "numba": _version("numba"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "loadavg_at_start": load,
    }


def machine_line(m: dict[str, Any]) -> str:
    return (f"{m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable), Python {m['python']}, "
            f"NumPy {m['numpy']}, Numba {m['numba']}, {m['date']}")


def write_json(path: Path | str, payload: Any) -> Path:
    """Write `payload` as indented JSON (atomically: a temporary file, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
    return path


def plot_ratios(path: Path | str, records: list[dict[str, Any]], title: str, subtitle: str = "") -> Path | None:
    """A bar chart of each record's `ratio` (log scale), with its `target` drawn as a tick over the bar.

    Bars are green where the target is met, red where it is missed, grey where there is no target.
    Returns None (and plots nothing) if matplotlib is not installed.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written", file=sys.stderr)
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = [r["name"] + (f"\nvs {r['reference']}" if r.get("reference") else "") for r in records]
    ratios = [r["ratio"] for r in records]
    colors = ["0.6" if r.get("target") is None else ("tab:green" if r.get("passed") else "tab:red") for r in records]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(records) + 2), 5.0))
    xs = range(len(records))
    ax.bar(xs, ratios, color=colors, edgecolor="black", linewidth=0.5)
    for x, r in zip(xs, records):
        if r.get("target") is not None:
            ax.hlines(r["target"], x - 0.45, x + 0.45, colors="black", linestyles="--", linewidth=1.5)
            ax.annotate(f"target {r['target']:g}x", (x, r["target"]), ha="center", va="bottom", fontsize=7,
                        xytext=(0, 2), textcoords="offset points")
        ax.annotate(f"{r['ratio']:.2f}x", (x, r["ratio"]), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_yscale("log")
    top = max(ratios + [r["target"] for r in records if r.get("target") is not None])
    ax.set_ylim(min(0.5, min(ratios) / 1.5), top * 2.0)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("time ratio fold / reference (log scale)")
    ax.set_title(title + ("\n" + subtitle if subtitle else ""), fontsize=9)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color="tab:green", label="target met"), Patch(color="tab:red", label="target missed"),
                       Patch(color="0.6", label="no target (information)"),
                       Line2D([], [], color="black", linestyle="--", label="target")], fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def save_figure(fig: Any, path: Path | str, title: str, dpi: int = 110) -> Path:
    """Title, lay out, write and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)


def benchmark_parser(module: str, doc: str, quick_help: str, repeats: int, repeats_help: str):
    """The command line every benchmark shares: --quick and --repeats (checked positive after parsing)."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{module}", description=doc.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--repeats", type=int, default=repeats, help=repeats_help)
    return parser


def parse_benchmark_args(parser: Any, argv: list[str] | None) -> Any:
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be positive")
    return args


def traced_peak(fn: Callable[[], Any]) -> int:
    """Bytes allocated at the peak of one call of `fn` beyond what was allocated before it (tracemalloc;
    NumPy reports its buffers to it). The result is dropped before returning."""
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = fn()
        peak = tracemalloc.get_traced_memory()[1]
        del out
    finally:
        tracemalloc.stop()
    gc.collect()
    return int(peak - base)


def status_bytes(field: str) -> int | None:
    """A memory field of this process's /proc/self/status in bytes ("VmRSS": resident now, "VmHWM": its peak
    since the process started or since `reset_peak_rss`), or None where /proc has none.

    Why not `resource.getrusage(RUSAGE_SELF).ru_maxrss`: Linux keeps the peak of the address space a process
    had before exec, so a process started by fork + exec (a Dask worker, a multiprocessing child) reports at
    least its parent's RSS at the fork, whatever it did itself. VmHWM belongs to the process's own memory."""
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux: "5" to /proc/self/clear_refs), so
    that the next reading of VmHWM is the peak of what ran since. False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="utf-8") as f:
            f.write("5")
    except OSError:
        return False
    return status_bytes("VmHWM") is not None
