"""The user-facing transformations: fold.vjp, fold.jvp, fold.grad, fold.value_and_grad (JAX's contracts),
and fold.ad.vjp_value (the cotangent-first form fold's own tools use).

Each traces the function (cached per input signature), transforms the Program (cached per program), and
then either inlines the result into the enclosing trace — so that transformations compose: `fold.jvp` of a
function calling `fold.grad` gives Hessian-vector products — or runs it with `fold.jit` on the default backend.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

import numpy as np

from fold.api import bind_static, captured_consts, signature_of, trace_signature
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
    if isinstance(primals, list):
        primals = tuple(primals)
    if not isinstance(primals, tuple):
        raise FoldTypeError(f"{where}: primals must be a tuple or list of the positional arguments, got "
                            f"{type(primals).__name__}")
    leaves, signature = signature_of(primals, where)
    program = trace_signature(f, signature)
    consts = captured_consts(program)
    return consts + list(leaves), program, len(consts)


def _spread(results: Any, mask: Sequence[bool], avals: Sequence[ShapedArray]) -> list:
    """Results for the masked entries, zeros of the right dtype for the others."""
    it = iter(results)
    return [next(it) if m else np.zeros(a.shape, a.dtype) for m, a in zip(mask, avals, strict=True)]


def _split_aux(program: Program, has_aux: bool, where: str) -> tuple[int, TreeDef, TreeDef | None]:
    """(how many output leaves are the differentiated output, its structure, the aux output's structure)."""
    tree = program.out_tree
    if not has_aux:
        return tree.num_leaves, tree, None
    if tree.kind not in ("tuple", "list") or len(tree.children) != 2:
        raise StructureError(f"{where}: with has_aux=True the function must return a pair (output, aux), but it "
                             f"returned structure {tree}")
    main, aux = tree.children
    return main.num_leaves, main, aux


def vjp_value(f: Callable[..., Any], primals: tuple, cotangent: Any, *, reduce_rule: str = "auto") -> tuple:
    """Cotangents of `primals` (in their structure) for the output cotangent `cotangent` of `f(*primals)`:
    `fold.vjp(f, *primals)[1](cotangent)` in one call, without computing the output on its own first.

    The cotangent-first form fold's own tools (`fold.testing`, `compare_rules`) use. Reverse mode by program
    transformation: the gradient program re-executes each scope instead of keeping a tape. `reduce_rule`
    picks how reductions are differentiated: "auto", "generic" or "monoid". Integer and boolean inputs get
    zero cotangents of their own dtype.

    >>> import numpy as np, fold
    >>> fold.ad.vjp_value(lambda x: fold.reduce(fold.monoids.sum, x * x), (np.arange(3.0),), 1.0)
    (array([0., 2., 4.]),)
    """
    args, program, nc = _trace(f, primals, "fold.vjp")
    return _pull(program, args, nc, program.out_tree.num_leaves, program.out_tree, cotangent, reduce_rule)


def _pull(program: Program, args: list, nc: int, n_main: int, main_tree: TreeDef, cotangent: Any,
          reduce_rule: str) -> tuple:
    """The cotangents of the primal arguments for `cotangent` of the first `n_main` outputs (the rest: aux)."""
    cts = _conform("fold.vjp", "cotangent", cotangent, program.out_avals[:n_main], main_tree)
    ct_mask = [differentiable(a) for a in program.out_avals[:n_main]] + [False] * (len(program.outputs) - n_main)
    with reduce_rule_scope(reduce_rule):
        grad_program, in_mask = vjp_program(program, ct_mask, wrt=[False] * nc + [True] * (len(args) - nc))
    results = _run(grad_program, args + [c for c, m in zip(cts, ct_mask, strict=False) if m])
    in_cts = _spread(results, in_mask, program.in_avals)[nc:]  # captured values are constants here
    return tuple(program.in_tree.unflatten(in_cts))


def vjp(f: Callable[..., Any], *primals: Any, has_aux: bool = False, reduce_rule: str = "auto") -> tuple:
    """`(f(*primals), pullback)` (JAX's contract): `pullback(cotangent)` returns the cotangents of `primals`,
    a tuple with one entry per primal in its structure. With `has_aux=True`, `f` returns `(output, aux)` and
    `vjp` returns `(output, pullback, aux)`.

    The pullback may be called many times (the gradient program is made once and cached) and inside a traced
    or jitted function (it is then inlined there). Reverse mode is by program transformation: the gradient
    program re-executes each scope instead of keeping a tape, so each call of the pullback re-runs the primal
    statements it needs. `reduce_rule` picks how reductions are differentiated ("auto", "generic" or
    "monoid"). Integer and boolean primals get zero cotangents of their own dtype.

    >>> import numpy as np, fold
    >>> y, pullback = fold.vjp(lambda x: fold.reduce(fold.monoids.sum, x * x), np.arange(3.0))
    >>> float(y), pullback(1.0)
    (5.0, (array([0., 2., 4.]),))
    """
    args, program, nc = _trace(f, primals, "fold.vjp")
    n_main, main_tree, aux_tree = _split_aux(program, has_aux, "fold.vjp")
    outs = _run(program, args)
    out = main_tree.unflatten(outs[:n_main])

    def pullback(cotangent: Any) -> tuple:
        return _pull(program, args, nc, n_main, main_tree, cotangent, reduce_rule)

    pullback.__name__ = f"pullback({getattr(f, '__name__', 'f')})"
    if aux_tree is None:
        return out, pullback
    return out, pullback, aux_tree.unflatten(outs[n_main:])


def _is_float0(value: Any) -> bool:
    """JAX's tangent dtype for integer inputs (`jax.dtypes.float0`, a NumPy void dtype)."""
    return getattr(getattr(value, "dtype", None), "kind", None) == "V"


def _data_tangents(primals: tuple, tangents: tuple) -> tuple:
    """`tangents` with None or float0 given for an integer or boolean primal (JAX's way) replaced by zeros."""
    if len(tangents) != len(primals):
        raise StructureError(f"fold.jvp: got {len(primals)} primals but {len(tangents)} tangents; give one tangent "
                             f"per primal (None or zeros for integer ones)")
    out = []
    for i, (p, t) in enumerate(zip(primals, tangents, strict=True)):
        p_leaves, p_tree = tree_flatten(p)
        if t is None or _is_float0(t):
            floats = [leaf for leaf in p_leaves if np.issubdtype(getattr(leaf, "dtype", np.asarray(leaf).dtype), np.inexact)]
            if floats:
                raise FoldTypeError(f"fold.jvp: tangent {i} is {'None' if t is None else 'float0'}, but primal {i} has "
                                    f"float leaves, which need a tangent of their shape and dtype")
            t = p_tree.unflatten([np.zeros(np.shape(leaf), getattr(leaf, "dtype", np.asarray(leaf).dtype)) for leaf in p_leaves])
        else:
            t_leaves, t_tree = tree_flatten(t)
            if t_tree == p_tree and any(_is_float0(leaf) for leaf in t_leaves):
                t = t_tree.unflatten([np.zeros(np.shape(pl), getattr(pl, "dtype", np.asarray(pl).dtype)) if _is_float0(tl) else tl
                                      for tl, pl in zip(t_leaves, p_leaves, strict=True)])
        out.append(t)
    return tuple(out)


def jvp(f: Callable[..., Any], primals: Sequence[Any], tangents: Sequence[Any], *, has_aux: bool = False,
        reduce_rule: str = "auto") -> tuple:
    """`(f(*primals), tangent of the output)` in the direction `tangents` (forward mode; JAX's contract).

    `primals` and `tangents` are tuples (or lists) of the positional arguments and their tangents, of the
    same structure, shapes and dtypes. An integer or boolean primal takes None, JAX's float0 or zeros as its
    tangent. With `has_aux=True`, `f` returns `(output, aux)` and `jvp` returns `(output, tangent, aux)`.
    `reduce_rule`: "auto" gives a reduce of scalars whose monoid qualifies for Theorem 2.1 the tangent
    sum_i <D(y, a_i, e_j), adot_i> for each state leaf j; "generic" folds (value, tangent) pairs with the
    operator's own jvp, as for any other operator (the two agree; vjp's rules are compared the same way).

    >>> import numpy as np, fold
    >>> y, ydot = fold.jvp(lambda x: fold.reduce(fold.monoids.sum, x * x), (np.arange(3.0),), (np.ones(3),))
    >>> float(y), float(ydot)
    (5.0, 6.0)
    """
    if isinstance(primals, list):
        primals = tuple(primals)
    if isinstance(tangents, list):
        tangents = tuple(tangents)
    args, program, nc = _trace(f, primals, "fold.jvp")
    if not isinstance(tangents, tuple):
        raise FoldTypeError(f"fold.jvp: tangents must be a tuple or list like primals, got {type(tangents).__name__}")
    n_main, main_tree, aux_tree = _split_aux(program, has_aux, "fold.jvp")
    tans = _conform("fold.jvp", "tangents", _data_tangents(primals, tangents), program.in_avals[nc:], program.in_tree)
    # a tangent given as concrete zeros (the other arguments' in a Hessian-vector product) is a symbolic zero:
    # nothing is computed from it, and a jitted caller does not hold it as a constant
    tangent_mask = [False] * nc + [differentiable(a) and (isinstance(t, Tracer) or bool(np.any(t)))
                                   for a, t in zip(program.in_avals[nc:], tans, strict=True)]
    with reduce_rule_scope(reduce_rule):
        forward, out_mask = jvp_program(program, tangent_mask)
    results = _run(forward, args + [t for t, m in zip(tans, tangent_mask[nc:], strict=True) if m])
    n_out = len(program.outputs)
    out_tangents = _spread(results[n_out:], out_mask, program.out_avals)
    out = main_tree.unflatten(results[:n_main])
    tangent_out = main_tree.unflatten(out_tangents[:n_main])
    if aux_tree is None:
        return out, tangent_out
    return out, tangent_out, aux_tree.unflatten(results[n_main:n_out])


def value_and_grad(f: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False, *,
                   reduce_rule: str = "auto") -> Callable:
    """`f` returning (its float scalar value, its gradient with respect to argument(s) `argnums`).

    The value comes from the same gradient program (one forward sweep), not from a second evaluation.
    With `has_aux=True`, `f` returns `(value, aux)` and the result is `((value, aux), gradient)`, as in JAX.
    Keyword arguments are traced like positional ones and never differentiated (`argnums` counts the
    positional ones), as in JAX. Arguments not differentiated that are Python ints or bools, or not arrays
    at all (strings, functions), reach `f` as they are, untraced: a count used by `fold.loop` works, and
    so does `fold.jit(fold.grad(f), static_argnums=...)`.
    """
    single, nums = _argnums(argnums)

    def value_and_grad_f(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        _check_argnums(args, nums)
        target, every, positions = bind_static(f, args, kwargs, sorted({i % len(args) for i in nums}),
                                               "fold.grad")
        positions = [positions[sorted({j % len(args) for j in nums}).index(i % len(args))] for i in nums]
        flat_args, program, nc = _trace(target, every, "fold.grad")
        n_main, _, aux_tree = _split_aux(program, has_aux, "fold.grad")
        _check_scalar(program, n_main)
        ct_mask = [True] + [False] * (len(program.outputs) - 1)
        with reduce_rule_scope(reduce_rule):
            grad_program, in_mask = vjp_program(program, ct_mask, wrt=_wrt_mask(every, positions, nc),
                                                with_primal_outputs=True)
        seed = np.ones((), program.out_avals[0].dtype)
        results = _run(grad_program, flat_args + [seed])
        n_out = len(program.outputs)
        cts = program.in_tree.unflatten(_spread(results[n_out:], in_mask, program.in_avals)[nc:])
        grads = tuple(cts[i] for i in positions)
        value = results[0] if aux_tree is None else (results[0], aux_tree.unflatten(results[1:n_out]))
        return value, (grads[0] if single else grads)

    value_and_grad_f.__name__ = f"value_and_grad({getattr(f, '__name__', 'f')})"
    value_and_grad_f.__wrapped__ = f  # inspect.signature (jit's static_argnames) sees f's parameters
    return value_and_grad_f


def grad(f: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False, *,
         reduce_rule: str = "auto") -> Callable:
    """The gradient of float-scalar-valued `f` with respect to argument(s) `argnums`.

    With `has_aux=True`, `f` returns `(value, aux)` and the gradient function returns `(gradient, aux)`.
    Arguments are handled as in `value_and_grad`.

    >>> import numpy as np, fold
    >>> fold.grad(lambda x: fold.reduce(fold.monoids.sum, x * x))(np.arange(3.0))
    array([0., 2., 4.])
    """
    both = value_and_grad(f, argnums, has_aux, reduce_rule=reduce_rule)

    def grad_f(*args: Any, **kwargs: Any) -> Any:
        value, g = both(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    grad_f.__name__ = f"grad({getattr(f, '__name__', 'f')})"
    grad_f.__wrapped__ = f
    return grad_f


def _check_scalar(program: Program, n_main: int = 1) -> None:
    avals = program.out_avals[:n_main]
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
