"""Build kernel source specialised to a number of leaves and compile it with numba.njit, once per key.

A kernel template is a Python function `template(k, m, ...) -> str` returning the source of one function
named `kernel`. The source names the caller's compiled scalar functions as globals (`combine`, `mapper`);
Numba freezes a global dispatcher into the kernel at compile time, so every distinct function object gets
its own kernel, and the in-memory cache below is keyed by those objects.

On disk: where every function in a kernel's environment comes from a content-addressed module (see
kernels.cpu.modules: the functions fold's backend generates), the kernel is written as one such module that
imports them, and Numba's cache keeps the compiled kernel between processes. A caller's own njit function
(defined in an ordinary, editable file) gets a kernel compiled in memory, once per process: Numba's cache
does not notice when a function a cached kernel calls has changed.

Helpers for writing templates, with `k` leaves:

    names("acc", 3)                          -> "acc0, acc1, acc2"
    grouped("x", (1, 2))                     -> ("x0, x_g1", "x1 = x_g1[0]\nx2 = x_g1[1]")
    each("acc{j} = id{j}", 2, indent=8)      -> "        acc0 = id0\n        acc1 = id1"
    indent(block, 4)                         -> every line of block indented by 4 more spaces
    call("acc", "combine", "acc0, x0[i]", 1) -> "acc0 = as_scalar(combine(acc0, x0[i]))"
    simd_import("load", "splat")             -> the import of those kernels.cpu.simd functions
    serial_or_parallel("for r in {0}(rows):", body) -> that loop with range if T == 1, else with prange
"""

from __future__ import annotations

import itertools
import linecache
import textwrap
import threading
from typing import Any, Callable, Hashable, Sequence

import numpy as np
from numba import njit, prange, types
from numba.core.errors import TypingError
from numba.extending import overload

from . import modules

_KERNELS: dict[Hashable, Any] = {}
_LOCK = threading.RLock()
_SERIAL = itertools.count()


def as_scalar(x):
    """Inside kernels: a 1-tuple's only item, or a scalar unchanged (so k == 1 functions may return either)."""
    return x[0] if isinstance(x, tuple) else x


@overload(as_scalar)
def _as_scalar_typed(x):
    if isinstance(x, types.BaseTuple):
        if len(x) != 1:
            raise TypingError(f"expected a scalar or a 1-tuple, got a {len(x)}-tuple {x}")
        return lambda x: x[0]
    return lambda x: x


def names(prefix: str, count: int) -> str:
    return ", ".join(f"{prefix}{j}" for j in range(count))


def each(line: str, count: int, indent: int = 0) -> str:
    """`line` formatted with j = 0 .. count-1, one per line, indented by `indent` spaces."""
    return "\n".join(" " * indent + line.format(j=j) for j in range(count))


def grouped(prefix: str, sizes: tuple[int, ...]) -> tuple[str, str]:
    """(parameters, unpacking) for values prefix0, prefix1, .. passed in groups of these sizes (see
    host.column_groups, host.packed_rows and host.packed_values): a group of one is the value itself,
    `prefix{j}`; a larger one an array `prefix_g{g}` whose rows (or items) the unpacking lines name
    `prefix{j}` again, so that the rest of the kernel's text is the same either way."""
    params, lines, j = [], [], 0
    for g, size in enumerate(sizes):
        if size == 1:
            params.append(f"{prefix}{j}")
        else:
            params.append(f"{prefix}_g{g}")
            lines += [f"{prefix}{j + row} = {prefix}_g{g}[{row}]" for row in range(size)]
        j += size
    return ", ".join(params), "\n".join(lines)


def signature(groups: Sequence[tuple[str, tuple[int, ...]]]) -> tuple[str, str]:
    """(parameters, unpacking lines) of a function whose arguments are these (prefix, sizes) groups, in
    order, each as `grouped` writes it (a prefix with no sizes has no parameter)."""
    parts = [grouped(prefix, sizes) for prefix, sizes in groups]
    return ", ".join(p for p, _ in parts if p), "\n".join(rows for _, rows in parts if rows)


