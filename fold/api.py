"""`fold.trace`: a Python function and example arguments to a Program, cached per input signature."""

from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

import numpy as np

from .dtypes import ShapedArray
from .errors import FoldTypeError
from .gemm import block_cap
from .ir import Program
from .pytree import TreeDef
from .tracing import Tracer, abstractify, trace_body

Signature = tuple[TreeDef, tuple[ShapedArray, ...]]

_trace_cache: "weakref.WeakKeyDictionary[Callable, dict[tuple[Signature, int], Program]]" = weakref.WeakKeyDictionary()


def signature_of(args: tuple, where: str) -> tuple[list, Signature]:
    leaves, treedef, avals = abstractify(args, where)
    return leaves, (treedef, tuple(avals))


def keywords_as_positional(f: Callable[..., Any], count: int, names: tuple[str, ...]) -> Callable[..., Any]:
    """`f` taking its keyword arguments `names` as positional ones after the first `count` (so that a
    call's keyword arguments can be traced like the others); one such function per (count, names)."""
    def called(*flat: Any) -> Any:
        return f(*flat[:count], **dict(zip(names, flat[count:], strict=True)))

    called.__name__ = getattr(f, "__name__", "f")
    return called


def trace(f: Callable[..., Any], *args: Any) -> Program:
    """Trace `f` on arguments shaped like `args` (arrays or pytrees of them) into a Program.

    Only shapes, dtypes and structure matter; the Program is cached per such signature, so tracing twice
    with same-shaped arguments returns the same Program.

    >>> import numpy as np, fold
    >>> prog = fold.trace(lambda x: fold.exp(x) * 2.0, np.ones(3))
    >>> print(prog)
    in a: f64[3]
    let b: f64[3] = exp a
    let c: f64[3] = b * 2.0
    out c
    """
    if not callable(f):
        raise FoldTypeError(f"fold.trace: expected a function, got {type(f).__name__}")
    _, signature = signature_of(args, "fold.trace")
    return trace_signature(f, signature)


def trace_signature(f: Callable[..., Any], signature: Signature) -> Program:
    try:
        per_function = _trace_cache.setdefault(f, {})
    except TypeError:  # not weak-referenceable: trace every time
        per_function = {}
    key = (signature, block_cap())  # a gemm_map_reduce's blocks depend on the cap it is traced under
    program = per_function.get(key)
    if program is None:
        treedef, avals = signature
        arg_trees = treedef.unflatten(list(avals))
        body = trace_body(f, arg_trees, getattr(f, "__name__", "function"))
        program = body.program
        program.meta["consts"] = body.consts
        if not body.consts:  # a program that captured tracers of an enclosing trace belongs to that trace alone
            per_function[key] = program
    return program


def captured_consts(program: Program) -> list:
    """The tracers of an enclosing trace that a program traced inside it captured (its leading inputs)."""
    return list(program.meta.get("consts", ()))


_STATIC_LEAF_TYPES = (float, complex, int, np.ndarray, np.generic)
_bound_cache: "weakref.WeakKeyDictionary[Callable, dict]" = weakref.WeakKeyDictionary()


def is_static_value(value: Any) -> bool:
    """Whether an argument a transformation does not differentiate is passed to `f` as it is, untraced: a
    Python int or bool (a count, a flag: what `fold.jit(..., static_argnums=...)` hands on), or anything that
    is not a pytree of arrays and numbers (a string, a function). Such values key the trace, as in
    `jax.grad`, where the arguments it does not differentiate reach `f` concrete."""
    if isinstance(value, Tracer):
        return False
    if type(value) in (int, bool):
        return True
    from .pytree import tree_flatten

    leaves, _ = tree_flatten(value)
    return any(not isinstance(leaf, (Tracer, *_STATIC_LEAF_TYPES)) for leaf in leaves)


def bind_static(f: Callable[..., Any], args: tuple, kwargs: dict, traced: Sequence[int], where: str
                ) -> tuple[Callable[..., Any], tuple, list[int]]:
    """(`f` with the call's static arguments bound and its keyword arguments made positional, the arguments
    left to trace, where each position of `traced` is among them).

    The positions in `traced` (the differentiated arguments, non-negative) are always traced; of the others,
    those `is_static_value` picks are bound. One function per (positions, static values, keyword names), so
    that the trace cache, keyed by function, sees the same one for the same call shape.
    """
    count = len(args)
    chosen = set(traced)
    statics = {i: a for i, a in enumerate(args) if i not in chosen and is_static_value(a)}
    names = tuple(sorted(kwargs))
    static_kw = {k: kwargs[k] for k in names if is_static_value(kwargs[k])}
    dynamic_kw = tuple(k for k in names if k not in static_kw)
    dynamic = tuple(a for i, a in enumerate(args) if i not in statics) + tuple(kwargs[k] for k in dynamic_kw)
    positions = [i - sum(1 for j in statics if j < i) for i in traced]
    if not statics and not names:
        return f, dynamic, positions
    try:
        key = (count, tuple((i, _typed(v)) for i, v in statics.items()), dynamic_kw,
               tuple((k, _typed(v)) for k, v in static_kw.items()))
        hash(key)
    except TypeError:
        bad = [repr(v) for v in [*statics.values(), *static_kw.values()]]
        raise FoldTypeError(f"{where}: arguments passed untraced (Python ints, flags, strings, functions) must be "
                            f"hashable, as they key the traced program; got {', '.join(bad)}") from None
    try:
        per_f = _bound_cache.setdefault(f, {})
        target = weakref.ref(f)  # the cache must not keep its own key alive
    except TypeError:
        per_f, target = {}, (lambda: f)
    bound = per_f.get(key)
    if bound is None:
        def bound(*flat: Any) -> Any:
            fn = target()
            rest = iter(flat)
            positional = [statics[i] if i in statics else next(rest) for i in range(count)]
            keywords = {k: next(rest) for k in dynamic_kw}
            return fn(*positional, **keywords, **static_kw)

        bound.__name__ = getattr(f, "__name__", "f")
        per_f[key] = bound
    return bound, dynamic, positions


def _typed(value: Any) -> Any:
    """`value` with its type beside it (2, 2.0 and True hash alike but trace differently)."""
    if isinstance(value, tuple):
        return type(value), tuple(_typed(v) for v in value)
    return type(value), value
