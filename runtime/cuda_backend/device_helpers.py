"""The numba backend's scalar helpers (NumPy's NaN, log and logaddexp semantics) as CUDA device functions,
compiled from the same Python source, for the operators and map bodies that device_functions.py writes."""

from numba import cuda

from fold.runtime.numba_backend import scalar_helpers

# _mod and _floordiv are typed per argument kind with numba.extending.overload, for the CPU only: a
# lambda that calls them is not compiled for CUDA (device_functions.UNSUPPORTED_HELPERS).
HELPERS = tuple(name for name in scalar_helpers.HELPERS if name not in ("_mod", "_floordiv"))

for _name in HELPERS:
    globals()[_name] = cuda.jit(device=True)(getattr(scalar_helpers, _name).py_func)
