"""Parallel reduce and fused map-reduce over 1-D arrays of k-leaf elements.

    reduce(combine, k, identity, leaves)              = x_0 . x_1 . ... . x_{n-1}
    map_reduce(mapper, m, combine, k, identity, xs)   = f(xs[.][0]) . f(xs[.][1]) . ... . f(xs[.][n-1])

The kernel splits [0, n) into T contiguous chunks, folds each from the identity in parallel (prange),
then combines the T partials sequentially in chunk order, so the operands never change order and
non-commutative associative operators are correct (T = 1: one plain loop, no parallel region). In
map_reduce the mapped elements are never stored.

A fold is a chain of dependent combines, so one accumulator runs at the latency of the operator, not at
the speed of memory. The parallel kernel therefore folds each chunk as LANES contiguous sub-chunks
interleaved in one loop (independent chains the CPU overlaps), then combines the lane totals in order:
the same bracketing freedom as the chunks, never a change of operand order. A mapper with a lane form
(kernels.cpu.lanes) makes that one sub-chunk per lane, the lane form mapping the elements of a step in one
call of it, serially too.

A commutative operator (the caller says so) may take the elements in any order, so each chunk is folded
in TILE lanes of consecutive elements instead: element i goes to lane i % TILE, the lanes live in a small
array, and the loop over one tile of TILE elements is a plain elementwise loop that LLVM's loop vectoriser
turns into SIMD instructions (Numba leaves its SLP vectoriser off, so scalar accumulators stay scalar).
Measured at 10^7 float64 with a five-operation arithmetic body, on one thread: 7.8 ms -> 5.7 ms, the
time of reading the input; four scalar chains were compute-bound. A bare operator (no mapper) over 64
lanes is vectorised too (10^7 float64, two threads: + 3.3 -> 2.3 ms, * 3.4 -> 2.4 ms, maximum 4.5 -> 3.6
ms against 32 lanes, which LLVM unrolled into 32 scalar chains instead).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from . import host
from .codegen import call, compile_kernel, each, first_row, indent, names, signature
from .lanes import lane_call, lane_form, lane_width


# Independent accumulators per parallel chunk: enough to hide the latency of a floating-point add.
LANES = 4
# Operators a floating-point fold may name (its combine is exactly this IEEE operation on one leaf): the
# kernel then writes the operation inline and lets LLVM reassociate it ("reassoc" on the kernel's own
# instructions only; the mapper and combine keep theirs), so the loop vectoriser keeps SIMD partial results.
INLINE_OPERATORS = {"add": "+", "mul": "*"}
# Lanes of a commutative fold. LLVM unrolls a loop of 32 or fewer iterations of a bare operator completely,
# leaving it to the SLP vectoriser that Numba disables; it vectorises a loop of 64 (checked in the assembly:
# packed ymm additions and maxima), with or without a mapper.
TILE = 64


def _element(k: int, m: int, mapped: bool, index: str, prefix: str, source: str = "x") -> str:
    """prefix0.. = the element at `index` of the arrays source0.. (mapped or read)."""
    if mapped:
        return call(prefix, "mapper", ", ".join(f"{source}{j}[{index}]" for j in range(m)), k)
    return each(prefix + "{j} = " + source + "{j}[" + index + "]", k)


def _combine_into(acc: str, other: str, k: int) -> str:
    return call(acc, "combine", names(acc, k) + ", " + names(other, k), k)


def _fold_loop(k: int, m: int, mapped: bool, lo: str, hi: str, acc: str, vector: int = 0) -> str:
    """Fold the elements lo <= i < hi into acc_0.., starting from the identity (one chain); `vector`: the
    elements mapped that many at a time by the mapper's lane form (0: one at a time)."""
    return f"""{each(acc + "{j} = id{j}", k)}
{_each_element(k, m, mapped, lo, hi, False, vector, _combine_into(acc, "e", k))}"""


