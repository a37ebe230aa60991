"""NumPy implementations of the primitives gradient programs add (fold.primitives.ad_support)."""

from __future__ import annotations

import numpy as np

from fold.primitives import IndexTranspose, LoopSaving, StopGradient

from ..interpreter import eval_program, numpy_impls
from .structural import index_key


@numpy_impls.register(IndexTranspose)
def _index_transpose(prim: IndexTranspose, args: list, depth: int) -> list:
    (x,) = args
    out = np.zeros(x.shape[:depth] + tuple(prim.shape), dtype=x.dtype)
    key = index_key(prim.index)
    out[(slice(None),) * depth + key] = x
    return [out]


@numpy_impls.register(LoopSaving)
def _loop_saving(prim: LoopSaving, args: list, depth: int) -> list:
    consts, state = args[: prim.num_consts], list(args[prim.num_consts:])
    if depth == 0:
        return _loop_saving_into_stacks(prim, consts, state)
    saved: list[list[np.ndarray]] = [[] for _ in state]
    for i in range(prim.n):
        if i % prim.stride == 0:
            for store, s in zip(saved, state, strict=True):
                store.append(s)
        counter = np.full((1,) * depth, i, dtype=np.int64)
        state = eval_program(prim.body, list(consts) + [counter] + state, depth)
    stacks = []
    for store, s in zip(saved, state, strict=True):
        if not store:
            stacks.append(np.zeros(s.shape[:depth] + (0,) + s.shape[depth:], dtype=s.dtype))
            continue
        batch = np.broadcast_shapes(*[x.shape[:depth] for x in store]) if depth else ()
        stacks.append(np.stack([np.broadcast_to(x, batch + x.shape[depth:]) for x in store], axis=depth))
    return state + stacks


def _loop_saving_into_stacks(prim: LoopSaving, consts: list, state: list) -> list:
    """At the top level every state has its aval's shape: each saved state is written into its row of a
    stack allocated once, so the iteration's own array can be reused (not kept alive until a final stack
    copies them all)."""
    stacks = [np.empty((prim.num_saved,) + a.shape, a.dtype) for a in prim.body.out_avals]
    for i in range(prim.n):
        if i % prim.stride == 0:
            for stack, s in zip(stacks, state, strict=True):
                stack[i // prim.stride] = s
        state = eval_program(prim.body, list(consts) + [np.full((), i, dtype=np.int64)] + state, 0)
    return state + stacks


@numpy_impls.register(StopGradient)
def _stop_gradient(prim: StopGradient, args: list, depth: int) -> list:
    return [args[0]]
