"""Combining the partial states of a fold split over chunks, with the fold's operator, in order.

`tree_combine` merges neighbours pairwise, level by level (log2 of the chunks deep), always left . right,
so an operator that is associative but not commutative gives the unsplit fold's result (up to the
reassociation any parallel fold makes). A merge runs where its left state lives: with chunks placed in
contiguous runs per worker, only workers - 1 merges move a state, rows x state bytes each.
`exclusive_prefix` gives each chunk the fold of the chunks before it (after it, for a reverse scan): the
offsets of a sharded scan's local pass.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from fold.dtypes import ShapedArray
from fold.ir import Program

from . import tasks
from .context import Context
from .programs import combine_program

# the combine of two partial states is O(state) work: the NumPy reference (vectorised over a mapped
# combine's rows) runs it without a compile per worker
COMBINE_BACKEND = "numpy"


class Partial:
    """One chunk's fold state: a future of the tuple of its leaves, and the worker that holds it."""

    def __init__(self, packed: Any, worker: str | None):
        self.packed, self.worker = packed, worker


def _merge(ctx: Context, tag: tuple, program: Program, consts: list, left: Partial, right: Partial, nbytes: int) -> Partial:
    key, _ = ctx.program(tag, lambda: program)
    ctx.merges.append((nbytes, left.worker != right.worker))
    packed = ctx.submit(_combine_task, key, program, consts, left.packed, right.packed, worker=left.worker, name="combine")
    return Partial(packed, left.worker)


def _combine_task(key: str, program: Program, consts: list, left: tuple, right: tuple) -> tuple:
    return tasks.run_program(key, program, COMBINE_BACKEND, *consts, *left, *right)


def state_bytes(avals: Sequence[ShapedArray]) -> int:
    return int(sum(np.prod(a.shape, dtype=np.int64) * a.dtype.itemsize for a in avals))


def combiner(ctx: Context, what: tuple, op: Program, num_consts: int, avals: Sequence[ShapedArray], mapped: bool) -> tuple:
    """(cache tag, Program) of the combine of two states of `avals`."""
    shapes = tuple((a.shape, a.dtype.str) for a in avals)
    tag = ("combine",) + what + (shapes, mapped)
    _, program = ctx.program(tag, lambda: combine_program(op, num_consts, avals, mapped))
    return tag, program


def tree_combine(ctx: Context, what: tuple, op: Program, num_consts: int, consts: list, avals: Sequence[ShapedArray],
                 parts: list[Partial], mapped: bool) -> Partial:
    """The fold of `parts` (in order) with `op`: neighbours merged pairwise, level by level."""
    tag, program = combiner(ctx, what, op, num_consts, avals, mapped)
    nbytes = state_bytes(avals)
    while len(parts) > 1:
        merged = [_merge(ctx, tag, program, consts, parts[i], parts[i + 1], nbytes) for i in range(0, len(parts) - 1, 2)]
        parts = merged + parts[len(parts) - len(parts) % 2:]
    return parts[0]


def exclusive_prefix(ctx: Context, what: tuple, op: Program, num_consts: int, consts: list, avals: Sequence[ShapedArray],
                     identity: Partial, totals: list[Partial], reverse: bool) -> list[Partial]:
    """Per chunk, the fold of the chunks' totals before it (after it when `reverse`); the identity for the
    first (last). A chain over the totals: the chunks are few and their totals one element each."""
    tag, program = combiner(ctx, what, op, num_consts, avals, False)
    nbytes = state_bytes(avals)
    order = list(range(len(totals)))[::-1] if reverse else list(range(len(totals)))
    offsets: dict[int, Partial] = {}
    running = identity
    for k in order:
        offsets[k] = running
        step = totals[k]
        running = _merge(ctx, tag, program, consts, step, running, nbytes) if reverse else _merge(ctx, tag, program, consts, running, step, nbytes)
    return [offsets[k] for k in range(len(totals))]
