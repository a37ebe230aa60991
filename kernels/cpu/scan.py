"""Parallel inclusive/exclusive, forward/reverse scan of 1-D arrays of k-leaf elements.

With x_0 .. x_{n-1} and the operator '.', the four variants are

    inclusive forward   y_i = x_0 . ... . x_i
    exclusive forward   y_i = e . x_0 . ... . x_{i-1}          (y_0 = e, the identity)
    inclusive reverse   y_i = x_i . ... . x_{n-1}
    exclusive reverse   y_i = x_{i+1} . ... . x_{n-1} . e      (y_{n-1} = e)

Reverse is the forward scan of the reversed sequence under the swapped operator (a, b) -> b . a, reversed
back; the kernel computes exactly that in place, walking each chunk from its right end and combining as
combine(x_i, acc), so no array is copied and operand order is kept.

Three phases over T + 1 contiguous chunks for T threads (work-efficient: about 2n combines in all; T = 1
is one plain loop with no parallel region):
  1. (parallel) the first chunk (the last in reverse) needs no seed: one thread scans it, keeping its total,
     while the others fold the totals of the chunks up to the other end's (one chain each: the scan of the
     seedless chunk is the longer task, so the reduce's interleaved lanes would only add register pressure);
     the chunk at the other end needs no total;
  2. (sequential) the exclusive scan of the totals, in chunk order: the seed of each chunk;
  3. (parallel) the T other chunks scanned from their seeds.
Each thread takes one chunk in each parallel phase: with T chunks, the seedless one would leave a thread idle
while the totals are folded.

map_scan fuses a map on either side: the elements are mapper(inputs at i), computed in phases 1 and 3 and
never stored (WIDTH at a time by the mapper's lane form, kernels.cpu.lanes, if it has one), and `post` turns the scan's value at i (with the inputs at i) into the outputs, so a map
reading the scan needs no scan written out. Phase 3 can run a restricted operator, `step`, that computes
only the leaves an output needs (the matrix part of an affine recurrence is carried between chunks, but
only its vector part is read). Where the totals of phase 1 cost many times that step, one serial pass
beats the three phases on few threads (`parallel_pays`), and map_scan runs it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numba
import numpy as np

from . import host
from .codegen import call, compile_kernel, each, indent, names
from .lanes import lane_form, lane_width
from .reduce import _each_element, _fold_loop


def _store(k: int, m: int, r: int, post: bool) -> str:
    """out_j[i] = the scan's value at i, or post(value, inputs at i)."""
    if not post:
        return each("out{j}[i] = acc{j}", k)
    x_i = ", ".join(f"x{j}[i]" for j in range(m))
    return call("o", "post", f"{names('acc', k)}, {x_i}", r) + "\n" + each("out{j}[i] = o{j}", r)


def _step(k: int, live: tuple | None, reverse: bool) -> str:
    """acc = acc . e (e . acc in reverse); with `live`, only those leaves, by `step` (the others feed no output)."""
    args = f"{names('e', k)}, {names('acc', k)}" if reverse else f"{names('acc', k)}, {names('e', k)}"
    if live is None:
        return call("acc", "combine", args, k)
    targets = ", ".join(f"acc{j}" for j in live)
    return f"{targets} = as_scalar(step({args}))" if len(live) == 1 else f"{targets} = step({args})"


def _scan_chunk(k: int, m: int, mapped: bool, r: int, post: bool, live: tuple | None, exclusive: bool,
                reverse: bool, vector: int) -> str:
    """Scan the elements lo <= i < hi into out_j, from the seed acc_0.. (one of the four variants: each kernel
    is written for one, which keeps the source, and Numba's compile time, a quarter of all four)."""
    store, step = _store(k, m, r, post), _step(k, live, reverse)
    return _each_element(k, m, mapped, "lo", "hi", reverse, vector, "\n".join([store, step] if exclusive else [step, store]))


