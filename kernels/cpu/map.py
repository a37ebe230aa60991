"""Parallel elementwise map: out[.][i] = mapper(c_0, ..., inputs[0][i], ..., inputs[m-1][i]) over 1-D arrays,
or out[.][i, j] over 2-D arrays, with optional scalar consts c_j passed to every call (a lambda's captured values).

2-D inputs may have any strides, zero included: a value broadcast along an axis (np.broadcast_to) is read
as it is, never expanded. Parallel (prange over the first axis, Numba's own scheduling) once there are at
least MIN_CHUNK elements for two threads; serial below that, where starting the threads would cost more than
the work. A mapper with a lane form (kernels.cpu.lanes) maps WIDTH consecutive elements per call of it
(along the last axis), the remainder one at a time.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from . import host
from .codegen import call, compile_kernel, each, indent, names
from .lanes import WIDTH, lane_call, lane_form


def _map_source(k: int, m: int, c: int, ndim: int, vector: bool) -> str:
    body = _element_step(k, m, c, "i" if ndim == 1 else "i, j")
    if vector and ndim == 1:
        return f"""
def kernel(T, {_params(m, k, c)}):
    if T == 1:  # no parallel region at all
{indent(_lanes_then_rest(k, m, c, ndim, "range"), 8)}
    else:
{indent(_lanes_then_rest(k, m, c, ndim, "prange"), 8)}
"""
    if vector:
        body = _lanes_then_rest(k, m, c, ndim, "range")
    elif ndim == 2:
        body = "for j in range(x0.shape[1]):\n" + indent(body, 4)
    return f"""
def kernel(T, {_params(m, k, c)}):
    n = x0.shape[0]
    if T == 1:  # no parallel region at all
        for i in range(n):
{indent(body, 12)}
    else:
        for i in prange(n):
{indent(body, 12)}
"""


def _lanes_then_rest(k: int, m: int, c: int, ndim: int, loop: str) -> str:
    """The elements of a 1-D input (of row i of a 2-D one) WIDTH per call of the lane form, then the
    remainder one at a time."""
    block, one, span = ("b", "i", "x0.shape[0]") if ndim == 1 else ("jb", "j", "x0.shape[1]")
    return f"""for {block} in {loop}({span} // {WIDTH}):
{indent(_lanes_step(k, m, c, "" if ndim == 1 else "i, ", block), 4)}
for {one} in range({WIDTH} * ({span} // {WIDTH}), {span}):
{indent(_element_step(k, m, c, "i" if ndim == 1 else "i, j"), 4)}"""


def _params(m: int, k: int, c: int) -> str:
    return "".join(f"c{j}, " for j in range(c)) + f"{names('x', m)}, {names('out', k)}"


def _element_step(k: int, m: int, c: int, index: str) -> str:
    args = ", ".join([f"c{j}" for j in range(c)] + [f"x{j}[{index}]" for j in range(m)])
    return call("e", "mapper", args, k) + "\n" + each(f"out{{j}}[{index}] = e{{j}}", k)


def _lanes_step(k: int, m: int, c: int, row: str, block: str) -> str:
    """The elements WIDTH * block + lane (after the index prefix `row`) through the mapper's lane form."""
    index = [f"{row}{WIDTH} * {block} + {lane}" for lane in range(WIDTH)]
    arguments = [[f"c{j}"] * WIDTH for j in range(c)] + [[f"x{j}[{ix}]" for ix in index] for j in range(m)]
    targets = [[f"e{j}_{lane}" for lane in range(WIDTH)] for j in range(k)]
    stores = "\n".join(f"out{j}[{ix}] = e{j}_{lane}" for j in range(k) for lane, ix in enumerate(index))
    return lane_call(targets, arguments) + "\n" + stores


def map_kernel(mapper: Any, k: int, m: int, parallel: bool = True, c: int = 0, ndim: int = 1) -> Any:
    """The compiled kernel(T, c_0..c_{c-1}, x_0..x_{m-1}, out_0..out_{k-1}), filling the out_j in place
    (T == 1: serially); through the mapper's lane form (kernels.cpu.lanes) where it has one."""
    vector = lane_form(mapper)
    return compile_kernel(("map", mapper, k, m, c, parallel, ndim), lambda: _map_source(k, m, c, ndim, vector is not None),
                          {"mapper": mapper, "mapper_lanes": vector}, parallel=parallel)


def map(mapper: Any, m: int, k: int, inputs: Sequence[np.ndarray], *,  # noqa: A001 (the combinator's name)
        consts: Sequence[Any] = (), parallel: bool | None = None, out: Sequence[np.ndarray] | None = None) -> tuple:
    """Apply `mapper` (len(consts) + m scalars in, k out; a scalar when k == 1) to m arrays of one shape
    (all 1-D, or all 2-D with any strides), the scalars `consts` first in every call.

    Returns a tuple of k arrays of that shape whose dtypes are the mapper's result types for the arguments'
    dtypes: new ones, or `out` filled.
    `parallel` overrides the automatic choice (parallel from 2 * MIN_CHUNK elements with two threads).
    """
    host.check_function(mapper, "mapper")
    m, k = host.check_count(m, "m"), host.check_count(k, "k")
    first = inputs[0] if isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], np.ndarray) else None
    ndim = 2 if first is not None and first.ndim == 2 else 1
    inputs = host.check_arrays(inputs, m, ndim, "inputs", any_strides=True)
    consts = host.check_scalars(consts, "consts")
    dtypes = host.result_dtypes(mapper, [np.asarray(c).dtype for c in consts] + [a.dtype for a in inputs], k, "mapper")
    shape = inputs[0].shape
    outs = host.outputs(out, dtypes, shape, "out")
    size = math.prod(shape)
    if size > 0:
        T = host.num_chunks(size, None) if parallel is None else 1 + bool(parallel)
        map_kernel(mapper, k, m, T > 1, len(consts), ndim)(T, *consts, *inputs, *outs)
    return outs
