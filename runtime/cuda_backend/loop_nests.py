"""Loop nests (runtime/loops) as CUDA kernels: the nest the numba backend runs as a prange, run by GPU threads.

The statements are the same text as on the CPU (runtime/loops/text.py), compiled with numba.cuda.jit against
device_helpers; a Buffer is a thread's local array. How the outer traversal is split:

- `ParallelMap`: one thread per index.
- `ParallelFold`: one thread per chunk of consecutive indices, folding them into states of its own, written to
  a partial array per state; then one thread folds the chunks' partials in chunk order (a second, one-thread
  launch), so a non-commutative operator sees its operands in order and the result does not depend on the
  launch. The merge is sequential, so the chunk count is bounded by the state's size (MERGED_SCALARS).
  Where every state is a sum over the traversal (a gradient's sum over a map's rows: State.summed), the
  partials are summed over chunks by the device's own reduction instead (CuPy's sum over the leading axis),
  and the chunks are as many as keep the GPU's threads busy, bounded by the partials' bytes (SUMMED_BYTES):
  a (k, d) sum's chunks were otherwise bounded to MERGED_SCALARS / (k d), a thousand threads for k-means'
  (64, 16) gradient.

A nest whose kernel does not compile or run runs the statements it replaced, each as the
cuda backend runs it.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np

from fold.kernels.cuda.codegen import compile_kernel
from fold.kernels.cuda.host import SIMULATED, start
from fold.runtime.loops import LoopNest, constants_of, kernel_of
from fold.runtime.loops.nest import Buffer, Kernel, ParallelFold, ParallelMap, State, checked_inputs_hold
from fold.runtime.loops.text import allocations, shape_text, statement_lines

from ..interpreter import eval_program
from . import device, device_helpers
from .lowering import _decline, cuda_impls

# Threads per block; under the simulator every thread is a Python thread, so few.
THREADS = 8 if SIMULATED else 128
# A fold's chunks (threads) at most, and the most scalars the one-thread merge folds (chunks x state size).
MAX_CHUNKS = 16 if SIMULATED else 16384
MERGED_SCALARS = 1 << 16 if SIMULATED else 1 << 20
# A fold of sums: its chunks at most, and the most bytes their partials take (256 MB)
SUMMED_CHUNKS = 16 if SIMULATED else 1 << 16
SUMMED_BYTES = 1 << 28


def _allocation(node: Buffer, indent: int) -> str:
    return f"{' ' * indent}{node.name} = cuda.local.array({shape_text(node.shape)}, np.{node.dtype.name})"


def _nodes(nodes: tuple, indent: int, hoisted: bool = False) -> list[str]:
    return statement_lines(nodes, indent, _allocation, hoisted)


def map_source(kernel: Kernel) -> str:
    """`kernel(*inputs, *outputs)`: thread i runs iteration i of the ParallelMap."""
    outer = kernel.outer
    params = [p.name for p in kernel.inputs] + [p.name for p in kernel.outputs]
    return "\n".join([
        f"def kernel({', '.join(params)}):",
        f"    {outer.index} = cuda.grid(1)",
        f"    if {outer.index} < {outer.extent}:",
        *allocations(outer.body, 8, _allocation),
        *_nodes(outer.body, 8, hoisted=True), ""])


def fold_source(kernel: Kernel) -> str:
    """`kernel(*inputs, *mapped outputs, *partials, chunks)`: thread `chunk` folds its chunk into its partial
    states (and stores its rows of the outputs the traversal writes)."""
    fold = kernel.outer
    partials = [fold.partial + s.name for s in fold.states]
    params = [p.name for p in kernel.inputs] + [p.name for p in kernel.mapped] + partials + ["chunks"]
    lines = [f"def kernel({', '.join(params)}):",
             f"    {fold.chunk} = cuda.grid(1)",
             f"    if {fold.chunk} < chunks:",
             f"        lo = ({fold.chunk} * {fold.extent}) // chunks",
             f"        hi = (({fold.chunk} + 1) * {fold.extent}) // chunks",
             *_nodes(fold.init, 8), *allocations(fold.step, 8, _allocation),
             f"        for {fold.index} in range(lo, hi):",
             *_nodes(fold.step, 12, hoisted=True)]
    for s, partial in zip(fold.states, partials, strict=True):
        lines += _copy(s, lambda idx, s=s, partial=partial: f"{partial}[{', '.join((fold.chunk,) + idx)}] = {_at(s, idx)}", 8)
    return "\n".join(lines + [""])


def merge_source(kernel: Kernel) -> str:
    """`kernel(*partials, *folded outputs, chunks)`: one thread folds the partial states in chunk order."""
    fold = kernel.outer
    partials = [fold.partial + s.name for s in fold.states]
    params = partials + [p.name for p in kernel.folded] + ["chunks"]
    lines = [f"def kernel({', '.join(params)}):",
             "    if cuda.grid(1) == 0:",
             *_nodes(fold.init, 8),
             f"        for {fold.chunk} in range(chunks):",
             *(_nodes(fold.merge, 12) or ["            pass"])]
    for s in fold.states:
        strides = [math.prod((s.shape or (1,))[k + 1:]) for k in range(len(s.shape or (1,)))]
        lines += _copy(s, lambda idx, s=s, strides=strides: (
            f"{s.output}[{' + '.join(f'{i} * {st}' for i, st in zip(idx, strides)) or '0'}] = {_at(s, idx)}"), 8)
    return "\n".join(lines + [""])


def _at(state: State, idx: tuple) -> str:
    if not state.stored:
        return state.name
    return f"{state.name}[{', '.join(idx) or '0'}]"


def _copy(state: State, line, indent: int) -> list[str]:
    """line(idx) for every index of a stored state (in loops), or line(()) for a scalar one."""
    if not state.stored:
        return [" " * indent + line(())]
    shape = state.shape or (1,)
    out, idx = [], []
    for k, n in enumerate(shape):
        out.append(f"{' ' * (indent + 4 * k)}for q{k} in range({n}):")
        idx.append(f"q{k}")
    return out + [" " * (indent + 4 * len(shape)) + line(tuple(idx))]


def _compiled(prim: LoopNest, kernel: Kernel) -> tuple[Any, Any]:
    env = {name: getattr(device_helpers, name) for name in device_helpers.HELPERS}
    env["math"] = math
    if isinstance(kernel.outer, ParallelMap):
        return compile_kernel(("loop_nest", prim), lambda: map_source(kernel), env), None
    return (compile_kernel(("loop_nest", prim), lambda: fold_source(kernel), env),
            compile_kernel(("loop_nest_merge", prim), lambda: merge_source(kernel), env))


def summed(fold: ParallelFold) -> bool:
    """Whether every state of the fold is a sum, whose partials the device's reduction adds up."""
    return all(s.summed for s in fold.states)


