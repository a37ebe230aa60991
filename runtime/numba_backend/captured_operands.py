"""Folds whose operator captures values, run as folds whose operator captures nothing.

The fold kernels call an operator of two elements and nothing else, so an operator that captures a value
(a temperature, a decay, a parameter being differentiated) could not run in them. Each captured value c is
made a field of every element instead: the elements become (x_i, c), read from a broadcast view of c that
is never copied, the identity becomes (e, c), and the operator (a, c) . (b, c') = (a .c b, c) keeps the left
operand's copy, which equals every other. It is a monoid again whenever .c is, with the same commutativity,
so the kernels' parallel and vectorised forms stay correct. The results carrying c are dropped.

Only a few captured scalars are carried so (each is one more array a kernel reads per element), and only
values the same for every fold of a statement: a fold inside a map whose operator captures a per-row value
needs a different identity per row, which the kernels do not take, and stays with the numpy backend.
"""

from __future__ import annotations

import dataclasses
import weakref
import numpy as np

from fold.ir import Program, Var
from fold.primitives import ReduceByIndex
from fold.pytree import tree_flatten

# Element components the captured values may add.
MAX_CAPTURED_COMPONENTS = 8


def capture_problem(prim) -> str | None:
    """Why the fold `prim`'s captured values cannot be carried as element fields, or None if they can."""
    consts = prim.body.inputs[: prim.num_consts]
    scalars = sum(v.aval.size for v in consts)
    if scalars > MAX_CAPTURED_COMPONENTS:
        return f"its operator captures {scalars} scalars, more than the {MAX_CAPTURED_COMPONENTS} a kernel carries"
    odd = [str(v.aval.dtype) for v in consts if v.aval.dtype.kind not in "biuf"]
    return f"its operator captures values of dtype {', '.join(odd)}" if odd else None


def same_for_every_fold(prim, args: list) -> bool:
    """Whether the captured values are the same for every fold of the statement: inside a map, their batch
    axes (the leading ones beyond each value's own shape) are all of size 1."""
    consts, inputs = args[: prim.num_consts], prim.body.inputs[: prim.num_consts]
    return all(all(b == 1 for b in np.shape(c)[: np.ndim(c) - len(v.aval.shape)]) for c, v in zip(consts, inputs, strict=True))


_CARRYING: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def carrying(prim):
    """The fold with the captured values as element fields, one per statement (the kernels' compiled
    operators are memoised on it)."""
    found = _CARRYING.get(prim)
    if found is None:
        found = _CARRYING[prim] = dataclasses.replace(prim, body=_carrying_body(prim.body, prim.num_consts, prim.num_leaves),
                                                      num_consts=0)
    return found


def _carrying_body(body: Program, nc: int, k: int) -> Program:
    """The operator of (a, c), (b, c') pairs: `body` applied with the left operand's c as its captured values,
    and that c returned beside its results."""
    consts, a, b = body.inputs[:nc], body.inputs[nc: nc + k], body.inputs[nc + k:]
    unused = tuple(Var(c.aval) for c in consts)
    inputs = tuple(a) + tuple(consts) + tuple(b) + unused
    _, in_tree = tree_flatten(tuple(range(len(inputs))))
    _, out_tree = tree_flatten(tuple(range(k + nc)))
    return Program(inputs, body.stmts, tuple(body.outputs) + tuple(consts), in_tree, out_tree, dict(body.meta))


def carrying_args(prim, args: list, depth: int) -> list:
    """The rewritten fold's arguments: identity and captured values, then what lies between (reduce_by_index's
    indices), then the elements and a broadcast view of each captured value along the elements' axis."""
    nc, k = prim.num_consts, prim.num_leaves
    consts, identity, rest = args[:nc], args[nc: nc + k], args[nc + k:]
    between = 1 if isinstance(prim, ReduceByIndex) else 0
    xs = rest[between:]
    n = xs[0].shape[depth]  # (not np.shape: the cuda backend's device arrays refuse NumPy)
    per_element = [_along_elements(_batched(np.asarray(c), v.aval.shape, depth), depth, n)
                   for c, v in zip(consts, prim.body.inputs[:nc], strict=True)]
    return list(identity) + list(consts) + list(rest[:between]) + list(xs) + per_element


def _batched(c: np.ndarray, shape: tuple, depth: int) -> np.ndarray:
    """c with `depth` batch axes (of size 1 where it has none: a value the same for every row)."""
    missing = depth - (c.ndim - len(shape))
    return c.reshape((1,) * missing + c.shape) if missing else c


def _along_elements(c: np.ndarray, depth: int, n: int) -> np.ndarray:
    """c (its batch axes, then its own) repeated n times along a new elements axis after the batch axes."""
    expanded = np.expand_dims(c, depth)
    return np.broadcast_to(expanded, expanded.shape[:depth] + (n,) + expanded.shape[depth + 1:])
