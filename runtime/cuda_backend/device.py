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

A statement that the numpy implementation runs as NumPy calls (a transpose, a matrix product, a map's
batched body) can run on device arrays directly: NumPy hands a CuPy array to CuPy (its `__array_ufunc__`
and `__array_function__`), and the simulator's arrays do the same with NumPy underneath, refusing, as CuPy
does, a host array among the operands.

Exercised only on a real GPU (the simulator takes the other branch of each): the CuPy branches of
`to_device`, `to_host`, `for_kernel`, `adopt`, `reshape`, `astype`, `stack_last`, `broadcast_view`, `copy`,
`use_memory_pool`.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
from numba import config, cuda

from fold.kernels.cuda import host

from ..numpy_impl.elementwise import NUMPY_SCALAR_FNS

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

    from numpy.lib.mixins import NDArrayOperatorsMixin

    class SimulatedDeviceArray(NDArrayOperatorsMixin, FakeCUDAArray):
        """The simulator's device array, made to behave as CuPy's arrays do: it refuses implicit conversion
        to NumPy (NumPy would otherwise read it through the `__array_interface__` it forwards, and a statement
        running on the host would copy it without the copy being counted), and NumPy's calls and Python's
        operators on it compute a device array."""

        def __init__(self, ary: np.ndarray):
            super().__init__(ary)

        def _refuse(self, *args: Any, **kwargs: Any) -> Any:
            raise TypeError("a device array was read as a NumPy array without a counted copy: copy it with "
                            "fold.runtime.cuda_backend.device.to_host")

        __array__ = _refuse

        def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
            """NumPy's ufuncs on device operands run "on the device", as CuPy's __array_ufunc__ does; a host
            array among the operands is refused, as CuPy refuses it."""
            return _simulated(getattr(ufunc, method)(*_unwrapped(inputs), **_unwrapped(kwargs)))

        def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
            """NumPy's functions (np.transpose, np.sum, ...) on device arrays, as CuPy's __array_function__."""
            return _simulated(func(*_unwrapped(args), **_unwrapped(kwargs)))

        @property
        def __array_interface__(self) -> Any:
            self._refuse()

        @property
        def __array_struct__(self) -> Any:
            self._refuse()

        def __getitem__(self, idx: Any) -> Any:
            return _simulated(self._ary[_unwrapped(idx)])

        def __setitem__(self, idx: Any, value: Any) -> None:
            self._ary[_unwrapped(idx)] = _unwrapped(value)

        def __getattr__(self, name: str) -> Any:
            """An ndarray's other attributes and methods (x.flags, x.swapaxes(...)), their arrays on the device."""
            if name.startswith("__") or name == "_ary":
                raise AttributeError(name)
            found = getattr(self._ary, name)
            if callable(found):
                return lambda *args, **kwargs: _simulated(found(*_unwrapped(args), **_unwrapped(kwargs)))
            return _simulated(found)

        def reshape(self, *args: Any, **kwargs: Any) -> "SimulatedDeviceArray":
            return _simulated(self._ary.reshape(*args, **kwargs))

        def astype(self, dtype: Any, copy: bool = True) -> "SimulatedDeviceArray":
            return _simulated(self._ary.astype(dtype, copy=copy))

        def __repr__(self) -> str:
            return f"SimulatedDeviceArray(shape={self._ary.shape}, dtype={self._ary.dtype})"

    def _simulated(ary: Any) -> Any:
        """NumPy's results as device arrays (a scalar stays a scalar, as CuPy's 0-d arrays are not)."""
        if isinstance(ary, (tuple, list)):
            return type(ary)(_simulated(a) for a in ary)
        return SimulatedDeviceArray(ary) if isinstance(ary, np.ndarray) else ary

    def _unwrapped(values: Any) -> Any:
        """The NumPy arrays behind device arrays, in nested tuples, lists and dicts; a host array with
        dimensions is refused (CuPy refuses to mix one with its arrays)."""
        if isinstance(values, FakeCUDAArray):
            return values._ary
        if isinstance(values, np.ndarray) and values.ndim:
            raise TypeError(f"a host array of shape {values.shape} among a device computation's operands: "
                            f"copy it with fold.runtime.cuda_backend.device.to_device")
        if isinstance(values, (tuple, list)):
            return type(values)(_unwrapped(v) for v in values)
        if isinstance(values, dict):
            return {k: _unwrapped(v) for k, v in values.items()}
        return values


def use_memory_pool() -> None:
    """Have kernels.cuda allocate its results in CuPy's memory pool (as Numba views of CuPy arrays), where
    CuPy is installed: Numba's own allocator calls cuMemAlloc for every array and frees them in batches that
    synchronise the device, between statements that would otherwise queue one kernel after another."""
    cupy = _cupy()
    if cupy is not None:
        host.use_allocator(lambda shape, dtype: cuda.as_cuda_array(cupy.empty(shape, dtype)))


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


def zeros(shape: tuple, dtype: np.dtype) -> Any:
    """A device array of zeros."""
    if SIMULATED:
        return SimulatedDeviceArray(np.zeros(shape, dtype))
    cupy = _cupy()
    if cupy is not None:
        return cupy.zeros(shape, dtype)
    out = cuda.device_array(shape, dtype)
    out.copy_to_device(np.zeros(shape, dtype))
    return out


def arange(n: int, dtype: np.dtype) -> Any:
    """0, 1, ..., n - 1 made on the device."""
    if SIMULATED:
        return SimulatedDeviceArray(np.arange(n, dtype=dtype))
    return _require_cupy("counting on the device").arange(n, dtype=dtype)


asarray = to_device  # the name array code uses (`arrays.asarray`) for "this value where my arrays are"


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
    return x if tuple(x.shape) == tuple(shape) else broadcast_view(x, shape).copy()


def broadcast_view(x: Any, shape: tuple) -> Any:
    """`x` broadcast to `shape` as a view (stride 0 along the broadcast axes: nothing copied), for a kernel
    that reads its operands through their strides (kernels.cuda.map_over). NumPy's broadcast_to hands a
    CuPy array to CuPy, a simulated one to the simulator's arrays; a bare Numba array cannot be broadcast."""
    if tuple(x.shape) == tuple(shape):
        return x
    if not SIMULATED:
        _require_cupy("broadcasting")
    return np.broadcast_to(x, shape)


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


def _as_operand(host: Any, deepest: int) -> Any:
    """A host operand of a device computation: one element as a NumPy scalar (no copy; broadcasting it gives
    the shape it would give where it has no more dimensions than the deepest device operand), else copied."""
    if np.size(host) == 1 and np.ndim(host) <= deepest:
        return np.asarray(host).reshape(())[()]
    return to_device(host)


def elementwise(op: str, values: Sequence[Any]) -> Any:
    """The scalar operation `op` on the device, where at least one operand is a device array: NumPy's
    function for it (runtime/numpy_impl/elementwise.py's table), which hands device operands to CuPy (its
    __array_ufunc__ and __array_function__) or to the simulator's arrays. Host operands of one element are
    passed as NumPy scalars (no copy, `_as_operand`); larger ones are copied (counted)."""
    deepest = max(v.ndim for v in values if is_device(v))
    operands = [v if is_device(v) else _as_operand(v, deepest) for v in values]
    if op == "sigmoid":
        (x,) = operands
        with np.errstate(over="ignore"):  # exp(-x) overflows to inf for very negative x: the limit 0, rightly
            return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype, copy=False)
    return NUMPY_SCALAR_FNS[op](*operands)