def chunks_for(fold: ParallelFold) -> int:
    """How many chunks (threads) fold the traversal: as many as MAX_CHUNKS, while the one-thread merge of
    their partial states stays within MERGED_SCALARS; for sums, as many as SUMMED_CHUNKS while their partials
    stay within SUMMED_BYTES."""
    state_scalars = sum(max(1, math.prod(s.shape)) for s in fold.states)
    if summed(fold):
        state_bytes = sum(max(1, math.prod(s.shape)) * s.dtype.itemsize for s in fold.states)
        return max(1, min(fold.extent, SUMMED_CHUNKS, SUMMED_BYTES // state_bytes))
    return max(1, min(fold.extent, MAX_CHUNKS, MERGED_SCALARS // state_scalars))


def _blocks(threads: int) -> int:
    return max(1, -(-threads // THREADS))


_declined: "weakref.WeakKeyDictionary[LoopNest, str]" = weakref.WeakKeyDictionary()


@cuda_impls.register(LoopNest)
def _loop_nest(prim: LoopNest, args: list, depth: int) -> list:
    """The nest's kernels at the top level; elsewhere, or where they do not compile, the statements it
    replaced, each as the cuda backend runs it (the values stay where they are)."""
    kernel = kernel_of(prim)
    problem = "inside a map, the statements it replaced run batched" if depth else _declined.get(prim)
    if problem is None and kernel.checked and not checked_inputs_hold(kernel, args):
        return eval_program(prim.program, args, depth)  # their gather raises the error naming the index
    if problem is None:
        try:
            return _run(prim, kernel, args)
        except Exception as err:  # noqa: BLE001 - a kernel that does not compile or run: the statements run
            problem = f"its kernel failed: {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
    if not depth and prim not in _declined:
        _declined[prim] = problem
        _decline(prim, problem)
    return eval_program(prim.program, args, depth)


def _run(prim: LoopNest, kernel: Kernel, args: list) -> list:
    main, merge = _compiled(prim, kernel)
    constants, values, inputs = constants_of(prim), iter(args), []
    for p in kernel.inputs:
        value = constants[p.name] if p.role == "constant" else next(values)
        value = device.to_device(value if device.is_device(value) else np.ascontiguousarray(value, dtype=p.dtype))
        if value.dtype != p.dtype:
            value = device.astype(value, p.dtype)
        inputs.append(device.for_kernel(device.reshape(value, (1,)) if value.shape == () else value))
    outer = kernel.outer
    if isinstance(outer, ParallelMap):
        outs = [device.empty(p.shape, p.dtype) for p in kernel.outputs]
        start(main, _blocks(outer.extent), THREADS, *inputs, *[device.for_kernel(o) for o in outs])
        return [device.adopt(o) for o in outs]
    chunks = chunks_for(outer)
    partials = [device.empty((chunks,) + tuple(s.shape or (1,)) if s.stored else (chunks,), s.dtype)
                for s in outer.states]
    mapped = {p.name: device.empty(p.shape, p.dtype) for p in kernel.mapped}
    start(main, _blocks(chunks), THREADS, *inputs, *[device.for_kernel(o) for o in mapped.values()],
          *[device.for_kernel(p) for p in partials], chunks)
    if summed(outer):
        sums = {s.output: p.sum(axis=0) for s, p in zip(outer.states, partials, strict=True)}
        return [device.adopt(mapped[p.name]) if p.name in mapped
                else device.reshape(device.astype(sums[p.name], p.dtype), tuple(p.shape)) for p in kernel.outputs]
    flat = {p.name: device.empty((max(1, math.prod(p.shape)),), p.dtype) for p in kernel.folded}
    start(merge, 1, 1, *[device.for_kernel(p) for p in partials], *[device.for_kernel(o) for o in flat.values()], chunks)
    return [device.adopt(mapped[p.name]) if p.name in mapped else device.reshape(device.adopt(flat[p.name]), tuple(p.shape))
            for p in kernel.outputs]
