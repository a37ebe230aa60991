"""`fold.precompile`: compile a function ahead of its first real call, and say how long that took.

Why this shape and not JAX's `jit(f).lower(*args).compile()`: fold's numba backend compiles each kernel when
a call first needs it, for the dtypes and layouts that call brings, inside the run (the interpreter decides
statement by statement which kernel runs), so there is no compile step apart from a run to expose. What
`precompile` does is honest about that: it runs `f` once on example arguments (arrays, or `fold.ShapedArray`s
that it fills with ones), which traces, compiles and loads every kernel that signature needs, and returns
the `Jitted` that later calls use warm. Its `compile_seconds` is the one-off cost of tracing and compiling;
the whole first call is timed and logged on the "fold" logger beside it.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import numpy as np

from fold.dtypes import ShapedArray
from fold.errors import FoldTypeError
from fold.pytree import tree_map

from .api import Jitted, jit

logger = logging.getLogger("fold")


def _example(value: Any) -> Any:
    """A ShapedArray becomes an array of ones of its shape and dtype (ones: logs and divisions stay finite)."""
    if isinstance(value, ShapedArray):
        return np.ones(value.shape, value.dtype)
    return value


def precompile(f: Callable[..., Any] | Jitted, *example_args: Any, **jit_kwargs: Any) -> Jitted:
    """`fold.jit(f, **jit_kwargs)` with everything a call on arguments like `example_args` needs compiled.

    `example_args` are arrays (or pytrees of them), or `fold.ShapedArray(shape, dtype)` placeholders; their
    values do not matter, only shapes and dtypes (and the values of static arguments). A `Jitted` may be
    passed instead of `f` (then `jit_kwargs` must be empty). The returned function's `compile_seconds` is
    the tracing and compiling this cost; later calls with that signature compile nothing.

    >>> import numpy as np, fold
    >>> g = fold.precompile(lambda x: fold.reduce(fold.monoids.sum, x * x), fold.ShapedArray((4,), np.float64))
    >>> g.trace_count, float(g(np.arange(4.0)))
    (1, 14.0)
    """
    if isinstance(f, Jitted):
        if jit_kwargs:
            raise FoldTypeError(f"fold.precompile: got a fold.jit function and jit options {sorted(jit_kwargs)}; "
                            f"pass the plain function with the options, or the jitted one alone")
        jitted = f
    else:
        jitted = jit(f, **jit_kwargs)
    args = tree_map(_example, example_args)
    compiled_before = jitted.compile_seconds
    start = time.perf_counter()
    with np.errstate(all="ignore"):
        jitted(*args)
    elapsed = time.perf_counter() - start
    compile_seconds = jitted.compile_seconds - compiled_before
    logger.info("fold: precompiled %s in %.2f s: %.2f s tracing and compiling, the rest running it once (with "
                "kernels loaded from the disk cache and modules imported on first use)", jitted.__name__, elapsed,
                compile_seconds)
    return jitted
