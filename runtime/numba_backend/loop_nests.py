"""Loop nests (runtime/loops) as Numba kernels: the outer traversal a prange, split into chunks for a fold.

Both run `chunks` chunks of consecutive indices in a prange. A ParallelFold's chunk folds its elements into
states of its own, and the chunks' states are folded in chunk order after the prange: the operator sees its
operands in order, and the result does not depend on the threads. The small buffers an iteration uses are
allocated once per chunk (every one is written before it is read within an iteration), not per index.
"""

from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from fold.kernels.cpu import vector_math
from fold.kernels.cpu.modules import file_digest, load_module
from fold.runtime.loops import LoopNest, constants_of, kernel_of
from fold.runtime.loops.nest import Buffer, Kernel, Loop, ParallelFold, ParallelMap, Param, Store, checked_inputs_hold
from fold.runtime.loops import text
from fold.runtime.loops.text import allocations, reads, shape_text, size, statement_lines

from . import nest_interchange, nest_jam, nest_lanes, nest_parts, nest_reuse, nest_tiles, scalar_helpers
from .extremum_loops import vectorised_extrema
from .lowering import numba_impls

# chunks of a fold per thread: enough that uneven rows even out, few enough that merging them costs nothing
CHUNKS_PER_THREAD = 4
# A fold's chunks are merged serially after the prange, each state scalar once per chunk: a fold of large
# states (a histogram's bins, a sum of long rows) gets no more chunks than keep that merge within a quarter
# of the traversal's work (as kernels/cpu/histogram.py's private histograms).
MERGE_SHARE = 4
# No fastmath: with reassoc and contract the GMM gradient (2 x 10^5 x 32 x 16) took 337-499 ms against
# 194-251 ms without, alternately here, and k-means' cost 253 against 228 ms (the 390 -> 249 ms once
# measured for them did not come back); commutative folds are split into lanes in the text (nest_lanes).
NEST_OPTIONS = {"parallel": True, "error_model": "numpy"}
SERIAL_OPTIONS = {k: v for k, v in NEST_OPTIONS.items() if k != "parallel"}
# A nest of less work than this (statements run, each loop's body counted once per iteration) runs as the
# same kernel compiled serially, in one chunk, as kernels/cpu's kernels do below 2 * MIN_CHUNK elements:
# starting the threads costs more than they save there. Measured on the 2-core VM, parallel against serial:
# a sum of a mapped lambda (6 per element) at 10^3 elements 194 against 35 us, at 6.4 x 10^4 116 against 40,
# at 2.6 x 10^5 (work 1.5 x 10^6) 142 against 117; row logsumexps of 64 at 10^3 rows (work 3.3 x 10^5) 280
# against 277, at 10^4 rows 1575 against 2210; the natural k-means over 64 centroids of 16 at 256 points
# (work 2.2 x 10^6) 293 against 107, at 4096 points 582 against 822.
SERIAL_WORK = 1 << 19


# a long body's parts (nest_parts): compiled on their own, serially (each runs inside the kernel's prange)
PART_OPTIONS = SERIAL_OPTIONS


def kernel_source(kernel: Kernel) -> str:
    """The text of a module defining `kernel(*inputs, *outputs, chunks)` (and the parts it calls)."""
    return kernel_module(kernel)[0]


def work(kernel: Kernel) -> int:
    """How many statements the kernel runs in all: each loop's body counted once per iteration."""
    body = kernel.outer.body if isinstance(kernel.outer, ParallelMap) else kernel.outer.step
    return kernel.outer.extent * text.work(body)


def as_run(kernel: Kernel) -> Kernel:
    """The nest as this backend runs it: with what a later loop would compute again stored (nest_reuse), and
    loops folding an inner loop per iteration swapped with it (nest_interchange). A long inner loop's steps
    are written out a block at a time only in a body compiled whole (at most nest_parts.WHOLE statements): in
    parts, the blocks (or the loops around them) call a part per iteration (attention's gradient 24 -> 57 ms,
    its Hessian-vector product 54 -> 553 ms)."""
    reused = nest_reuse.reused(kernel)
    run = nest_interchange.interchanged(reused)
    if _laned_size(run) > nest_parts.WHOLE:
        return nest_interchange.interchanged(reused, blocks=False)
    return run


