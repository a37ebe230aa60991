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


class CudaBackend:
    name = "cuda"

    def __init__(self) -> None:
        from numba import cuda

        if not cuda.is_available():
            raise FoldRuntimeError("the cuda backend needs an NVIDIA GPU with a working CUDA driver, and "
                                   "numba.cuda.is_available() is False here; set NUMBA_ENABLE_CUDASIM=1 (before "
                                   "Numba is first imported) to run it on Numba's CUDA simulator instead")

    def compile(self, program: Program):
        def run(args: Sequence[np.ndarray]) -> list[np.ndarray]:
            with lowering(cuda_impls):
                return eval_program(program, list(args))

        return run