def _each_element(k: int, m: int, mapped: bool, lo: str, hi: str, reverse: bool, vector: int, body: str) -> str:
    """A loop running `body` (which reads i and e_0..) for each element i in [lo, hi), in order (from hi - 1
    down in reverse). `vector`: that many elements mapped per call of the mapper's lane form, then `body` for
    each of them in turn; the remainder one at a time (0: every element one at a time)."""
    if not vector:
        return _one_at_a_time(k, m, mapped, lo, hi, reverse, body)
    assert mapped
    sign = "-" if reverse else "+"
    width = vector
    elements = lane_call([[f"e{j}_{lane}" for lane in range(width)] for j in range(k)],
                         [[f"x{j}[i0 {sign} {lane}]" for lane in range(width)] for j in range(m)])
    each_lane = "\n".join(f"i = i0 {sign} {lane}\n" + each("e{j} = e{j}_" + str(lane), k) + "\n" + body for lane in range(width))
    done = f"{width} * (({hi} - {lo}) // {width})"
    rest = _one_at_a_time(k, m, mapped, lo, f"{hi} - {done}", True, body) if reverse else \
        _one_at_a_time(k, m, mapped, f"{lo} + {done}", hi, False, body)
    return f"""for b in range(({hi} - {lo}) // {width}):
    i0 = {f"{hi} - 1 - {width} * b" if reverse else f"{lo} + {width} * b"}
{indent(elements, 4)}
{indent(each_lane, 4)}
{rest}"""


def _one_at_a_time(k: int, m: int, mapped: bool, lo: str, hi: str, reverse: bool, body: str) -> str:
    header = f"for i in range({hi} - 1, {lo} - 1, -1):" if reverse else f"for i in range({lo}, {hi}):"
    return header + "\n" + indent(_element(k, m, mapped, "i", "e") + "\n" + body, 4)


def _lanes_loop(k: int, m: int, mapped: bool, lanes: int, row: str = "", vector: bool = False, merge: bool = True,
                q: str | None = None) -> str:
    """Fold lo <= i < hi into acc_0.. as `lanes` interleaved sub-chunks of q elements (the last one also
    takes the remainder), then combine the lane totals in lane order. `row`: an index prefix for 2-D
    inputs ("r, ": the elements of row r). `vector`: map the `lanes` elements of a step with one call of the
    mapper's lane form (of that many lanes). `merge=False`: leave the lane totals in a0_.., a1_.., uncombined. `q`:
    the sub-chunk length where the caller knows it better than (hi - lo) // lanes (a literal)."""
    acc = [f"a{lane}_" for lane in range(lanes)]
    index = [f"{row}i + {lane} * q" for lane in range(lanes)]
    combines = [_combine_into(acc[lane], f"e{lane}_", k) for lane in range(lanes)]
    if vector:
        assert mapped, lanes
        elements = lane_call([[f"e{lane}_{j}" for lane in range(lanes)] for j in range(k)],
                             [[f"x{j}[{ix}]" for ix in index] for j in range(m)])
        step = elements + "\n" + "\n".join(combines)
    else:
        step = "\n".join(_element(k, m, mapped, index[lane], f"e{lane}_") + "\n" + combines[lane] for lane in range(lanes))
    last = acc[-1]
    merged = "\n".join([_combine_into(acc[0], acc[lane], k) for lane in range(1, lanes)]
                       + [each("acc{j} = " + acc[0] + "{j}", k)]) if merge else ""
    return f"""q = {q or f"(hi - lo) // {lanes}"}
{chr(10).join(each(a + "{j} = id{j}", k) for a in acc)}
for i in range(lo, lo + q):
{indent(step, 4)}
for i in range(lo + {lanes} * q, hi):
{indent(_element(k, m, mapped, row + "i", "e"), 4)}
    {_combine_into(last, "e", k)}
{merged}"""


