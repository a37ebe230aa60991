"""The numba backend: fuse (scan pairs read by a map, maps read by a reduce, runs of elementwise statements),
then interpret with the kernel lowerings tried before the numpy implementations."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fold.ir import Program

from .. import numpy_impl  # noqa: F401  (the reference implementations it falls back to)
from ..interpreter import eval_program, lowering
from . import gemm  # noqa: F401  (registers the gemm lowerings)
from . import loop_nests  # noqa: F401  (registers the loop nests' kernels)
from .allocator import keep_freed_memory
from .blas_threads import quiet_blas_threads
from .compile_clock import clock as _clock
from .passes import prepare_jitted
from .lowering import numba_impls


class CompiledNumbaProgram:
    """A fused program run with the numba lowerings. Kernels compile (or load from the disk cache) when a
    call first needs them, for the dtypes it brings; `compile_seconds` is the time Numba spent on that,
    which `fold.jit` reports apart from run time. A call that compiles says so (`label` names the program in
    the messages; runtime/compile_feedback.py)."""

    def __init__(self, program: Program, label: str = "a program"):
        self.program = prepare_jitted(program)
        self.compile_seconds = 0.0
        self.label = label

    def __call__(self, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        local = _clock.local
        outer, outer_feedback = getattr(local, "program", None), getattr(local, "feedback", None)
        local.program, local.feedback = self, None
        try:
            with lowering(numba_impls):
                return eval_program(self.program, list(args))
        finally:
            if local.feedback is not None:
                local.feedback.finish()
            local.program, local.feedback = outer, outer_feedback


class NumbaBackend:
    name = "numba"

    def compile(self, program: Program) -> CompiledNumbaProgram:
        keep_freed_memory()
        quiet_blas_threads()
        return CompiledNumbaProgram(program)
