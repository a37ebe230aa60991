"""The gemm_map_reduce benchmark: Table 1 layers in fold vs the naive, materialised NumPy formulas.

    python -m benchmarks.bench_gemm            # the issue's sizes (slow: tens of minutes, many GiB for naive)
    python -m benchmarks.bench_gemm --quick    # small sizes: a smoke test
    python -m benchmarks.bench_gemm --backend numba --only mlp --threads 1   # the MLP on the numba backend

Layers (float32, the numpy backend unless --backend says otherwise), each implementation run in its own
process (this module with --worker), so that every peak memory is that implementation's own:

- attention softmax(Q K^T / sqrt(F)) V with M = N in {1024, 4096, 16384}, F = D = 64;
- cross-entropy of the logits P C^T against class indices, M = 8192 rows, D = 256, vocabulary N in
  {32768, 131072};
- the paper's two-layer MLP sigmoid(X P) Q with B = K in {8192, 16384}, D = 128 (X: B x D, P: D x K, Q: K x D).

Implementations: "fold" (examples/gemm_layers.py on fold.gemm_map_reduce, the default block size; backward
by fold.vjp), "naive" (the materialised formulas with their hand-written backward from examples/gemm_layers.py,
forward-only versions written here), and, for attention, "torch" (torch.nn.functional.
scaled_dot_product_attention and autograd) when torch is importable.

What each worker measures, warm (one untimed call of each function first: it compiles, on numba):
- forward time and forward+backward time (the output and the cotangents of every float input): the median
  of `--repeats` calls (fewer when the calls are slow, see `--time-budget`);
- peak RSS of a forward call and of a forward+backward call ("raw"), and the same less the worker's
  baseline ("net"): its resident set (VmRSS) after imports, input creation, tracing and the warm-up calls.
  The workers run with fold's malloc retention off (FOLD_KEEP_FREED_MEMORY=0) and glibc returning every
  buffer over 64 KiB to the system when it is freed (MALLOC_MMAP_THRESHOLD_=65536), so that what a warm-up
  call freed is not reused unseen by the measured call. The peak is
  the kernel's high-water mark VmHWM, reset to the current RSS before each call (/proc/self/clear_refs);
  `resource.getrusage(RUSAGE_SELF).ru_maxrss` is recorded too, but it cannot be reset and a child process
  inherits its parent's, so it is only an upper bound (it is the fallback where VmHWM cannot be reset);
- tracemalloc peak of one forward call and of one forward+backward call (what the call allocates through
  Python/NumPy; inputs already exist and are not counted).
Ratios are fold / naive. Targets: peak memory (net RSS and tracemalloc of forward+backward) at most 5% of
naive at the MLP size, at M = N = 16384 attention and at N = 131072 cross-entropy; forward+backward time at
most 1.5x naive at every size. A naive case that would not fit in the memory available (estimated from the
smaller sizes measured in the same run, else from a count of M x N matrices) or that runs past the worker
timeout is recorded as skipped, with the reason and the memory it would need.

Writes benchmarks/results/gemm_<backend>.json and .png (gemm_<backend>_quick.* with --quick).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .common import (RESULTS_DIR, benchmark_parser, machine, machine_line, mem_available, parse_benchmark_args,
                     reset_peak_rss, save_figure, status_bytes, traced_peak, write_json)

BACKEND = "numpy"
DTYPE = np.float32
MEMORY_TARGET = 0.05
TIME_TARGET = 1.5
MARK = "BENCH_GEMM_RESULT "
ROOT = Path(__file__).resolve().parent.parent

# (layer, sizes, whether the memory target applies); the MLP's sizes follow the paper's names
FULL_CASES = [
    ("attention", {"M": 1024, "N": 1024, "F": 64, "D": 64}, False),
    ("attention", {"M": 4096, "N": 4096, "F": 64, "D": 64}, False),
    ("attention", {"M": 16384, "N": 16384, "F": 64, "D": 64}, True),
    ("cross_entropy", {"M": 8192, "N": 32768, "D": 256}, False),
    ("cross_entropy", {"M": 8192, "N": 131072, "D": 256}, True),
    ("mlp", {"B": 8192, "K": 8192, "D": 128}, True),
    ("mlp", {"B": 16384, "K": 16384, "D": 128}, True),
]
QUICK_CASES = [  # a smoke test: at these sizes one default block covers most of the matrix, so no targets
    ("attention", {"M": 256, "N": 256, "F": 32, "D": 32}, False),
    ("attention", {"M": 1024, "N": 1024, "F": 32, "D": 32}, False),
    ("cross_entropy", {"M": 512, "N": 2048, "D": 64}, False),
    ("cross_entropy", {"M": 512, "N": 8192, "D": 64}, False),
    ("mlp", {"B": 2048, "K": 2048, "D": 32}, False),
]
# M x N float32 matrices the naive formulas hold at once (for the estimate when no smaller size was measured)
NAIVE_MATRICES = {"attention": 6, "cross_entropy": 4, "mlp": 6}


def _mn(layer: str, sizes: dict) -> tuple[int, int]:
    return (sizes["B"], sizes["K"]) if layer == "mlp" else (sizes["M"], sizes["N"])


def _label(layer: str, sizes: dict) -> str:
    return f"{layer} " + " ".join(f"{k}={v}" for k, v in sizes.items())


# ------------------------------------------------------------------------------------------ the functions

def make_inputs(layer: str, sizes: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs and the output cotangent, float32 (targets int64); the same in every worker."""
    rng = np.random.default_rng(seed)
    r = lambda *shape: rng.standard_normal(shape, dtype=np.float32)  # noqa: E731
    if layer == "attention":
        m, n, f, d = sizes["M"], sizes["N"], sizes["F"], sizes["D"]
        return {"Q": r(m, f), "K": r(n, f), "V": r(n, d), "G": r(m, d)}
    if layer == "cross_entropy":
        m, n, d = sizes["M"], sizes["N"], sizes["D"]
        return {"P": r(m, d) / np.float32(np.sqrt(d)), "C": r(n, d), "targets": rng.integers(0, n, m), "g": r(m)}
    if layer == "mlp":
        b, k, d = sizes["B"], sizes["K"], sizes["D"]
        return {"X": r(b, d), "P": r(d, k) / np.float32(np.sqrt(d)), "Q": r(k, d) / np.float32(np.sqrt(k)), "G": r(b, d)}
    raise ValueError(layer)


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def naive_functions(layer: str, x: dict) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(forward, forward+backward) of the materialised formulas; the backward passes are examples/gemm_layers'."""
    from examples import gemm_layers as L

    if layer == "attention":
        scale = np.float32(1.0 / np.sqrt(x["Q"].shape[1]))
        return (lambda: _softmax_rows(x["Q"] @ x["K"].T * scale) @ x["V"],
                lambda: L.attention_naive(x["Q"], x["K"], x["V"], x["G"]))
    if layer == "cross_entropy":
        def forward():
            logits = x["P"] @ x["C"].T
            mx = logits.max(1)
            lse = np.log(np.exp(logits - mx[:, None]).sum(1)) + mx
            return lse - logits[np.arange(len(x["targets"])), x["targets"]]

        return forward, lambda: L.cross_entropy_naive(x["P"], x["C"], x["targets"], x["g"])
    if layer == "mlp":
        return (lambda: (1.0 / (1.0 + np.exp(-(x["X"] @ x["P"])))) @ x["Q"],
                lambda: L.mlp_naive(x["X"], x["P"], x["Q"], x["G"]))
    raise ValueError(layer)


