"""Helpers for arrays with leading batch dimensions (each full size or 1)."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def batch_shape(arrays: Sequence[np.ndarray], depth: int) -> tuple[int, ...]:
    return np.broadcast_shapes(*[a.shape[:depth] for a in arrays]) if depth else ()


def fit_axis(x: np.ndarray, axis: int, size: int) -> np.ndarray:
    """Stretch a size-1 `axis` of `x` to `size` (a view)."""
    if x.shape[axis] == size:
        return x
    return np.broadcast_to(x, x.shape[:axis] + (size,) + x.shape[axis + 1:])


def concat_broadcast(arrays: Sequence[np.ndarray], axis: int) -> np.ndarray:
    """Concatenate along `axis`, broadcasting every other dimension first."""
    ndim = arrays[0].ndim
    others = np.broadcast_shapes(*[a.shape[:axis] + (1,) + a.shape[axis + 1:] for a in arrays])
    parts = [np.broadcast_to(a, others[:axis] + (a.shape[axis],) + others[axis + 1:]) for a in arrays]
    assert all(p.ndim == ndim for p in parts)
    return np.concatenate(parts, axis=axis)


def take_axis(x: np.ndarray, axis: int, sl: slice | int) -> np.ndarray:
    return x[(slice(None),) * axis + (sl,)]


def expand_for_body(x: np.ndarray, depth: int) -> np.ndarray:
    """A value of the enclosing scope as seen one map deeper: a size-1 batch dimension at `depth`."""
    return np.expand_dims(x, depth)
