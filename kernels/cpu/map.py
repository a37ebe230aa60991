"""Parallel elementwise map: out[.][i] = mapper(c_0, ..., inputs[0][i], ..., inputs[m-1][i]) over 1-D arrays,
with optional scalar consts c_j passed to every call (a lambda's captured values).

Parallel (prange, Numba's own scheduling) once there are at least MIN_CHUNK elements for two threads;
serial below that, where starting the threads would cost more than the work.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import host
from .codegen import call, compile_kernel, each, indent, names


def _map_source(k: int, m: int, c: int) -> str:
    args = ", ".join([f"c{j}" for j in range(c)] + [f"x{j}[i]" for j in range(m)])
    body = call("e", "mapper", args, k) + "\n" + each("out{j}[i] = e{j}", k)
    consts = "".join(f"c{j}, " for j in range(c))
    return f"""
def kernel(T, {consts}{names("x", m)}, {names("out", k)}):
    n = x0.shape[0]
    if T == 1:  # no parallel region at all
        for i in range(n):
{indent(body, 12)}
    else:
        for i in prange(n):
{indent(body, 12)}
"""


def map_kernel(mapper: Any, k: int, m: int, parallel: bool = True, c: int = 0) -> Any:
    """The compiled kernel(T, c_0..c_{c-1}, x_0..x_{m-1}, out_0..out_{k-1}), filling the out_j in place
    (T == 1: serially)."""
    return compile_kernel(("map", mapper, k, m, c, parallel), lambda: _map_source(k, m, c), {"mapper": mapper},
                          parallel=parallel)


def map(mapper: Any, m: int, k: int, inputs: Sequence[np.ndarray], *,  # noqa: A001 (the combinator's name)
        consts: Sequence[Any] = (), parallel: bool | None = None, out: Sequence[np.ndarray] | None = None) -> tuple:
    """Apply `mapper` (len(consts) + m scalars in, k out; a scalar when k == 1) to m 1-D arrays of one length,
    the scalars `consts` first in every call.

    Returns a tuple of k arrays whose dtypes are the mapper's result types for the arguments' dtypes: new
    ones, or `out` filled.
    `parallel` overrides the automatic choice (parallel from 2 * MIN_CHUNK elements with two threads).
    """
    host.check_function(mapper, "mapper")
    m, k = host.check_count(m, "m"), host.check_count(k, "k")
    inputs = host.check_arrays(inputs, m, 1, "inputs")
    consts = host.check_scalars(consts, "consts")
    dtypes = host.result_dtypes(mapper, [np.asarray(c).dtype for c in consts] + [a.dtype for a in inputs], k, "mapper")
    n = inputs[0].shape[0]
    outs = host.outputs(out, dtypes, n, "out")
    if n > 0:
        T = host.num_chunks(n, None) if parallel is None else 1 + bool(parallel)
        map_kernel(mapper, k, m, T > 1, len(consts))(T, *consts, *inputs, *outs)
    return outs
