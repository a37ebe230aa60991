"""Parallel elementwise map: out[.][i] = mapper(c_0, ..., inputs[0][i], ..., inputs[m-1][i]) over 1-D arrays,
or out[.][i, j] over 2-D arrays, with optional scalar consts c_j passed to every call (a lambda's captured values).

2-D inputs may have any strides, zero included: a value broadcast along an axis (np.broadcast_to) is read
as it is, never expanded. Parallel (prange over the first axis, Numba's own scheduling) once there are at
least MIN_CHUNK elements for two threads; serial below that, where starting the threads would cost more than
the work. A mapper with a lane form (kernels.cpu.lanes) maps as many consecutive elements per call of it as
it has lanes (along the last axis), the remainder one at a time.

Where every argument and result is float64 (an input may also be boolean) and the mapper has an F64x4 form
(kernels.cpu.simd), the kernel is "wide": four consecutive elements are loaded into one vector register, mapped by that form and stored,
never unpacked into scalars (a lane form packs and unpacks around each call of libmvec). Measured on the
2-core VM, exp(h - m) over a 1024 x 1024 block with a row-broadcast m (attention's softmax): 0.92 ms
through the lane form, 0.65 ms wide.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from . import host, simd
from .codegen import call, compile_kernel, each, indent, names, serial_or_parallel, simd_import
from .lanes import lane_call, lane_form, lane_width


def _map_source(k: int, m: int, c: int, ndim: int, lanes: int, wide: bool = False, gathered: tuple = ()) -> str:
    """The kernel's text; `lanes`: the elements per call of the mapper's lane form (0: it has none)."""
    if wide:
        return _wide_source(k, m, c, ndim, gathered)
    body = _element_step(k, m, c, "i" if ndim == 1 else "i, j", gathered)
    shape = _shape_source(gathered)
    if lanes and ndim == 1:
        return f"""
def kernel(T, {_params(m, k, c)}):
    if T == 1:  # no parallel region at all
{indent(_lanes_then_rest(k, m, c, ndim, "range", lanes), 8)}
    else:
{indent(_lanes_then_rest(k, m, c, ndim, "prange", lanes), 8)}
"""
    if lanes:
        body = _lanes_then_rest(k, m, c, ndim, "range", lanes, gathered)
    elif ndim == 2:
        body = f"for j in range({shape}.shape[1]):\n" + indent(body, 4)
    return f"""
def kernel(T, {_params(m, k, c, gathered)}):
    n = {shape}.shape[0]
{indent(serial_or_parallel("for i in {0}(n):", body), 4)}
"""


def _shape_source(gathered: tuple) -> str:
    """The array whose shape is the map's: the first input, unless inputs are gathered (then a result)."""
    return "out0" if gathered else "x0"


def _read(j: int, index: str, gathered: tuple) -> str:
    """Input j's element at `index` ("i, ..." for 2-D maps): row g_j[i] of its table where it is gathered."""
    return f"x{j}[g{j}[i]{index[1:]}]" if j in gathered else f"x{j}[{index}]"


def _lanes_then_rest(k: int, m: int, c: int, ndim: int, loop: str, lanes: int, gathered: tuple = ()) -> str:
    """The elements of a 1-D input (of row i of a 2-D one) `lanes` per call of the lane form, then the
    remainder one at a time."""
    block, one, span = ("b", "i", "x0.shape[0]") if ndim == 1 else ("jb", "j", f"{_shape_source(gathered)}.shape[1]")
    return f"""for {block} in {loop}({span} // {lanes}):
{indent(_lanes_step(k, m, c, "" if ndim == 1 else "i, ", block, lanes, gathered), 4)}
for {one} in range({lanes} * ({span} // {lanes}), {span}):
{indent(_element_step(k, m, c, "i" if ndim == 1 else "i, j", gathered), 4)}"""


