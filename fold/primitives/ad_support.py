"""Primitives that gradient programs need beyond the user's language.

- `IndexTranspose`: the transpose of a static index: a zero array with the slice filled in.
- `LoopSaving`: a loop that also returns every `stride`-th state (the checkpoints of reverse mode).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import ShapedArray
from ..errors import ShapeError
from ..ir import Primitive, Program
from ..tracing import shape_rules
from .combinators import _check_consts
from .structural import StaticIndex


@dataclass(frozen=True)
class IndexTranspose(Primitive):
    """zeros(shape) with `out[index] = x`, for a static `index` as in StaticIndex."""

    index: tuple
    shape: tuple[int, ...]
    name = "index_transpose"


@shape_rules.register(IndexTranspose)
def _index_transpose_shape(prim: IndexTranspose, x: ShapedArray) -> list[ShapedArray]:
    (expected,) = shape_rules.lookup(StaticIndex(prim.index))(StaticIndex(prim.index), x.update(shape=prim.shape))
    if expected.shape != x.shape:
        raise ShapeError(f"index_transpose: value of shape {x.shape} does not fill index {prim.index} of {prim.shape}")
    return [x.update(shape=prim.shape)]


@dataclass(frozen=True)
class LoopSaving(Primitive):
    """A Loop (same body and arguments) that also returns the states before iterations 0, stride, 2*stride, ...

    Outputs: the final state leaves, then one stacked array per state leaf with ceil(n / stride) rows.
    """

    body: Program
    num_consts: int
    n: int
    stride: int
    name = "loop_saving"
    body_fields = ("body",)

    @property
    def num_saved(self) -> int:
        return -(-self.n // self.stride)


@shape_rules.register(LoopSaving)
def _loop_saving_shape(prim: LoopSaving, *avals: ShapedArray) -> list[ShapedArray]:
    consts, init = avals[: prim.num_consts], avals[prim.num_consts:]
    _check_consts("loop_saving", prim.body, prim.num_consts, consts)
    if tuple(init) != prim.body.out_avals:
        raise ShapeError("loop_saving: the state does not match the body's state")
    if prim.stride < 1:
        raise ShapeError(f"loop_saving: stride must be positive, got {prim.stride}")
    return list(init) + [a.update(shape=(prim.num_saved,) + a.shape) for a in init]


@dataclass(frozen=True)
class StopGradient(Primitive):
    """The identity, with no derivative: its tangents and cotangents are zero."""

    name = "stop_gradient"


@shape_rules.register(StopGradient)
def _stop_gradient_shape(prim: StopGradient, x: ShapedArray) -> list[ShapedArray]:
    return [x]
