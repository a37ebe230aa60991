"""Map: one thread per element, each calling the mapper on its element's scalars (and the captured
scalars, passed to every call first); map_over: the same over every index of an N-d shape, its inputs
read through their strides (broadcast ones in place)."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
from numba import cuda

from . import host
from .codegen import compile_kernel, lines, names


def map(mapper: Callable, inputs: Sequence[Any], out_dtypes: Sequence[np.dtype], *, consts: Sequence[Any] = (),
        threads: int | None = None) -> tuple:  # noqa: A001 (the combinator's name)
    """mapper(*consts, x0[i], x1[i], ...) for every i: one array of n per dtype in `out_dtypes` (NumPy
    arrays for NumPy inputs, device arrays for device ones)."""
    inputs, on_host = host.check_vectors(inputs, None, "inputs")
    if not inputs:
        raise ValueError("inputs: a map needs at least one input array")
    dtypes = tuple(np.dtype(d) for d in out_dtypes)
    if not dtypes:
        raise ValueError("out_dtypes: a map needs at least one result")
    shape = host.launch(threads, 1)
    host.check_arity(mapper, len(consts) + len(inputs), "mapper")
    n = inputs[0].shape[0]
    outs = host.empty(n, dtypes)
    if n:
        m, c, r = len(inputs), len(consts), len(dtypes)
        key = ("map", mapper, m, c, dtypes)
        kernel = compile_kernel(key, lambda: _map_source(m, c, r), {"mapper": mapper})
        host.start(kernel, shape.blocks(n), shape.threads, *host.to_device(inputs), *consts, n, *outs)
    return host.returned(outs, on_host)


def _map_source(m: int, c: int, r: int) -> str:
    args = ", ".join(filter(None, [names("c", c), ", ".join(f"x{j}[i]" for j in range(m))]))
    params = ", ".join(filter(None, [names("x", m), names("c", c), "n", names("out", r)]))
    return f"""def kernel({params}):
    i = cuda.grid(1)
    if i < n:
        {names("y", r)} = mapper({args})
{lines("out{j}[i] = y{j}", r, 8)}
"""


MAX_NDIM = 4  # the most dimensions map_over indexes


def map_over(mapper: Callable, inputs: Sequence[Any], shape: Sequence[int], out_dtypes: Sequence[np.dtype], *,
             threads: int | None = None) -> tuple:
    """mapper(x0[idx], x1[idx], ...) for every index idx of `shape`: one device array of `shape` per dtype in
    `out_dtypes`. Each input is a device array of `shape` read through its strides, so that one broadcast
    along some axes (stride 0 there, as NumPy's and CuPy's broadcast_to make it) is never expanded: a
    fused elementwise run's per-row values against a block of a gemm."""
    shape = tuple(int(s) for s in shape)
    if not 1 <= len(shape) <= MAX_NDIM:
        raise ValueError(f"shape: map_over indexes 1 to {MAX_NDIM} dimensions, got {shape}")
    for j, x in enumerate(inputs):
        if tuple(x.shape) != shape:
            raise ValueError(f"inputs[{j}] has shape {tuple(x.shape)}, not the map's {shape}")
    dtypes = tuple(np.dtype(d) for d in out_dtypes)
    if not dtypes:
        raise ValueError("out_dtypes: a map needs at least one result")
    launch = host.launch(threads, 1)
    host.check_arity(mapper, len(inputs), "mapper")
    outs = [host.device_array(shape, d) for d in dtypes]
    n = math.prod(shape)
    if n:
        m, d, r = len(inputs), len(shape), len(dtypes)
        by_rows = d > 1 and shape[-1] >= MIN_ROW
        kernel = compile_kernel(("map_over", mapper, m, d, dtypes, by_rows), lambda: _map_over_source(m, d, r, by_rows),
                                {"mapper": mapper})
        if by_rows:
            last, rows = shape[-1], n // shape[-1]
            across = min(launch.threads, 1 << (last - 1).bit_length())  # threads along the last axis
            down = launch.threads // across
            blocks = (-(-last // across), min(-(-rows // down), MAX_GRID_Y))
            host.start(kernel, blocks, (across, down), *inputs, rows, *shape[1:], *outs)
        else:
            host.start(kernel, launch.blocks(n), launch.threads, *inputs, n, *shape[1:], *outs)
    return tuple(outs)


MAX_GRID_Y = 65535  # CUDA's limit on a grid's second dimension: more rows are taken in a grid-stride loop
MIN_ROW = 32  # a shorter last axis is indexed as one run of all the elements (its rows would idle most of a warp)


def _map_over_source(m: int, d: int, r: int, by_rows: bool) -> str:
    """By rows: a 2-D grid, threads along x taking consecutive elements of the last axis (the outputs'
    writes are coalesced) and threads along y the rows of the leading axes, in a grid-stride loop; only a
    shape of more than two axes unravels a row number, and the last axis needs no division (a 64-bit
    division is a long sequence of instructions on a GPU). Otherwise thread k takes the k-th element in C
    order, its index unravelled."""
    index = ", ".join(f"i{a}" for a in range(d))
    extents = ", ".join(f"e{a}" for a in range(1, d))
    call = [f"{names('y', r)} = mapper({', '.join(f'x{j}[{index}]' for j in range(m))})",
            *(f"out{j}[{index}] = y{j}" for j in range(r))]
    if by_rows:
        unravel = ["rest = row"]
        for a in range(d - 2, 0, -1):
            unravel += [f"i{a} = rest % e{a}", f"rest = rest // e{a}"]
        params = ", ".join(filter(None, [names("x", m), "rows", extents, names("out", r)]))
        return f"""def kernel({params}):
    i{d - 1}, first = cuda.grid(2)
    if i{d - 1} < e{d - 1}:
        for row in range(first, rows, cuda.gridsize(2)[1]):
{chr(10).join(" " * 12 + line for line in unravel + ["i0 = rest"] + call)}
"""
    unravel = ["rest = k"]
    for a in range(d - 1, 0, -1):
        unravel += [f"i{a} = rest % e{a}", f"rest = rest // e{a}"]
    params = ", ".join(filter(None, [names("x", m), "n", extents, names("out", r)]))
    return f"""def kernel({params}):
    k = cuda.grid(1)
    if k < n:
{chr(10).join(" " * 8 + line for line in unravel + ["i0 = rest"] + call)}
"""
