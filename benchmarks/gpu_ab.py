"""The cuda backend's launch mechanisms, each on and off in one process on one GPU (not run in CI): where a
GPU is lent for a few minutes, this says which of them pays, measured side by side.

- `pool`: kernels.cuda allocates its results in CuPy's memory pool (device.use_memory_pool) or with Numba's
  own allocator (cuMemAlloc per array, frees in batches that synchronise the device).
- `rows`: kernels.cuda.map_over indexes a shape by rows on a 2-D grid (no division for the last axis) or
  unravels every element's flat index (a 64-bit division and remainder per axis).
- `summed`: a loop nest's fold of sums adds its chunks' partials with CuPy's reduction (as many chunks as
  keep the GPU busy) or merges them on one thread (chunks bounded by that merge's work).

Cases: one fused elementwise run over a gemm block of attention at 16384 (1548 x 3096 float32, a per-row
operand broadcast) through map_over, CuPy's three calls for the same; attention 4096 forward and
forward+backward; k-means' gradient for the centroids over 10^6 points (64 x 16). `python -m
benchmarks.gpu_ab` writes $OUT/gpu_ab.json (or ./gpu_ab.json)."""
from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

import fold
from benchmarks.bench_cuda import _sync, gpu_name, gpu_seconds
from examples.gemm_layers import attention
from fold.kernels.cuda import host
from fold.runtime.cuda_backend import device, loop_nests

map_module = importlib.import_module("fold.kernels.cuda.map")
SMALL = bool(os.environ.get("AB_SMALL"))  # a smoke test's sizes (the simulator)


@contextlib.contextmanager
def variant(pool: bool, rows: bool, summed: bool):
    """The backend with each mechanism on or off."""
    saved = (host._allocate, map_module.MIN_ROW, loop_nests.summed)
    if pool:
        device.use_memory_pool()
    else:
        host.use_allocator(None)
    map_module.MIN_ROW = 32 if rows else 1 << 62
    if not summed:
        loop_nests.summed = lambda fold: False
    try:
        yield
    finally:
        host._allocate, map_module.MIN_ROW, loop_nests.summed = saved


def block_run(repeats: int) -> dict:
    """exp(where(x, 0, h - m)) over a 1548 x 3096 float32 block, m one value per row."""
    import cupy
    from numba import cuda

    @cuda.jit(device=True)
    def shifted_exp(h, m, x):
        return math.exp(np.float32(0.0) if x else h - m)

    rng = np.random.default_rng(0)
    h = cupy.asarray(rng.normal(size=(1548, 3096)).astype(np.float32))
    m = cupy.asarray(rng.normal(size=(1548, 1)).astype(np.float32))
    x = h > 2.5
    mb = cupy.broadcast_to(m, h.shape)
    out = {}
    run = lambda: map_module.map_over(shifted_exp, [device.for_kernel(h), device.for_kernel(mb), device.for_kernel(x)],
                                      h.shape, [np.float32])
    out["map_over_seconds"] = gpu_seconds(run, repeats)
    samples = []
    for _ in range(repeats):  # the host's side alone: the call returns once the kernel is queued
        _sync()
        t = time.perf_counter()
        run()
        samples.append(time.perf_counter() - t)
    out["map_over_host_seconds"] = float(np.median(samples))
    out["cupy_seconds"] = gpu_seconds(lambda: cupy.exp(cupy.where(x, np.float32(0.0), h - mb)), repeats)
    return out


_made: dict = {}  # the jitted programs and their inputs, made once: each variant runs the same compiled kernels


def _once(name: str, make):
    if name not in _made:
        _made[name] = make()
    return _made[name]


def _attention():
    rng = np.random.default_rng(1)
    n, f = (64, 8) if SMALL else (4096, 64)
    Q, K, V, G = (device.to_device(rng.normal(size=(n, f)).astype(np.float32)) for _ in range(4))
    grad = lambda q, k, v, g: fold.vjp(attention, q, k, v)[1](g)  # noqa: E731
    return (fold.jit(attention, backend="cuda", results="device"), fold.jit(grad, backend="cuda", results="device"),
            (Q, K, V, G))


def attention_cases(repeats: int) -> dict:
    forward, backward, (Q, K, V, G) = _once("attention", _attention)
    return {"attention_4096_forward_seconds": gpu_seconds(lambda: forward(Q, K, V), repeats),
            "attention_4096_forward_backward_seconds": gpu_seconds(lambda: backward(Q, K, V, G), repeats)}