def fold_functions(layer: str, x: dict) -> tuple[Callable[[], Any], Callable[[], Any], dict]:
    """(forward, forward+backward, info) of the gemm_map_reduce layer, jitted on the numpy backend."""
    import fold
    from fold.ad import vjp_program
    from examples import gemm_layers as L
    from fold.inline import inline_program

    if layer == "attention":
        args, cot, f = (x["Q"], x["K"], x["V"]), x["G"], L.attention
    elif layer == "cross_entropy":
        args, cot, f = (x["P"], x["C"], x["targets"]), x["g"], L.cross_entropy
    elif layer == "mlp":
        args, cot, f = (x["X"], x["P"], x["Q"]), x["G"], L.mlp
    else:
        raise ValueError(layer)
    forward = fold.jit(f, backend=BACKEND)
    # one gradient program that also returns the output (the forward runs once, as in fold.value_and_grad)
    grad_program, _ = vjp_program(fold.trace(f, *args), with_primal_outputs=True)
    both = fold.jit(lambda *a: inline_program(grad_program, list(a)), backend=BACKEND)

    def info() -> dict:
        fwd_program = forward.program(*args)
        block = next((s.prim.block for s in fwd_program.stmts if s.prim.name == "gemm_map_reduce"), None)
        return {"block": list(block) if block else None, "fold_memory_forward_bytes": int(fold.memory(fwd_program)),
                "fold_memory_forward_backward_bytes": int(fold.memory(grad_program))}

    return lambda: forward(*args), lambda: both(*args, cot), info


