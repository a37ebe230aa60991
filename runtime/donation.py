"""A statement's result written into an operand's buffer where nothing else holds that operand.

The interpreter frees each value after its last reader, so a run of elementwise statements over an (n, m)
array allocated its result while the operand it had just read for the last time was still alive: two
buffers of that size at once, and a fresh one per call that the system zeroes and maps in page by page
(glibc returns large blocks on free). A two-layer network's `tanh(X @ W1)` held 2 x 25.6 MB where one
does. The interpreter releases a statement's dead operands from its environment before running it
(interpreter._run_steps); the statement's argument list is then the only holder of such an operand. An
operand of the result's shape and dtype, contiguous, writeable and owning its memory, that the argument list
alone references (no view of it, no caller, no cached literal: each would hold a reference) is handed to the
kernel as the result's buffer: the numba backend's elementwise runs of one result, and a single elementwise
statement on NumPy (a ufunc's `out=`, which NumPy allows to be an operand). A run's one result is computed
from every operand, so its store at an element waits for that element's loads. A run of two results may not
take a buffer: the compiled loop may store the result that does not read the donated operand before it
loads that operand at the same element (the kernel's arrays do not alias as far as LLVM is told), which
gave a Gaussian kernel sum's gradient wrong values.

The references are counted the way NumPy elides temporaries in `a + b + c`: `exclusive` compares an
operand's reference count with that of an array held by one list alone, measured through the same call
when this module is imported, so a Python that counts references on its stack differently still agrees.
"""

from __future__ import annotations

import sys

import numpy as np


def _count(values: list, k: int) -> int:
    return sys.getrefcount(values[k])


_ALONE = _count([np.empty(1)], 0)  # the count of an array only the list holds


def exclusive(values: list, k: int) -> bool:
    """Whether `values[k]` is an array that only the list `values` references."""
    return _count(values, k) <= _ALONE


def outputs(values: list, shape: tuple, dtypes: list[np.dtype]) -> list[np.ndarray]:
    """Buffers for a run's results of these dtypes and `shape`: where it has one result, an operand of
    `values` that nothing else holds (see the module docstring) if one matches, else new arrays."""
    found = _first_donatable(values, shape, dtypes[0]) if len(dtypes) == 1 else None
    return [found] if found is not None else [np.empty(shape, dtype) for dtype in dtypes]


def ufunc_output(values: list, ufunc: np.ufunc) -> np.ndarray | None:
    """An operand of `values` (see `outputs`) that can take `ufunc`'s result, or None."""
    if ufunc.nout != 1 or not all(type(v) is np.ndarray for v in values):
        return None
    shape = np.broadcast_shapes(*(v.shape for v in values))
    try:
        dtype = ufunc.resolve_dtypes(tuple(v.dtype for v in values) + (None,))[-1]
    except (TypeError, ValueError):  # no loop for these dtypes: NumPy names the problem when it runs
        return None
    return _first_donatable(values, shape, dtype)


def _first_donatable(values: list, shape: tuple, dtype: np.dtype) -> np.ndarray | None:
    k = next((k for k in range(len(values)) if _donatable(values, k, shape) and values[k].dtype == dtype), None)
    return None if k is None else values[k]


def _donatable(values: list, k: int, shape: tuple) -> bool:
    if not exclusive(values, k):  # counted before a local name holds it too
        return False
    x = values[k]
    return (type(x) is np.ndarray and x.shape == shape and x.base is None and x.flags.c_contiguous
            and x.flags.writeable)
