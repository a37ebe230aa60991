"""`fold.trace`: a Python function and example arguments to a Program, cached per input signature."""

from __future__ import annotations

import weakref
from typing import Any, Callable

from .dtypes import ShapedArray
from .errors import FoldTypeError
from .ir import Program
from .pytree import TreeDef
from .tracing import abstractify, trace_body

Signature = tuple[TreeDef, tuple[ShapedArray, ...]]

_trace_cache: "weakref.WeakKeyDictionary[Callable, dict[Signature, Program]]" = weakref.WeakKeyDictionary()


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
    program = per_function.get(signature)
    if program is None:
        treedef, avals = signature
        arg_trees = treedef.unflatten(list(avals))
        body = trace_body(f, arg_trees, getattr(f, "__name__", "function"))
        program = body.program
        program.meta["consts"] = body.consts
        if not body.consts:  # a program that captured tracers of an enclosing trace belongs to that trace alone
            per_function[signature] = program
    return program


def captured_consts(program: Program) -> list:
    """The tracers of an enclosing trace that a program traced inside it captured (its leading inputs)."""
    return list(program.meta.get("consts", ()))