def _scan_source(k: int, m: int, mapped: bool, r: int, post: bool, live: tuple | None, exclusive: bool,
                 reverse: bool, vector: int) -> str:
    full = _scan_chunk(k, m, mapped, r, post, None, exclusive, reverse, vector)
    final = _scan_chunk(k, m, mapped, r, post, live, exclusive, reverse, vector)
    if reverse:  # the last chunk needs no seed; the totals of chunks 1 .. T; seeds from the right
        first, seedless, rest, order, far_end = "t + 1", "C - 1", "t", "range(C - 1, 0, -1)", "0"
        fold_in = f"{names('nxt', k)}, {names('seed', k)}"
    else:  # the first chunk needs no seed; the totals of chunks 0 .. T - 1; seeds from the left
        first, seedless, rest, order, far_end = "t", "0", "t + 1", "range(C - 1)", "C - 1"
        fold_in = f"{names('seed', k)}, {names('nxt', k)}"
    seeds = f"""for c in {order}:
{each("nxt{j} = tot{j}[c]", k, 4)}
{each("tot{j}[c] = seed{j}", k, 4)}
    {call("seed", "combine", fold_in, k)}
{each("tot{j}[" + far_end + "] = seed{j}", k)}"""
    return f"""
def kernel(T, {names("x", m)}, {names("id", k)}, {names("tot", k)}, {names("out", r)}):
    n = x0.shape[0]
    if T == 1:  # no parallel region at all
        lo = 0
        hi = n
{each("acc{j} = id{j}", k, 8)}
{indent(final, 8)}
        return
    C = T + 1
    # 1. the seedless chunk scanned from the identity, its total kept; at once, the totals of the chunks
    #    between it and the other end
    for t in prange(T):
        ch = {first}
        lo = ch * n // C
        hi = (ch + 1) * n // C
        if ch == {seedless}:
{each("acc{j} = id{j}", k, 12)}
{indent(full, 12)}
        else:
{indent(_fold_loop(k, m, mapped, "lo", "hi", "acc", vector), 12)}
{each("tot{j}[ch] = acc{j}", k, 8)}
    # 2. seeds: tot[c] becomes the combination of the totals of the chunks before c (after c in reverse)
{each("seed{j} = id{j}", k, 4)}
{indent(seeds, 4)}
    # 3. the other chunks scanned from their seeds
    for t in prange(T):
        ch = {rest}
        lo = ch * n // C
        hi = (ch + 1) * n // C
{each("acc{j} = tot{j}[ch]", k, 8)}
{indent(final, 8)}
"""


def scan_kernel(combine: Any, k: int, parallel: bool = True, *, exclusive: bool = False, reverse: bool = False,
                mapper: Any = None, m: int | None = None, post: Any = None, r: int | None = None, step: Any = None,
                live: tuple | None = None) -> Any:
    """The compiled kernel(T, x_0.., id_0.., tot_0.., out_0..) of one variant, filling out_j in place.

    tot_j are (T + 1)-element scratch arrays; out_j are the n-element outputs. All allocated by the driver.
    """
    m = k if mapper is None else m
    r = k if post is None else r
    live = None if step is None else tuple(live)
    exclusive, reverse = bool(exclusive), bool(reverse)
    vector = lane_form(mapper)
    key = ("scan", combine, k, parallel, exclusive, reverse, mapper, m, post, r, step, live)
    return compile_kernel(key, lambda: _scan_source(k, m, mapper is not None, r, post is not None, live, exclusive, reverse,
                                                    lane_width(mapper)),
                          {"combine": combine, "mapper": mapper, "mapper_lanes": vector, "post": post, "step": step},
                          parallel=parallel)


def scan(combine: Any, k: int, identity: Sequence[Any], leaves: Sequence[np.ndarray],
         exclusive: bool = False, reverse: bool = False, *, chunks: int | None = None,
         out: Sequence[np.ndarray] | None = None, carry: Sequence[Any] | None = None) -> tuple:
    """Scan k 1-D arrays of one length n (the leaves of n elements) with `combine`.

    Returns a tuple of k arrays of length n with the leaves' dtypes (see the module docstring for the
    four variants): new ones, or `out` filled. `chunks` overrides the number of parallel chunks (default:
    one per Numba thread). `carry`: the dtypes the running values are kept in (see host.carried_dtypes:
    `combine` takes and returns those, and each output is rounded to its leaf's dtype as it is stored).
    """
    host.check_function(combine, "combine")
    k = host.check_count(k, "k")
    leaves = host.check_arrays(leaves, k, 1, "leaves")
    return _run(combine, k, identity, leaves, [a.dtype for a in leaves], exclusive, reverse, chunks, out, None,
                carry)


