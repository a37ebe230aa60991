"""Reduce: two launches, the elements folded into a bounded number of block totals, then those by one block.

The first level runs at most `blocks` blocks (by default enough to fill the GPU: the multiprocessors times
the blocks of `threads` that each holds at once), so that the second level is one block and there are
exactly two launches whatever n is. How a block walks its elements depends on the operator:

- commutative (`commutative=True`, the caller's promise): a grid-stride loop, thread t of block b reading
  elements b * threads + t, then that plus threads x blocks, and so on: a warp reads consecutive elements
  (coalesced), `items` loads issued before their combines. The order of the combines is then not the
  elements' order, which a commutative and associative operator does not mind (float rounding differs).
- otherwise, in order: block b owns a contiguous run of tiles of `threads x items` elements and walks them
  first to last; in each tile thread t folds its `items` consecutive elements, the tile's partials are
  combined pairwise in shared memory (partial t with partial t + stride for strides 1, 2, 4, ..., the
  earlier range always on the left), and thread 0 folds the tile's total into the block's running total.

`block_totals` (the old single-tile-per-block first level) is the scan's first phase, where it may walk the
elements last to first (`reverse`) with the operands swapped (`flip`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from numba import cuda

from . import host
from .codegen import combined, compile_kernel, lines, names, shared_arrays, tree_fold

# Blocks of 256 threads a multiprocessor holds at once (2048 threads): the first level's grid fills the GPU.
BLOCKS_PER_SM = 8
SIMULATED_BLOCKS = 4  # the simulator runs every thread in Python: few blocks keep the tests quick


def reduce(combine: Callable, k: int, identity: Sequence[Any], leaves: Sequence[Any], *,
           threads: int | None = None, items: int | None = None, blocks: int | None = None,
           commutative: bool = False, keep_on_device: bool = False) -> tuple:
    """The fold of the n elements (k leaves each) with `combine` from `identity`: k NumPy scalars, or, with
    `keep_on_device` (device leaves only), k device arrays of one element each, left on the GPU.

    `blocks` bounds the first level's grid (default: enough to fill the GPU); `commutative` lets the
    first level read the elements in a coalesced grid-stride order instead of in order."""
    a = host.fold_arguments(combine, k, identity, leaves, threads, items)
    if keep_on_device and a.on_host:
        raise ValueError("keep_on_device: the leaves are NumPy arrays; pass device arrays to keep the result on the GPU")
    grid = max_blocks(a.launch.threads) if blocks is None else host.check_count(blocks, "blocks")
    if a.n == 0:
        if not keep_on_device:
            return a.ident
        return tuple(cuda.to_device(np.array([v], dtype=d)) for v, d in zip(a.ident, a.dtypes, strict=True))
    totals = grid_totals(combine, a.ident, host.to_device(a.leaves), a.n, a.launch, min(grid, a.launch.blocks(a.n)),
                         bool(commutative))
    if totals[0].shape[0] > 1:
        totals = grid_totals(combine, a.ident, totals, totals[0].shape[0], a.launch, 1, bool(commutative))
    return tuple(totals) if keep_on_device else tuple(t.copy_to_host()[0] for t in totals)


def max_blocks(threads: int) -> int:
    """The first level's default grid: every multiprocessor full of blocks of `threads` threads."""
    if host.SIMULATED:
        return SIMULATED_BLOCKS
    return cuda.get_current_device().MULTIPROCESSOR_COUNT * max(1, BLOCKS_PER_SM * 256 // threads)


def grid_totals(combine: Callable, ident: tuple, leaves: list, n: int, shape: host.Launch, blocks: int,
                commutative: bool) -> list:
    """Device arrays of the totals of `blocks` blocks that together fold the n elements (in order unless
    `commutative`)."""
    dtypes = tuple(np.dtype(a.dtype) for a in leaves)
    key = ("grid_totals", combine, dtypes, shape, commutative)
    source = _strided_source if commutative else _tiled_source
    kernel = compile_kernel(key, lambda: source(dtypes, shape), {"combine": combine})
    tiles = shape.blocks(n)
    totals = host.empty(blocks, dtypes)
    host.start(kernel, blocks, shape.threads, *leaves, *ident, n, -(-tiles // blocks), *totals)
    return totals


def _strided_source(dtypes: tuple, shape: host.Launch) -> str:
    """A commutative operator's first level: a grid-stride loop, `items` coalesced loads per step."""
    k, threads, items = len(dtypes), shape.threads, shape.items
    loads = "\n".join(f"            v{j}_{q} = x{j}[i + {q} * stride]" for q in range(items) for j in range(k))
    folds = "\n".join(" " * 12 + combined(names("acc", k), names("acc", k), ", ".join(f"v{j}_{q}" for j in range(k)), False)
                       for q in range(items))
    return f"""def kernel({names("x", k)}, {names("id", k)}, n, tiles_per_block, {names("out", k)}):
    t = cuda.threadIdx.x
{shared_arrays("s", dtypes, threads, 4)}
{lines("acc{j} = id{j}", k, 4)}
    stride = cuda.gridDim.x * {threads}
    i = cuda.blockIdx.x * {threads} + t
    while i + {items - 1} * stride < n:
{loads}
{folds}
            i += {items} * stride
    while i < n:
        {combined(names("acc", k), names("acc", k), ", ".join(f"x{j}[i]" for j in range(k)), False)}
        i += stride
{lines("s{j}[t] = acc{j}", k, 4)}
{tree_fold(k, threads, False, 4)}
    if t == 0:
{lines("out{j}[cuda.blockIdx.x] = s{j}[0]", k, 8)}
"""


def _tiled_source(dtypes: tuple, shape: host.Launch) -> str:
    """Any operator's first level, in order: a block walks its contiguous run of tiles first to last."""
    k, threads, items = len(dtypes), shape.threads, shape.items
    tot = names("tot", k)
    return f"""def kernel({names("x", k)}, {names("id", k)}, n, tiles_per_block, {names("out", k)}):
    t = cuda.threadIdx.x
{shared_arrays("s", dtypes, threads, 4)}
{lines("tot{j} = id{j}", k, 4)}
    tile = cuda.blockIdx.x * tiles_per_block
    last = tile + tiles_per_block
    if last * {shape.span} > n:
        last = (n + {shape.span - 1}) // {shape.span}
    while tile < last:
{lines("acc{j} = id{j}", k, 8)}
        start = tile * {shape.span} + t * {items}
        for q in range({items}):
            i = start + q
            if i < n:
                {combined(names("acc", k), names("acc", k), ", ".join(f"x{j}[i]" for j in range(k)), False)}
{lines("s{j}[t] = acc{j}", k, 8)}
{tree_fold(k, threads, False, 8)}
        if t == 0:
            {combined(tot, tot, ", ".join(f"s{j}[0]" for j in range(k)), False)}
        cuda.syncthreads()
        tile += 1
    if t == 0:
{lines("out{j}[cuda.blockIdx.x] = tot{j}", k, 8)}
"""


def block_totals(combine: Callable, ident: tuple, leaves: list, n: int, shape: host.Launch, *, reverse: bool,
                 flip: bool) -> list:
    """Device arrays of each block's total, in the order the blocks are walked."""
    dtypes = tuple(np.dtype(a.dtype) for a in leaves)
    key = ("block_totals", combine, dtypes, shape, reverse, flip)
    kernel = compile_kernel(key, lambda: _block_totals_source(dtypes, shape, reverse, flip), {"combine": combine})
    blocks = shape.blocks(n)
    totals = host.empty(blocks, dtypes)
    host.start(kernel, blocks, shape.threads, *leaves, *ident, n, *totals)
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