def torch_functions(layer: str, x: dict) -> tuple[Callable[[], Any], Callable[[], Any]]:
    import torch
    import torch.nn.functional as F

    if layer != "attention":
        raise ValueError(layer)
    q, k, v, g = (torch.from_numpy(x[name]) for name in ("Q", "K", "V", "G"))

    def forward():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q[None], k[None], v[None])[0]

    def both():
        qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
        out = F.scaled_dot_product_attention(qq[None], kk[None], vv[None])[0]
        out.backward(g)
        return out.detach(), (qq.grad, kk.grad, vv.grad)

    return forward, both


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except Exception:  # not installed (the default), or broken
        return False
    return True


# ------------------------------------------------------------------------------------------ the worker

def set_backend(name: str) -> None:
    """The backend fold's workers run on (this process's and, through FOLD_BACKEND, theirs)."""
    global BACKEND
    BACKEND = name


def _maxrss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux


def _reset_peak_rss() -> bool:
    return reset_peak_rss()


def _peak_rss_bytes(reset_ok: bool) -> int:
    """VmHWM since the reset, or ru_maxrss (an upper bound: it cannot be reset, and a child inherits its
    parent's at fork/exec) where the reset failed."""
    return (status_bytes("VmHWM") if reset_ok else None) or _maxrss_bytes()


def _current_rss_bytes() -> int:
    return status_bytes("VmRSS") or _maxrss_bytes()


def _leaves(tree: Any) -> list[np.ndarray]:
    if isinstance(tree, (tuple, list)):
        return [leaf for t in tree for leaf in _leaves(t)]
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in _leaves(tree[k])]
    return [np.asarray(tree.numpy() if hasattr(tree, "numpy") else tree)]


def _summary(result: Any) -> list[float]:
    """Float64 norms of the output and of every float cotangent (compared across workers)."""
    return [float(np.linalg.norm(np.asarray(a, np.float64))) for a in _leaves(result) if np.asarray(a).dtype.kind == "f"]


def _timed(fn: Callable[[], Any], repeats: int, budget: float) -> tuple[float, list[float]]:
    samples: list[float] = []
    spent = 0.0
    while len(samples) < repeats and (not samples or spent < budget):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
        spent += samples[-1]
    return statistics.median(samples), samples


