"""Histogram (reduce by index): out[b] = e . x_{i_1} . x_{i_2} . ... over the i with indices[i] == b, in
increasing i; indices outside [0, n_bins) are ignored, and a bin that receives nothing holds e.

Any operator: W workers (threads) each fold a contiguous chunk of the elements into a private histogram in
global memory (W x n_bins per leaf), then one thread per bin folds the W private values in worker order, so
every bin sees its elements in order and non-commutative operators are correct. W is as large as the
private histograms' budget allows, and no larger than gives each worker 4 elements per bin.

A recognised + of one scalar leaf (`operator="add"`, identity 0) instead adds every element into its bin
with an atomic add: no private histograms, whatever the number of bins; float sums then round in an order
that varies from run to run.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from numba import cuda

from . import host
from .codegen import combined, compile_kernel, lines, names

# Private histogram slots per leaf (W x n_bins): 2^22 float64 values are 32 MiB.
PRIVATE_SLOTS = 1 << 22
ELEMENTS_PER_BIN = 4
ATOMIC_DTYPES = (np.float32, np.float64, np.int32, np.int64, np.uint32, np.uint64)


def histogram(combine: Callable, k: int, identity: Sequence[Any], n_bins: int, indices: Any, leaves: Sequence[Any],
              *, operator: str | None = None, workers: int | None = None, threads: int | None = None) -> tuple:
    """k arrays of n_bins (NumPy arrays for NumPy leaves and device arrays for device ones). `operator`
    names a recognised operation, as in kernels.cpu ("add" takes the atomic path; others change nothing);
    `workers` overrides the number of private histograms."""
    a = host.fold_arguments(combine, k, identity, leaves, threads, 1, min_span=1)
    if not hasattr(indices, "shape") or len(indices.shape) != 1 or np.dtype(indices.dtype).kind not in "iu":
        got = f"shape {tuple(indices.shape)}, dtype {indices.dtype}" if hasattr(indices, "shape") else type(indices).__name__
        raise ValueError(f"indices must be a 1-D integer array, got {got}")
    if indices.shape[0] != a.n or host.is_host(indices) != a.on_host:
        raise ValueError(f"indices: {indices.shape[0]} indices for {a.n} elements; both on the host or both on the device")
    if not host.is_int(n_bins) or n_bins < 0:
        raise ValueError(f"n_bins must be an integer >= 0, got {n_bins!r}")
    outs = host.empty(int(n_bins), a.dtypes)
    if n_bins:
        on_device = host.to_device([indices, *a.leaves])
        if operator == "add" and len(a.dtypes) == 1 and a.dtypes[0] in ATOMIC_DTYPES and a.ident[0] == 0:
            _atomic_add(on_device[0], on_device[1], a.n, outs[0], a.launch)
        else:
            _private_histograms(combine, a.ident, on_device[0], on_device[1:], a.n, outs, a.launch, workers)
    return host.returned(outs, a.on_host)


def _atomic_add(indices, values, n: int, out, shape: host.Launch) -> None:
    zero = compile_kernel(("fill",), lambda: _FILL_SOURCE, {})
    host.start(zero, shape.blocks(out.shape[0]), shape.threads, out, out.dtype.type(0))
    if n:
        add = compile_kernel(("atomic_add",), lambda: _ATOMIC_ADD_SOURCE, {})
        host.start(add, shape.blocks(n), shape.threads, indices, values, n, out)


def _private_histograms(combine: Callable, ident: tuple, indices, leaves: list, n: int, outs: list,
                        shape: host.Launch, workers: int | None) -> None:
    n_bins, dtypes = outs[0].shape[0], tuple(np.dtype(o.dtype) for o in outs)
    if workers is None:
        workers = min(max(1, PRIVATE_SLOTS // n_bins), max(1, n // (ELEMENTS_PER_BIN * n_bins)))
    workers = host.check_count(workers, "workers")
    chunk = max(1, -(-n // workers))
    private = [host.device_array((workers, n_bins), d) for d in dtypes]
    k = len(dtypes)
    fill = compile_kernel(("private_fold", combine, dtypes), lambda: _private_source(k), {"combine": combine})
    host.start(fill, -(-workers // shape.threads), shape.threads, indices, *leaves, *ident, n, chunk, *private)
    merge = compile_kernel(("merge_private", combine, dtypes), lambda: _merge_source(k), {"combine": combine})
    host.start(merge, shape.blocks(n_bins), shape.threads, *private, *outs)


_FILL_SOURCE = """def kernel(out, value):
    b = cuda.grid(1)
    if b < out.shape[0]:
        out[b] = value
"""

_ATOMIC_ADD_SOURCE = """def kernel(idx, x, n, out):
    i = cuda.grid(1)
    if i < n:
        s = idx[i]
        if s >= 0 and s < out.shape[0]:
            cuda.atomic.add(out, s, x[i])
"""


def _private_source(k: int) -> str:
    own = ", ".join(f"p{j}[w, s]" for j in range(k))
    return f"""def kernel(idx, {names("x", k)}, {names("id", k)}, n, chunk, {names("p", k)}):
    w = cuda.grid(1)
    if w < p0.shape[0]:
        for b in range(p0.shape[1]):
{lines("p{j}[w, b] = id{j}", k, 12)}
        stop = w * chunk + chunk
        if stop > n:
            stop = n
        for i in range(w * chunk, stop):
            s = idx[i]
            if s >= 0 and s < p0.shape[1]:
                {combined(names("acc", k), own, ", ".join(f"x{j}[i]" for j in range(k)), False)}
{lines("p{j}[w, s] = acc{j}", k, 16)}
"""


def _merge_source(k: int) -> str:
    return f"""def kernel({names("p", k)}, {names("out", k)}):
    b = cuda.grid(1)
    if b < out0.shape[0]:
{lines("acc{j} = p{j}[0, b]", k, 8)}
        for w in range(1, p0.shape[0]):
            {combined(names("acc", k), names("acc", k), ", ".join(f"p{j}[w, b]" for j in range(k)), False)}
{lines("out{j}[b] = acc{j}", k, 8)}
"""
