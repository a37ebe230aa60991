"""Segmented reduce and scan: each row of (rows, length) leaves folded (scanned) on its own, one block per
row.

A row's threads each fold a contiguous run of about length / threads elements; the block then combines
their partials pairwise in order (codegen.tree_fold), or scans them (codegen.tree_scan) and each thread
walks its run again from the partials before its own. Non-commutative operators stay correct.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from . import host
from .codegen import combined, compile_kernel, lines, names, shared_arrays, tree_fold, tree_scan, walk


def segmented_reduce(combine: Callable, k: int, identity: Sequence[Any], leaves: Sequence[Any], *,
                     threads: int | None = None) -> tuple:
    """out[r] = the fold of row r's elements (k leaves, each a (rows, length) array) from `identity`: k
    arrays of `rows`, NumPy arrays for NumPy leaves and device arrays for device ones."""
    a = host.fold_arguments(combine, k, identity, leaves, threads, 1, ndim=2, min_span=1)
    (rows, length), threads = a.leaves[0].shape, a.launch.threads
    outs = host.empty(rows, a.dtypes)
    if rows:
        key = ("segmented_reduce", combine, a.dtypes, threads)
        kernel = compile_kernel(key, lambda: _segmented_source(a.dtypes, threads), {"combine": combine})
        host.start(kernel, rows, threads, *host.to_device(a.leaves), *a.ident, length, *outs)
    return host.returned(outs, a.on_host)


def segmented_scan(combine: Callable, k: int, identity: Sequence[Any], leaves: Sequence[Any], exclusive: bool = False,
                   reverse: bool = False, *, threads: int | None = None) -> tuple:
    """Each row's prefixes (suffixes if `reverse`), including the element or (`exclusive`) not: k arrays
    of (rows, length), NumPy arrays for NumPy leaves and device arrays for device ones."""
    a = host.fold_arguments(combine, k, identity, leaves, threads, 1, ndim=2, min_span=1)
    (rows, length), threads = a.leaves[0].shape, a.launch.threads
    outs = [host.empty(rows * length, [d])[0].reshape(rows, length) for d in a.dtypes]
    if rows and length:
        flags = (bool(exclusive), bool(reverse))
        key = ("segmented_scan", combine, a.dtypes, threads, flags)
        kernel = compile_kernel(key, lambda: _segmented_scan_source(a.dtypes, threads, *flags), {"combine": combine})
        host.start(kernel, rows, threads, *host.to_device(a.leaves), *a.ident, length, *outs)
    return host.returned(outs, a.on_host)


def _row_partials(dtypes: tuple, threads: int, at: str, flip: bool) -> str:
    """A kernel's signature and the text that folds thread t's run of row r (cuda.blockIdx.x) into
    `acc0, ...` and `s0[t], ...`; `at` indexes the row with the walk's position i."""
    k = len(dtypes)
    x = ", ".join(f"x{j}[r, {at}]" for j in range(k))
    return f"""def kernel({names("x", k)}, {names("id", k)}, length, {names("out", k)}):
    t = cuda.threadIdx.x
    r = cuda.blockIdx.x
{shared_arrays("s", dtypes, threads, 4)}
    run = (length + {threads - 1}) // {threads}
    stop = t * run + run
    if stop > length:  # not min(): the CUDA target types min through an overload that fails here
        stop = length
{lines("acc{j} = id{j}", k, 4)}
    for i in range(t * run, stop):
        {combined(names("acc", k), names("acc", k), x, flip)}
{lines("s{j}[t] = acc{j}", k, 4)}"""


def _segmented_source(dtypes: tuple, threads: int) -> str:
    k = len(dtypes)
    return f"""{_row_partials(dtypes, threads, "i", False)}
{tree_fold(k, threads, False, 4)}
    if t == 0:
{lines("out{j}[r] = s{j}[0]", k, 8)}
"""


def _segmented_scan_source(dtypes: tuple, threads: int, exclusive: bool, reverse: bool) -> str:
    k = len(dtypes)
    at = "length - 1 - i" if reverse else "i"
    return f"""{_row_partials(dtypes, threads, at, reverse)}
{tree_scan(k, threads, reverse, 4)}
{lines("acc{j} = id{j}", k, 4)}
    if t > 0:
{lines("acc{j} = s{j}[t - 1]", k, 8)}
    for i in range(t * run, stop):
{walk(k, "x{j}[r, " + at + "]", "out{j}[r, " + at + "]", exclusive, reverse, 8)}
"""
