"""The numba backend: fuse, then interpret with the kernel lowerings tried before the numpy implementations."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fold.ir import Program

from .. import numpy_impl  # noqa: F401  (the reference implementations it falls back to)
from ..interpreter import eval_program, lowering
from .fusion import fuse
from .lowering import numba_impls


class NumbaBackend:
    name = "numba"

    def compile(self, program: Program):
        fused = fuse(program)

        def run(args: Sequence[np.ndarray]) -> list[np.ndarray]:
            with lowering(numba_impls):
                return eval_program(fused, list(args))

        return run
