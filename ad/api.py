"""The user-facing transformations: fold.vjp, fold.jvp, fold.grad, fold.value_and_grad.

Each traces the function (cached per input signature), transforms the Program (cached per program), and
then either inlines the result into the enclosing trace — so that transformations compose: `fold.jvp` of a
function calling `fold.grad` gives Hessian-vector products — or runs it with `fold.jit` on the default backend.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

import numpy as np

from fold.api import captured_consts, keywords_as_positional, signature_of, trace_signature
from fold.dtypes import ShapedArray, is_static_int
from fold.errors import FoldTypeError, ShapeError, StructureError
from fold.inline import inline_program
from fold.ir import Program
from fold.pytree import TreeDef, leaf_paths, tree_flatten
from fold.tracing import Tracer, current_scope

from .jvp import jvp_program
from .vjp import reduce_rule_scope, vjp_program
from .zeros import differentiable


def _conform(where: str, what: str, value: Any, avals: Sequence[ShapedArray], expected: TreeDef) -> list:
    """The leaves of a user's (co)tangent, checked against the structure, shapes and dtypes they must have."""
    leaves, treedef = tree_flatten(value)
    if treedef != expected:
        raise StructureError(f"{where}: {what} has structure {treedef}, but it must match {expected}")
    out = []
    for path, leaf, aval in zip(leaf_paths(treedef, what), leaves, avals, strict=True):
        if isinstance(leaf, Tracer):
            got_shape, got_dtype = leaf.shape, leaf.dtype
        else:
            array = np.asarray(leaf)
            got_shape, got_dtype = array.shape, array.dtype
        if tuple(got_shape) != aval.shape:
            raise ShapeError(f"{where}: {path} has shape {tuple(got_shape)}, expected {aval.shape}")
        python_number = isinstance(leaf, (int, float)) and not isinstance(leaf, bool)
        if differentiable(aval) and got_dtype != aval.dtype and not python_number:
            raise FoldTypeError(f"{where}: {path} has dtype {np.dtype(got_dtype).name}, expected {aval.dtype.name}")
        if not differentiable(aval) and not isinstance(leaf, Tracer) and np.any(np.asarray(leaf) != 0):
            raise FoldTypeError(f"{where}: {path} is nonzero, but its value is {aval.dtype.name}, which has no "
                                f"derivative: pass zeros there (it would be ignored)")
        out.append(leaf if isinstance(leaf, Tracer) else np.asarray(leaf, dtype=aval.dtype))
    return out


def _trace(f: Callable, primals: Any, where: str) -> tuple[list, Program, int]:
    """The program's arguments (captured values of an enclosing trace first), the program, and their count."""
    if not isinstance(primals, tuple):
        raise FoldTypeError(f"{where}: primals must be a tuple of the positional arguments, got {type(primals).__name__}")
    leaves, signature = signature_of(primals, where)
    program = trace_signature(f, signature)
    consts = captured_consts(program)
    return consts + list(leaves), program, len(consts)


def _spread(results: Any, mask: Sequence[bool], avals: Sequence[ShapedArray]) -> list:
    """Results for the masked entries, zeros of the right dtype for the others."""
    it = iter(results)
    return [next(it) if m else np.zeros(a.shape, a.dtype) for m, a in zip(mask, avals, strict=True)]


def vjp(f: Callable[..., Any], primals: tuple, cotangent: Any, *, reduce_rule: str = "auto") -> tuple:
    """Cotangents of `primals` (in their structure) for the output cotangent `cotangent` of `f(*primals)`.

    Reverse mode by program transformation: the gradient program re-executes each scope instead of keeping
    a tape. `reduce_rule` picks how reductions are differentiated: "auto", "generic" or "monoid".
    Integer and boolean inputs get zero cotangents of their own dtype.

    >>> import numpy as np, fold
    >>> fold.vjp(lambda x: fold.reduce(fold.monoids.sum, x * x), (np.arange(3.0),), 1.0)
    (array([0., 2., 4.]),)
    """
    args, program, nc = _trace(f, primals, "fold.vjp")
    cts = _conform("fold.vjp", "cotangent", cotangent, program.out_avals, program.out_tree)
    with reduce_rule_scope(reduce_rule):
        grad_program, in_mask = vjp_program(program, wrt=[False] * nc + [True] * (len(args) - nc))
    out_mask = [differentiable(a) for a in program.out_avals]
    results = _run(grad_program, args + [c for c, m in zip(cts, out_mask, strict=True) if m])
    in_cts = _spread(results, in_mask, program.in_avals)[nc:]  # captured values are constants here
    return tuple(program.in_tree.unflatten(in_cts))


def jvp(f: Callable[..., Any], primals: tuple, tangents: tuple) -> Any:
    """The tangent of `f`'s output at `primals` in the direction `tangents` (forward mode).

    >>> import numpy as np, fold
    >>> float(fold.jvp(lambda x: fold.reduce(fold.monoids.sum, x * x), (np.arange(3.0),), (np.ones(3),)))
    6.0
    """
    args, program, nc = _trace(f, primals, "fold.jvp")
    if not isinstance(tangents, tuple):
        raise FoldTypeError(f"fold.jvp: tangents must be a tuple like primals, got {type(tangents).__name__}")
    tans = _conform("fold.jvp", "tangents", tangents, program.in_avals[nc:], program.in_tree)
    tangent_mask = [False] * nc + [differentiable(a) for a in program.in_avals[nc:]]
    forward, out_mask = jvp_program(program, tangent_mask)
    results = _run(forward, args + [t for t, m in zip(tans, tangent_mask[nc:], strict=True) if m])
    return program.out_tree.unflatten(_spread(results[len(program.outputs):], out_mask, program.out_avals))


