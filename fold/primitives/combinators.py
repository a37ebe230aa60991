"""The parallel combinators as primitives. Each holds its lambda as a closed Program (`body`).

Argument layout, shared by every combinator: first the body's consts (outer values the lambda captured,
`num_consts` of them), then the combinator's own operands as flat pytree leaves:

- Map:           consts, xs...                  body(consts, x_elems...) -> y_elems...
- Reduce/Scan:   consts, identity..., xs...     body(consts, a..., b...) -> c...
- ReduceByIndex: consts, identity..., indices, values...
- Loop:          consts, init...                body(consts, i, state...) -> state...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..dtypes import ShapedArray
from ..errors import ShapeError
from ..ir import Primitive, Program
from ..tracing import shape_rules


def _check_consts(prim_name: str, body: Program, num_consts: int, const_avals: tuple) -> None:
    expected = body.in_avals[:num_consts]
    if tuple(const_avals) != tuple(expected):
        raise ShapeError(f"{prim_name}: captured values {list(map(str, const_avals))} do not match the body's inputs {list(map(str, expected))}")


def _elements(prim_name: str, avals: tuple[ShapedArray, ...]) -> tuple[int, list[ShapedArray]]:
    """The common leading size of `avals` and their element avals."""
    sizes = {a.shape[0] if a.ndim else None for a in avals}
    if None in sizes or len(sizes) != 1:
        raise ShapeError(f"{prim_name}: operands must share a leading axis, got shapes {[a.shape for a in avals]}")
    return sizes.pop(), [a.update(shape=a.shape[1:]) for a in avals]


@dataclass(frozen=True)
class Map(Primitive):
    body: Program
    num_consts: int
    name = "map"
    body_fields = ("body",)


@dataclass(frozen=True)
class Reduce(Primitive):
    body: Program
    num_consts: int
    monoid: Any = None  # the fold.Monoid the operator came from, if any (its d, commutativity, name)
    name = "reduce"
    body_fields = ("body",)

    @property
    def num_leaves(self) -> int:
        return len(self.body.outputs)


@dataclass(frozen=True)
class Scan(Primitive):
    body: Program
    num_consts: int
    monoid: Any = None
    exclusive: bool = False
    reverse: bool = False
    name = "scan"
    body_fields = ("body",)

    @property
    def num_leaves(self) -> int:
        return len(self.body.outputs)


@dataclass(frozen=True)
class ReduceByIndex(Primitive):
    body: Program
    num_consts: int
    n: int
    monoid: Any = None
    name = "reduce_by_index"
    body_fields = ("body",)

    @property
    def num_leaves(self) -> int:
        return len(self.body.outputs)


@dataclass(frozen=True)
class Loop(Primitive):
    body: Program
    num_consts: int
    n: int
    checkpoint: int | None = None
    name = "loop"
    body_fields = ("body",)


@shape_rules.register(Map)
def _map_shape(prim: Map, *avals: ShapedArray) -> list[ShapedArray]:
    consts, xs = avals[: prim.num_consts], avals[prim.num_consts:]
    _check_consts("map", prim.body, prim.num_consts, consts)
    n, elems = _elements("map", xs) if xs else (None, [])
    if n is None:
        raise ShapeError("map: needs at least one mapped array")
    if tuple(elems) != prim.body.in_avals[prim.num_consts:]:
        raise ShapeError(f"map: elements {list(map(str, elems))} do not match the body's inputs")
    return [a.update(shape=(n,) + a.shape) for a in prim.body.out_avals]


def _fold_operands(prim_name: str, prim: Any, avals: tuple) -> tuple[int, list[ShapedArray]]:
    k = prim.num_leaves
    consts = avals[: prim.num_consts]
    identity = avals[prim.num_consts: prim.num_consts + k]
    xs = avals[prim.num_consts + k:]
    _check_consts(prim_name, prim.body, prim.num_consts, consts)
    n, elems = _elements(prim_name, xs)
    if list(identity) != elems:
        raise ShapeError(f"{prim_name}: identity {list(map(str, identity))} does not match the elements {list(map(str, elems))}")
    return n, elems


@shape_rules.register(Reduce)
def _reduce_shape(prim: Reduce, *avals: ShapedArray) -> list[ShapedArray]:
    _, elems = _fold_operands("reduce", prim, avals)
    return elems


@shape_rules.register(Scan)
def _scan_shape(prim: Scan, *avals: ShapedArray) -> list[ShapedArray]:
    n, elems = _fold_operands("scan", prim, avals)
    return [e.update(shape=(n,) + e.shape) for e in elems]


@shape_rules.register(ReduceByIndex)
def _rbi_shape(prim: ReduceByIndex, *avals: ShapedArray) -> list[ShapedArray]:
    k = prim.num_leaves
    consts = avals[: prim.num_consts]
    identity = avals[prim.num_consts: prim.num_consts + k]
    indices = avals[prim.num_consts + k]
    values = avals[prim.num_consts + k + 1:]
    _check_consts("reduce_by_index", prim.body, prim.num_consts, consts)
    if indices.ndim != 1 or indices.dtype.kind not in "iu":
        raise ShapeError(f"reduce_by_index: indices must be a 1-d integer array, got {indices}")
    n, elems = _elements("reduce_by_index", (indices,) + tuple(values))
    if list(identity) != elems[1:]:
        raise ShapeError("reduce_by_index: identity does not match the value elements")
    return [e.update(shape=(prim.n,) + e.shape) for e in elems[1:]]


@shape_rules.register(Loop)
def _loop_shape(prim: Loop, *avals: ShapedArray) -> list[ShapedArray]:
    consts, init = avals[: prim.num_consts], avals[prim.num_consts:]
    _check_consts("loop", prim.body, prim.num_consts, consts)
    if tuple(init) != prim.body.in_avals[prim.num_consts + 1:] or tuple(init) != prim.body.out_avals:
        raise ShapeError(f"loop: state {list(map(str, init))} does not match the body's state {list(map(str, prim.body.out_avals))}")
    return list(init)
