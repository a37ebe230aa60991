"""What the CUDA drivers share: the launch shape, moving arrays to and from the GPU, checking arguments."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from numba import config, cuda

SIMULATED = bool(config.ENABLE_CUDASIM)
# A block of 256 threads folding 8 consecutive elements each keeps a GPU's threads busy with few blocks;
# under the simulator every thread is a Python thread, and 32 x 2 keeps a test's kernels quick.
DEFAULT_THREADS = 32 if SIMULATED else 256
DEFAULT_ITEMS = 2 if SIMULATED else 8
MAX_THREADS = 1024
# Static shared memory a block may hold: a block's partials take threads x (the leaves' bytes per element).
SHARED_BYTES = 48 * 1024


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


def launch(threads: int | None, items: int | None, dtypes: Sequence[np.dtype] = (), min_span: int = 1) -> Launch:
    """The launch shape asked for (or the default); a default block of wide elements (a 5 x 5 float64
    matrix: 200 bytes) gets fewer threads, so that its partials fit in SHARED_BYTES. A fold's block totals
    must be fewer than its elements, so a reduce or scan asks for blocks of `min_span` = 2 elements or more."""
    element = sum(np.dtype(d).itemsize for d in dtypes)
    if threads is None:
        threads = DEFAULT_THREADS
        while threads > 1 and threads * element > SHARED_BYTES:
            threads //= 2
    items = DEFAULT_ITEMS if items is None else items
    if not is_int(threads) or threads < 1 or threads > MAX_THREADS or threads & (threads - 1):
        raise ValueError(f"threads must be a power of two from 1 to {MAX_THREADS}, got {threads!r}")
    if not is_int(items) or items < 1:
        raise ValueError(f"items must be an integer >= 1, got {items!r}")
    if threads * items < min_span:
        raise ValueError(f"a block must span at least {min_span} elements, so that each level of block totals is "
                         f"shorter than the last; got threads={threads}, items={items}")
    if threads * element > SHARED_BYTES:
        raise ValueError(f"threads={threads} blocks of {element}-byte elements need {threads * element} bytes of "
                         f"shared memory, more than {SHARED_BYTES}: pass fewer threads")
    return Launch(int(threads), int(items))


# Numba warns of a grid under 128 blocks (the text starts with a terminal's bold code, hence the leading .*)
_LOW_OCCUPANCY = r".*Grid size \d+ will likely result in GPU under-utilization"


def start(kernel: Any, blocks: int, threads: int, *args: Any) -> None:
    """`kernel[blocks, threads](*args)`. A small input's grid is small by design (a merge is one block), so
    Numba's low-occupancy warning is silenced for fold's own launches; a user's kernels still get it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_LOW_OCCUPANCY)
        kernel[blocks, threads](*args)


def is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def is_host(x: Any) -> bool:
    return isinstance(x, np.ndarray)


def check_count(count: Any, what: str) -> int:
    if not is_int(count) or count < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {count!r}")
    return int(count)


def check_vectors(arrays: Sequence[Any], count: int | None, what: str, ndim: int = 1) -> tuple[list[Any], bool]:
    """(the arrays, whether they are on the host): `count` (if given) arrays of `ndim` dimensions and one
    shape, all NumPy arrays or all device arrays."""
    if isinstance(arrays, np.ndarray) or (count is not None and len(arrays) != count):
        got = "one array" if isinstance(arrays, np.ndarray) else f"{len(arrays)} arrays"
        raise ValueError(f"{what}: expected a sequence of {'' if count is None else f'{count} '}arrays, got {got}")
    for j, a in enumerate(arrays):
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            raise TypeError(f"{what}[{j}] must be a NumPy or device array, got {type(a).__name__}")
        if len(a.shape) != ndim:
            raise ValueError(f"{what}[{j}] must be {ndim}-D, got shape {tuple(a.shape)}")
    shapes = [tuple(a.shape) for a in arrays]
    if any(shape != shapes[0] for shape in shapes):
        got = [shape[0] for shape in shapes] if ndim == 1 else shapes
        raise ValueError(f"{what}: all arrays must have one {'length' if ndim == 1 else 'shape'}, got {got}")
    places = {is_host(a) for a in arrays}
    if len(places) > 1:
        raise ValueError(f"{what}: mix NumPy and device arrays; pass all of one kind")
    return list(arrays), places != {False}


@dataclass(frozen=True)
class FoldArguments:
    """A fold's checked arguments: the leaves, whether they are on the host, their dtypes, the identity in
    those dtypes, the launch shape and the leaves' leading length."""

    leaves: list
    on_host: bool
    dtypes: tuple
    ident: tuple
    launch: Launch
    n: int


