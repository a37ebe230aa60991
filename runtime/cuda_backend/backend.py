"""The cuda backend: a program interpreted statement by statement, with the folds and maps that
lowering.py lowers run as Numba CUDA kernels, and every other statement on the numpy implementation.

Values live on the host (NumPy arrays) between statements: each lowered statement copies its inputs to the
GPU and its results back. That keeps the backend exactly as general as the numpy one, and makes it a
correct but not yet a fast way to run a program on a GPU; the kernels themselves take device arrays
(CuPy's or Numba's) and leave results there, for a runtime that keeps values on the device.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fold.errors import FoldRuntimeError
from fold.ir import Program

from .. import numpy_impl  # noqa: F401  (the reference implementations it falls back to)
from ..interpreter import eval_program, lowering
from .lowering import cuda_impls


_TOOLCHAIN: list = []  # the probe's answer, once per process


def toolchain_problem() -> str | None:
    """Why numba-cuda cannot compile a kernel here (None if it can), from compiling a one-line kernel once.

    A numba-cuda that cannot compile at all (numba-cuda 0.30 with NumPy 2.5, whose typing module reads
    np.row_stack, which NumPy 2.5 removed) would otherwise decline every statement with a warning of its own."""
    if not _TOOLCHAIN:
        _TOOLCHAIN.append(_probe())
    return _TOOLCHAIN[0]


def _probe() -> str | None:
    from numba import config, cuda

    if config.ENABLE_CUDASIM:
        return None  # the simulator runs kernels as Python: nothing to compile

    def double(x):
        x[0] = 2.0 * x[0]

    try:
        cuda.compile_ptx_for_current_device(double, "void(float64[::1])")
    except Exception as err:  # noqa: BLE001 - whatever breaks the compiler, the user needs its text
        stack = f"numba {_version('numba')}, numba-cuda {_version('numba-cuda')}, NumPy {np.__version__}"
        return (f"the cuda backend cannot compile a kernel with this stack ({stack}): {type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}. Install a NumPy that this numba-cuda supports "
                f"(numba-cuda 0.30 needs NumPy < 2.5: pip install 'numpy<2.5') or a newer numba-cuda; "
                f"`pip install 'fold[gpu]'` pins a pair that works")
    return None


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


class CudaBackend:
    name = "cuda"

    def __init__(self) -> None:
        from numba import cuda

        if not cuda.is_available():
            raise FoldRuntimeError("the cuda backend needs an NVIDIA GPU with a working CUDA driver, and "
                                   "numba.cuda.is_available() is False here; set NUMBA_ENABLE_CUDASIM=1 (before "
                                   "Numba is first imported) to run it on Numba's CUDA simulator instead")
        problem = toolchain_problem()
        if problem is not None:
            raise FoldRuntimeError(problem)

    def compile(self, program: Program):
        def run(args: Sequence[np.ndarray]) -> list[np.ndarray]:
            with lowering(cuda_impls):
                return eval_program(program, list(args))

        return run