def map_scan(mapper: Any, m: int, combine: Any, k: int, identity: Sequence[Any], inputs: Sequence[np.ndarray],
             exclusive: bool = False, reverse: bool = False, *, post: Any = None, r: int | None = None,
             step: Any = None, live: Sequence[int] | None = None, chunks: int | None = None,
             out: Sequence[np.ndarray] | None = None, carry: Sequence[Any] | None = None) -> tuple:
    """Scan the elements mapper(inputs[0][i], ..., inputs[m-1][i]), i < n, without storing them.

    `mapper` takes m scalars and returns k (mapper None: the m == k inputs are the leaves, as in `scan`).
    With `post` (returning r scalars), out_j[i] = post(*scan_i, *inputs[.][i]) is written instead of the
    scan, which is then never stored either. With `step` (a combine that returns only the leaves `live`, in
    that order), the final pass computes only those: where the other leaves feed no output, as the matrix
    part of an affine recurrence whose vector part alone is read. Returns a tuple of k (or r) arrays.
    `carry`: as for scan (`step` and `post` then take the carried values too).
    """
    for fn, what in ((mapper, "mapper"), (post, "post"), (step, "step")):
        if fn is not None:
            host.check_function(fn, what)
    host.check_function(combine, "combine")
    k = host.check_count(k, "k")
    m = k if mapper is None else host.check_count(m, "m")
    inputs = host.check_arrays(inputs, m, 1, "inputs")
    in_dtypes = [a.dtype for a in inputs]
    dtypes = in_dtypes if mapper is None else host.result_dtypes(mapper, in_dtypes, k, "mapper")
    live = _check_live(live, k, step)
    carried = host.carried_dtypes(carry, dtypes)
    if step is not None:
        host.result_dtypes(step, carried * 2, len(live), "step")
    out_dtypes = None
    if post is None and r is not None:
        raise ValueError(f"r is the number of post's results; got r={r!r} without a post")
    if post is not None:
        r = host.check_count(r, "r")
        out_dtypes = host.result_dtypes(post, carried + in_dtypes, r, "post")
    if chunks is None and not parallel_pays(k, live, numba.get_num_threads()):
        chunks = 1
    return _run(combine, k, identity, inputs, dtypes, exclusive, reverse, chunks, out, out_dtypes, carry,
                mapper=mapper, post=post, r=r, step=step, live=live)


def parallel_pays(k: int, live: Sequence[int] | None, threads: int) -> bool:
    """Whether the parallel scan of map_scan can beat one serial pass on `threads` threads.

    With `live`, the serial pass runs only the restricted step (for an affine recurrence of state size s,
    k = s^2 + s leaves, s live: matrix-vector products, s^2 per element), while the parallel scan's totals
    pass composes whole elements (matrix products, s^3): about k / len(live) times the work, on top of the
    final pass. Measured on 2 threads (benchmarks 1a-1c, generic scan gradients at 10^7 elements): at
    k / live = 2 and 3 the parallel scan took 0.8x the serial time, at 5 (2 x 2 matrices, s = 4) 1.7x.
    So: parallel while k / len(live) < 2 * threads."""
    return live is None or k < 2 * threads * len(live)


def _check_live(live: Any, k: int, step: Any) -> tuple | None:
    if step is None:
        if live is not None:
            raise ValueError(f"live names the leaves a step computes; got live={live!r} without a step")
        return None
    if live is None or not len(live) or any(not isinstance(j, (int, np.integer)) or not 0 <= j < k for j in live) \
            or len(set(live)) != len(live):
        raise ValueError(f"live must be distinct leaf indices in [0, {k}) with step, got {live!r}")
    return tuple(int(j) for j in live)


def _run(combine: Any, k: int, identity: Sequence[Any], inputs: list[np.ndarray], dtypes: list, exclusive: bool,
         reverse: bool, chunks: int | None, out: Sequence[np.ndarray] | None, out_dtypes: list | None,
         carry: Sequence[Any] | None, **fused: Any) -> tuple:
    """Allocate (or check `out`, of `out_dtypes`, default the elements'), choose the chunks, run the kernel."""
    carried = host.carried_dtypes(carry, dtypes)
    ident = host.cast_identity(identity, carried)
    host.check_combine(combine, carried)
    n = inputs[0].shape[0]
    outs = host.outputs(out, out_dtypes or dtypes, n, "out", reads=inputs)
    if n == 0:
        return outs
    T = host.num_chunks(n, chunks)
    totals = [np.empty(T + 1, d) for d in carried]
    m = len(inputs)
    scan_kernel(combine, k, T > 1, exclusive=exclusive, reverse=reverse, m=m, **fused)(T, *inputs, *ident, *totals, *outs)
    return outs
