"""Structural primitives on batched arrays: the logical axes start after the `depth` batch dimensions."""

from __future__ import annotations

import math

import numpy as np

from fold.errors import FoldIndexError
from fold.primitives import (
    BroadcastTo,
    Concatenate,
    Convert,
    Gather,
    Iota,
    MatMul,
    Reshape,
    StaticIndex,
    SumAxes,
    Transpose,
)

from ..interpreter import numpy_impls
from .accumulation import reduce_dtype
from .batching import batch_shape, concat_broadcast


@numpy_impls.register(Convert)
def _convert(prim: Convert, args: list, depth: int) -> list:
    return [args[0].astype(prim.dtype)]


@numpy_impls.register(Iota)
def _iota(prim: Iota, args: list, depth: int) -> list:
    return [np.arange(prim.n, dtype=prim.dtype).reshape((1,) * depth + (prim.n,))]


@numpy_impls.register(BroadcastTo)
def _broadcast(prim: BroadcastTo, args: list, depth: int) -> list:
    (x,) = args
    batch, logical = x.shape[:depth], x.shape[depth:]
    padded = x.reshape(batch + (1,) * (len(prim.shape) - len(logical)) + logical)
    return [np.broadcast_to(padded, batch + tuple(prim.shape))]


@numpy_impls.register(Reshape)
def _reshape(prim: Reshape, args: list, depth: int) -> list:
    (x,) = args
    return [x.reshape(x.shape[:depth] + tuple(prim.shape))]


@numpy_impls.register(Transpose)
def _transpose(prim: Transpose, args: list, depth: int) -> list:
    (x,) = args
    return [np.transpose(x, tuple(range(depth)) + tuple(depth + p for p in prim.perm))]


def _slice(start: int, stop: int, step: int) -> slice:
    # a normalised slice (from slice.indices) stops at -1 when a negative step runs past index 0; to NumPy,
    # stop=-1 would mean "the last element", so that end is spelled None
    return slice(start, None if stop < 0 else stop, step)


def index_key(index: tuple) -> tuple:
    """A StaticIndex entry list as a NumPy key."""
    return tuple(_slice(*e) if isinstance(e, tuple) else e for e in index)


@numpy_impls.register(StaticIndex)
def _static_index(prim: StaticIndex, args: list, depth: int) -> list:
    (x,) = args
    return [x[(slice(None),) * depth + index_key(prim.index)]]


def check_indices(idx: np.ndarray, size: int, where: str) -> None:
    """Indices in [-size, size) are fine (NumPy's indexing wraps the negative ones); others are an error."""
    if idx.size and (idx.min() < -size or idx.max() >= size):
        bad = idx[(idx < -size) | (idx >= size)].ravel()[0]
        raise FoldIndexError(f"{where}: index {bad} is out of range for an axis of size {size}")


@numpy_impls.register(Gather)
def _gather(prim: Gather, args: list, depth: int) -> list:
    x, idx = args
    check_indices(idx, x.shape[depth], "gather")
    if all(s == 1 for s in x.shape[:depth]):
        # one position read by a plain index is a view (a row of a loop's saved states), not a copy
        return [x.reshape(x.shape[depth:])[int(idx) if np.ndim(idx) == 0 else idx]]
    batch = batch_shape([x, idx], depth)
    k = idx.ndim - depth
    grids = tuple(
        (np.arange(size) if x.shape[d] != 1 else np.zeros(size, dtype=np.int64)).reshape(
            (1,) * d + (size,) + (1,) * (depth - d - 1 + k)
        )
        for d, size in enumerate(batch)
    )
    return [x[grids + (np.broadcast_to(idx, batch + idx.shape[depth:]),)]]


@numpy_impls.register(Concatenate)
def _concatenate(prim: Concatenate, args: list, depth: int) -> list:
    return [concat_broadcast(args, depth + prim.axis)]


@numpy_impls.register(MatMul)
def _matmul(prim: MatMul, args: list, depth: int) -> list:
    a, b = args
    if depth and all(s == 1 for s in b.shape[:depth]) and b.ndim - depth == 2:
        # the common case in a map body: rows @ a shared matrix, one BLAS call for all rows
        k, n = b.shape[-2:]
        out = a.reshape(_rows(a.shape[:-1]), k) @ b.reshape(k, n)
        return [out.reshape(a.shape[:-1] + (n,))]
    if depth and all(s == 1 for s in a.shape[:depth]) and a.ndim - depth == 2:
        # a shared matrix @ each row's vector or matrix (centroids @ point): one BLAS call, not one per row
        shared = a.reshape(a.shape[depth:])
        m, k = shared.shape
        if b.ndim - depth == 1:
            out = b.reshape(_rows(b.shape[:-1]), k) @ shared.T
            return [out.reshape(b.shape[:depth] + (m,))]
        p = b.shape[-1]  # (A @ B_r)^T = B_r^T @ A^T: all rows' B_r^T stacked, times A^T, in one product
        out = np.swapaxes(b, -1, -2).reshape(_rows(b.shape[:-2]) * p, k) @ shared.T
        return [np.swapaxes(out.reshape(b.shape[:depth] + (p, m)), -1, -2)]
    return [np.matmul(a, b)]


def _rows(shape: tuple) -> int:
    """The rows a stack of this leading shape has (reshape(-1, k) cannot tell them when k is 0)."""
    return math.prod(shape)


@numpy_impls.register(SumAxes)
def _sum(prim: SumAxes, args: list, depth: int) -> list:
    (x,) = args
    axes = tuple(depth + a for a in prim.axes)
    return [np.sum(x, axis=axes, dtype=reduce_dtype(np.add, x, axes)).astype(x.dtype, copy=False)]  # accumulation.py
