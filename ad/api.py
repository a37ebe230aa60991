"""The user-facing transformations: fold.vjp, fold.jvp, fold.grad, fold.value_and_grad."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from fold.api import signature_of, trace_signature
from fold.dtypes import ShapedArray
from fold.errors import FoldTypeError, ShapeError, StructureError
from fold.inline import inline_program
from fold.pytree import leaf_paths, tree_flatten

from .jvp import jvp_program
from .vjp import reduce_rule_scope, vjp_program
from .zeros import differentiable


def _check_like(where: str, what: str, values: list, avals: Sequence[ShapedArray], treedef, expected_def) -> list:
    if treedef != expected_def:
        raise StructureError(f"{where}: {what} has structure {treedef}, but it must match {expected_def}")
    out = []
    for path, value, aval in zip(leaf_paths(treedef, what), values, avals, strict=True):
        shape, dtype = tuple(np.shape(value)), (value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype)
        if shape != aval.shape:
            raise ShapeError(f"{where}: {path} has shape {shape}, expected {aval.shape}")
        if differentiable(aval) and np.dtype(dtype) != aval.dtype and not isinstance(value, (int, float)):
            raise FoldTypeError(f"{where}: {path} has dtype {np.dtype(dtype).name}, expected {aval.dtype.name}")
        out.append(value if hasattr(value, "aval") else np.asarray(value, dtype=aval.dtype))
    return out


def vjp(f: Callable[..., Any], primals: tuple, cotangent: Any, *, reduce_rule: str = "auto") -> tuple:
    """Cotangents of `primals` (in their structure) for the output cotangent `cotangent` of `f(*primals)`.

    Reverse mode by program transformation: the gradient program re-executes each scope instead of keeping
    a tape. `reduce_rule` picks how reductions are differentiated: "auto", "generic" or "monoid".
    Integer and boolean inputs get zero cotangents of their own dtype.

    >>> import numpy as np, fold
    >>> fold.vjp(lambda x: fold.reduce(fold.monoids.sum, x * x), (np.arange(3.0),), 1.0)
    (array([0., 2., 4.]),)
    """
    if not isinstance(primals, tuple):
        raise FoldTypeError(f"fold.vjp: primals must be a tuple of the positional arguments, got {type(primals).__name__}")
    leaves, signature = signature_of(primals, "fold.vjp")
    program = trace_signature(f, signature)
    ct_leaves, ct_def = tree_flatten(cotangent)
    cts = _check_like("fold.vjp", "cotangent", ct_leaves, program.out_avals, ct_def, program.out_tree)
    with reduce_rule_scope(reduce_rule):
        grad_program, in_mask = vjp_program(program)
    out_mask = [differentiable(a) for a in program.out_avals]
    args = list(leaves) + [c for c, m in zip(cts, out_mask, strict=True) if m]
    results = iter(_run(grad_program, args))
    in_cts = [next(results) if m else np.zeros(a.shape, a.dtype) for m, a in zip(in_mask, program.in_avals, strict=True)]
    return tuple(program.in_tree.unflatten(in_cts))


def jvp(f: Callable[..., Any], primals: tuple, tangents: tuple) -> Any:
    """The tangent of `f`'s output at `primals` in the direction `tangents` (forward mode).

    >>> import numpy as np, fold
    >>> float(fold.jvp(lambda x: fold.reduce(fold.monoids.sum, x * x), (np.arange(3.0),), (np.ones(3),)))
    6.0
    """
    if not isinstance(primals, tuple) or not isinstance(tangents, tuple):
        raise FoldTypeError("fold.jvp: primals and tangents must be tuples of the positional arguments")
    leaves, signature = signature_of(primals, "fold.jvp")
    program = trace_signature(f, signature)
    t_leaves, t_def = tree_flatten(tangents)
    tans = _check_like("fold.jvp", "tangents", t_leaves, program.in_avals, t_def, program.in_tree)
    tangent_mask = [differentiable(a) for a in program.in_avals]
    fwd, out_mask = jvp_program(program, tangent_mask)
    args = list(leaves) + [t for t, m in zip(tans, tangent_mask, strict=True) if m]
    results = _run(fwd, args)[len(program.outputs):]
    results = iter(results)
    out_tangents = [next(results) if m else np.zeros(a.shape, a.dtype) for m, a in zip(out_mask, program.out_avals, strict=True)]
    return program.out_tree.unflatten(out_tangents)


def _run(program, args: list) -> list:
    """Inline into the current trace when there is one (so transformations compose), else execute."""
    from fold.tracing import Tracer, current_scope

    if current_scope() is not None or any(isinstance(a, Tracer) for a in args):
        return inline_program(program, args)
    import fold

    return list(_executor(program)(*args))


_executors: dict = {}


def _executor(program):
    import fold

    key = id(program)
    entry = _executors.get(key)
    if entry is None or entry[0] is not program:
        entry = (program, fold.jit(lambda *a: inline_program(program, list(a))))
        _executors[key] = entry
    return entry[1]


def _argnums_tuple(argnums: int | Sequence[int]) -> tuple[int, ...]:
    return (argnums,) if isinstance(argnums, int) else tuple(argnums)


def value_and_grad(f: Callable[..., Any], argnums: int | Sequence[int] = 0, *, reduce_rule: str = "auto") -> Callable:
    """`f` returning (its scalar value, its gradient with respect to the `argnums` arguments)."""
    nums = _argnums_tuple(argnums)

    def value_and_grad_f(*args):
        for i in nums:
            if i >= len(args):
                raise FoldTypeError(f"fold.grad: argnums {i} but only {len(args)} arguments were given")
            for leaf in tree_flatten(args[i])[0]:
                dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
                if not np.issubdtype(dtype, np.floating):
                    raise FoldTypeError(f"fold.grad: argument {i} has dtype {np.dtype(dtype).name}; only float arguments can be differentiated")
        from fold.tracing import current_scope

        value = _value(f, args)
        if hasattr(value, "shape") and tuple(value.shape) != () or not np.issubdtype(np.asarray(value).dtype if not hasattr(value, "aval") else value.dtype, np.floating):
            raise FoldTypeError(f"fold.grad: the function must return a float scalar, got {getattr(value, 'aval', np.asarray(value).shape)}")
        dtype = value.dtype
        cts = vjp(f, tuple(args), np.ones((), dtype), reduce_rule=reduce_rule)
        grads = tuple(cts[i] for i in nums)
        del current_scope
        return value, (grads[0] if isinstance(argnums, int) else grads)

    return value_and_grad_f


def _value(f, args):
    from fold.tracing import Tracer, current_scope

    leaves, signature = signature_of(tuple(args), "fold.grad")
    program = trace_signature(f, signature)
    if len(program.outputs) != 1:
        raise FoldTypeError(f"fold.grad: the function must return a single scalar, got {program.out_tree} outputs")
    return _run(program, list(leaves))[0]


def grad(f: Callable[..., Any], argnums: int | Sequence[int] = 0, *, reduce_rule: str = "auto") -> Callable:
    """The gradient of scalar-valued `f` with respect to argument `argnums` (an int or a tuple of ints).

    >>> import numpy as np, fold
    >>> fold.grad(lambda x: fold.reduce(fold.monoids.sum, x * x))(np.arange(3.0))
    array([0., 2., 4.])
    """
    vg = value_and_grad(f, argnums, reduce_rule=reduce_rule)
    return lambda *args: vg(*args)[1]