def _wide_source(k: int, m: int, c: int, ndim: int, gathered: tuple = ()) -> str:
    """The kernel on F64x4 values: simd.WIDTH consecutive elements (of a row) loaded, mapped by the mapper's
    F64x4 form and stored per step, the remainder one at a time by the mapper itself."""
    splats = "".join(f"v{j} = splat(c{j})\n" for j in range(c))
    arguments = ", ".join([f"v{j}" for j in range(c)] + [f"load(r{j}, {{0}})" for j in range(m)])
    stores = "\n".join(f"store(o{j}, {{0}}, w{j})" for j in range(k))

    def step(at: str) -> str:
        return f"{names('w', k)}{',' if k > 1 else ''} = mapper_f64x4({arguments.format(at)})\n" + stores.format(at)

    rest = _element_step(k, m, c, "i" if ndim == 1 else "i, j", gathered)
    if ndim == 1:
        views = each("r{j} = x{j}", m) + "\n" + each("o{j} = out{j}", k)
        blocks = f"""for b in {{0}}(x0.shape[0] // {simd.WIDTH}):
{indent(step(f"{simd.WIDTH} * b"), 4)}
for i in range({simd.WIDTH} * (x0.shape[0] // {simd.WIDTH}), x0.shape[0]):
{indent(rest, 4)}"""
        return f"""{simd_import("load", "splat", "store")}

def kernel(T, {_params(m, k, c)}):
{indent(splats + views, 4)}
    if T == 1:  # no parallel region at all
{indent(blocks.format("range"), 8)}
    else:
{indent(blocks.format("prange"), 8)}
"""
    shape = _shape_source(gathered)
    row = f"""{chr(10).join(f"r{j} = {_read(j, 'i', gathered)}" for j in range(m))}
{each("o{j} = out{j}[i]", k)}
for jb in range({shape}.shape[1] // {simd.WIDTH}):
{indent(step(f"{simd.WIDTH} * jb"), 4)}
for j in range({simd.WIDTH} * ({shape}.shape[1] // {simd.WIDTH}), {shape}.shape[1]):
{indent(rest, 4)}"""
    return f"""{simd_import("load", "splat", "store")}

def kernel(T, {_params(m, k, c, gathered)}):
{indent(splats, 4)}
    n = {shape}.shape[0]
{indent(serial_or_parallel("for i in {0}(n):", row), 4)}
"""


def _params(m: int, k: int, c: int, gathered: tuple = ()) -> str:
    return "".join(f"c{j}, " for j in range(c)) + f"{names('x', m)}, {names('out', k)}" + "".join(
        f", g{j}" for j in gathered)


def _element_step(k: int, m: int, c: int, index: str, gathered: tuple = ()) -> str:
    args = ", ".join([f"c{j}" for j in range(c)] + [_read(j, index, gathered) for j in range(m)])
    return call("e", "mapper", args, k) + "\n" + each(f"out{{j}}[{index}] = e{{j}}", k)


def _lanes_step(k: int, m: int, c: int, row: str, block: str, lanes: int, gathered: tuple = ()) -> str:
    """The elements lanes * block + lane (after the index prefix `row`) through the mapper's lane form."""
    index = [f"{row}{lanes} * {block} + {lane}" for lane in range(lanes)]
    arguments = [[f"c{j}"] * lanes for j in range(c)] + [[_read(j, ix, gathered) for ix in index] for j in range(m)]
    targets = [[f"e{j}_{lane}" for lane in range(lanes)] for j in range(k)]
    stores = "\n".join(f"out{j}[{ix}] = e{j}_{lane}" for j in range(k) for lane, ix in enumerate(index))
    return lane_call(targets, arguments) + "\n" + stores


def map_kernel(mapper: Any, k: int, m: int, parallel: bool = True, c: int = 0, ndim: int = 1, wide: bool = False,
               gathered: tuple[int, ...] = ()) -> Any:
    """The compiled kernel(T, c_0..c_{c-1}, x_0..x_{m-1}, out_0..out_{k-1}, g_j for j in gathered), filling the
    out_j in place (T == 1: serially); through the mapper's lane form (kernels.cpu.lanes) where it has one.
    `wide`: through its F64x4 form (kernels.cpu.simd.vector_form) instead, for float64 arguments and results
    only. `gathered` (2-D maps): the inputs whose row i is row g_j[i] of x_j (a table)."""
    vector, form = lane_form(mapper), simd.vector_form(mapper) if wide else None
    if wide and form is None:
        raise ValueError("map_kernel(wide=True) needs a mapper with a registered F64x4 form")
    if gathered and ndim != 2:
        raise ValueError(f"gathered rows need a 2-D map, got ndim={ndim}")
    return compile_kernel(("map", mapper, k, m, c, parallel, ndim, wide, tuple(gathered)),
                          lambda: _map_source(k, m, c, ndim, lane_width(mapper), wide, tuple(gathered)),
                          {"mapper": mapper, "mapper_lanes": None if wide else vector, "mapper_f64x4": form},
                          parallel=parallel)


def has_wide_form(mapper: Any, consts: Sequence[np.dtype], inputs: Sequence[np.dtype], results: Sequence[np.dtype]) -> bool:
    """Whether the map of `mapper` with consts, inputs and results of these dtypes runs on F64x4 values: the
    mapper has an F64x4 form, the inputs are float64 or boolean (loaded as 0.0 / 1.0), the rest float64."""
    return (simd.vector_form(mapper) is not None and all(np.dtype(d) in _WIDE_INPUTS for d in inputs)
            and all(np.dtype(d) == np.float64 for d in [*consts, *results]))