def _laned_size(kernel: Kernel) -> int:
    """The statements of the kernel's per-index body once run in lanes (what _in_parts measures)."""
    laned, _ = _with_lanes(kernel.outer, kernel.params)
    return size(laned.body if isinstance(laned, ParallelMap) else laned.step)


def kernel_module(kernel: Kernel, parallel: bool = True) -> tuple[str, dict[str, dict]]:
    """The kernel's module text, and the functions in it to compile with their options (`parallel`: its
    traversal over threads, else serially)."""
    kernel = as_run(kernel)
    params = [p.name for p in kernel.inputs] + [p.name for p in kernel.outputs] + ["chunks"]
    lines = [f"def kernel({', '.join(params)}):"]
    transposes = nest_interchange.transposed(kernel)
    lines += [f"    {a}{nest_interchange.TRANSPOSED} = np.ascontiguousarray({a}.T)" for a in transposes]
    laned, whole_chunk = _with_lanes(kernel.outer, kernel.params)
    outer, parts = _in_parts(laned, params + [a + nest_interchange.TRANSPOSED for a in transposes])
    # every buffer is allocated once per chunk: those of the outlined parts too, passed to them
    if isinstance(outer, ParallelMap):
        lines += [f"    for chunk in prange(chunks):", *_chunk_bounds("chunk", outer.extent),
                  *_allocations(laned.body, 8)]
        if whole_chunk:
            lines += _nodes(outer.body, 8, hoisted=True)
        else:
            lines += [f"        for {outer.index} in range(lo, hi):", *_nodes(outer.body, 12, hoisted=True)]
    else:
        lines += _fold_lines(outer, laned.step, whole_chunk)
    return "\n".join([
        f"# scalar helpers {file_digest(scalar_helpers)}",
        "import math",
        "import numpy as np",
        "from numba import prange",
        "from fold.runtime.numba_backend.scalar_helpers import "
        + ", ".join(scalar_helpers.HELPERS + scalar_helpers.VECTORISED_HELPERS),
        f"from fold.kernels.cpu.vector_math import {', '.join(nest_lanes.IMPORTS)}",
        f"# vector math {file_digest(vector_math)} available: {vector_math.AVAILABLE}",
        "", "", *[text + "\n\n" for text in parts.sources], *lines, ""]), \
        {"kernel": NEST_OPTIONS if parallel else SERIAL_OPTIONS, **{name: PART_OPTIONS for name in parts.names}}


def _in_parts(outer, params: list[str]):
    """The traversal with a long per-index body split into parts (nest_parts), and the outliner holding them."""
    body = outer.body if isinstance(outer, ParallelMap) else outer.step
    if isinstance(outer, ParallelMap):
        total, extra = nest_parts.uses(body), ()
    else:
        # the states are read after the traversal (their partials): one more use each
        total = nest_parts.uses(outer.init + outer.step + outer.merge) + Counter(s.name for s in outer.states)
        extra = [s.name for s in outer.states]
    variables = nest_parts.kernel_variables(body, extra=[*params, outer.index, "chunk", "lo", "hi", *extra])
    parts = nest_parts.Outliner(variables, total)
    if size(body) <= nest_parts.WHOLE:
        return outer, parts
    body = parts.block(body)
    return (ParallelMap(outer.index, outer.extent, body) if isinstance(outer, ParallelMap)
            else replace(outer, step=body)), parts


