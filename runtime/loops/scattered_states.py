"""A loop's array state that gains a histogram at each step, binned straight into the state.

The gradient of a loop that reads a captured array at its counter (a recurrent network's input `xs[t]`) carries
that array's cotangent as a state, and each step adds the gather's cotangent, a histogram of one row:

    bt = aq + reduce_by_index(+, 32, [t], [row])

Written as it reads, every step fills a (32, 16) histogram with zeros, bins the row into it and adds the whole
histogram to the state: two passes over the state for 16 useful additions, at each of the loop's steps. Where
nothing else in the step reads the state, the loop nest adds the histogram's values into the state's own
buffer at their indices instead (an index outside the bins skipped, as reduce_by_index does): the sum
`aq + (0 + v1 + v2)` computed as `(aq + v1) + v2`, which differs only in rounding where two values share a bin.

`scattered_states(body, num_consts)` finds such states in a loop body and returns the body without their
additions and histograms: the state returned as it came in, each histogram's indices and values as extra
outputs, which the loop nest's loop rule (build.py) bins into the state after the body.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fold.ir import Let, Lit, Program, Var, use_counts
from fold.primitives import Elementwise, ReduceByIndex
from fold.recognize import recognize_binary_op


@dataclass(frozen=True)
class ScatteredState:
    """Loop state number `state` gains, at each step, the sum histogram `histogram` (a one-leaf
    reduce_by_index of + started at zero); its indices and values are the body's extra outputs
    `first_output` and `first_output + 1`."""

    state: int
    histogram: ReduceByIndex
    first_output: int


def scattered_states(body: Program, num_consts: int) -> tuple[Program, list[ScatteredState]]:
    """`body` (a fold.loop's: consts, counter, states) rewritten as the module docstring says, and which
    states; `body` itself and [] where no state qualifies."""
    states = body.inputs[num_consts + 1:]
    uses = use_counts(body)
    producer = {v: s for s in body.stmts for v in s.outs}
    removed: set[int] = set()
    found: list[tuple[int, Var, Let]] = []
    for k, state in enumerate(states):
        out = body.outputs[k]
        adding = producer.get(out) if isinstance(out, Var) else None
        # the state read once, by the statement making its next value, which is read only as that
        if (state.aval.shape == () or uses[state] != 1 or adding is None or state not in adding.args
                or uses[out] != 1):
            continue
        histogram = _histogram_added(adding, state, producer, uses)
        if histogram is not None:
            removed |= {id(adding), id(histogram)}
            found.append((k, state, histogram))
    if not found:
        return body, []
    outputs = list(body.outputs)
    scattered = []
    for k, state, histogram in found:
        outputs[k] = state
        prim = histogram.prim
        scattered.append(ScatteredState(k, prim, len(outputs)))
        outputs += list(histogram.args[prim.num_leaves:])  # the indices, then the values
    stmts = tuple(s for s in body.stmts if id(s) not in removed)
    return Program(body.inputs, stmts, tuple(outputs), body.in_tree, meta=dict(body.meta)), scattered


def _histogram_added(adding: Let, state: Var, producer: dict, uses) -> Let | None:
    """The histogram statement that `adding` (state + histogram, either order) adds to `state`, where it is a
    one-leaf sum started at zero that nothing else reads and has the state's shape and dtype; else None."""
    if not (isinstance(adding.prim, Elementwise) and adding.prim.op == "add" and len(adding.args) == 2):
        return None
    other = adding.args[1] if adding.args[0] is state else adding.args[0]
    histogram = producer.get(other) if isinstance(other, Var) else None
    if histogram is None or not isinstance(histogram.prim, ReduceByIndex) or uses[other] != 1:
        return None
    prim = histogram.prim
    if (prim.num_consts or prim.num_leaves != 1 or recognize_binary_op(prim.body) != "add"
            or other.aval != state.aval or adding.outs[0].aval != state.aval):
        return None
    identity = histogram.args[0]
    return histogram if isinstance(identity, Lit) and not np.any(np.asarray(identity.value)) else None
