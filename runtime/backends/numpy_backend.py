"""The reference backend: the batched NumPy interpreter. Every other backend is tested against it."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fold.ir import Program

from .. import numpy_impl  # noqa: F401  (registers the implementations)
from ..interpreter import eval_program


class NumpyBackend:
    name = "numpy"

    def compile(self, program: Program):
        def run(args: Sequence[np.ndarray]) -> list[np.ndarray]:
            return eval_program(program, list(args))

        return run