def _with_lanes(outer, params: tuple[Param, ...]) -> tuple[Any, bool]:
    """The traversal with its indices (nest_lanes.outer_in_lanes) or its innermost loops run in lanes where
    that pays (nest_lanes), or a fold's rows in tiles (nest_tiles), or its sweeps of a shared matrix several
    rows at once (nest_jam), and whether its body is now a whole chunk (its chunk's loop written by those).
    `params`: the kernel's."""
    arrays = {q.name: q.dtype for q in params}
    read_only = {q.name: int(np.prod(q.shape)) * np.dtype(q.dtype).itemsize for q in params if q.role != "output"}
    read_only |= {name + nest_interchange.TRANSPOSED: nbytes for name, nbytes in read_only.items()}
    if isinstance(outer, ParallelMap):
        outer = ParallelMap(outer.index, outer.extent, vectorised_extrema(outer.body))
        chunk = nest_lanes.outer_in_lanes(outer, Counter())
        if chunk is not None:
            return ParallelMap(outer.index, outer.extent, chunk), True
        body = nest_lanes.in_lanes(outer.body, runs=outer.extent)
        jammed = nest_jam.rows_jammed(outer.index, body, read_only)
        return (ParallelMap(outer.index, outer.extent, jammed), True) if jammed else (replace(outer, body=body), False)
    outer = replace(outer, step=vectorised_extrema(outer.step))
    # the states are read after the traversal: they count as read outside any loop of the step
    outside = Counter(s.name for s in outer.states) + reads(outer.init + outer.merge)
    chunk = (nest_lanes.outer_in_lanes(outer, outside) or nest_lanes.chunk_in_lanes(outer, outside)
             or nest_tiles.rows_in_tiles(outer, arrays))
    if chunk is not None:
        return replace(outer, step=chunk), True
    step = nest_lanes.in_lanes(outer.step, outside + reads(outer.step), outer.extent)
    jammed = nest_jam.rows_jammed(outer.index, step, read_only)
    return (replace(outer, step=jammed), True) if jammed else (replace(outer, step=step), False)


def _fold_lines(fold: ParallelFold, allocated: tuple, whole_chunk: bool) -> list[str]:
    """The fold's lines; `allocated`: the step whose buffers are allocated per chunk (before outlining);
    `whole_chunk`: the step folds the chunk's indices itself."""
    lines = []
    for s in fold.states:
        shape = (s.shape or (1,)) if s.stored else ()
        lines.append(f"    {fold.partial}{s.name} = np.empty((chunks, {', '.join(map(str, shape))}), np.{s.dtype.name})")
    lines += [f"    for {fold.chunk} in prange(chunks):", *_chunk_bounds(fold.chunk, fold.extent)]
    lines += _nodes(fold.init, 8) + _allocations(allocated, 8)
    if whole_chunk:
        lines += _nodes(fold.step, 8, hoisted=True)
    else:
        lines.append(f"        for {fold.index} in range(lo, hi):")
        lines += _nodes(fold.step, 12, hoisted=True)
    for s in fold.states:
        if s.stored:
            lines += _nodes(_copy(s.shape or (1,), lambda ix, s=s: (f"{fold.partial}{s.name}", (fold.chunk, *ix)), s.name), 8)
        else:
            lines.append(f"        {fold.partial}{s.name}[{fold.chunk}] = {s.name}")
    lines += _nodes(fold.init, 4)
    lines.append(f"    for {fold.chunk} in range(chunks):")
    lines += _nodes(fold.merge, 8)
    for s in fold.states:
        if s.stored:
            shape = s.shape or (1,)
            lines += _nodes(_copy(shape, lambda ix, s=s, shape=shape: (s.output, (_flat_index(ix, shape),)), s.name), 4)
        else:
            lines.append(f"    {s.output}[0] = {s.name}")
    return lines


def _copy(shape: tuple[int, ...], target: Callable[[tuple[str, ...]], tuple[str, tuple[str, ...]]], source: str) -> tuple:
    """Loops storing array `source` of `shape` element by element at `target(indices)` (an array and its
    index). Not a slice assignment: Numba compiles an array-to-slice store with its shape-mismatch error,
    which took 7 of the 9 s a recurrent network's gradient kernel compiled in (its state a 16 x 16 matrix)."""
    indices = tuple(f"copy{d}" for d in range(len(shape)))
    node = Store(*target(indices), f"{source}[{', '.join(indices)}]")
    for index, extent in reversed(list(zip(indices, shape))):
        node = Loop(index, extent, (node,))
    return (node,)


def _flat_index(indices: tuple[str, ...], shape: tuple[int, ...]) -> str:
    """The C-order position of element `indices` of an array of `shape`, as text."""
    strides = [int(np.prod(shape[d + 1:])) for d in range(len(shape))]
    return " + ".join(f"{q} * {stride}" if stride != 1 else q for q, stride in zip(indices, strides))


def _chunk_bounds(chunk: str, extent: int) -> list[str]:
    return [f"        lo = ({chunk} * {extent}) // chunks", f"        hi = (({chunk} + 1) * {extent}) // chunks"]