def _tiled_loop(k: int, m: int, mapped: bool) -> str:
    """Fold lo <= i < hi into acc_0.. in TILE lanes of consecutive elements (lane i % TILE), then the lanes
    and the remainder: any order, so for commutative operators only. The views y0.. of [lo, hi) start at
    index 0, so the loop's indices are provably non-negative (no wraparound test to stop vectorisation)."""
    combine = call("c", "combine", ", ".join([f"t{j}[l]" for j in range(k)] + [f"e{j}" for j in range(k)]), k)
    return f"""{each("y{j} = x{j}[lo:hi]", m)}
q = (hi - lo) // {TILE}
{each("t{j} = np.full(" + str(TILE) + ", id{j})", k)}
for b in range(q):
    for l in range({TILE}):
{indent(_element(k, m, mapped, f"b * {TILE} + l", "e", "y"), 8)}
        {combine}
{each("t{j}[l] = c{j}", k, 8)}
{each("acc{j} = t{j}[0]", k)}
for l in range(1, {TILE}):
    {call("acc", "combine", names("acc", k) + ", " + ", ".join(f"t{j}[l]" for j in range(k)), k)}
for i in range({TILE} * q, hi - lo):
{indent(_element(k, m, mapped, "i", "e", "y"), 4)}
    {_combine_into("acc", "e", k)}"""


def _reassociated_loop(m: int, mapped: bool, symbol: str) -> str:
    """Fold lo <= i < hi into acc0 with the inline operator `symbol`, in one loop that LLVM may reassociate
    (the kernel is compiled with fastmath "reassoc"): it vectorises the fold into SIMD partial results, as
    for a Numba prange reduction. Indices from 0 over views, as in _tiled_loop."""
    return f"""{each("y{j} = x{j}[lo:hi]", m)}
acc0 = id0
for i in range(hi - lo):
{indent(_element(1, m, mapped, "i", "e", "y"), 4)}
    acc0 = acc0 {symbol} e0"""


def _fold_source(k: int, m: int, mapped: bool, vector: int, tiled: bool = False, inline: str | None = None,
                 layout: tuple[tuple[int, ...], ...] | None = None) -> str:
    if inline is not None:  # one reassociable loop, serially too
        serial = f"""lo = 0
hi = n
{_reassociated_loop(m, mapped, inline)}
return (acc0,)"""
    elif tiled:  # TILE lanes of consecutive elements, serially too
        serial = f"""lo = 0
hi = n
{_tiled_loop(k, m, mapped)}
return ({names("acc", k)},)"""
    elif vector:  # the lane form maps `vector` elements at a time, each to its own chain
        serial = f"""lo = 0
hi = n
{_lanes_loop(k, m, mapped, vector, vector=True)}
return ({names("acc", k)},)"""
    else:
        serial = f"""{_fold_loop(k, m, mapped, "0", "n", "s")}
return ({names("s", k)},)"""
    if inline is not None:
        chunk = _reassociated_loop(m, mapped, inline)
    else:
        chunk = _tiled_loop(k, m, mapped) if tiled else _lanes_loop(k, m, mapped, vector or LANES,
                                                                    vector=bool(vector))
    # The two folds are helpers the kernel calls: a prange loop's body is copied and analysed again by
    # Numba's parfor passes, and at k = 6 (a record of six leaves) the kernel with the chunk's fold written
    # in the loop took 4.7 s to compile (see kernels.cpu.codegen.compile_kernel's `helpers`).
    x_sizes, id_sizes, p_sizes = layout or ((1,) * m, (1,) * k, (1,) * k)
    inputs, input_rows = signature([("x", x_sizes), ("id", id_sizes)])
    partials, partial_rows = signature([("p", p_sizes)])
    return f"""
def serial_fold(n, {inputs}):
{indent(input_rows, 4)}
{indent(serial, 4)}


def chunk_fold(t, T, n, {inputs}):
{indent(input_rows, 4)}
    lo = t * n // T
    hi = (t + 1) * n // T
{indent(chunk, 4)}
    return ({names("acc", k)},)


def kernel(T, {inputs}, {partials}):
{indent(partial_rows, 4)}
    n = {first_row("x", x_sizes)}.shape[0]
    if T == 1:  # no parallel region at all
        return serial_fold(n, {inputs})
    for t in prange(T):
        {names("acc", k)}, = chunk_fold(np.int64(t), T, n, {inputs})
{each("p{j}[t] = acc{j}", k, 8)}
{each("tot{j} = p{j}[0]", k, 4)}
    for t in range(1, T):
        {call("tot", "combine", names("tot", k) + ", " + ", ".join(f"p{j}[t]" for j in range(k)), k)}
    return ({names("tot", k)},)
"""


