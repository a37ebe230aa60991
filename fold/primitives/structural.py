"""Structural primitives: they move, select or combine array elements without elementwise math."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dtypes import ShapedArray
from ..errors import FoldTypeError, ShapeError
from ..ir import Primitive
from ..tracing import shape_rules


@dataclass(frozen=True)
class Convert(Primitive):
    dtype: np.dtype
    name = "convert"


@dataclass(frozen=True)
class Iota(Primitive):
    n: int
    dtype: np.dtype = np.dtype("int64")
    name = "iota"


@dataclass(frozen=True)
class BroadcastTo(Primitive):
    """NumPy broadcasting made explicit: dimensions aligned on the right, size-1 dimensions stretched."""

    shape: tuple[int, ...]
    name = "broadcast"


@dataclass(frozen=True)
class Reshape(Primitive):
    shape: tuple[int, ...]
    name = "reshape"


@dataclass(frozen=True)
class Transpose(Primitive):
    perm: tuple[int, ...]
    name = "transpose"


@dataclass(frozen=True)
class StaticIndex(Primitive):
    """Basic indexing with indices known at trace time, one entry per leading dimension.

    An entry is an int (that dimension is removed) or a normalised slice `(start, stop, step)`.
    """

    index: tuple[int | tuple[int, int, int], ...]
    name = "index"


@dataclass(frozen=True)
class Gather(Primitive):
    """`x[idx]` along the leading axis with an integer index array of any shape. As in NumPy, an index in
    [-n, 0) counts from the end of the axis (of size n); one outside [-n, n) is an error."""

    name = "gather"


@dataclass(frozen=True)
class Concatenate(Primitive):
    axis: int
    name = "concat"


@dataclass(frozen=True)
class MatMul(Primitive):
    """A (m, k) @ (k, n) matrix product; the tracer reshapes vector operands to matrices."""

    name = "matmul"


@dataclass(frozen=True)
class SumAxes(Primitive):
    axes: tuple[int, ...]
    name = "sum"


@shape_rules.register(Convert)
def _convert_shape(prim: Convert, x: ShapedArray) -> list[ShapedArray]:
    return [x.update(dtype=np.dtype(prim.dtype))]


@shape_rules.register(Iota)
def _iota_shape(prim: Iota) -> list[ShapedArray]:
    return [ShapedArray((prim.n,), np.dtype(prim.dtype))]


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy's broadcast of several shapes, or a ShapeError naming them."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(ndim):
        sizes = {s[axis - ndim + len(s)] for s in shapes if axis - ndim + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise ShapeError(f"shapes {', '.join(map(str, shapes))} do not broadcast together")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


@shape_rules.register(BroadcastTo)
def _broadcast_shape(prim: BroadcastTo, x: ShapedArray) -> list[ShapedArray]:
    if broadcast_shapes(x.shape, prim.shape) != tuple(prim.shape):
        raise ShapeError(f"broadcast: shape {x.shape} cannot be broadcast to {prim.shape}")
    return [x.update(shape=prim.shape)]


@shape_rules.register(Reshape)
def _reshape_shape(prim: Reshape, x: ShapedArray) -> list[ShapedArray]:
    if int(np.prod(prim.shape, dtype=np.int64)) != x.size:
        raise ShapeError(f"reshape: cannot reshape {x.shape} ({x.size} elements) to {prim.shape}")
    return [x.update(shape=prim.shape)]


@shape_rules.register(Transpose)
def _transpose_shape(prim: Transpose, x: ShapedArray) -> list[ShapedArray]:
    if sorted(prim.perm) != list(range(x.ndim)):
        raise ShapeError(f"transpose: {prim.perm} is not a permutation of the {x.ndim} axes of {x.shape}")
    return [x.update(shape=tuple(x.shape[p] for p in prim.perm))]


def slice_length(start: int, stop: int, step: int) -> int:
    return len(range(start, stop, step))


@shape_rules.register(StaticIndex)
def _static_index_shape(prim: StaticIndex, x: ShapedArray) -> list[ShapedArray]:
    if len(prim.index) > x.ndim:
        raise ShapeError(f"index: {len(prim.index)} indices for an array of shape {x.shape}")
    shape = []
    for entry, size in zip(prim.index, x.shape, strict=False):
        if isinstance(entry, tuple):
            shape.append(slice_length(*entry))
        elif not 0 <= entry < size:
            raise ShapeError(f"index: {entry} out of range for an axis of size {size}")
    return [x.update(shape=tuple(shape) + x.shape[len(prim.index):])]


@shape_rules.register(Gather)
def _gather_shape(prim: Gather, x: ShapedArray, idx: ShapedArray) -> list[ShapedArray]:
    if x.ndim == 0:
        raise ShapeError("gather: cannot index a 0-d array")
    if idx.dtype.kind not in "iu":
        raise FoldTypeError(f"gather: index dtype must be an integer, got {idx.dtype.name}")
    return [x.update(shape=idx.shape + x.shape[1:])]


@shape_rules.register(Concatenate)
def _concat_shape(prim: Concatenate, *xs: ShapedArray) -> list[ShapedArray]:
    first = xs[0]
    for x in xs:
        if x.ndim != first.ndim or x.shape[: prim.axis] + x.shape[prim.axis + 1:] != first.shape[: prim.axis] + first.shape[prim.axis + 1:]:
            raise ShapeError(f"concatenate along axis {prim.axis}: shapes {[a.shape for a in xs]} differ off that axis")
        if x.dtype != first.dtype:
            raise ShapeError(f"concatenate: dtypes {[a.dtype.name for a in xs]} differ")
    size = sum(x.shape[prim.axis] for x in xs)
    shape = first.shape[: prim.axis] + (size,) + first.shape[prim.axis + 1:]
    return [first.update(shape=shape)]


@shape_rules.register(MatMul)
def _matmul_shape(prim: MatMul, a: ShapedArray, b: ShapedArray) -> list[ShapedArray]:
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ShapeError(f"matmul: shapes {a.shape} and {b.shape} do not fit (m, k) @ (k, n)")
    if a.dtype != b.dtype:
        raise ShapeError(f"matmul: dtypes {a.dtype.name} and {b.dtype.name} differ")
    return [ShapedArray((a.shape[0], b.shape[1]), a.dtype)]


@shape_rules.register(SumAxes)
def _sum_shape(prim: SumAxes, x: ShapedArray) -> list[ShapedArray]:
    if any(not 0 <= a < x.ndim for a in prim.axes):
        raise ShapeError(f"sum: axes {prim.axes} out of range for shape {x.shape}")
    return [x.update(shape=tuple(s for i, s in enumerate(x.shape) if i not in prim.axes))]