def worker(spec: dict) -> dict:
    """Measure one implementation of one case in this process (see the module docstring)."""
    import fold  # noqa: F401  (imports count towards the baseline, for every implementation alike)
    import examples.gemm_layers  # noqa: F401

    layer, sizes, impl = spec["layer"], spec["sizes"], spec["impl"]
    set_backend(spec.get("backend", "numpy"))
    load = list(os.getloadavg())
    x = make_inputs(layer, sizes)
    info_fn = None
    if impl == "fold":
        forward, both, info_fn = fold_functions(layer, x)
    elif impl == "naive":
        forward, both = naive_functions(layer, x)
    elif impl == "torch":
        forward, both = torch_functions(layer, x)
    else:
        raise ValueError(impl)
    np.ones((64, 64), DTYPE) @ np.ones((64, 64), DTYPE)  # BLAS buffers into the baseline
    start = time.perf_counter()
    forward()  # warm-up calls: they compile (numba); what they free goes back to the system (see run_worker)
    first_forward = time.perf_counter() - start
    start = time.perf_counter()
    both()
    first_both = time.perf_counter() - start
    gc.collect()
    baseline, baseline_maxrss = _current_rss_bytes(), _maxrss_bytes()
    reset_ok = _reset_peak_rss()
    forward()
    gc.collect()
    rss_forward, maxrss_forward = _peak_rss_bytes(reset_ok), _maxrss_bytes()
    reset_ok = reset_ok and _reset_peak_rss()
    result = both()
    rss_both, maxrss_both = _peak_rss_bytes(reset_ok), _maxrss_bytes()
    summary = _summary(result)
    del result
    gc.collect()
    budget = spec.get("time_budget", 120.0)
    t_forward, s_forward = _timed(forward, spec["repeats"], budget)
    t_both, s_both = _timed(both, spec["repeats"], budget)
    record = {
        "impl": impl, "backend": BACKEND if impl == "fold" else None, "layer": layer, "sizes": sizes, "loadavg_at_start": load, "loadavg_at_end": list(os.getloadavg()),
        "blas_threads": {name: os.environ.get(name) for name in THREAD_VARIABLES},
        "input_bytes": int(sum(a.nbytes for a in x.values())),
        "forward_seconds": t_forward, "forward_samples": s_forward,
        "forward_backward_seconds": t_both, "forward_backward_samples": s_both,
        "first_call_seconds": {"forward": first_forward, "forward_backward": first_both},
        "rss_peak_source": "VmHWM, reset before each call" if reset_ok else "ru_maxrss",
        "rss_baseline_bytes": baseline, "rss_baseline_maxrss_bytes": baseline_maxrss,
        "ru_maxrss_after_forward_bytes": maxrss_forward, "ru_maxrss_after_forward_backward_bytes": maxrss_both,
        "rss_peak_forward_bytes": rss_forward, "rss_peak_forward_backward_bytes": rss_both,
        "rss_net_forward_bytes": rss_forward - baseline, "rss_net_forward_backward_bytes": rss_both - baseline,
        "tracemalloc_forward_bytes": traced_peak(forward),
        "tracemalloc_forward_backward_bytes": traced_peak(both),
        "summary_norms": summary,
    }
    if info_fn is not None:
        record.update(info_fn())
    return record


# ------------------------------------------------------------------------------------------ the driver

def _estimate_naive_bytes(layer: str, sizes: dict, measured: list[dict]) -> tuple[int, str]:
    """Peak bytes the naive formulas would need: scaled from the largest smaller size measured in this run
    (net RSS grows with M x N), else NAIVE_MATRICES M x N float32 matrices plus the inputs."""
    m, n = _mn(layer, sizes)
    prior = [r for r in measured if r["layer"] == layer and r.get("impl") == "naive" and "rss_net_forward_backward_bytes" in r]
    if prior:
        ref = max(prior, key=lambda r: np.prod(_mn(layer, r["sizes"])))
        rm, rn = _mn(layer, ref["sizes"])
        scaled = ref["rss_net_forward_backward_bytes"] * (m * n) / (rm * rn)
        return int(scaled), f"scaled by M*N from the measured {_label(layer, ref['sizes'])}"
    inputs = sum(a.size for a in _input_shapes(layer, sizes)) * 4
    return int(NAIVE_MATRICES[layer] * m * n * 4 + inputs), f"{NAIVE_MATRICES[layer]} M x N float32 matrices"


def _input_shapes(layer: str, sizes: dict) -> list[np.ndarray]:
    # zero-strided arrays: only their .size is used
    return [np.broadcast_to(np.float32(0), s) for s in _shapes(layer, sizes)]


def _shapes(layer: str, s: dict) -> list[tuple[int, ...]]:
    if layer == "attention":
        return [(s["M"], s["F"]), (s["N"], s["F"]), (s["N"], s["D"]), (s["M"], s["D"])]
    if layer == "cross_entropy":
        return [(s["M"], s["D"]), (s["N"], s["D"]), (s["M"],), (s["M"],)]
    return [(s["B"], s["D"]), (s["D"], s["K"]), (s["K"], s["D"]), (s["B"], s["D"])]


THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def run_worker(spec: dict, timeout: float, threads: int | None = None) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.bench_gemm", "--worker", json.dumps(spec)]
    env = dict(os.environ, FOLD_BACKEND=BACKEND, FOLD_KEEP_FREED_MEMORY="0", MALLOC_MMAP_THRESHOLD_="65536",
               MALLOC_TRIM_THRESHOLD_="0")
    if threads is not None:
        env.update({name: str(threads) for name in THREAD_VARIABLES})
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"skipped": f"ran past the worker timeout of {timeout:.0f} s"}
    wall = time.perf_counter() - start
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            record = json.loads(line[len(MARK):])
            record["worker_wall_seconds"] = wall
            return record
    tail = (proc.stderr or proc.stdout)[-2000:]
    killed = proc.returncode in (-9, 137)
    return {"skipped" if killed else "failed": ("worker killed (signal 9: out of memory?)" if killed else
                                               f"worker exited with status {proc.returncode}"), "stderr_tail": tail}