def fold_kernel(combine: Any, k: int, mapper: Any = None, m: int | None = None, parallel: bool = True,
                commutative: bool = False, operator: str | None = None,
                layout: tuple[tuple[int, ...], ...] | None = None) -> Any:
    """The compiled kernel(T, x_0..x_{m-1}, id_0..id_{k-1}, p_0..p_{k-1}) -> k-tuple (m = k without mapper).

    The p_j are T-element scratch arrays for the chunk partials, allocated by the driver. `layout`: how many
    of the x, id and p each argument holds (default one each; see kernels.cpu.bidirectional's). `commutative`:
    the elements may be folded in any order (TILE lanes of consecutive elements), unless the mapper has a
    lane form, whose vector calls serve better. `operator`: a key of INLINE_OPERATORS that `combine` is
    (floating-point elements only; the driver checks): the fold is written inline and reassociated.
    """
    m = k if mapper is None else m
    vector = lane_form(mapper)
    inline = INLINE_OPERATORS[operator] if operator is not None and k == 1 and vector is None else None
    tiled = commutative and vector is None and inline is None
    key = ("fold", combine, mapper, k, m, parallel, tiled, inline, layout)
    return compile_kernel(key, lambda: _fold_source(k, m, mapper is not None, lane_width(mapper), tiled, inline, layout),
                          {"combine": combine, "mapper": mapper, "mapper_lanes": vector}, parallel=parallel,
                          fastmath={"reassoc"} if inline is not None else None, helpers=("serial_fold", "chunk_fold"))


def reduce(combine: Any, k: int, identity: Sequence[Any], leaves: Sequence[np.ndarray], *,
           chunks: int | None = None, commutative: bool = False, operator: str | None = None,
           carry: Sequence[Any] | None = None) -> tuple:
    """Reduce k 1-D arrays of one length n (the leaves of n elements) with `combine`.

    Returns a tuple of k NumPy scalars of the leaves' dtypes; the identity when n == 0.
    `chunks` overrides the number of parallel chunks (default: one per Numba thread, see host.num_chunks).
    `commutative`: `combine` is commutative, so the elements may be folded in any order (faster).
    `operator`: "add" or "mul" when `combine` is exactly that operation (so commutative too): floating-point
    folds are then vectorised, reassociated as a commutative fold's lanes are.
    `carry`: the dtypes the partial results are kept in (see host.carried_dtypes; `combine` takes and
    returns those, and the results are rounded to the leaves' dtypes once).
    """
    host.check_function(combine, "combine")
    k = host.check_count(k, "k")
    leaves = host.check_arrays(leaves, k, 1, "leaves")
    dtypes = [a.dtype for a in leaves]
    carried = host.carried_dtypes(carry, dtypes)
    ident = host.cast_identity(identity, carried)
    commutative, operator = commutative or operator is not None, _inline_operator(operator, k, dtypes)
    host.check_combine(combine, carried)
    return _run(lambda parallel, layout: fold_kernel(combine, k, parallel=parallel, commutative=commutative,
                                                     operator=operator, layout=layout),
                ident, dtypes, carried, leaves, chunks)


