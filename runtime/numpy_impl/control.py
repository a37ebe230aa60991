"""map and loop: a map evaluates its body once, one batch dimension deeper; a loop runs its body n times."""

from __future__ import annotations

import numpy as np

from fold.ir import Program
from fold.primitives import Loop, Map

from ..interpreter import eval_program, numpy_impls
from .batching import expand_for_body, fit_axis


@numpy_impls.register(Map)
def _map(prim: Map, args: list, depth: int, body: Program | None = None) -> list:
    """`body` replaces the map's own body where a backend has rewritten it (the same function)."""
    consts, xs = args[: prim.num_consts], args[prim.num_consts:]
    n = xs[0].shape[depth]
    outs = eval_program(body or prim.body, [expand_for_body(c, depth) for c in consts] + list(xs), depth + 1)
    return [fit_axis(o, depth, n) for o in outs]


@numpy_impls.register(Loop)
def _loop(prim: Loop, args: list, depth: int) -> list:
    consts, state = args[: prim.num_consts], list(args[prim.num_consts:])
    for i in range(prim.n):
        counter = np.full((1,) * depth, i, dtype=np.int64)
        state = eval_program(prim.body, list(consts) + [counter] + state, depth)
    return state
