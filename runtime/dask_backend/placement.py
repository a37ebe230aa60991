"""Where a program variable's value lives during a sharded run.

`Rep`: one whole value (a Dask future, or a constant known on the client), with the worker that holds it.
`Split`: the value cut along `axis` into chunks, chunk k a future on `workers[k]`. Partial fold states are
never a placement of their own: a rule combines them (in a tree, in order) before anything reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fold.dtypes import ShapedArray


@dataclass(frozen=True, eq=False)
class Rep:
    """A whole value: `value` is a Future or a NumPy array; `copies` are futures of it already on workers
    (a whole input has one on every worker: a task there reads it, and a slice of it is cut there)."""

    value: Any
    aval: ShapedArray
    worker: str | None = None
    copies: dict = field(default_factory=dict)

    def on(self, worker: str | None) -> Any:
        """The copy to hand a task on `worker`: its own if it has one (no transfer), else the value."""
        return self.copies.get(worker, self.value)


@dataclass(frozen=True, eq=False)
class Split:
    """A value of `aval` cut along `axis` into chunks of `chunks` sizes: `parts[k]` lives on `workers[k]`."""

    axis: int
    chunks: tuple[int, ...]
    parts: tuple
    workers: tuple
    aval: ShapedArray

    def offsets(self) -> list[int]:
        return [int(o) for o in np.cumsum((0,) + self.chunks[:-1])]

    def chunk_aval(self, k: int) -> ShapedArray:
        shape = list(self.aval.shape)
        shape[self.axis] = self.chunks[k]
        return self.aval.update(shape=tuple(shape))


def describe(placement: Rep | Split) -> str:
    """How a placement prints in errors: 'replicated' or 'split on axis 1 in chunks (3, 2)'."""
    if isinstance(placement, Split):
        return f"split on axis {placement.axis} in chunks {placement.chunks}"
    return "replicated"
