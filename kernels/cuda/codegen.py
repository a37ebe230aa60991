"""CUDA kernel source specialised to a number of leaves, their dtypes and a launch shape, compiled with
numba.cuda.jit once per key.

A template returns the source of one function named `kernel`, which names the caller's device functions as
globals (`combine`, `mapper`); the cache is keyed by those function objects, as in kernels.cpu.codegen.
Shared-memory arrays need their length and dtype as constants, so both are written into the text.
"""

from __future__ import annotations

import itertools
import linecache
import textwrap
import threading
from typing import Any, Callable, Hashable, Sequence

import numpy as np
from numba import cuda

_KERNELS: dict[Hashable, Any] = {}
_LOCK = threading.RLock()
_SERIAL = itertools.count()


def names(prefix: str, count: int) -> str:
    return ", ".join(f"{prefix}{j}" for j in range(count))


def lines(template: str, count: int, indent: int) -> str:
    """`template` formatted with j = 0 .. count-1, one per line, indented by `indent` spaces."""
    return "\n".join(" " * indent + template.format(j=j) for j in range(count))


def dtype_text(dtype: np.dtype) -> str:
    return "np.bool_" if np.dtype(dtype) == np.bool_ else f"np.{np.dtype(dtype).name}"


def shared_arrays(prefix: str, dtypes: Sequence[np.dtype], length: int, indent: int) -> str:
    return "\n".join(f"{' ' * indent}{prefix}{j} = cuda.shared.array({length}, {dtype_text(d)})"
                     for j, d in enumerate(dtypes))


def combined(targets: str, left: str, right: str, flip: bool) -> str:
    """`targets = combine(left, right)`, or with the operands swapped where the fold runs right to left (a
    reverse scan walks its elements last to first, and each new one goes on the left)."""
    a, b = (right, left) if flip else (left, right)
    return f"{targets} = combine({a}, {b})"


def tree_fold(k: int, threads: int, flip: bool, indent: int) -> str:
    """The text that combines a block's partials, thread t's in `acc0, ...` and in `s0[t], ...`, pairwise in
    order (t with t + stride for strides 1, 2, 4, ...), leaving the block's total in `s0[0], ...`. Every
    thread runs every step, so each cuda.syncthreads() is reached by the whole block."""
    acc = names("acc", k)
    return textwrap.indent(f"""cuda.syncthreads()
stride = 1
while stride < {threads}:
    if t % (2 * stride) == 0:
        {combined(acc, acc, ", ".join(f"s{j}[t + stride]" for j in range(k)), flip)}
{lines("s{j}[t] = acc{j}", k, 8)}
    cuda.syncthreads()
    stride *= 2""", " " * indent)


def tree_scan(k: int, threads: int, flip: bool, indent: int) -> str:
    """The text that scans a block's partials in `s0[t], ...` in place (Hillis and Steele: partial t - offset
    combined on the left of partial t, for offsets 1, 2, 4, ...), leaving in s[t] the fold of partials 0 to
    t. Every thread runs every step, reading before a barrier and writing after it."""
    v = names("v", k)
    return textwrap.indent(f"""cuda.syncthreads()
offset = 1
while offset < {threads}:
{lines("v{j} = s{j}[t]", k, 4)}
    if t >= offset:
        {combined(v, ", ".join(f"s{j}[t - offset]" for j in range(k)), v, flip)}
    cuda.syncthreads()
{lines("s{j}[t] = v{j}", k, 4)}
    cuda.syncthreads()
    offset *= 2""", " " * indent)


def walk(k: int, x: str, out: str, exclusive: bool, flip: bool, indent: int) -> str:
    """The text that folds element `x` (its leaves' text, one {j} each) into `acc0, ...` and stores the
    running value in `out` (likewise), before the element for an exclusive scan and after it otherwise."""
    acc = names("acc", k)
    step = " " * indent + combined(acc, acc, ", ".join(x.format(j=j) for j in range(k)), flip)
    store = lines(out + " = acc{j}", k, indent)
    return f"{store}\n{step}" if exclusive else f"{step}\n{store}"


def compile_kernel(key: Hashable, build: Callable[[], str], env: dict[str, Any]) -> Any:
    """The cuda.jit-compiled `kernel` for `key`, building its source with `build()` on first use. `env`
    holds the globals the source refers to besides `cuda` and `np`; the source is registered with
    linecache so that Numba's errors can show it."""
    with _LOCK:
        kernel = _KERNELS.get(key)
        if kernel is None:
            source = build()
            filename = f"<kernels.cuda generated #{next(_SERIAL)}: {key[0]}>"
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
            namespace = {"cuda": cuda, "np": np, **env}
            exec(compile(source, filename, "exec"), namespace)
            kernel = _KERNELS[key] = cuda.jit(namespace["kernel"])
        return kernel

