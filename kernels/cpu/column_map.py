"""A map over 2-D arrays that also sums one of its values down each column:

    out_j[r, i] = f_j(c.., xs[.][r, i])        for j < k
    sums[i]     = f_k(c.., xs[.][0, i]) + ... + f_k(c.., xs[.][n-1, i])

with f the mapper (k + 1 results). Batch normalisation's variance, mean((x - mu)^2, axis=0), and a logsumexp
over each column, sum(exp(x - m), axis=0), are such a map then a sum over the first axis: as two passes
they write the (n, c) values and read them back. Here the rows are split into T contiguous chunks (prange);
each thread adds its rows' values into a private row of partial sums, which stays in cache, and the T
partial rows are added in chunk order afterwards (kernels.cpu.columns does the same for a plain array).
The partial sums of floats are float64 (rounded once at the end), of integers the results' own dtype.

Along a row the mapper's lane form (kernels.cpu.lanes), where it has one, maps as many consecutive elements
per call as it has lanes, each lane adding into its own column's partial sum in memory: no running value is
carried across the call (which clobbers every vector register).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import host
from .codegen import call, compile_kernel, each, indent
from .lanes import lane_call, lane_form, lane_width


def _params(c: int, m: int, k: int) -> str:
    return "".join(f"c{j}, " for j in range(c)) + ", ".join(f"x{j}" for j in range(m)) + \
        "".join(f", out{j}" for j in range(k)) + ", partial"


def _one_element(c: int, m: int, k: int) -> str:
    args = ", ".join([f"c{j}" for j in range(c)] + [f"x{j}[r, i]" for j in range(m)])
    return f"{call('e', 'mapper', args, k + 1)}\n{each('out{j}[r, i] = e{j}', k)}\npartial[t, i] += e{k}"


def _lanes_step(c: int, m: int, k: int, lanes: int) -> str:
    index = [f"r, {lanes} * b + {lane}" for lane in range(lanes)]
    arguments = [[f"c{j}"] * lanes for j in range(c)] + [[f"x{j}[{ix}]" for ix in index] for j in range(m)]
    targets = [[f"e{j}_{lane}" for lane in range(lanes)] for j in range(k + 1)]
    stores = [f"out{j}[{ix}] = e{j}_{lane}" for j in range(k) for lane, ix in enumerate(index)]
    adds = [f"partial[t, {lanes} * b + {lane}] += e{k}_{lane}" for lane in range(lanes)]
    return "\n".join([lane_call(targets, arguments), *stores, *adds])


def _source(c: int, m: int, k: int, lanes: int) -> str:
    if lanes:
        row = f"""for b in range(cols // {lanes}):
{indent(_lanes_step(c, m, k, lanes), 4)}
for i in range({lanes} * (cols // {lanes}), cols):
{indent(_one_element(c, m, k), 4)}"""
    else:
        row = f"for i in range(cols):\n{indent(_one_element(c, m, k), 4)}"
    return f"""
def kernel(T, {_params(c, m, k)}):
    n, cols = x0.shape
    for t in prange(T):
        for i in range(cols):
            partial[t, i] = 0
        for r in range(t * n // T, (t + 1) * n // T):
{indent(row, 12)}
"""


def column_map_kernel(mapper: Any, k: int, m: int, c: int) -> Any:
    """The compiled kernel(T, c.., x.., out.., partial), filling out_j and the (T, columns) partial sums."""
    lanes = lane_width(mapper)
    return compile_kernel(("map_column_sums", mapper, k, m, c, lanes), lambda: _source(c, m, k, lanes),
                          {"mapper": mapper, "mapper_lanes": lane_form(mapper) if lanes else None}, parallel=True)


def map_with_column_sums(mapper: Any, m: int, k: int, inputs: Sequence[np.ndarray], *, consts: Sequence[Any] = (),
                         chunks: int | None = None, out: Sequence[np.ndarray] | None = None) -> tuple:
    """Apply `mapper` (len(consts) + m scalars in, k + 1 out) to m 2-D arrays of one shape (any strides: a
    broadcast view is read as it is), the scalars `consts` first in every call; store its first k results
    and sum its last down each column.

    Returns (k arrays of the inputs' shape, the column sums: an array of length columns), of the mapper's
    result dtypes; the first k are new, or `out` filled. `chunks` overrides the number of row chunks
    (default: one per Numba thread, see host.num_chunks).
    """
    inputs, consts, _, dtypes = host.check_summing_map(mapper, m, k, inputs, consts)
    n, cols = inputs[0].shape
    outs = host.outputs(out, dtypes[:k], (n, cols), "out")
    if n == 0 or cols == 0:
        return outs, np.zeros(cols, dtypes[k])
    T = min(n, host.num_chunks(n * cols, None)) if chunks is None else host.num_chunks(n, chunks)
    partial = np.empty((T, cols), np.float64 if dtypes[k].kind == "f" else dtypes[k])
    column_map_kernel(mapper, k, m, len(consts))(T, *consts, *inputs, *outs, partial)
    sums = partial[0].copy()
    for t in range(1, T):
        sums += partial[t]
    return outs, sums.astype(dtypes[k], copy=False)
