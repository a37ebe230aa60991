"""What a backend will run for a program: `fold.lowered(f, *args)`, the tool for a program that is slow."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from fold.ir import Program


@dataclass(frozen=True)
class Lowered:
    """The program as the backend runs it (its statements after the backend's fusions) and each loop nest's
    loops, with what it materialises and how many bytes. `str()` of it is that text."""

    program: Program
    nests: tuple[str, ...]
    backend: str

    def __str__(self) -> str:
        parts = [f"# as the {self.backend} backend runs it", str(self.program)]
        for j, text in enumerate(self.nests):
            parts += ["", f"# loop nest {j}", text]
        return "\n".join(parts)


def lowered(f: Callable[..., Any], *args: Any, backend: str = "numba") -> Lowered:
    """The statements `backend` runs for f(*args) after fusion, and the loop nests among them.

    A map of a map (k-means' distances, pairwise minima, attention written with maps) should appear as one
    `loop_nest` statement whose nest materialises nothing of the maps' size; a statement left as a `map` whose
    body nests another map runs batched instead, holding every row of the inner map at once."""
    from fold.api import trace
    from fold.cse import cse
    from fold.dce import dce

    from .loops import LoopNest, describe, kernel_of

    program = dce(cse(trace(f, *args)))
    as_run = _as_built  # a backend's last rewrite of a nest's kernel
    if backend == "numba":
        from .numba_backend.loop_nests import as_run
        from .numba_backend.passes import prepare_jitted

        program = prepare_jitted(program)
    elif backend == "cuda":
        from .cuda_backend.fused import prepared

        program = prepared(program)  # what CudaProgram runs (cuda_backend/backend.py)
    elif backend != "numpy":
        raise ValueError(f"fold.lowered: backend must be 'numba', 'cuda' or 'numpy', got {backend!r}")
    nests = tuple(describe(as_run(kernel_of(s.prim))) for s in program.stmts if isinstance(s.prim, LoopNest))
    return Lowered(program, nests, backend)


def _as_built(kernel):
    return kernel