def first_row(prefix: str, sizes: tuple[int, ...]) -> str:
    """The expression for prefix0 where its values are passed in groups of these sizes (see `grouped`)."""
    return f"{prefix}0" if sizes[0] == 1 else f"{prefix}_g0[0]"


def indent(block: str, spaces: int) -> str:
    return textwrap.indent(block, " " * spaces)


def call(targets: str, fn: str, args: str, count: int) -> str:
    """`target0, ... = fn(args)`, unwrapping a scalar result when count == 1."""
    if count == 1:
        return f"{targets}0 = as_scalar({fn}({args}))"
    return f"{names(targets, count)} = {fn}({args})"


def compile_kernel(key: Hashable, build: Callable[[], str], env: dict[str, Any], *, parallel: bool,
                   fastmath: set[str] | None = None, helpers: tuple[str, ...] = ()) -> Any:
    """The njit-compiled `kernel` for `key`, building its source with `build()` on first use.

    `env` holds the globals the source refers to (the caller's compiled functions; None entries are
    unused); `np`, `prange` and `as_scalar` are always available. Generated source is registered with
    linecache (or written to a file) so that Numba's error messages and tracebacks can show it. `fastmath`:
    LLVM's fast-math flags for the kernel's own instructions (`key` must tell kernels with and without apart).

    `helpers` names functions of the source, besides `kernel`, compiled with the same options but serially.
    A large prange body belongs in one: Numba's parfor passes copy and re-analyse the body they are given,
    and k-means' product_fold kernel took 6.3 s to compile with its row block written in the loop, 2.2 s
    with the loop calling it. The loop must call a helper with arguments of the types the serial typing
    gives them (np.int64(b) for the prange index, which the parallel region may type as unsigned): a call
    with other types compiles the helper a second time.
    """
    with _LOCK:
        kernel = _KERNELS.get(key)
        if kernel is None:
            env = {k: v for k, v in env.items() if v is not None}
            options = {"parallel": parallel, "error_model": "numpy"}
            if fastmath:
                options["fastmath"] = set(fastmath)
            serial = {k: v for k, v in options.items() if k != "parallel"}
            if modules.cache_dir() is not None and all(modules.is_content_addressed(f) for f in env.values()):
                preamble = "\n".join(["import numpy as np", "from numba import prange",
                                      "from fold.kernels.cpu.codegen import as_scalar"]
                                     + [modules.import_line(f, alias) for alias, f in sorted(env.items())])
                jit = {"kernel": options, **{name: serial for name in helpers}}
                kernel = modules.load_module(preamble + "\n\n" + build(), jit).kernel
            else:
                source = build()
                filename = f"<kernels.cpu generated #{next(_SERIAL)}: {key[0]}>"
                linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
                namespace = {"np": np, "prange": prange, "as_scalar": as_scalar, **env}
                exec(compile(source, filename, "exec"), namespace)
                for name in helpers:
                    namespace[name] = njit(**serial)(namespace[name])
                kernel = njit(**options)(namespace["kernel"])
            _KERNELS[key] = kernel
        return kernel


def serial_or_parallel(loop: str, body: str) -> str:
    """A kernel's loop text, `loop` (e.g. "for r in {0}(rows):") run with range when T == 1 (no parallel
    region at all) and with prange otherwise, each time around `body`."""
    return f"""if T == 1:  # no parallel region at all
{indent(loop.format("range"), 4)}
{indent(body, 8)}
else:
{indent(loop.format("prange"), 4)}
{indent(body, 8)}"""


def simd_import(*functions: str) -> str:
    """A kernel text's import of these kernels.cpu.simd functions, led by a digest of simd's source, so that
    the text (which names the module on disk) changes whenever simd does."""
    from . import simd

    return f"# simd {modules.file_digest(simd)}\nfrom fold.kernels.cpu.simd import {', '.join(sorted(functions))}\n"


def clear_kernels() -> None:
    with _LOCK:
        _KERNELS.clear()
