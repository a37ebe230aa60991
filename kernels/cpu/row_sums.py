"""A map over the rows of 2-D arrays that also sums one of its values along each row:

    out_j[r, i] = f_j(c.., xs[.][r, i])        for j < k
    sums[r]     = f_k(c.., xs[.][r, 0]) + ... + f_k(c.., xs[.][r, n-1])

with f the mapper (k + 1 results). This is the shape of softmax's numerator and denominator, exp(s - m)
and its row sums, where the exponentials are also needed whole (attention multiplies them by V): as a map
then a sum it reads the exponentials back from memory; here they are summed while still in registers.

Rows run in parallel (prange) once there is work for two threads. Where every value is float64 (an
input may be boolean) and the mapper has an F64x4 form (kernels.cpu.simd), four consecutive elements are
mapped at once and their last values added to a four-lane accumulator ("wide"). Where the mapper has a lane
form (kernels.cpu.lanes: its exp or log1p computed for four or eight elements per call of libmvec), that
many consecutive elements go through it per call, their summed values added pairwise, then into the row's
sum; otherwise one element at a time. The row sum is therefore reassociated (lanes, then the rest in order), as
NumPy's pairwise sum is in its own way: the two agree to rounding, not bit for bit.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import host, simd
from .codegen import call, compile_kernel, each, indent, names, serial_or_parallel, simd_import
from .lanes import lane_call, lane_form, lane_width
from .simd import WIDTH  # the F64x4 values' lanes
from .map import has_wide_form


def _params(c: int, m: int, k: int) -> str:
    return "".join(f"c{j}, " for j in range(c)) + names("x", m) + "".join(f", out{j}" for j in range(k)) + ", zero, sums"


def _one_element(c: int, m: int, k: int) -> str:
    """Element (r, i): its first k values stored, its last added to the row's sum s."""
    args = ", ".join([f"c{j}" for j in range(c)] + [f"x{j}[r, i]" for j in range(m)])
    stores = each("out{j}[r, i] = e{j}", k)
    return f"{call('e', 'mapper', args, k + 1)}\n{stores}\ns += e{k}"


def _scalar_source(c: int, m: int, k: int) -> str:
    row = f"""s = zero
for i in range(x0.shape[1]):
{indent(_one_element(c, m, k), 4)}
sums[r] = s"""
    return f"""
def kernel(T, {_params(c, m, k)}):
    rows = x0.shape[0]
{indent(serial_or_parallel("for r in {0}(rows):", row), 4)}
"""


def _wide_source(c: int, m: int, k: int) -> str:
    arguments = ", ".join([f"v{j}" for j in range(c)] + [f"load(y{j}, at)" for j in range(m)])
    results = names("w", k + 1) + ("," if k > 0 else "")  # an F64x4 form of one result returns it bare
    row = f"""{each("y{j} = x{j}[r]", m)}
{each("o{j} = out{j}[r]", k)}
acc = splat(zero)
for b in range(x0.shape[1] // {WIDTH}):
    at = {WIDTH} * b
    {results} = mapper_f64x4({arguments})
{each("store(o{j}, at, w{j})", k, 4)}
    acc = add(acc, w{k})
s = (lane(acc, 0) + lane(acc, 1)) + (lane(acc, 2) + lane(acc, 3))
for i in range({WIDTH} * (x0.shape[1] // {WIDTH}), x0.shape[1]):
{indent(_one_element(c, m, k), 4)}
sums[r] = s"""
    return f"""{simd_import("add", "lane", "load", "splat", "store")}

def kernel(T, {_params(c, m, k)}):
{each("v{j} = splat(c{j})", c, 4)}
    rows = x0.shape[0]
{indent(serial_or_parallel("for r in {0}(rows):", row), 4)}
"""