def map_reduce(mapper: Any, m: int, combine: Any, k: int, identity: Sequence[Any],
               inputs: Sequence[np.ndarray], *, chunks: int | None = None, commutative: bool = False,
               operator: str | None = None, carry: Sequence[Any] | None = None) -> tuple:
    """Reduce the elements mapper(inputs[0][i], ..., inputs[m-1][i]), i < n, without materialising them.

    `mapper` takes m scalars and returns k (a scalar when k == 1); the element dtypes are its result
    types for the inputs' dtypes. Returns a tuple of k NumPy scalars of those dtypes. `commutative`,
    `operator` and `carry`: as for reduce.
    """
    inputs = host.check_arrays(inputs, host.check_count(m, "m"), 1, "inputs")
    fold = MapReduce(mapper, m, combine, k, [a.dtype for a in inputs], commutative=commutative, operator=operator,
                     carry=carry)
    return fold(inputs, identity, chunks=chunks)


class MapReduce:
    """map_reduce with everything that depends only on the functions and the inputs' dtypes checked once:
    a caller that folds the same functions over new arrays of those dtypes again and again (the numba
    backend, once per statement) pays only for the arrays' checks and the kernel's call. Calling it is
    map_reduce(mapper, m, combine, k, identity, inputs, chunks=chunks, ...) for inputs of `input_dtypes`."""

    def __init__(self, mapper: Any, m: int, combine: Any, k: int, input_dtypes: Sequence[np.dtype], *,
                 commutative: bool = False, operator: str | None = None, carry: Sequence[Any] | None = None):
        host.check_function(mapper, "mapper")
        host.check_function(combine, "combine")
        self.m, self.k = host.check_count(m, "m"), host.check_count(k, "k")
        self.input_dtypes = tuple(np.dtype(d) for d in input_dtypes)
        if len(self.input_dtypes) != self.m:
            raise ValueError(f"input_dtypes: expected {self.m} dtypes, got {len(self.input_dtypes)}")
        self.dtypes = host.result_dtypes(mapper, self.input_dtypes, self.k, "mapper")
        self.carried = host.carried_dtypes(carry, self.dtypes)
        host.check_combine(combine, self.carried)
        self.commutative = commutative or operator is not None
        self.operator = _inline_operator(operator, self.k, self.dtypes)
        self.mapper, self.combine = mapper, combine

    def __call__(self, inputs: Sequence[np.ndarray], identity: Sequence[Any], *, chunks: int | None = None) -> tuple:
        inputs = host.check_arrays(inputs, self.m, 1, "inputs")
        for j, (a, d) in enumerate(zip(inputs, self.input_dtypes, strict=True)):
            if a.dtype != d:
                raise TypeError(f"inputs[{j}] has dtype {a.dtype}, but this fold was prepared for {d}")
        ident = host.cast_identity(identity, self.carried)
        return _run(lambda parallel, layout: fold_kernel(self.combine, self.k, self.mapper, self.m, parallel,
                                                         self.commutative, self.operator, layout),
                    ident, self.dtypes, self.carried, inputs, chunks)


def _inline_operator(operator: str | None, k: int, dtypes: list[np.dtype]) -> str | None:
    """`operator` where the kernel may write it inline (one floating-point leaf), else None."""
    if operator is not None and operator not in INLINE_OPERATORS:
        raise ValueError(f"operator must be one of {sorted(INLINE_OPERATORS)} or None, got {operator!r}")
    return operator if k == 1 and dtypes[0].kind == "f" else None


def _run(kernel_for: Callable[[bool, tuple], Any], ident: tuple, dtypes: list[np.dtype], carried: list[np.dtype],
         xs: list[np.ndarray], chunks: int | None) -> tuple:
    """The fold of xs from `ident` (both checked, the combine too) by the kernel `kernel_for(parallel, layout)`."""
    n = xs[0].shape[0]
    if n == 0:
        return tuple(d.type(v) for d, v in zip(dtypes, ident, strict=True))
    T = host.num_chunks(n, chunks)
    (inputs, x_sizes), (ids, id_sizes) = host.column_groups(xs), host.packed_values(ident, carried)
    partials, p_sizes = host.packed_rows(carried, T)
    out = kernel_for(T > 1, (x_sizes, id_sizes, p_sizes))(T, *inputs, *ids, *partials)
    return tuple(d.type(v) for d, v in zip(dtypes, out, strict=True))
