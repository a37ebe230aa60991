"""Jacobians and friends with JAX's contracts: fold.jacfwd, fold.jacrev, fold.hessian, fold.linearize.

A Jacobian is a batch of jvps (one per input basis vector) or of vjps (one per output basis vector), and a
batch is what `fold.map` is: `jacfwd` maps `jvp` over the rows of an identity matrix, `jacrev` maps the
pullback. Each traces once per input signature (through `fold.jit`) and runs on the default backend, or is
inlined where it is called inside a traced function, so the transformations nest: `hessian` is
`jacfwd(jacrev(f))`.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

import numpy as np

from fold.api import bind_static
from fold.errors import FoldTypeError
from fold.pytree import TreeDef, tree_flatten

from .api import _argnums, _check_argnums, _run, _trace, jvp, vjp


def _shape(leaf: Any) -> tuple[int, ...]:
    return tuple(leaf.shape) if hasattr(leaf, "shape") else np.shape(leaf)


def _dtype(leaf: Any) -> np.dtype:
    return np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.asarray(leaf).dtype


def _basis(leaves: list, where: str) -> tuple[int, list[np.ndarray]]:
    """The rows of the identity over the concatenated leaves, split per leaf: (size, per leaf (size, *shape))."""
    sizes = [int(np.prod(_shape(leaf), dtype=np.int64)) for leaf in leaves]
    total = int(np.sum(sizes, dtype=np.int64))
    if total == 0:
        raise FoldTypeError(f"{where}: the differentiated values have no elements; a Jacobian needs at least one")
    blocks, start = [], 0
    for leaf, size in zip(leaves, sizes, strict=True):
        block = np.zeros((total, size), _dtype(leaf))
        block[start:start + size] = np.eye(size, dtype=_dtype(leaf))
        blocks.append(block.reshape((total, *_shape(leaf))))
        start += size
    return total, blocks


def _blocks_fwd(per_out: list, in_leaves: list) -> list[list[Any]]:
    """jacfwd: per output leaf an array (n_in, *out_shape) -> per (output leaf, input leaf) the block
    (*out_shape, *in_shape)."""
    import fold

    blocks = []
    for out in per_out:
        out_shape = tuple(out.shape[1:])
        row, start = [], 0
        for leaf in in_leaves:
            in_shape = _shape(leaf)
            size = int(np.prod(in_shape, dtype=np.int64))
            part = fold.reshape(out[start:start + size], (*in_shape, *out_shape))
            k, m = len(in_shape), len(out_shape)
            row.append(fold.transpose(part, tuple(range(k, k + m)) + tuple(range(k))) if k and m else part)
            start += size
        blocks.append(row)
    return blocks


def _blocks_rev(per_in: list, out_avals: list) -> list[list[Any]]:
    """jacrev: per input leaf an array (n_out, *in_shape) -> per (output leaf, input leaf) the block."""
    import fold

    blocks, start = [], 0
    for aval in out_avals:
        size = int(np.prod(aval.shape, dtype=np.int64))
        blocks.append([fold.reshape(cot[start:start + size], (*aval.shape, *cot.shape[1:])) for cot in per_in])
        start += size
    return blocks


def _assemble(blocks: list[list[Any]], out_tree: TreeDef, arg_trees: list[TreeDef], single: bool) -> Any:
    """JAX's layout: the output's structure, each leaf holding the argument(s)' structure of blocks."""
    leaves = []
    for row in blocks:
        it = iter(row)
        per_arg = [tree.unflatten([next(it) for _ in range(tree.num_leaves)]) for tree in arg_trees]
        leaves.append(per_arg[0] if single else tuple(per_arg))
    return out_tree.unflatten(leaves)


_jitted: "weakref.WeakKeyDictionary[Callable, dict]" = weakref.WeakKeyDictionary()


def _jitted_for(target: Callable, key: Any, make: Callable[[], Callable]) -> Callable:
    """One `fold.jit` of the Jacobian body per (function, argument numbers, aux, mode): traced once per signature."""
    import fold

    try:
        per = _jitted.setdefault(target, {})
    except TypeError:
        per = {}
    body = per.get(key)
    if body is None:
        body = per[key] = fold.jit(make())
    return body


def _jacobian(f: Callable, argnums: int | Sequence[int], has_aux: bool, mode: str) -> Callable:
    single, nums = _argnums(argnums)
    where = f"fold.{mode}"

    def jacobian_f(*args: Any, **kwargs: Any) -> Any:
        _check_argnums(args, nums)
        chosen = sorted({i % len(args) for i in nums})
        target, dynamic, positions = bind_static(f, args, kwargs, chosen, where)
        order = [positions[chosen.index(i % len(args))] for i in nums]
        make = _forward_body if mode == "jacfwd" else _reverse_body
        body = _jitted_for(target, (tuple(order), has_aux, mode, single),
                           lambda: make(target, order, has_aux, single, where))
        return body(*dynamic)

    jacobian_f.__name__ = f"{mode}({getattr(f, '__name__', 'f')})"
    jacobian_f.__wrapped__ = f  # inspect.signature (jit's static_argnames) sees f's parameters
    return jacobian_f


def _split(args: tuple, order: list[int]) -> tuple[list, list[TreeDef]]:
    flats = [tree_flatten(args[i]) for i in order]
    return [leaf for leaves, _ in flats for leaf in leaves], [tree for _, tree in flats]