def _ratio(a: Any, b: Any) -> float | None:
    return None if a is None or b is None or not b else float(a) / float(b)


def compare(case: dict, judge_time: bool = True) -> dict:
    """Ratios fold / naive, and the verdict on the targets (none for the time with judge_time=False)."""
    fold_r, naive_r = case["results"].get("fold", {}), case["results"].get("naive", {})
    keys = ["forward_seconds", "forward_backward_seconds", "rss_net_forward_bytes", "rss_net_forward_backward_bytes",
            "rss_peak_forward_backward_bytes", "tracemalloc_forward_bytes", "tracemalloc_forward_backward_bytes"]
    ratios = {k: _ratio(fold_r.get(k), naive_r.get(k)) for k in keys}
    checks: dict[str, Any] = {}
    if judge_time and ratios["forward_backward_seconds"] is not None:
        checks["time"] = {"target": TIME_TARGET, "ratio": ratios["forward_backward_seconds"],
                          "passed": ratios["forward_backward_seconds"] <= TIME_TARGET}
    if case["memory_target"]:
        mem = [ratios["rss_net_forward_backward_bytes"], ratios["tracemalloc_forward_backward_bytes"]]
        if None not in mem:
            checks["memory"] = {"target": MEMORY_TARGET, "ratio_rss_net": mem[0], "ratio_tracemalloc": mem[1],
                                "passed": max(mem) <= MEMORY_TARGET}
    agree = None
    if fold_r.get("summary_norms") and naive_r.get("summary_norms"):
        a, b = np.array(fold_r["summary_norms"]), np.array(naive_r["summary_norms"])
        if a.shape == b.shape:
            agree = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30)))
    return {"ratios": ratios, "checks": checks, "norms_max_rel_diff": agree,
            "passed": all(c["passed"] for c in checks.values()) if checks else None}


def _mib(x: Any) -> str:
    return "      -" if x is None else f"{x / 2**20:9.1f}"


def _sec(x: Any) -> str:
    return "      -" if x is None else f"{x:8.3f}"


def print_case(case: dict) -> None:
    print(f"  {case['label']}", flush=True)
    for impl, r in case["results"].items():
        if "skipped" in r or "failed" in r:
            print(f"    {impl:<6} {'skipped' if 'skipped' in r else 'FAILED'}: {r.get('skipped') or r.get('failed')}", flush=True)
            continue
        print(f"    {impl:<6} fwd {_sec(r['forward_seconds'])} s  fwd+bwd {_sec(r['forward_backward_seconds'])} s | "
              f"RSS net fwd {_mib(r['rss_net_forward_bytes'])} fwd+bwd {_mib(r['rss_net_forward_backward_bytes'])} MiB"
              f" (raw {_mib(r['rss_peak_forward_backward_bytes'])}) | tracemalloc fwd {_mib(r['tracemalloc_forward_bytes'])}"
              f" fwd+bwd {_mib(r['tracemalloc_forward_backward_bytes'])} MiB", flush=True)
    cmp = case.get("comparison")
    if cmp:
        r = cmp["ratios"]
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        verdict = "" if cmp["passed"] is None else ("  PASS" if cmp["passed"] else "  FAIL")
        print(f"    fold/naive: fwd {fmt(r['forward_seconds'])}x, fwd+bwd {fmt(r['forward_backward_seconds'])}x, "
              f"RSS net fwd+bwd {fmt(r['rss_net_forward_backward_bytes'])}, tracemalloc fwd+bwd "
              f"{fmt(r['tracemalloc_forward_backward_bytes'])}{verdict}"
              + (f"  [norms differ by {cmp['norms_max_rel_diff']:.1e}]" if cmp["norms_max_rel_diff"] is not None else ""),
              flush=True)