def _lanes_source(c: int, m: int, k: int, lanes: int) -> str:
    """Each row `lanes` elements per call of the mapper's lane form, the lanes' summed values added pairwise
    and then into the row's sum, then the remainder one at a time. (Summed, a lane form's results cost more
    than stored: the softplus of an outer product, 16.7M float32, one thread, 25 ms summed by rows against
    16 ms stored, whether the sum is one accumulator or one per lane, or a row buffer summed after; not
    understood. The whole row's sum in the pass still beats storing the matrix and reading it back once the
    matrix must be faulted in, and never writes it.)"""
    index = [f"r, {lanes} * b + {lane}" for lane in range(lanes)]
    arguments = [[f"c{j}"] * lanes for j in range(c)] + [[f"x{j}[{ix}]" for ix in index] for j in range(m)]
    targets = [[f"e{j}_{lane}" for lane in range(lanes)] for j in range(k + 1)]
    stores = [f"out{j}[{ix}] = e{j}_{lane}" for j in range(k) for lane, ix in enumerate(index)]
    partial = [f"e{k}_{lane}" for lane in range(lanes)]
    while len(partial) > 1:
        partial = [f"({a} + {b})" for a, b in zip(partial[::2], partial[1::2])]
    row = "\n".join([
        "s = zero",
        f"for b in range(x0.shape[1] // {lanes}):",
        indent("\n".join([lane_call(targets, arguments), *stores, f"s += {partial[0]}"]), 4),
        f"for i in range({lanes} * (x0.shape[1] // {lanes}), x0.shape[1]):",
        indent(_one_element(c, m, k), 4),
        "sums[r] = s"])
    return f"""
def kernel(T, {_params(c, m, k)}):
    rows = x0.shape[0]
{indent(serial_or_parallel("for r in {0}(rows):", row), 4)}
"""


def row_sums_kernel(mapper: Any, k: int, m: int, c: int, parallel: bool, wide: bool) -> Any:
    """The compiled kernel(T, c.., x.., out.., zero, sums), filling out_j and sums in place (T == 1:
    serially). `wide`: through the mapper's F64x4 form (float64 values only); otherwise through its lane
    form where it has one (kernels.cpu.lanes)."""
    form = simd.vector_form(mapper) if wide else None
    if wide and form is None:
        raise ValueError("row_sums_kernel(wide=True) needs a mapper with a registered F64x4 form")
    lanes = 0 if wide else lane_width(mapper)
    if wide:
        build = lambda: _wide_source(c, m, k)  # noqa: E731
    elif lanes:
        build = lambda: _lanes_source(c, m, k, lanes)  # noqa: E731
    else:
        build = lambda: _scalar_source(c, m, k)  # noqa: E731
    return compile_kernel(("map_row_sums", mapper, k, m, c, parallel, wide, lanes), build,
                          {"mapper": mapper, "mapper_f64x4": form, "mapper_lanes": lane_form(mapper) if lanes else None},
                          parallel=parallel)


def map_with_row_sums(mapper: Any, m: int, k: int, inputs: Sequence[np.ndarray], *, consts: Sequence[Any] = (),
                      parallel: bool | None = None, out: Sequence[np.ndarray] | None = None) -> tuple:
    """Apply `mapper` (len(consts) + m scalars in, k + 1 out) to m 2-D arrays of one shape (any strides: a
    broadcast view is read as it is), the scalars `consts` first in every call; store its first k results
    and sum its last along each row.

    Returns (k arrays of the inputs' shape, the row sums: an array of length rows), of the mapper's result
    dtypes; the first k are new, or `out` filled. `parallel` overrides the automatic choice (parallel from
    2 * MIN_CHUNK elements with two threads).
    """
    inputs, consts, const_dtypes, dtypes = host.check_summing_map(mapper, m, k, inputs, consts)
    shape = inputs[0].shape
    outs = host.outputs(out, dtypes[:k], shape, "out")
    sums = np.zeros(shape[0], dtypes[k])
    if shape[0] * shape[1] > 0:
        T = host.num_chunks(shape[0] * shape[1], None) if parallel is None else 1 + bool(parallel)
        wide = has_wide_form(mapper, const_dtypes, [a.dtype for a in inputs], dtypes)
        row_sums_kernel(mapper, k, m, len(consts), T > 1, wide)(T, *consts, *inputs, *outs, dtypes[k].type(0), sums)
    return outs, sums
