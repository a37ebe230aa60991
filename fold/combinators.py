"""The parallel combinators users call: map, reduce, scan, reduce_by_index, loop.

Each traces its lambda once, on abstract elements, into a closed body Program, checks that the pieces fit
(leading axes, identity, operator result) with errors that name them, and binds the primitive.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .dtypes import ShapedArray, is_static_int
from .errors import FoldTypeError, MonoidLawError, ShapeError, StructureError
from .monoid import Monoid, identity_leaves
from .recognize import KNOWN_IDENTITIES, recognize_binary_op
from .primitives import Loop, Map, Reduce, ReduceByIndex, Scan
from .pytree import TreeDef, leaf_paths, tree_flatten
from .tracing import STATIC_HINT, TracedBody, Tracer, abstractify, bind, trace_body

Operator = Callable[[Any, Any], Any] | Monoid


def _leading_axis(where: str, avals: list[ShapedArray], treedef: TreeDef, label: str) -> tuple[int, list[ShapedArray]]:
    paths = leaf_paths(treedef, label)
    for path, aval in zip(paths, avals, strict=True):
        if aval.ndim == 0:
            raise ShapeError(f"{where}: {path} is 0-d (shape ()), it has no leading axis to {where.split('.')[-1]} over")
    sizes = [a.shape[0] for a in avals]
    if len(set(sizes)) > 1:
        listed = ", ".join(f"{p} has shape {a.shape}" for p, a in zip(paths, avals, strict=True))
        raise ShapeError(f"{where}: mismatched leading axes: {listed}")
    return sizes[0], [a.update(shape=a.shape[1:]) for a in avals]


def map(f: Callable[..., Any], *xs: Any) -> Any:  # noqa: A001
    """Apply `f` to the rows (leading axis) of `xs`, which may be arrays or pytrees of arrays.

    `f` may use values of the enclosing function freely (a weight vector, another map's element): they are
    passed into the body, never copied per row.

    >>> import numpy as np, fold
    >>> fold.map(lambda row: fold.reduce(fold.monoids.sum, row * row), np.ones((3, 4)))
    array([4., 4., 4.])
    """
    if not xs:
        raise FoldTypeError("fold.map: needs at least one array to map over")
    leaves, treedef, avals = abstractify(xs, "fold.map")
    if not leaves:
        raise FoldTypeError("fold.map: the arguments contain no arrays to map over")
    _, elems = _leading_axis("fold.map", avals, treedef, "xs")
    body = trace_body(f, treedef.unflatten(elems), f"map body {_name(f)}")
    outs = bind(Map(body.program, len(body.consts)), *body.consts, *leaves)
    return body.out_tree.unflatten(outs)


def _operator(where: str, op: Operator, identity: Any) -> tuple[Callable, Any, Monoid | None]:
    if isinstance(op, Monoid):
        if identity is not None:
            raise FoldTypeError(f"{where}: identity= is given by the monoid {op.name}; do not pass it")
        return op.op, op.identity, op
    if not callable(op):
        raise FoldTypeError(f"{where}: op must be a fold.Monoid or a two-argument callable, got {type(op).__name__}")
    if identity is None:
        raise FoldTypeError(
            f"{where}: operator {_name(op)} is a plain callable, so identity= is required "
            f"(it is the result for an empty array); or pass a fold.Monoid"
        )
    return op, identity, None


def _trace_operator(where: str, fn: Callable, treedef: TreeDef, elems: list[ShapedArray]) -> TracedBody:
    elem_tree = treedef.unflatten(elems)
    body = trace_body(fn, (elem_tree, elem_tree), f"{where} operator {_name(fn)}")
    if body.out_tree != treedef:
        raise StructureError(f"{where}: operator {_name(fn)} returned structure {body.out_tree}, but its arguments have structure {treedef}")
    got = list(body.program.out_avals)
    if got != elems:
        paths = leaf_paths(treedef)
        diffs = ", ".join(f"{p}: {e} -> {g}" for p, e, g in zip(paths, elems, got, strict=True) if e != g)
        raise StructureError(f"{where}: operator {_name(fn)} must return elements like its arguments, but {diffs}")
    return body


def _fold_setup(where: str, op: Operator, xs: Any, identity: Any):
    leaves, treedef, avals = abstractify(xs, where)
    if not leaves:
        raise FoldTypeError(f"{where}: xs contains no arrays")
    n, elems = _leading_axis(where, avals, treedef, "xs")
    fn, ident, monoid = _operator(where, op, identity)
    ident_leaves = identity_leaves(where, ident, treedef, elems)
    body = _trace_operator(where, fn, treedef, elems)
    _check_identity(where, fn, body, ident_leaves, treedef, sampled=monoid is None)
    return leaves, treedef, n, ident_leaves, body, monoid


def _check_identity(where: str, fn: Callable, body: TracedBody, ident: list[np.ndarray], treedef: TreeDef,
                    sampled: bool) -> None:
    """Refuse an identity that is not one: it is the result for no elements, and a fold may combine it into
    its elements any number of times (once per parallel chunk, per bin, per scan block), so a value like
    functools.reduce's `initializer` would give answers that depend on the backend and the array's size.
    For the operators fold recognises the identity is known; for others, op(e, e) must give e, and where the
    operator is a plain callable with `identity=` (`sampled`: where a starting value is mistaken for an
    identity), op(e, x) and op(x, e) must give x for a sample x in (0.25, 0.75) (1 for integers): inside most
    operators' domains (weights, logs, square roots, probabilities, angles, saturating sums; a mod-2 sum).
    Up to rounding; a NaN result is not judged. A fold.Monoid is trusted beyond op(e, e) (check_monoid tests
    it on its own domain); operators that capture traced values are not evaluated."""
    op = recognize_binary_op(body.program, len(body.consts))
    if op is not None:
        (value,) = ident
        known = KNOWN_IDENTITIES[op]
        want = identity_leaves(where, known, tree_flatten(known)[1], [ShapedArray(value.shape, value.dtype)])[0]
        if not np.array_equal(value, want):
            raise MonoidLawError(f"{where}: identity {_shown(value)} is not the identity of operator {_name(fn)} "
                                 f"({op}), which is {_shown(want)}. {_WHY_IDENTITY}")
        return
    if body.consts:
        return
    from fold.runtime.interpreter import eval_program  # lazy: runtime depends on fold, not the other way

    sample = [_positive_sample(e) for e in ident]
    paths = leaf_paths(treedef, "identity")
    cases = (("op(identity, identity)", ident + ident, ident), ("op(identity, x)", ident + sample, sample),
             ("op(x, identity)", sample + ident, sample))[: 3 if sampled else 1]
    for name, args, want in cases:
        try:
            with np.errstate(all="ignore"):
                got = eval_program(body.program, args)
        except Exception:  # noqa: BLE001 - an operator that fails on these values is judged when it runs, not here
            return
        for path, e, w, g in zip(paths, ident, want, got, strict=True):
            if not np.all(_same_up_to_rounding(np.asarray(g), w)):
                at = "" if treedef.kind == "leaf" else f" (leaf {path})"
                for_x = f" for x = {_shown(w)}" if "x" in name else ""
                raise MonoidLawError(f"{where}: identity {_shown(e)}{at} is not an identity of operator {_name(fn)}: "
                                     f"{name} gives {_shown(np.asarray(g))}{for_x}. {_WHY_IDENTITY}")


def _positive_sample(e: np.ndarray) -> np.ndarray:
    """Elements shaped like the identity leaf `e`: floats spread over (0.25, 0.75), integers 1, booleans True."""
    if e.dtype.kind in "biu":
        return np.ones(e.shape, e.dtype)
    return (0.25 + 0.5 * (np.arange(e.size).reshape(e.shape) + 0.5) / max(e.size, 1)).astype(e.dtype)


def _same_up_to_rounding(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    if want.dtype.kind != "f":
        return got == want
    with np.errstate(all="ignore"):
        return np.isnan(got) | (got == want) | (np.abs(got - want) <= 64 * np.finfo(want.dtype).eps * np.abs(want))


_WHY_IDENTITY = ("The identity is the result for an empty array, and a fold may combine it with the elements "
                 "any number of times (per parallel chunk, bin or block); to start from a value, combine it with "
                 "the result instead.")


def _shown(value: np.ndarray) -> str:
    return str(value.item()) if value.ndim == 0 else np.array2string(value, threshold=8)


def reduce(op: Operator, xs: Any, *, identity: Any = None) -> Any:
    """Combine the rows of `xs` with the associative operator `op` (order kept: it need not be commutative).

    `op` is a `fold.Monoid`, or a two-argument callable together with its `identity`.

    >>> import numpy as np, fold
    >>> float(fold.reduce(lambda a, b: a * b, np.array([1.0, 2.0, 3.0]), identity=1.0))
    6.0
    """
    leaves, treedef, _, ident, body, monoid = _fold_setup("fold.reduce", op, xs, identity)
    outs = bind(Reduce(body.program, len(body.consts), monoid), *body.consts, *ident, *leaves)
    return treedef.unflatten(outs)


def scan(op: Operator, xs: Any, *, identity: Any = None, exclusive: bool = False, reverse: bool = False) -> Any:
    """All prefix combinations of the rows of `xs` (suffixes with `reverse=True`).

    Inclusive by default (`out[i] = x_0 . ... . x_i`); `exclusive=True` shifts by one, starting at the identity.
    """
    flags = [_flag("fold.scan", "exclusive", exclusive), _flag("fold.scan", "reverse", reverse)]
    leaves, treedef, _, ident, body, monoid = _fold_setup("fold.scan", op, xs, identity)
    prim = Scan(body.program, len(body.consts), monoid, *flags)
    return treedef.unflatten(bind(prim, *body.consts, *ident, *leaves))


def reduce_by_index(op: Operator, n: int, indices: Any, values: Any, *, identity: Any = None) -> Any:
    """A generalised histogram: bin `b` holds the combination of the `values[i]` with `indices[i] == b`.

    Bins no index names hold the identity; indices outside [0, n) are ignored (as in Futhark).
    """
    where = "fold.reduce_by_index"
    n = _count(where, "n", n, 0)
    idx_leaves, _, idx_avals = abstractify(indices, where)
    if len(idx_leaves) != 1:
        raise FoldTypeError(f"{where}: indices must be one 1-d integer array, got a structure of {len(idx_leaves)} "
                            f"leaves ({indices!r:.60}); pass np.asarray(indices)")
    (idx,), (idx_aval,) = idx_leaves, idx_avals
    if idx_aval.ndim != 1 or idx_aval.dtype.kind not in "iu":
        raise FoldTypeError(f"{where}: indices must be a 1-d integer array, got {idx_aval}")
    leaves, treedef, avals = abstractify(values, where)
    m, elems = _leading_axis(where, avals, treedef, "values")
    if m != idx_aval.shape[0]:
        raise ShapeError(f"{where}: {idx_aval.shape[0]} indices but values have leading axis {m}")
    fn, ident, monoid = _operator(where, op, identity)
    ident_leaves = identity_leaves(where, ident, treedef, elems)
    body = _trace_operator(where, fn, treedef, elems)
    _check_identity(where, fn, body, ident_leaves, treedef, sampled=monoid is None)
    prim = ReduceByIndex(body.program, len(body.consts), n, monoid)
    return treedef.unflatten(bind(prim, *body.consts, *ident_leaves, idx, *leaves))


def loop(body: Callable[[Any, Any], Any], init: Any, n: int, *, checkpoint: int | None = None) -> Any:
    """Run `state = body(i, state)` for i = 0 .. n-1, sequentially.

    `checkpoint=k` affects only differentiation: every k-th state is saved and the rest recomputed.
    """
    where = "fold.loop"
    n = _count(where, "n", n, 0)
    checkpoint = None if checkpoint is None else _count(where, "checkpoint", checkpoint, 1, " or None")
    leaves, treedef, avals = abstractify(init, where)
    counter = ShapedArray((), np.dtype("int64"))
    traced = trace_body(body, (counter, treedef.unflatten(avals)), f"loop body {_name(body)}")
    if traced.out_tree != treedef:
        raise StructureError(f"{where}: body returned structure {traced.out_tree}, but the state has structure {treedef}")
    if list(traced.program.out_avals) != list(avals):
        paths = leaf_paths(treedef, "state")
        diffs = ", ".join(f"{p}: {a} -> {g}" for p, a, g in zip(paths, avals, traced.program.out_avals, strict=True) if a != g)
        raise StructureError(f"{where}: body must return a state like its input, but {diffs}")
    prim = Loop(traced.program, len(traced.consts), n, checkpoint)
    return treedef.unflatten(bind(prim, *traced.consts, *leaves))


def _count(where: str, name: str, value: Any, least: int, alternative: str = "") -> int:
    """A static integer parameter as an int; a bool, a float or a value below `least` is an error."""
    if not is_static_int(value) or value < least:
        kind = "non-negative" if least == 0 else "positive" if least == 1 else f">= {least}"
        hint = f" ({STATIC_HINT})" if isinstance(value, Tracer) else ""
        raise FoldTypeError(f"{where}: {name} must be a {kind} int{alternative}, got {value!r}{hint}")
    return int(value)


def _flag(where: str, name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        hint = f" ({STATIC_HINT})" if isinstance(value, Tracer) else ""
        raise FoldTypeError(f"{where}: {name} must be True or False, got {value!r}{hint}")
    return bool(value)


def _name(fn: Any) -> str:
    return getattr(fn, "name", None) or getattr(fn, "__name__", type(fn).__name__)