def _allocations(nodes: tuple, indent: int) -> list[str]:
    return allocations(nodes, indent, _allocation)


def _allocation(node: Buffer, indent: int) -> str:
    return f"{' ' * indent}{node.name} = np.empty({shape_text(node.shape)}, np.{node.dtype.name})"


def _nodes(nodes: tuple, indent: int, hoisted: bool = False) -> list[str]:
    return statement_lines(nodes, indent, _allocation, hoisted)


_compiled: "weakref.WeakKeyDictionary[LoopNest, dict[bool, Any]]" = weakref.WeakKeyDictionary()
# a nest's (chunk_limit, memory_chunks): the walk over its kernel once per nest, not per call
_limits: "weakref.WeakKeyDictionary[LoopNest, tuple[int, int]]" = weakref.WeakKeyDictionary()


def chunk_limit(kernel: Kernel) -> int:
    """The most chunks the nest is split into: 1 (its serial kernel) below SERIAL_WORK; for a fold, as many
    as keep the merge of their states within 1 / MERGE_SHARE of the work; a map, its extent."""
    total = work(kernel)
    if total < SERIAL_WORK:
        return 1
    if isinstance(kernel.outer, ParallelMap):
        return kernel.outer.extent
    state_scalars = sum(max(1, int(np.prod(s.shape))) for s in kernel.outer.states)
    return max(1, total // (MERGE_SHARE * state_scalars))


def memory_chunks(kernel: Kernel) -> int:
    """The most chunks whose states (a fold's partial states, one per chunk, kept until the merge) take no
    more memory than the nest's inputs and outputs: the scratch a fold needs stays within the memory its
    arguments already hold, so a gradient's peak memory stays within twice its inputs and outputs."""
    state_bytes = sum(max(1, int(np.prod(s.shape))) * np.dtype(s.dtype).itemsize
                      for s in getattr(kernel.outer, "states", ()))
    if not state_bytes:
        return kernel.outer.extent
    io_bytes = sum(int(np.prod(p.shape)) * np.dtype(p.dtype).itemsize for p in (*kernel.inputs, *kernel.outputs))
    return max(1, io_bytes // state_bytes)


def compiled_kernel(prim: LoopNest, parallel: bool = True):
    """The nest's kernel compiled with its traversal over threads (`parallel`) or serially; each variant is
    compiled the first time it is needed."""
    variants = _compiled.setdefault(prim, {})
    found = variants.get(parallel)
    if found is None:
        module = load_module(*kernel_module(kernel_of(prim), parallel))
        found = variants[parallel] = module.kernel
    return found


@numba_impls.register(LoopNest)
def _loop_nest(prim: LoopNest, args: list, depth: int):
    """The nest's kernel at the top level (inside a map, the statements it replaced run batched)."""
    if depth:
        return None
    import numba

    kernel = kernel_of(prim)
    if kernel.checked and not checked_inputs_hold(kernel, [np.asarray(a) for a in args]):
        return None  # the statements it replaced, on NumPy: their gather raises the error naming the index
    threads = numba.get_num_threads()
    limits = _limits.get(prim)
    if limits is None:
        limits = _limits[prim] = (chunk_limit(kernel), memory_chunks(kernel))
    # the memory budget gives way to one chunk per thread: the nest's parallelism is worth more than its scratch
    most_chunks = min(limits[0], max(limits[1], threads))
    parallel = threads > 1 and most_chunks > 1
    fn = compiled_kernel(prim, parallel)
    inputs = []
    constants = constants_of(prim)
    values = iter(args)
    for p in kernel.inputs:
        value = constants[p.name] if p.role == "constant" else next(values)
        value = np.ascontiguousarray(value, dtype=p.dtype)
        inputs.append(value.reshape(1) if value.shape == () else value)
    outs = [np.empty(p.shape, p.dtype) for p in kernel.outputs]
    folded = {p.name for p in kernel.folded}  # written from a state's buffer, flat
    passed = [o.reshape(-1) if p.name in folded or o.shape == () else o for o, p in zip(outs, kernel.outputs)]
    extent = kernel.outer.extent
    chunks = max(1, min(extent, CHUNKS_PER_THREAD * threads, most_chunks)) if parallel else 1
    fn(*inputs, *passed, chunks)
    return outs
