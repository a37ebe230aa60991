"""Segmented reduce: one fold per row of 2-D inputs (the reduce inside a map).

    out[r] = f(xs[.][r, 0]) . f(xs[.][r, 1]) . ... . f(xs[.][r, n-1])      for r < rows

with f the optional mapper (the identity map when None). Rows run in parallel (prange), each folded in
column order, so non-commutative operators are correct: a long row as LANES contiguous sub-rows folded in
one interleaved loop (independent chains, as in kernels.cpu.reduce), their totals combined in order; where
the mapper has a lane form (kernels.cpu.lanes), as one sub-row per lane, the lane form mapping the elements
of a step in one call.
Parallelism is over rows only:
with fewer rows than threads, some threads idle (a single long row is better served by map_reduce).
Below MIN_CHUNK elements per thread in all (host.num_chunks(rows * n)), the rows run serially.

A commutative operator on one float64 leaf, with F64x4 forms of it and of the mapper (kernels.cpu.simd),
folds each row on vector registers instead ("wide"): WIDE accumulators of four lanes, element i in lane
i mod 16, loaded four at a time. Measured on the 2-core VM, 1024 rows of 1024: maximum 0.36 -> 0.15 ms,
sum 0.21 -> 0.14 ms (NumPy's row sums 0.24 ms, its row maxima 0.20 ms).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import host, simd
from .codegen import call, compile_kernel, each, indent, names, serial_or_parallel, simd_import
from .lanes import lane_form, lane_width
from .reduce import LANES, _element, _lanes_loop

# F64x4 accumulators per row in the wide kernel: four hide the latency of an addition or a maximum.
WIDE = 4


def _segmented_source(k: int, m: int, mapped: bool, lanes: int, vector: bool) -> str:
    if lanes > 1:
        row = f"""lo = 0
hi = n
{_lanes_loop(k, m, mapped, lanes, row="r, ", vector=vector)}
{each("out{j}[r] = acc{j}", k)}"""
    else:
        row = f"""{each("acc{j} = id{j}", k)}
for i in range(n):
{indent(_element(k, m, mapped, "r, i", "e"), 4)}
    {call("acc", "combine", names("acc", k) + ", " + names("e", k), k)}
{each("out{j}[r] = acc{j}", k)}"""
    return f"""
