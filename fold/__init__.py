"""fold: a differentiable array language for Python.

Write array programs with the parallel combinators `map`, `reduce`, `scan`, `reduce_by_index`, `loop`
(and `gemm_map_reduce`); `fold.trace` turns them into Programs in A-normal form, `fold.run`/`fold.jit`
execute them on a backend, and `fold.vjp`/`fold.jvp` differentiate them by program transformation.

The runtime and AD entry points are re-exported lazily (module `__getattr__`), so `import fold` imports
neither the runtime's backends nor their dependencies.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import monoids, numpy_at, numpy_einsum, numpy_functions, numpy_masks, numpy_reductions, printing_rules  # noqa: F401  (they register print rules and NumPy's functions on tracers)
from .api import trace
from .combinators import loop, map, reduce, reduce_by_index, scan  # noqa: A004
from .dtypes import ShapedArray
from .gemm import gemm_map_reduce
from .errors import (
    ConcretizationError,
    EscapedTracerError,
    FoldAttributeError,
    FoldError,
    FoldIndexError,
    FoldRuntimeError,
    FoldTypeError,
    MissingRuleError,
    MonoidLawError,
    ProgramError,
    ShapeError,
    StructureError,
)
from .ir import Program
from .monoid import Monoid
from .ops import (
    abs,
    broadcast_to,
    concatenate,
    convert,
    cos,
    divide,
    dot,
    exp,
    expm1,
    iota,
    log,
    log1p,
    logaddexp,
    logical_and,
    logical_not,
    logical_or,
    matmul,
    maximum,
    minimum,
    replicate,
    reshape,
    sigmoid,
    sign,
    sin,
    sqrt,
    stop_gradient,
    sum,
    tanh,
    transpose,
    where,
)
from .pytree import tree_flatten, tree_map, tree_unflatten
from .tracing import Tracer
from .verify import check_program

# name -> (module, attribute): resolved on first use
_LAZY = {
    "run": ("fold.runtime.api", "run"),
    "jit": ("fold.runtime.api", "jit"),
    "precompile": ("fold.runtime.precompile", "precompile"),
    "lowered": ("fold.runtime.lowered", "lowered"),
    "memory": ("fold.runtime.memory", "memory"),
    "use_backend": ("fold.runtime.backends", "use_backend"),
    "available_backends": ("fold.runtime.backends", "available_backends"),
    "vjp": ("fold.ad", "vjp"),
    "jvp": ("fold.ad", "jvp"),
    "grad": ("fold.ad", "grad"),
    "value_and_grad": ("fold.ad", "value_and_grad"),
    "jacfwd": ("fold.ad", "jacfwd"),
    "jacrev": ("fold.ad", "jacrev"),
    "hessian": ("fold.ad", "hessian"),
    "linearize": ("fold.ad", "linearize"),
    "vmap": ("fold.batching", "vmap"),
    "check_monoid": ("fold.ad.monoid_laws", "check_monoid"),
    "check_operator": ("fold.ad.monoid_laws", "check_operator"),
    "compare_rules": ("fold.ad.compare", "compare_rules"),
    "shard": ("fold.runtime.dask_backend", "shard"),
}


_LAZY_MODULES = {"testing": "fold.testing", "ad": "fold.ad", "runtime": "fold.runtime"}


def _version() -> str:
    """The installed distribution's version; a checkout that was never installed says so."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fold")
    except PackageNotFoundError:
        return "0.0.0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value = globals()[name] = _version()
        return value
    if name in _LAZY_MODULES:  # `import fold; fold.testing.check_grads(...)` works without importing it first
        return importlib.import_module(_LAZY_MODULES[name])
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'fold' has no attribute {name!r}")
    value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value
    return value


__all__ = [
    "ConcretizationError", "EscapedTracerError", "FoldAttributeError", "FoldError", "FoldIndexError", "FoldRuntimeError",
    "FoldTypeError", "gemm_map_reduce", "MissingRuleError", "Monoid", "MonoidLawError", "Program", "ProgramError", "ShapeError",
    "ShapedArray", "StructureError", "Tracer", "abs", "broadcast_to", "check_program", "concatenate", "convert",
    "cos", "divide", "dot", "exp", "expm1", "iota", "log", "log1p", "logaddexp", "logical_and", "logical_not",
    "logical_or", "loop", "map", "matmul", "maximum", "minimum", "monoids", "reduce", "reduce_by_index",
    "replicate", "reshape", "scan", "sigmoid", "sign", "sin", "sqrt", "stop_gradient", "sum", "tanh", "trace", "transpose",
    "tree_flatten", "tree_map", "tree_unflatten", "where", "testing", *_LAZY,
]
