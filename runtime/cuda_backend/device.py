"""Where the cuda backend's values live, and every copy between the host and the GPU, counted.

This is the only module of fold that knows CuPy. A value on the device is one of:

- on a real GPU: a CuPy array (kernels.cuda gets a Numba view of it, `numba.cuda.as_cuda_array`, through
  `__cuda_array_interface__`: no copy), or, where CuPy is not installed, a Numba device array;
- under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1): a `SimulatedDeviceArray`, the simulator's device
  array that refuses to be read as a NumPy array, as a CuPy array does. A statement that reads a device value
  on the host without going through `to_host` then fails instead of silently copying (uncounted): that is
  what makes the simulator's transfer counts mean what they would on a GPU.

Every copy a program's values make between the host and the device goes through `to_device` and `to_host`,
which add to the `Transfers` of each `counting_transfers()` block open on this thread. Scalars that a kernel
takes as arguments (an identity, a captured scalar) are kernel arguments, not copies, and are not counted.

Exercised only on a real GPU (the simulator takes the other branch of each): the CuPy branches of
`to_device`, `to_host`, `for_kernel`, `adopt`, `reshape`, `astype`, `stack_last`, `broadcast_to`, `copy`,
and all of `elementwise` (CuPy's ufuncs on device arrays).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
from numba import config, cuda

SIMULATED = bool(config.ENABLE_CUDASIM)


@dataclass
class Transfers:
    """Copies between the host and the device: how many arrays each way, and their bytes."""

    to_device: int = 0
    to_host: int = 0
    bytes_to_device: int = 0
    bytes_to_host: int = 0

    @property
    def copies(self) -> int:
        return self.to_device + self.to_host

    def as_dict(self) -> dict[str, int]:
        return {"to_device": self.to_device, "to_host": self.to_host, "bytes_to_device": self.bytes_to_device,
                "bytes_to_host": self.bytes_to_host}


_local = threading.local()


@contextlib.contextmanager
def counting_transfers() -> Iterator[Transfers]:
    """`with counting_transfers() as t:` counts in `t` every host<->device copy of values made on this thread
    in the block (blocks may nest: each counts what happens inside it)."""
    counts = Transfers()
    outer = getattr(_local, "counters", ())
    _local.counters = (*outer, counts)
    try:
        yield counts
    finally:
        _local.counters = outer


def _count(direction: str, nbytes: int) -> None:
    for counts in getattr(_local, "counters", ()):
        setattr(counts, direction, getattr(counts, direction) + 1)
        setattr(counts, f"bytes_{direction}", getattr(counts, f"bytes_{direction}") + int(nbytes))


def _cupy() -> Any:
    """CuPy, on a real GPU where it is installed; else None. Imported on first use only."""
    if SIMULATED:
        return None
    found = getattr(_cupy, "module", False)
    if found is False:
        try:
            import cupy as found
        except ImportError:
            found = None
        _cupy.module = found
    return found


if SIMULATED:
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    class SimulatedDeviceArray(FakeCUDAArray):
        """The simulator's device array, made to refuse implicit conversion to NumPy (as CuPy's arrays do):
        NumPy would otherwise read it through the `__array_interface__` it forwards, and a statement
        running on the host would copy it without the copy being counted."""

        def __init__(self, ary: np.ndarray):
            super().__init__(ary)

        def _refuse(self, *args: Any, **kwargs: Any) -> Any:
            raise TypeError("a device array was read as a NumPy array without a counted copy: copy it with "
                            "fold.runtime.cuda_backend.device.to_host")

        __array__ = _refuse
        __array_function__ = _refuse
        __array_ufunc__ = None  # NumPy's ufuncs raise TypeError on it

        @property
        def __array_interface__(self) -> Any:
            self._refuse()

        @property
        def __array_struct__(self) -> Any:
            self._refuse()

        def __getitem__(self, idx: Any) -> Any:
            return _simulated(self._ary[idx])

        def reshape(self, *args: Any, **kwargs: Any) -> "SimulatedDeviceArray":
            return _simulated(self._ary.reshape(*args, **kwargs))

        def astype(self, dtype: Any, copy: bool = True) -> "SimulatedDeviceArray":
            return _simulated(self._ary.astype(dtype, copy=copy))

        def __repr__(self) -> str:
            return f"SimulatedDeviceArray(shape={self._ary.shape}, dtype={self._ary.dtype})"

    def _simulated(ary: Any) -> Any:
        return SimulatedDeviceArray(ary) if isinstance(ary, np.ndarray) else ary


def is_device(x: Any) -> bool:
    """Whether `x` is a device array (CuPy's, Numba's or the simulator's)."""
    if SIMULATED:
        return isinstance(x, FakeCUDAArray)
    return hasattr(x, "__cuda_array_interface__")


def to_device(x: Any) -> Any:
    """`x` on the device: a host array copied (counted), a device array as it is. Host arrays are packed to
    C order first (a real GPU's copy refuses some one-element strides that NumPy calls contiguous)."""
    if is_device(x):
        return x
    host = np.asarray(x)
    packed = host if host.flags.c_contiguous and _c_strides(host) else np.array(host, order="C")
    _count("to_device", packed.nbytes)
    if SIMULATED:
        return SimulatedDeviceArray(np.array(packed, copy=True))
    cupy = _cupy()
    return cupy.asarray(packed) if cupy is not None else cuda.to_device(packed)


def _c_strides(a: np.ndarray) -> bool:
    return a.strides == tuple(int(np.prod(a.shape[j + 1:], dtype=np.int64)) * a.itemsize for j in range(a.ndim))


def to_host(x: Any) -> np.ndarray:
    """`x` as a NumPy array: a device array copied (counted), a host array as it is."""
    if not is_device(x):
        return np.asarray(x)
    _count("to_host", x.nbytes)
    if SIMULATED:
        return np.array(x._ary, copy=True)
    cupy = _cupy()
    if cupy is not None and isinstance(x, cupy.ndarray):
        return cupy.asnumpy(x)
    return x.copy_to_host()


def empty(shape: tuple, dtype: np.dtype) -> Any:
    """An uninitialised device array (CuPy's on a real GPU with CuPy, else Numba's or the simulator's)."""
    if SIMULATED:
        return SimulatedDeviceArray(np.empty(shape, dtype))
    cupy = _cupy()
    return cupy.empty(shape, dtype) if cupy is not None else cuda.device_array(shape, dtype)


def on_device(values: Sequence[Any]) -> list:
    return [to_device(v) for v in values]


def on_host(values: Sequence[Any]) -> list:
    return [to_host(v) for v in values]


def for_kernel(x: Any) -> Any:
    """What kernels.cuda takes for the device value `x`: a Numba view of a CuPy array (no copy)."""
    cupy = _cupy()
    if cupy is not None and isinstance(x, cupy.ndarray):
        return cuda.as_cuda_array(x)
    return x


def adopt(x: Any) -> Any:
    """A kernel's device result as this module's device value: a CuPy view of a Numba device array (no copy;
    the view keeps the Numba array alive), the simulator's array made to refuse NumPy."""
    if SIMULATED:
        return _simulated(x._ary) if isinstance(x, FakeCUDAArray) else x
    cupy = _cupy()
    if cupy is not None and not isinstance(x, cupy.ndarray) and hasattr(x, "__cuda_array_interface__"):
        return cupy.asarray(x)
    return x


def reshape(x: Any, shape: tuple) -> Any:
    return x.reshape(shape)


def astype(x: Any, dtype: np.dtype) -> Any:
    """`x` converted to `dtype` on the device (CuPy or the simulator; a bare Numba device array cannot)."""
    if np.dtype(x.dtype) == np.dtype(dtype):
        return x
    if not hasattr(x, "astype"):
        raise TypeError(f"cannot convert a {type(x).__name__} of {x.dtype} to {np.dtype(dtype)} on the device "
                        f"without CuPy")
    return x.astype(dtype)


def stack_last(parts: Sequence[Any]) -> Any:
    """The device arrays `parts` (one shape) stacked along a new last axis, on the device."""
    if SIMULATED:
        return SimulatedDeviceArray(np.stack([p._ary for p in parts], axis=-1))
    return _require_cupy("stacking the components of an element").stack(list(parts), axis=-1)


def broadcast_to(x: Any, shape: tuple) -> Any:
    """`x` broadcast to `shape` on the device, as a contiguous array (a kernel reads it like any other)."""
    if tuple(x.shape) == tuple(shape):
        return x
    if SIMULATED:
        return SimulatedDeviceArray(np.ascontiguousarray(np.broadcast_to(x._ary, shape)))
    cupy = _require_cupy("broadcasting")
    return cupy.ascontiguousarray(cupy.broadcast_to(x, shape))


def copy(x: Any) -> Any:
    """A device array's own copy, on the device."""
    if SIMULATED:
        return SimulatedDeviceArray(np.array(x._ary, copy=True))
    cupy = _cupy()
    if cupy is not None:
        return cupy.array(x, copy=True)
    out = cuda.device_array(x.shape, x.dtype)
    out.copy_to_device(x)
    return out


def _require_cupy(what: str) -> Any:
    cupy = _cupy()
    if cupy is None:
        raise TypeError(f"{what} on the device needs CuPy, which is not installed here (pip install 'fold[gpu]')")
    return cupy


# The Elementwise ops as CuPy ufuncs (CuPy names them as NumPy does); sigmoid is composed.
_CUPY_NAMES = {
    "add": "add", "sub": "subtract", "mul": "multiply", "div": "true_divide", "pow": "power", "mod": "mod",
    "floordiv": "floor_divide", "maximum": "maximum", "minimum": "minimum", "logaddexp": "logaddexp",
    "neg": "negative", "abs": "abs", "sign": "sign", "exp": "exp", "log": "log", "log1p": "log1p",
    "expm1": "expm1", "sin": "sin", "cos": "cos", "tanh": "tanh", "sqrt": "sqrt", "lt": "less",
    "le": "less_equal", "gt": "greater", "ge": "greater_equal", "eq": "equal", "ne": "not_equal",
    "and": "logical_and", "or": "logical_or", "not": "logical_not", "where": "where",
}


def elementwise(op: str, values: Sequence[Any]) -> Any | None:
    """The scalar operation `op` applied by CuPy on the device (NumPy's broadcasting), where at least one
    operand is a CuPy array; None where CuPy is absent (the simulator: the statement runs on the host, its
    copies counted). Host operands of one element are passed as NumPy scalars (no copy); larger ones are
    copied (counted). Exercised only on a real GPU with CuPy."""
    cupy = _cupy()
    if cupy is None or not any(isinstance(v, cupy.ndarray) for v in values):
        return None
    operands = [v if isinstance(v, cupy.ndarray) else (np.asarray(v)[()] if np.size(v) == 1 and np.ndim(v) == 0
                                                        else to_device(v)) for v in values]
    if op == "sigmoid":
        (x,) = operands
        return (1.0 / (1.0 + cupy.exp(-x))).astype(x.dtype, copy=False)
    name = _CUPY_NAMES.get(op)
    return None if name is None else getattr(cupy, name)(*operands)
