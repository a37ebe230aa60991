"""What the CUDA drivers share: the launch shape, moving arrays to and from the GPU, checking arguments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from numba import config, cuda

SIMULATED = bool(config.ENABLE_CUDASIM)
# A block of 256 threads folding 8 consecutive elements each keeps a GPU's threads busy with few blocks;
# under the simulator every thread is a Python thread, and 32 x 2 keeps a test's kernels quick.
DEFAULT_THREADS = 32 if SIMULATED else 256
DEFAULT_ITEMS = 2 if SIMULATED else 8
MAX_THREADS = 1024


@dataclass(frozen=True)
class Launch:
    """A block of `threads` threads, each taking `items` consecutive elements: `span` elements a block."""

    threads: int
    items: int

    @property
    def span(self) -> int:
        return self.threads * self.items

    def blocks(self, n: int) -> int:
        return max(1, -(-n // self.span))


def launch(threads: int | None, items: int | None) -> Launch:
    threads = DEFAULT_THREADS if threads is None else threads
    items = DEFAULT_ITEMS if items is None else items
    if not isinstance(threads, (int, np.integer)) or threads < 1 or threads > MAX_THREADS or threads & (threads - 1):
        raise ValueError(f"threads must be a power of two from 1 to {MAX_THREADS}, got {threads!r}")
    if not isinstance(items, (int, np.integer)) or items < 1:
        raise ValueError(f"items must be an integer >= 1, got {items!r}")
    return Launch(int(threads), int(items))


def is_host(x: Any) -> bool:
    return isinstance(x, np.ndarray)


def check_count(count: Any, what: str) -> int:
    if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {count!r}")
    return int(count)


def check_vectors(arrays: Sequence[Any], count: int | None, what: str) -> tuple[list[Any], bool]:
    """(the arrays, whether they are on the host): `count` (if given) 1-D arrays of one length, all NumPy
    arrays or all device arrays."""
    if isinstance(arrays, np.ndarray) or (count is not None and len(arrays) != count):
        got = "one array" if isinstance(arrays, np.ndarray) else f"{len(arrays)} arrays"
        raise ValueError(f"{what}: expected a sequence of {count} arrays, got {got}")
    for j, a in enumerate(arrays):
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            raise TypeError(f"{what}[{j}] must be a NumPy or device array, got {type(a).__name__}")
        if len(a.shape) != 1:
            raise ValueError(f"{what}[{j}] must be 1-D, got shape {tuple(a.shape)}")
    lengths = [a.shape[0] for a in arrays]
    if any(n != lengths[0] for n in lengths):
        raise ValueError(f"{what}: all arrays must have one length, got {lengths}")
    places = {is_host(a) for a in arrays}
    if len(places) > 1:
        raise ValueError(f"{what}: mix NumPy and device arrays; pass all of one kind")
    return list(arrays), places != {False}


@dataclass(frozen=True)
class FoldArguments:
    """A fold's checked arguments: the leaves, whether they are on the host, the identity in their dtypes,
    the launch shape and the number of elements."""

    leaves: list
    on_host: bool
    ident: tuple
    shape: Launch
    n: int


def fold_arguments(k: Any, identity: Sequence[Any], leaves: Sequence[Any], threads: int | None,
                   items: int | None) -> FoldArguments:
    leaves, on_host = check_vectors(leaves, check_count(k, "k"), "leaves")
    ident = cast_identity(identity, [np.dtype(a.dtype) for a in leaves])
    return FoldArguments(leaves, on_host, ident, launch(threads, items), leaves[0].shape[0])


def to_device(arrays: Sequence[Any]) -> list[Any]:
    return [cuda.to_device(np.ascontiguousarray(a)) if is_host(a) else a for a in arrays]


def cast_identity(identity: Sequence[Any], dtypes: Sequence[np.dtype]) -> tuple:
    """The identity's scalars in the leaves' dtypes; each must be exactly representable there."""
    if len(identity) != len(dtypes):
        raise ValueError(f"identity: expected {len(dtypes)} scalars (one per leaf), got {len(identity)}")
    cast = []
    for j, (value, dtype) in enumerate(zip(identity, dtypes, strict=True)):
        c = np.dtype(dtype).type(value)
        if not (c == value or (c != c and value != value)):
            raise ValueError(f"identity[{j}] = {value!r} is not representable in the leaf's dtype {np.dtype(dtype)}")
        cast.append(c)
    return tuple(cast)


def empty(n: int, dtypes: Sequence[np.dtype]) -> list[Any]:
    return [cuda.device_array(n, np.dtype(d)) for d in dtypes]