def value_and_grad(f: Callable[..., Any], argnums: int | Sequence[int] = 0, *, reduce_rule: str = "auto") -> Callable:
    """`f` returning (its float scalar value, its gradient with respect to argument(s) `argnums`).

    The value comes from the same gradient program (one forward sweep), not from a second evaluation.
    Keyword arguments are traced like positional ones and never differentiated (`argnums` counts the
    positional ones), as in JAX.
    """
    single, nums = _argnums(argnums)
    with_keywords: dict[tuple[int, tuple[str, ...]], Callable] = {}  # per count of positional arguments and names

    def value_and_grad_f(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        _check_argnums(args, nums)
        positions = [i % len(args) for i in nums]
        names = tuple(sorted(kwargs))
        if names and (len(args), names) not in with_keywords:
            with_keywords[(len(args), names)] = keywords_as_positional(f, len(args), names)
        target = with_keywords[(len(args), names)] if names else f
        every = args + tuple(kwargs[k] for k in names)
        flat_args, program, nc = _trace(target, every, "fold.grad")
        _check_scalar(program)
        with reduce_rule_scope(reduce_rule):
            grad_program, in_mask = vjp_program(program, wrt=_wrt_mask(every, positions, nc), with_primal_outputs=True)
        seed = np.ones((), program.out_avals[0].dtype)
        results = _run(grad_program, flat_args + [seed])
        cts = program.in_tree.unflatten(_spread(results[1:], in_mask, program.in_avals)[nc:])
        grads = tuple(cts[i] for i in positions)
        return results[0], (grads[0] if single else grads)

    value_and_grad_f.__name__ = f"value_and_grad({getattr(f, '__name__', 'f')})"
    return value_and_grad_f


def grad(f: Callable[..., Any], argnums: int | Sequence[int] = 0, *, reduce_rule: str = "auto") -> Callable:
    """The gradient of float-scalar-valued `f` with respect to argument(s) `argnums`.

    >>> import numpy as np, fold
    >>> fold.grad(lambda x: fold.reduce(fold.monoids.sum, x * x))(np.arange(3.0))
    array([0., 2., 4.])
    """
    both = value_and_grad(f, argnums, reduce_rule=reduce_rule)

    def grad_f(*args: Any, **kwargs: Any) -> Any:
        return both(*args, **kwargs)[1]

    grad_f.__name__ = f"grad({getattr(f, '__name__', 'f')})"
    return grad_f


def _check_scalar(program: Program) -> None:
    avals = program.out_avals
    if len(avals) != 1 or avals[0].shape != () or not differentiable(avals[0]):
        got = ", ".join(map(str, avals)) or "nothing"
        raise FoldTypeError(f"fold.grad: the function must return one float scalar, got {got}")


def _argnums(argnums: Any) -> tuple[bool, tuple[int, ...]]:
    """(whether argnums names one argument, the argument numbers); a bool, a float or a string is an error."""
    if is_static_int(argnums):
        return True, (int(argnums),)
    if isinstance(argnums, (tuple, list)) and argnums and all(is_static_int(i) for i in argnums):
        return False, tuple(int(i) for i in argnums)
    raise FoldTypeError(f"fold.grad: argnums must be an int or a non-empty tuple or list of ints, got {argnums!r}")


def _wrt_mask(args: tuple, positions: Sequence[int], num_captured: int) -> list[bool]:
    """Per input leaf of the traced program: whether grad was asked for it (captured values never)."""
    chosen = set(positions)
    mask = [False] * num_captured
    for i, arg in enumerate(args):
        mask += [i in chosen] * len(tree_flatten(arg)[0])
    return mask


def _check_argnums(args: tuple, nums: tuple[int, ...]) -> None:
    for i in nums:
        if not -len(args) <= i < len(args):
            raise FoldTypeError(f"fold.grad: argnums contains {i}, but only {len(args)} arguments were given")
        for path, leaf in zip(leaf_paths(tree_flatten(args[i])[1], f"argument {i}"), tree_flatten(args[i])[0], strict=True):
            dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
            if not np.issubdtype(dtype, np.floating):
                raise FoldTypeError(f"fold.grad: {path} has dtype {np.dtype(dtype).name}; only float arguments can be differentiated (argnums={i})")


def _run(program: Program, args: list) -> list:
    """Inline into the enclosing trace when there is one (so transformations compose), else execute."""
    if current_scope() is not None or any(isinstance(a, Tracer) for a in args):
        return inline_program(program, args)
    return list(_executor(program)(*args))


_executors: "weakref.WeakKeyDictionary[Program, Callable]" = weakref.WeakKeyDictionary()


def _executor(program: Program) -> Callable:
    runner = _executors.get(program)
    if runner is None:
        import fold  # the runtime is reached through fold's lazy attributes: ad never imports it

        weak = weakref.ref(program)  # the runner must not hold its own key, or the entry lives forever
        runner = fold.jit(lambda *args: inline_program(weak(), list(args)))
        _executors[program] = runner
    return runner
