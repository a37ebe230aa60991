"""CUDA kernel source specialised to a number of leaves, their dtypes and a launch shape, compiled with
numba.cuda.jit once per key.

A template returns the source of one function named `kernel`, which names the caller's device functions as
globals (`combine`, `mapper`); the cache is keyed by those function objects, as in kernels.cpu.codegen.
Shared-memory arrays need their length and dtype as constants, so both are written into the text.
"""

from __future__ import annotations

import itertools
import linecache
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


def clear_kernels() -> None:
    with _LOCK:
        _KERNELS.clear()
