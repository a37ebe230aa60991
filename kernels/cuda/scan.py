"""Scan in three phases: each block's total (fold.block_totals), an exclusive scan of the totals (this same
scan, recursively, until one block holds them), and a pass in which every block scans its span starting
from its prefix.

Within a block each thread folds its `items` consecutive elements, the threads' partials are scanned in
shared memory (Hillis and Steele: partial t - offset on the left of partial t, for offsets 1, 2, 4, ...),
and each thread then walks its elements again from the block's prefix and the partials before its own. A
reverse scan walks the elements last to first with the operands swapped: y_i = x_i . (x_{i+1} . ...).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from numba import cuda

from . import host
from .codegen import combined, compile_kernel, lines, names, shared_arrays, tree_scan, walk
from .fold import block_totals


def scan(combine: Callable, k: int, identity: Sequence[Any], leaves: Sequence[Any], exclusive: bool = False,
         reverse: bool = False, *, threads: int | None = None, items: int | None = None) -> tuple:
    """Every prefix (suffix if `reverse`) of the n elements folded with `combine`, including the element at
    i or (`exclusive`) not: k arrays of n, NumPy arrays for NumPy leaves and device arrays for device ones."""
    a = host.fold_arguments(combine, k, identity, leaves, threads, items)
    outs = host.empty(a.n, a.dtypes)
    if a.n:
        _scan_into(combine, a.ident, host.to_device(a.leaves), a.n, outs, a.launch, exclusive=bool(exclusive),
                   reverse=bool(reverse), flip=bool(reverse))
    return host.returned(outs, a.on_host)


def _scan_into(combine: Callable, ident: tuple, leaves: list, n: int, outs: list, shape: host.Launch, *,
               exclusive: bool, reverse: bool, flip: bool) -> None:
    blocks = shape.blocks(n)
    if blocks == 1:
        prefixes = [cuda.to_device(np.array([v])) for v in ident]
    else:
        totals = block_totals(combine, ident, leaves, n, shape, reverse=reverse, flip=flip)
        prefixes = host.empty(blocks, [t.dtype for t in totals])
        _scan_into(combine, ident, totals, blocks, prefixes, shape, exclusive=True, reverse=False, flip=flip)
    dtypes = tuple(np.dtype(a.dtype) for a in leaves)
    key = ("block_scan", combine, dtypes, shape, exclusive, reverse, flip)
    kernel = compile_kernel(key, lambda: _block_scan_source(dtypes, shape, exclusive, reverse, flip),
                            {"combine": combine})
    host.start(kernel, blocks, shape.threads, *leaves, *ident, n, *prefixes, *outs)


def _block_scan_source(dtypes: tuple, shape: host.Launch, exclusive: bool, reverse: bool, flip: bool) -> str:
    k = len(dtypes)
    at = "n - 1 - i" if reverse else "i"
    x = ", ".join(f"x{j}[{at}]" for j in range(k))
    return f"""def kernel({names("x", k)}, {names("id", k)}, n, {names("pre", k)}, {names("out", k)}):
    t = cuda.threadIdx.x
    start = cuda.blockIdx.x * {shape.span} + t * {shape.items}
{shared_arrays("s", dtypes, shape.threads, 4)}
{lines("acc{j} = pre{j}[cuda.blockIdx.x]", k, 4)}
{lines("own{j} = id{j}", k, 4)}
    for q in range({shape.items}):
        i = start + q
        if i < n:
            {combined(names("own", k), names("own", k), x, flip)}
{lines("s{j}[t] = own{j}", k, 4)}
{tree_scan(k, shape.threads, flip, 4)}
    if t > 0:
        {combined(names("acc", k), names("acc", k), ", ".join(f"s{j}[t - 1]" for j in range(k)), flip)}
    for q in range({shape.items}):
        i = start + q
        if i < n:
{walk(k, "x{j}[" + at + "]", "out{j}[" + at + "]", exclusive, flip, 12)}
"""
