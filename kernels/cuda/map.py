"""Map: one thread per element, each calling the mapper on its element's scalars (and the captured
scalars, passed to every call first)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

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