_WIDE_INPUTS = (np.dtype(np.float64), np.dtype(np.bool_))


def map(mapper: Any, m: int, k: int, inputs: Sequence[np.ndarray], *,  # noqa: A001 (the combinator's name)
        consts: Sequence[Any] = (), parallel: bool | None = None, out: Sequence[np.ndarray] | None = None,
        rows: Sequence[np.ndarray | None] | None = None) -> tuple:
    """Apply `mapper` (len(consts) + m scalars in, k out; a scalar when k == 1) to m arrays of one shape
    (all 1-D, or all 2-D with any strides), the scalars `consts` first in every call.

    Returns a tuple of k arrays of that shape whose dtypes are the mapper's result types for the arguments'
    dtypes: new ones, or `out` filled (with k == 1, `out` may be an input read at the same element, not a
    gathered table; with more results one result's store may come before another's load at an element).
    `parallel` overrides the automatic choice (parallel from 2 * MIN_CHUNK elements with two threads).
    `rows` (2-D maps): per input, None or a 1-D integer array g (in [-rows, rows), negatives counted from the
    end); then inputs[j] is a table whose row g[i] is the input's row i (inputs[j][g] is never made: a
    gradient's nearest centroid per point is read in place).
    """
    host.check_function(mapper, "mapper")
    m, k = host.check_count(m, "m"), host.check_count(k, "k")
    if isinstance(inputs, np.ndarray) or len(inputs) != m:
        host.check_arrays(inputs, m, 1, "inputs")  # names the count it expected
    first = inputs[0] if isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], np.ndarray) else None
    ndim = 2 if first is not None and first.ndim == 2 else 1
    tables = _gathered_rows(rows, inputs, m)
    logical = [_rows_stand_in(x, tables[j]) if j in tables else x for j, x in enumerate(inputs)]
    logical = host.check_arrays(logical, m, ndim, "inputs", any_strides=True)
    if tables and ndim != 2:
        raise ValueError(f"rows: gathered inputs need a 2-D map, got 1-D inputs of shape {logical[0].shape}")
    consts = host.check_scalars(consts, "consts")
    dtypes = host.result_dtypes(mapper, [np.asarray(c).dtype for c in consts] + [a.dtype for a in logical], k, "mapper")
    shape = logical[0].shape
    outs = host.outputs(out, dtypes, shape, "out", reads={j: inputs[j] for j in tables})
    size = math.prod(shape)
    if size > 0:
        T = host.num_chunks(size, None) if parallel is None else 1 + bool(parallel)
        wide = has_wide_form(mapper, [np.asarray(c).dtype for c in consts], [a.dtype for a in logical], dtypes)
        gathered = tuple(sorted(tables))
        map_kernel(mapper, k, m, T > 1, len(consts), ndim, wide, gathered)(
            T, *consts, *inputs, *outs, *(tables[j] for j in gathered))
    return outs


def _gathered_rows(rows: Sequence[np.ndarray | None] | None, inputs: Sequence[np.ndarray], m: int) -> dict[int, np.ndarray]:
    """The inputs read through row indices: {input position: int64 indices}, each checked against its table."""
    if rows is None:
        return {}
    if isinstance(rows, np.ndarray) or len(rows) != m:
        raise ValueError(f"rows: expected a sequence of {m} entries (None or an index array), got "
                         f"{'one array' if isinstance(rows, np.ndarray) else len(rows)}")
    found = {}
    for j, g in enumerate(rows):
        if g is None:
            continue
        table = inputs[j]
        if not isinstance(g, np.ndarray) or g.ndim != 1 or g.dtype.kind not in "iu":
            raise TypeError(f"rows[{j}] must be a 1-D integer array, got {getattr(g, 'dtype', type(g).__name__)} "
                            f"of shape {getattr(g, 'shape', None)}")
        if not isinstance(table, np.ndarray) or table.ndim != 2:
            raise ValueError(f"inputs[{j}] is gathered by rows[{j}], so it must be a 2-D table, got shape "
                             f"{getattr(table, 'shape', None)}")
        n = table.shape[0]
        low = g.min() if g.size else 0
        if g.size and (low < -n or g.max() >= n):
            bad = g[(g < -n) | (g >= n)][0]
            raise IndexError(f"rows[{j}]: index {bad} is out of range for a table of {n} rows")
        found[j] = np.ascontiguousarray(np.where(g < 0, g + n, g) if low < 0 else g, dtype=np.int64)
    return found


def _rows_stand_in(table: np.ndarray, g: np.ndarray) -> np.ndarray:
    """A zero-stride array of the gathered input's shape and dtype, for the checks that inputs agree."""
    return np.broadcast_to(np.zeros((), table.dtype), (g.shape[0], table.shape[1]))