def kernel(T, {names("x", m)}, {names("id", k)}, {names("out", k)}):
    rows, n = x0.shape
{indent(serial_or_parallel("for r in {0}(rows):", row), 4)}
"""


def _wide_source(m: int, mapped: bool) -> str:
    """One leaf folded on F64x4 values: each row as WIDE accumulators of four lanes, element i going to lane
    i mod 4 * WIDE (any order: commutative operators only), then the lanes and the last n mod 4 * WIDE
    elements. Elements are loaded four at a time from the row views r_j (and mapped by the F64x4 form)."""
    step = 4 * WIDE

    def element(at: str) -> str:
        loads = ", ".join(f"load(r{j}, {at})" for j in range(m))
        return f"mapper_f64x4({loads})" if mapped else loads

    accumulate = "\n".join(f"a{w} = combine_f64x4(a{w}, {element(f'i + {4 * w}')})" for w in range(WIDE))
    merge = "\n".join(f"a0 = combine_f64x4(a0, a{w})" for w in range(1, WIDE))
    row = f"""{each("r{j} = x{j}[r]", m)}
{chr(10).join(f"a{w} = splat(id0)" for w in range(WIDE))}
for b in range(n // {step}):
    i = {step} * b
{indent(accumulate, 4)}
{merge}
acc0 = as_scalar(combine(as_scalar(combine(lane(a0, 0), lane(a0, 1))), as_scalar(combine(lane(a0, 2), lane(a0, 3)))))
for i in range({step} * (n // {step}), n):
{indent(_element(1, m, mapped, "r, i", "e"), 4)}
    {call("acc", "combine", "acc0, e0", 1)}
out0[r] = acc0"""
    return f"""{simd_import("lane", "load", "splat")}

def kernel(T, {names("x", m)}, id0, out0):
    rows, n = x0.shape
{indent(serial_or_parallel("for r in {0}(rows):", row), 4)}
"""


def lanes_for(n: int) -> int:
    """Independent chains per row: LANES for rows long enough to repay combining the lane totals."""
    return LANES if n >= LANED_FROM else 1


# Rows at least this long are folded as LANES interleaved sub-rows (measured: k-means' NaN-propagating
# minimum over 64 distances per row, in cache, 40 -> 32 ms per 10^6 rows; short rows would spend much of
# that on the 3 combines of the lane totals).
LANED_FROM = 32


def segmented_kernel(mapper: Any, combine: Any, k: int, m: int, parallel: bool = True, lanes: int = 1,
                     wide: bool = False) -> Any:
    """The compiled kernel(T, x_0..x_{m-1}, id_0.., out_0..), filling the rows-element out_j (T == 1: serially),
    each row folded as `lanes` interleaved contiguous sub-rows whose totals are combined in order. `wide`:
    on F64x4 values instead (see has_wide_form: one float64 leaf, a commutative operator)."""
    if wide:
        forms = {"combine_f64x4": simd.vector_form(combine), "mapper_f64x4": simd.vector_form(mapper)}
        return compile_kernel(("segmented_wide", combine, mapper, m, parallel), lambda: _wide_source(m, mapper is not None),
                              {"combine": combine, "mapper": mapper, **forms}, parallel=parallel)
    vector = lane_form(mapper) if lanes > 1 else None
    lanes = lane_width(mapper) if vector is not None else lanes  # a lane form's call fills a chain per lane
    key = ("segmented", combine, mapper, k, m, parallel, lanes)
    return compile_kernel(key, lambda: _segmented_source(k, m, mapper is not None, lanes, vector is not None),
                          {"combine": combine, "mapper": mapper, "mapper_lanes": vector}, parallel=parallel)


def has_wide_form(mapper: Any | None, combine: Any, k: int, elements: Sequence[np.dtype], inputs: Sequence[np.dtype]) -> bool:
    """Whether rows of these element and input dtypes fold on F64x4 values: one float64 leaf, F64x4 forms of
    the operator and of the mapper (if any), whose inputs may also be boolean (loaded as 0.0 / 1.0). The
    caller adds commutativity."""
    floats = (np.dtype(np.float64),) if mapper is None else (np.dtype(np.float64), np.dtype(np.bool_))
    return (k == 1 and np.dtype(elements[0]) == np.float64 and all(np.dtype(d) in floats for d in inputs)
            and simd.vector_form(combine) is not None and (mapper is None or simd.vector_form(mapper) is not None))


def segmented_reduce(mapper: Any | None, combine: Any, k: int, identity: Sequence[Any],
                     inputs: Sequence[np.ndarray], *, parallel: bool | None = None, commutative: bool = False,
                     carry: Sequence[Any] | None = None) -> tuple:
    """Reduce every row of 2-D arrays of one shape (rows, n) along its last axis.

    Without mapper, `inputs` are the k leaves, C-contiguous. With mapper (m = len(inputs) scalars in, k
    out), the element at (r, i) is mapper(inputs[0][r, i], ...), never stored; its inputs may have any
    strides (a broadcast view, stride 0, is read as it is). Returns a tuple of k arrays of
    length rows, of the element dtypes; the identity in every row when n == 0. `parallel` overrides the
    automatic choice between parallel and serial rows. `commutative`: `combine` is commutative, so a row's
    elements may be folded in any order (on F64x4 values where has_wide_form). `carry`: the dtypes each
    row's running value is kept in (see host.carried_dtypes; `combine` takes and returns those).
    """
    host.check_function(combine, "combine")
    k = host.check_count(k, "k")
    if mapper is None:
        inputs = host.check_arrays(inputs, k, 2, "inputs")
        dtypes = [a.dtype for a in inputs]
    else:
        host.check_function(mapper, "mapper")
        if isinstance(inputs, np.ndarray) or len(inputs) < 1:
            raise ValueError("inputs must be a non-empty sequence of 2-D arrays (the mapper's arguments)")
        inputs = host.check_arrays(inputs, len(inputs), 2, "inputs", any_strides=True)
        dtypes = host.result_dtypes(mapper, [a.dtype for a in inputs], k, "mapper")
    carried = host.carried_dtypes(carry, dtypes)
    ident = host.cast_identity(identity, carried)
    host.check_combine(combine, carried)
    rows, n = inputs[0].shape
    if n == 0:
        return tuple(np.full(rows, v, d) for v, d in zip(ident, dtypes, strict=True))
    outs = tuple(np.empty(rows, d) for d in dtypes)
    if rows > 0:
        auto = 1 if rows == 1 else host.num_chunks(rows * n, None)
        T = auto if parallel is None else 1 + bool(parallel)
        wide = commutative and has_wide_form(mapper, combine, k, carried, [a.dtype for a in inputs])
        segmented_kernel(mapper, combine, k, len(inputs), T > 1, lanes_for(n), wide)(T, *inputs, *ident, *outs)
    return outs
