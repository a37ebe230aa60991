"""The dtypes fold supports, and the abstract value (shape + dtype) every program variable carries."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import FoldTypeError

SUPPORTED_DTYPES = tuple(np.dtype(d) for d in ("float32", "float64", "int32", "int64", "bool"))
FLOAT_DTYPES = tuple(np.dtype(d) for d in ("float32", "float64"))
_SHORT = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64", "bool": "bool"}


def check_dtype(dtype: np.dtype, where: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise FoldTypeError(f"{where}: dtype {dtype.name} is not supported (fold supports {names})")
    return dtype


def native_byte_order(array: np.ndarray) -> np.ndarray:
    """`array` in the machine's byte order: data read from some file formats arrives big-endian ('>f8'),
    which is the same float64 to the user, so it is converted (one copy) rather than refused."""
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


def is_static_int(value: Any) -> bool:
    """A Python or NumPy integer, and not a bool (which Python counts as an int): what a count, a size or an
    axis must be, so that a float is never truncated and True never read as 1."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_float(dtype: np.dtype) -> bool:
    return np.dtype(dtype) in FLOAT_DTYPES


@dataclass(frozen=True)
class ShapedArray:
    """What the tracer knows of an array: its shape and dtype, never its values."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, np.dtype):  # ShapedArray((3,), np.float64), as a user writes it
            object.__setattr__(self, "dtype", np.dtype(self.dtype))
        if type(self.shape) is not tuple:
            object.__setattr__(self, "shape", tuple(self.shape))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(int(s) for s in self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{_SHORT.get(self.dtype.name, self.dtype.name)}[{','.join(map(str, self.shape))}]"

    def update(self, shape: tuple[int, ...] | None = None, dtype: np.dtype | None = None) -> "ShapedArray":
        return ShapedArray(self.shape if shape is None else tuple(shape), self.dtype if dtype is None else dtype)


def aval_of(value: np.ndarray) -> ShapedArray:
    return ShapedArray(tuple(value.shape), value.dtype)