def fold_arguments(combine: Any, k: Any, identity: Sequence[Any], leaves: Sequence[Any], threads: int | None,
                   items: int | None, *, ndim: int = 1, min_span: int = 2) -> FoldArguments:
    """A fold's arguments checked (a combine of 2k scalars; None: the caller needs none), k leaves of `ndim`
    dimensions, the identity, and the launch shape for them."""
    leaves, on_host = check_vectors(leaves, check_count(k, "k"), "leaves", ndim)
    dtypes = tuple(np.dtype(a.dtype) for a in leaves)
    if combine is not None:
        check_arity(combine, 2 * len(dtypes), "combine")
    return FoldArguments(leaves, on_host, dtypes, cast_identity(identity, dtypes),
                         launch(threads, items, dtypes, min_span), leaves[0].shape[0])


def check_arity(fn: Any, count: int, what: str) -> None:
    """A device function (Numba's, or the simulator's) must take `count` scalars."""
    py_func = getattr(fn, "py_func", None) or getattr(fn, "fn", None)
    code = getattr(py_func, "__code__", None)
    if code is not None and not code.co_flags & 0x04 and code.co_argcount != count:  # 0x04: takes *args
        raise ValueError(f"{what} must take {count} scalars, but {py_func.__name__} takes {code.co_argcount}")


def returned(outs: Sequence[Any], on_host: bool) -> tuple:
    """The results where the inputs were: copied to the host for host inputs, else the device arrays."""
    return tuple(o.copy_to_host() for o in outs) if on_host else tuple(outs)


def to_device(arrays: Sequence[Any]) -> list[Any]:
    """Host arrays copied to the GPU (device arrays passed on as they are)."""
    return [cuda.to_device(packed(a)) if is_host(a) else a for a in arrays]


def packed(a: np.ndarray) -> np.ndarray:
    """`a` itself where its strides are C order's, else a C-ordered copy. NumPy counts any one-element view
    as contiguous, whatever its stride: a captured scalar broadcast along one element (stride 0), or a
    reverse scan's x[::-1] of length 1 (stride -8). Numba's copy to a real GPU fails on those ("incompatible
    shape: (0,) vs. (1,)"), though its simulator copies them."""
    c_order = tuple(int(np.prod(a.shape[j + 1:], dtype=np.int64)) * a.itemsize for j in range(a.ndim))
    return a if a.strides == c_order else np.array(a, order="C")


def cast_identity(identity: Sequence[Any], dtypes: Sequence[np.dtype]) -> tuple:
    """The identity's scalars in the leaves' dtypes; each must be exactly representable there."""
    if len(identity) != len(dtypes):
        raise ValueError(f"identity: expected {len(dtypes)} scalars (one per leaf), got {len(identity)}")
    cast = []
    for j, (value, dtype) in enumerate(zip(identity, dtypes, strict=True)):
        try:
            c = np.dtype(dtype).type(value)
        except (OverflowError, ValueError, TypeError) as err:
            raise ValueError(f"identity[{j}] = {value!r} does not convert to the leaf's dtype {np.dtype(dtype)}: {err}") from None
        if not (c == value or (c != c and value != value)):
            raise ValueError(f"identity[{j}] = {value!r} is not representable in the leaf's dtype {np.dtype(dtype)}")
        cast.append(c)
    return tuple(cast)


def _numba_array(shape: tuple, dtype: np.dtype) -> Any:
    return cuda.device_array(shape, dtype)


# What the kernels' results and scratch arrays are allocated with: Numba's own allocator, unless a caller
# installs another. Numba's calls cuMemAlloc for every array and frees them in batches that synchronise the
# device, so the cuda backend, whose statements launch one kernel after another, installs CuPy's memory pool.
_allocate: Callable[[tuple, np.dtype], Any] = _numba_array


def use_allocator(allocate: Callable[[tuple, np.dtype], Any] | None) -> None:
    """Allocate the kernels' device arrays with allocate(shape, dtype) (something Numba takes as a device
    array: one with __cuda_array_interface__); None: Numba's own allocator again."""
    global _allocate
    _allocate = allocate or _numba_array


def device_array(shape: int | tuple, dtype: np.dtype) -> Any:
    """An uninitialised device array for a kernel to write, from the installed allocator."""
    return _allocate(shape if isinstance(shape, tuple) else (int(shape),), np.dtype(dtype))


def empty(n: int, dtypes: Sequence[np.dtype]) -> list[Any]:
    return [device_array(n, d) for d in dtypes]