def plot(path, cases: list[dict], title: str) -> Any:
    """Peak memory (net RSS of forward+backward, top) and forward+backward time (bottom) against N, log-log,
    one column per layer; fold, naive (and torch)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written", file=sys.stderr)
        return None
    layers = list(dict.fromkeys(c["layer"] for c in cases))
    fig, axes = plt.subplots(2, len(layers), figsize=(4.8 * len(layers), 8.0), squeeze=False)
    colors = {"fold": "tab:blue", "naive": "tab:red", "torch": "tab:green"}
    for col, layer in enumerate(layers):
        rows = sorted((c for c in cases if c["layer"] == layer), key=lambda c: _mn(layer, c["sizes"])[1])
        impls = list(dict.fromkeys(i for c in rows for i in c["results"]))
        for impl in impls:
            pts = [(_mn(layer, c["sizes"])[1], c["results"][impl]) for c in rows
                   if impl in c["results"] and "forward_seconds" in c["results"][impl]]
            if not pts:
                continue
            ns = [p[0] for p in pts]
            axes[0][col].plot(ns, [p[1]["rss_net_forward_backward_bytes"] / 2**20 for p in pts], "-o", color=colors.get(impl),
                              label=f"{impl}, RSS net")
            axes[0][col].plot(ns, [max(p[1]["tracemalloc_forward_backward_bytes"], 1) / 2**20 for p in pts], ":^",
                              color=colors.get(impl), label=f"{impl}, tracemalloc")
            axes[1][col].plot(ns, [p[1]["forward_backward_seconds"] for p in pts], "-o", color=colors.get(impl),
                              label=f"{impl}, fwd+bwd")
            axes[1][col].plot(ns, [p[1]["forward_seconds"] for p in pts], ":^", color=colors.get(impl), label=f"{impl}, fwd")
        for c in rows:
            n = _mn(layer, c["sizes"])[1]
            naive = c["results"].get("naive", {})
            if "estimated_bytes" in naive:
                axes[0][col].plot([n], [naive["estimated_bytes"] / 2**20], "x", color="tab:red", markersize=9)
                axes[0][col].annotate("naive skipped\n(estimate)", (n, naive["estimated_bytes"] / 2**20), fontsize=7)
            cmp = c.get("comparison") or {}
            r = cmp.get("ratios", {})
            fold_r = c["results"].get("fold", {})
            if r.get("rss_net_forward_backward_bytes") is not None and "rss_net_forward_backward_bytes" in fold_r:
                axes[0][col].annotate(f"{r['rss_net_forward_backward_bytes']:.3f}",
                                      (n, max(fold_r["rss_net_forward_backward_bytes"], 1) / 2**20), fontsize=8,
                                      xytext=(4, -10), textcoords="offset points")
            if r.get("forward_backward_seconds") is not None:
                axes[1][col].annotate(f"{r['forward_backward_seconds']:.2f}x", (n, fold_r["forward_backward_seconds"]),
                                      fontsize=8, xytext=(4, 4), textcoords="offset points")
        dims = {k: v for k, v in rows[0]["sizes"].items()
                if k not in ("N", "K") and not (layer == "attention" and k == "M") and not (layer == "mlp" and k == "B")}
        axes[0][col].set_title(f"{layer}  ({', '.join(f'{k}={v}' for k, v in dims.items())}"
                               + {"attention": ", M=N", "mlp": ", B=K"}.get(layer, "") + ")", fontsize=9)
        xlabel = "K (hidden width; B = K)" if layer == "mlp" else ("M = N" if layer == "attention" else "N (vocabulary)")
        for row, ylabel in ((0, "peak memory of fwd+bwd (MiB)"), (1, "time, median (s)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", linewidth=0.3)
            ax.legend(fontsize=7)
    return save_figure(fig, path, title)


def _wrapped(text: str, width: int) -> str:
    """A figure title in lines of at most `width` characters (a one-column figure is narrow)."""
    import textwrap

    return "\n".join(textwrap.fill(part, width) for part in text.split("; "))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = benchmark_parser("bench_gemm", __doc__, "small sizes (a smoke test)", 3, "timed repeats per function (median reported)")
    parser.add_argument("--time-budget", type=float, default=150.0,
                        help="seconds of timed calls per function in a worker before it stops repeating (at least one)")
    parser.add_argument("--worker-timeout", type=float, default=1800.0, help="seconds before a worker is stopped")
    parser.add_argument("--only", default="", help="comma-separated layers to run (default: all)")
    parser.add_argument("--threads", type=int, default=None,
                        help="BLAS threads in the workers (sets OPENBLAS/OMP/MKL_NUM_THREADS; default: the library's "
                             "own choice). 1 gives steadier ratios on a machine shared with other work")
    parser.add_argument("--backend", default=BACKEND, choices=("numpy", "numba"), help="fold's backend (default numpy)")
    parser.add_argument("--note", default="", help="a note on the machine or the run, printed and recorded")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parse_benchmark_args(parser, argv)
    set_backend(args.backend)
    if args.worker is not None:
        record = worker(json.loads(args.worker))
        print(MARK + json.dumps(record), flush=True)
        return record
    info = machine()
    line = machine_line(info)
    info["mem_total_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    threads = "default" if args.threads is None else args.threads
    line = f"{line}, {info['mem_total_bytes'] / 2**30:.1f} GiB memory, BLAS threads {threads}" + (f"; {args.note}" if args.note else "")
    print(f"bench_gemm ({BACKEND} backend, float32{', quick' if args.quick else ''}): {line}", flush=True)
    only = {s for s in args.only.split(",") if s}
    impls = ["fold", "naive"]
    if torch_available():
        impls.append("torch")
    cases, measured = [], []
    for layer, sizes, memory_target in (QUICK_CASES if args.quick else FULL_CASES):
        if only and layer not in only:
            continue
        case = {"layer": layer, "sizes": sizes, "label": _label(layer, sizes), "memory_target": memory_target, "results": {}}
        for impl in impls:
            if impl == "torch" and layer != "attention":
                continue
            spec = {"layer": layer, "sizes": sizes, "impl": impl, "backend": BACKEND, "repeats": args.repeats, "time_budget": args.time_budget}
            if impl == "naive":
                need, how = _estimate_naive_bytes(layer, sizes, measured)
                available = mem_available()
                if available is not None and need > 0.85 * available:
                    case["results"][impl] = {"skipped": f"would need about {need / 2**30:.1f} GiB ({how}), "
                                                        f"{available / 2**30:.1f} GiB available", "estimated_bytes": need}
                    continue
            record = run_worker(spec, args.worker_timeout, args.threads)
            if impl == "naive" and ("skipped" in record or "failed" in record):
                record["estimated_bytes"] = _estimate_naive_bytes(layer, sizes, measured)[0]
            record.setdefault("impl", impl)
            record.setdefault("layer", layer)
            record.setdefault("sizes", sizes)
            case["results"][impl] = record
            measured.append(record)
        case["comparison"] = compare(case, judge_time=not args.quick)
        print_case(case)
        cases.append(case)
    suffix = "_quick" if args.quick else ""
    payload = {
        "benchmark": "gemm", "backend": BACKEND, "budget_variable": os.environ.get("FOLD_GEMM_BUDGET"), "dtype": "float32", "quick": args.quick, "repeats": args.repeats,
        "blas_threads": args.threads if args.threads is not None else "library default",
        "statistic": "median wall seconds of warm calls, each implementation in its own worker process; rss_net = "
                     "peak RSS (VmHWM, reset before the call) of the first call less the worker's VmRSS after imports "
                     "and inputs; tracemalloc "
                     "= peak of one call (inputs not counted); ratios fold / naive",
        "targets": None if args.quick else {
            "memory_ratio_at_most": MEMORY_TARGET, "memory_cases": [c["label"] for c in cases if c["memory_target"]],
            "forward_backward_time_ratio_at_most": TIME_TARGET},
        "machine": info, "machine_line": line, "cases": cases,
    }
    json_path = write_json(RESULTS_DIR / f"gemm_{BACKEND}{suffix}.json", payload)
    png_path = plot(RESULTS_DIR / f"gemm_{BACKEND}{suffix}.png", cases,
                    _wrapped(f"gemm_map_reduce (fold, {BACKEND} backend) vs naive NumPy, float32, each in its own "
                             f"process; {line}", 36 * len({c['layer'] for c in cases}) + 24))
    judged = [c for c in cases if c["comparison"]["passed"] is not None]
    failed = [c["label"] for c in judged if not c["comparison"]["passed"]]
    if judged:
        print(f"  {len(judged) - len(failed)}/{len(judged)} cases meet their targets" + (f"; missed: {'; '.join(failed)}" if failed else ""))
    else:
        print("  no targets at these sizes (a smoke test)")
    print(f"  wrote {json_path}" + (f" and {png_path}" if png_path else ""), flush=True)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
