"""The numba backend: fuse (scan pairs read by a map, maps read by a reduce, runs of elementwise statements),
then interpret with the kernel lowerings tried before the numpy implementations."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba.core import event

from fold.ir import Program

from .. import numpy_impl  # noqa: F401  (the reference implementations it falls back to)
from ..interpreter import eval_program, lowering
from . import gemm  # noqa: F401  (registers the gemm lowerings)
from .allocator import keep_freed_memory
from .blas_threads import quiet_blas_threads
from .passes import prepare
from .lowering import numba_impls


class CompiledNumbaProgram:
    """A fused program run with the numba lowerings. Kernels compile (or load from the disk cache) when a
    call first needs them, for the dtypes it brings; `compile_seconds` is the time Numba spent on that,
    which `fold.jit` reports apart from run time."""

    def __init__(self, program: Program):
        self.program = prepare(program)
        self.compile_seconds = 0.0

    def _add_compile_time(self, seconds: float) -> None:
        self.compile_seconds += seconds

    def __call__(self, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        with event.install_timer("numba:compile", self._add_compile_time), lowering(numba_impls):
            return eval_program(self.program, list(args))


class NumbaBackend:
    name = "numba"

    def compile(self, program: Program) -> CompiledNumbaProgram:
        keep_freed_memory()
        quiet_blas_threads()
        return CompiledNumbaProgram(program)