def _forward_body(target: Callable, order: list[int], has_aux: bool, single: bool, where: str) -> Callable:
    import fold

    def forward(*args: Any) -> Any:
        in_leaves, arg_trees = _split(args, order)
        _, basis = _basis(in_leaves, where)

        def column(*rows: Any) -> Any:
            it = iter(rows)
            chosen = {i: tree.unflatten([next(it) for _ in range(tree.num_leaves)]) for i, tree in zip(order, arg_trees, strict=True)}
            tangents = tuple(chosen[i] if i in chosen else _zeros_like(a) for i, a in enumerate(args))
            return tree_flatten(jvp(target, args, tangents, has_aux=has_aux)[1])[0]

        out = target(*args)  # its structure (and aux); the statements no output needs are dropped
        out_tree = tree_flatten(out[0] if has_aux else out)[1]
        per_out = fold.map(column, *basis)
        jac = _assemble(_blocks_fwd(list(per_out), in_leaves), out_tree, arg_trees, single)
        return (jac, out[1]) if has_aux else jac

    return forward


def _reverse_body(target: Callable, order: list[int], has_aux: bool, single: bool, where: str) -> Callable:
    import fold

    def reverse(*args: Any) -> Any:
        in_leaves, arg_trees = _split(args, order)
        result = vjp(target, *args, has_aux=has_aux)
        out_leaves, out_tree = tree_flatten(result[0])
        for leaf in out_leaves:
            if not np.issubdtype(_dtype(leaf), np.floating):
                raise FoldTypeError(f"{where}: the function has an output of dtype {_dtype(leaf).name}; jacrev needs "
                                    f"float outputs (use jacfwd)")
        _, basis = _basis(out_leaves, where)
        pullback = result[1]

        def row(*cts: Any) -> Any:
            cotangents = pullback(out_tree.unflatten(list(cts)))
            return _split(cotangents, order)[0]

        per_in = fold.map(row, *basis)
        jac = _assemble(_blocks_rev(list(per_in), [fold.ShapedArray(_shape(x), _dtype(x)) for x in out_leaves]),
                        out_tree, arg_trees, single)
        return (jac, result[2]) if has_aux else jac

    return reverse


def _zeros_like(value: Any) -> Any:
    leaves, tree = tree_flatten(value)
    return tree.unflatten([np.zeros(_shape(leaf), _dtype(leaf)) for leaf in leaves])


def jacfwd(f: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The Jacobian of `f` with respect to argument(s) `argnums` by forward mode (JAX's `jacfwd`).

    One jvp per input element, batched by `fold.map` over the rows of an identity matrix: best when the
    inputs are fewer than the outputs. The result has the output's structure, each leaf holding blocks of
    shape `out_shape + in_shape` in the argument's structure (a tuple of them when `argnums` is a tuple).
    With `has_aux=True`, `f` returns `(output, aux)` and the function returns `(jacobian, aux)`.
    Arguments not differentiated that are Python ints or other non-arrays reach `f` untraced.

    >>> import numpy as np, fold
    >>> fold.jacfwd(lambda x: x * x)(np.array([1.0, 2.0]))
    array([[2., 0.],
           [0., 4.]])
    """
    return _jacobian(f, argnums, has_aux, "jacfwd")


def jacrev(f: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The Jacobian of `f` with respect to argument(s) `argnums` by reverse mode (JAX's `jacrev`).

    One pullback per output element, batched by `fold.map` over the rows of an identity matrix: best when
    the outputs are fewer than the inputs. Same layout and arguments as `jacfwd`.

    >>> import numpy as np, fold
    >>> fold.jacrev(lambda x: fold.sum(x * x))(np.array([1.0, 2.0]))
    array([2., 4.])
    """
    return _jacobian(f, argnums, has_aux, "jacrev")


def hessian(f: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The Hessian of float-scalar-valued `f`: `jacfwd(jacrev(f))`, as JAX's `hessian` (forward over reverse).

    >>> import numpy as np, fold
    >>> fold.hessian(lambda x: fold.sum(x * x * x))(np.array([1.0, 2.0]))
    array([[ 6.,  0.],
           [ 0., 12.]])
    """
    if has_aux:
        inner = jacrev(f, argnums, has_aux=True)
        return jacfwd(inner, argnums, has_aux=True)
    return jacfwd(jacrev(f, argnums), argnums)


def linearize(f: Callable[..., Any], *primals: Any) -> tuple[Any, Callable]:
    """`(f(*primals), f_jvp)` with `f_jvp(*tangents)` the tangent of the output (JAX's `linearize`).

    fold does not store a linearized program: each call of `f_jvp` runs the forward-mode program (primal
    and tangent together, cached once traced), which costs about one evaluation of `f` more than JAX's.

    >>> import numpy as np, fold
    >>> y, f_jvp = fold.linearize(lambda x: fold.sum(x * x), np.array([1.0, 2.0]))
    >>> float(y), float(f_jvp(np.array([1.0, 0.0])))
    (5.0, 2.0)
    """
    args, program, _ = _trace(f, primals, "fold.linearize")
    out = program.out_tree.unflatten(_run(program, args))

    def f_jvp(*tangents: Any) -> Any:
        return jvp(f, primals, tangents)[1]

    f_jvp.__name__ = f"linearized({getattr(f, '__name__', 'f')})"
    return out, f_jvp