def _kmeans():
    M = fold.monoids

    def cost(C, P):
        return fold.reduce(M.sum, fold.map(
            lambda p: fold.reduce(M.min, fold.map(lambda c: fold.reduce(M.sum, (p - c) * (p - c)), C)), P))

    rng = np.random.default_rng(3)
    C, P = rng.normal(size=(64, 16)).astype(np.float32), rng.normal(size=(200 if SMALL else 10**6, 16)).astype(np.float32)
    return fold.jit(fold.grad(cost, argnums=0), backend="cuda", results="device"), [device.to_device(a) for a in (C, P)]


def kmeans_grad(repeats: int) -> dict:
    run, on_device = _once("kmeans", _kmeans)
    value = device.to_host(run(*on_device))
    return {"kmeans_grad_seconds": gpu_seconds(lambda: run(*on_device), repeats),
            "kmeans_grad_checksum": float(np.abs(value).sum())}


def statement_times(run, args) -> dict:
    """One warm call of `run` with a device synchronisation after each top-level statement: milliseconds and
    calls per (primitive, op), the 12 costliest, and the call's total."""
    import collections

    from fold.runtime import interpreter

    times, counts, depth = collections.Counter(), collections.Counter(), [0]
    original = interpreter._run_step

    def timed(step, values, d):
        depth[0] += 1
        try:
            if depth[0] != 1:
                return original(step, values, d)
            _sync()
            t = time.perf_counter()
            result = original(step, values, d)
            _sync()
            key = f"{step.prim.name}:{str(getattr(step.prim, 'op', ''))[:40]}"
            times[key] += time.perf_counter() - t
            counts[key] += 1
            return result
        finally:
            depth[0] -= 1

    run(*args)
    _sync()
    interpreter._run_step = timed
    try:
        t = time.perf_counter()
        run(*args)
        _sync()
        total = time.perf_counter() - t
    finally:
        interpreter._run_step = original
    return {"total_ms": total * 1e3, "rows": [(k, round(v * 1e3, 3), counts[k]) for k, v in times.most_common(12)]}


def profiles() -> dict:
    """Where the time of the slowest cases of bench_cuda goes, statement by statement."""
    rng = np.random.default_rng(1)
    n = 1000 if SMALL else 10**7
    p, s = rng.uniform(0.999, 1.001, n), rng.uniform(-1.0, 1.0, n)

    def affine_scan_sum(a, b):
        scanned = fold.scan(lambda x, y: (x[0] * y[0], y[0] * x[1] + y[1]), (a, b), identity=(1.0, 0.0))
        return fold.reduce(fold.monoids.sum, scanned[1])

    scan_grad = fold.jit(fold.grad(affine_scan_sum, argnums=(0, 1)), backend="cuda", results="device")
    forward, backward, (Q, K, V, G) = _once("attention", _attention)
    kmeans, on_device = _once("kmeans", _kmeans)
    out = {}
    for name, run, args in (("affine_scan_grad", scan_grad, [device.to_device(p), device.to_device(1e-3 * s)]),
                            ("kmeans_grad", kmeans, on_device), ("attention_4096_forward_backward", backward, (Q, K, V, G))):
        try:
            out[name] = statement_times(run, args)
        except Exception as err:  # noqa: BLE001
            out[name] = f"{type(err).__name__}: {str(err)[:300]}"
        print(name, json.dumps(out[name]), flush=True)
    return out


VARIANTS = [dict(pool=True, rows=True, summed=True), dict(pool=False, rows=True, summed=True),
            dict(pool=True, rows=False, summed=True), dict(pool=True, rows=True, summed=False),
            dict(pool=False, rows=False, summed=False), dict(pool=True, rows=True, summed=True)]  # the first again: drift


def main() -> Path:
    repeats = int(os.environ.get("AB_REPEATS", "5"))
    records = []
    for v in VARIANTS:
        record = dict(v)
        with variant(**v):
            for part in (block_run, attention_cases, kmeans_grad):
                try:
                    record.update(part(repeats))
                except Exception as err:  # noqa: BLE001 - one failing part must not lose the others' numbers
                    record[part.__name__ + "_error"] = f"{type(err).__name__}: {str(err)[:300]}"
        print(json.dumps(record), flush=True)
        records.append(record)
    out = Path(os.environ.get("OUT", ".")) / "gpu_ab.json"
    out.write_text(json.dumps({"gpu": gpu_name(), "records": records}, indent=1))  # kept if the profiles fail
    out.write_text(json.dumps({"gpu": gpu_name(), "records": records, "statements": profiles()}, indent=1))
    return out


if __name__ == "__main__":
    print(main(), file=sys.stderr)
