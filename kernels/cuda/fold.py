"""Reduce: the elements folded in order, each block's span to one total, then the totals the same way.

A thread folds its `items` consecutive elements from the identity; the block's partials are combined
pairwise in shared memory, partial t with partial t + stride for strides 1, 2, 4, ..., so that every
combine has the earlier range on its left. `block_totals` is also the scan's first phase, where it may
walk the elements last to first (`reverse`) with the operands swapped (`flip`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from . import host
from .codegen import combined, compile_kernel, lines, names, shared_arrays, tree_fold


def reduce(combine: Callable, k: int, identity: Sequence[Any], leaves: Sequence[Any], *,
           threads: int | None = None, items: int | None = None) -> tuple:
    """The fold of the n elements (k leaves each) with `combine` from `identity`: k NumPy scalars."""
    a = host.fold_arguments(combine, k, identity, leaves, threads, items)
    if a.n == 0:
        return a.ident
    totals, n = host.to_device(a.leaves), a.n
    while True:
        totals = block_totals(combine, a.ident, totals, n, a.launch, reverse=False, flip=False)
        n = totals[0].shape[0]
        if n == 1:
            return tuple(t.copy_to_host()[0] for t in totals)


def block_totals(combine: Callable, ident: tuple, leaves: list, n: int, shape: host.Launch, *, reverse: bool,
                 flip: bool) -> list:
    """Device arrays of each block's total, in the order the blocks are walked."""
    dtypes = tuple(np.dtype(a.dtype) for a in leaves)
    key = ("block_totals", combine, dtypes, shape, reverse, flip)
    kernel = compile_kernel(key, lambda: _block_totals_source(dtypes, shape, reverse, flip), {"combine": combine})
    blocks = shape.blocks(n)
    totals = host.empty(blocks, dtypes)
    kernel[blocks, shape.threads](*leaves, *ident, n, *totals)
    return totals


def _block_totals_source(dtypes: tuple, shape: host.Launch, reverse: bool, flip: bool) -> str:
    k, threads = len(dtypes), shape.threads
    at = "n - 1 - i" if reverse else "i"
    return f"""def kernel({names("x", k)}, {names("id", k)}, n, {names("out", k)}):
    t = cuda.threadIdx.x
    start = cuda.blockIdx.x * {shape.span} + t * {shape.items}
{shared_arrays("s", dtypes, threads, 4)}
{lines("acc{j} = id{j}", k, 4)}
    for q in range({shape.items}):
        i = start + q
        if i < n:
            {combined(names("acc", k), names("acc", k), ", ".join(f"x{j}[{at}]" for j in range(k)), flip)}
{lines("s{j}[t] = acc{j}", k, 4)}
{tree_fold(k, threads, flip, 4)}
    if t == 0:
{lines("out{j}[cuda.blockIdx.x] = s{j}[0]", k, 8)}
"""
