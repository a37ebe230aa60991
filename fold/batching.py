"""`fold.vmap`: JAX's vectorising map, which in fold is `fold.map` with the batch axis moved to the front.

`fold.map` already applies a function to the rows of its arguments; `vmap` adds JAX's interface to it:
`in_axes` (which axis of each argument is the batch axis, or None for an argument every row shares) and
`out_axes` (where the batch axis goes in the outputs). Outside a traced function the batched function runs
through `fold.jit` (traced once per signature); inside one it is traced in place.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .api import is_static_value
from .combinators import map as fold_map
from .dtypes import is_static_int
from .errors import FoldTypeError, ShapeError, StructureError
from .ops import transpose
from .pytree import leaf_paths, tree_flatten
from .tracing import Tracer, current_scope


def _broadcast_axes(in_axes: Any, args: tuple) -> list[Any]:
    """One entry per argument of the call: `in_axes` itself when it is an int or None, else its entries."""
    if in_axes is None or is_static_int(in_axes):
        return [in_axes] * len(args)
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)
    if not isinstance(in_axes, tuple):
        raise FoldTypeError(f"fold.vmap: in_axes must be an int, None, or a tuple/list with one entry per argument, "
                            f"got {in_axes!r}")
    if len(in_axes) != len(args):
        raise FoldTypeError(f"fold.vmap: in_axes has {len(in_axes)} entries, but the function was called with "
                            f"{len(args)} positional arguments (in_axes={in_axes!r})")
    return list(in_axes)


def _leaf_axes(axis: Any, arg: Any, path: str) -> list[Any]:
    """The batch axis of each leaf of `arg` from its in_axes entry: an int or None (for the whole subtree), or
    a pytree prefix of `arg` (JAX's rule)."""
    if axis is None or is_static_int(axis):
        return [axis] * len(tree_flatten(arg)[0])
    if isinstance(axis, dict) and isinstance(arg, dict):
        if sorted(axis) != sorted(arg):
            raise StructureError(f"fold.vmap: in_axes for {path} has keys {sorted(axis)}, the argument {sorted(arg)}")
        return [ax for k in sorted(arg) for ax in _leaf_axes(axis[k], arg[k], f"{path}[{k!r}]")]
    if isinstance(axis, (tuple, list)) and isinstance(arg, (tuple, list)) and type(axis) is type(arg):
        if len(axis) != len(arg):
            raise StructureError(f"fold.vmap: in_axes for {path} has {len(axis)} entries, the argument {len(arg)}")
        return [ax for j, (x, a) in enumerate(zip(axis, arg, strict=True)) for ax in _leaf_axes(x, a, f"{path}[{j}]")]
    raise StructureError(f"fold.vmap: in_axes for {path} is {axis!r}, which is neither an int, None, nor a "
                         f"container matching the argument ({type(arg).__name__})")


def _size_and_front(leaves: list, axes: list, where: list[str]) -> tuple[int, list]:
    """The batch size all mapped leaves agree on, and each mapped leaf with its batch axis moved to the front."""
    size, moved = None, []
    for leaf, axis, path in zip(leaves, axes, where, strict=True):
        if axis is None:
            continue
        if not is_static_int(axis):
            raise FoldTypeError(f"fold.vmap: in_axes entries must be ints or None, got {axis!r} for {path}")
        shape = tuple(np.shape(leaf)) if not isinstance(leaf, Tracer) else leaf.shape
        if not -len(shape) <= axis < len(shape):
            raise ShapeError(f"fold.vmap: in_axes={axis} for {path}, which has shape {shape} ({len(shape)} axes)")
        axis = axis % len(shape)
        if size is not None and shape[axis] != size:
            raise ShapeError(f"fold.vmap: mapped axes have different sizes: {path} has {shape[axis]} on axis {axis}, "
                             f"but an earlier argument has {size}")
        size = shape[axis]
        order = (axis, *[a for a in range(len(shape)) if a != axis])
        moved.append(leaf if axis == 0 else transpose(leaf, order))
    if size is None:
        raise FoldTypeError("fold.vmap: in_axes maps no argument (every entry is None); at least one must be mapped")
    return size, moved


def _out_axis(y: Any, axis: int) -> Any:
    ndim = len(y.shape)
    if not -ndim <= axis < ndim:
        raise ShapeError(f"fold.vmap: out_axes={axis}, but an output has shape {tuple(y.shape)} with its batch axis "
                         f"first ({ndim} axes)")
    axis %= ndim
    if axis == 0:
        return y
    order = list(range(1, ndim))
    order.insert(axis, 0)
    return transpose(y, tuple(order))


def vmap(f: Callable[..., Any], in_axes: Any = 0, out_axes: Any = 0) -> Callable:
    """`f` mapped over a batch axis of its arguments (JAX's `vmap`; in fold, a `fold.map`).

    `in_axes`: an int (the batch axis of every argument), None (an argument every row shares), or a tuple or
    list with one such entry per positional argument, each entry possibly a pytree matching its argument.
    `out_axes`: an int (or a pytree of ints matching the output) saying where the batch axis goes in the
    outputs. Arguments with in_axes None that are Python ints or other non-arrays reach `f` untraced.

    >>> import numpy as np, fold
    >>> fold.vmap(lambda x, w: fold.sum(x * w), in_axes=(0, None))(np.ones((3, 2)), np.array([1.0, 2.0]))
    array([3., 3., 3.])
    """
    if not callable(f):
        raise FoldTypeError(f"fold.vmap: expected a function, got {type(f).__name__}")
    jitted: dict = {}

    def batched(*args: Any) -> Any:
        per_arg = _broadcast_axes(in_axes, args)
        if current_scope() is None and not any(isinstance(x, Tracer) for x in tree_flatten(args)[0]):
            statics = tuple(i for i, (a, ax) in enumerate(zip(args, per_arg, strict=True))
                            if ax is None and is_static_value(a))
            runner = jitted.get(statics)
            if runner is None:
                import fold

                runner = jitted[statics] = fold.jit(batched, static_argnums=statics)
            return runner(*args)
        return _batched_call(f, args, per_arg, out_axes)

    batched.__name__ = f"vmap({getattr(f, '__name__', 'f')})"
    batched.__wrapped__ = f  # inspect.signature (jit's static_argnames) sees f's parameters
    return batched


def _batched_call(f: Callable, args: tuple, per_arg: list, out_axes: Any) -> Any:
    """Inside a trace: move each batch axis to the front, `fold.map` over the mapped leaves, place the outputs."""
    flats = [tree_flatten(a) for a in args]
    mapped_leaves, mapped_axes, mapped_paths, plans = [], [], [], []
    for i, ((leaves, tree), axis) in enumerate(zip(flats, per_arg, strict=True)):
        axes = _leaf_axes(axis, args[i], f"argument {i}")
        plans.append(axes)
        for leaf, ax, path in zip(leaves, axes, leaf_paths(tree, f"argument {i}"), strict=True):
            if ax is not None:
                mapped_leaves.append(leaf)
                mapped_axes.append(ax)
                mapped_paths.append(path)
    _, fronts = _size_and_front(mapped_leaves, mapped_axes, mapped_paths)

    def row(*rows: Any) -> Any:
        it = iter(rows)
        rebuilt = []
        for (leaves, tree), axes in zip(flats, plans, strict=True):
            rebuilt.append(tree.unflatten([next(it) if ax is not None else leaf for leaf, ax in zip(leaves, axes, strict=True)]))
        return f(*rebuilt)

    out = fold_map(row, *fronts)
    out_leaves, out_tree = tree_flatten(out)
    if is_static_int(out_axes):
        axes = [out_axes] * len(out_leaves)
    else:
        axes, axes_tree = tree_flatten(out_axes)
        if axes_tree != out_tree:
            raise StructureError(f"fold.vmap: out_axes has structure {axes_tree}, but the output has {out_tree}")
        if not all(is_static_int(a) for a in axes):
            raise FoldTypeError(f"fold.vmap: out_axes must be ints, got {out_axes!r}")
    return out_tree.unflatten([_out_axis(y, a) for y, a in zip(out_leaves, axes, strict=True)])
