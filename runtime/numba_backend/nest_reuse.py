"""A transcendental computed again in a later loop over the same elements is stored by the first loop and read
by the second.

A gradient re-executes its primal's scope and a jvp computes a value beside its tangent, so two sibling loops
over a row often compute the same element: the Hessian-vector product of a row's logsumexp sums
exp(x - lse) * tangent over the row in one loop and writes exp(x - lse) * (tangent - that sum) in the next,
an exp per element each. The nest recomputes whatever it does not store (build.py), and the writer's
memo of expressions (Writer._texts) reaches only what is in scope, not a loop that has closed. Here, after the
nest is built: where a loop's statement with a lane rule (exp, log, tanh, ...: what costs more than a load)
has the same value as one in an earlier sibling loop of the same trip count, the earlier loop stores it in
a buffer of the row's length (in cache: 4 KB for 1000 float32) and the later one reads it. Only values that
cannot change between the loops qualify: expressions of the loop's index, of read-only arrays and of
names assigned neither in the loops nor between them (an accumulator's final value, read by both, counts).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from fold.runtime.loops.nest import Assign, Buffer, If, Kernel, Loop, ParallelMap, Store
from fold.runtime.loops.prune import prune
from fold.runtime.loops.text import assigned, names, reads_only_inputs, substitute

from .nest_lanes import lane_call

# a statement's value rounded to a float type: the type of the buffer that holds it
_TYPED = re.compile(r"np\.(float32|float64)\(")


def reused(kernel: Kernel) -> Kernel:
    """`kernel` with each transcendental that a later sibling loop computes again stored and read back."""
    outer, serial = kernel.outer, iter(range(10**9))
    if isinstance(outer, ParallelMap):
        changed = dataclasses.replace(outer, body=_block(outer.body, serial))
    else:
        changed = dataclasses.replace(outer, step=_block(outer.step, serial))
    return kernel if changed == outer else prune(dataclasses.replace(kernel, outer=changed))


def _block(nodes: tuple, serial) -> tuple:
    nodes = [dataclasses.replace(n, body=_block(n.body, serial)) if isinstance(n, (Loop, If)) else n
             for n in nodes]
    for b, later in enumerate(nodes):
        if not _straight(later):
            continue
        for a in range(b):
            earlier = nodes[a]
            if not (_straight(earlier) and earlier.extent == later.extent):
                continue
            between = nodes[a + 1: b]
            found = _shared(earlier, later, assigned(between))
            if not found:
                continue
            buffers, stores, reads = [], [], {}
            for name_a, assign_b, dtype in found:
                buffer = f"kept{next(serial)}"  # build.py names a merge's right operands r<n>
                buffers.append(Buffer(buffer, (later.extent,), np.dtype(dtype)))
                stores.append(Store(buffer, (earlier.index,), name_a))
                reads[assign_b.target] = f"{buffer}[{later.index}]"
            nodes[a] = dataclasses.replace(earlier, body=earlier.body + tuple(stores))
            nodes[b] = later = dataclasses.replace(later, body=tuple(
                Assign(n.target, reads[n.target]) if isinstance(n, Assign) and n.target in reads else n
                for n in later.body))
            nodes[a:a] = buffers
            return _block(tuple(nodes), serial)  # positions moved: look again
    return tuple(nodes)


def _straight(node) -> bool:
    """An innermost loop of a static trip count."""
    return isinstance(node, Loop) and isinstance(node.extent, int) and all(
        isinstance(n, (Assign, Store)) for n in node.body)


def _shared(earlier: Loop, later: Loop, unstable: set[str]) -> list[tuple[str, Assign, str]]:
    """(the earlier loop's name, the later loop's assignment, its dtype) for each transcendental of the later
    loop whose value the earlier loop computes too."""
    numbering: dict[str, int] = {}  # shared by the two loops: the same value, the same number
    known = {}
    for target, number in _canonical(earlier, unstable, numbering).items():
        known.setdefault(number, target)
    found = []
    later_texts = _canonical(later, unstable, numbering)
    for node in later.body:
        if not (isinstance(node, Assign) and lane_call(node.expr)):
            continue
        text = later_texts.get(node.target)
        typed = _TYPED.match(node.expr)
        if text is not None and text in known and typed:
            found.append((known[text], node, typed.group(1)))
    return found


def _canonical(loop: Loop, unstable: set[str], numbering: dict[str, int]) -> dict[str, int]:
    """Each temporary the loop assigns once, numbered by its value in terms of the loop's index (`@`),
    read-only arrays and names assigned neither in the loop nor in `unstable`; those that read anything else
    (a value the loop changes, a buffer) are left out. A name the earlier loop assigns stays in the later
    loop's text as itself, never in the earlier's, so the two never match through it."""
    counts: dict[str, int] = {}
    for node in loop.body:
        if isinstance(node, Assign):
            for n in names(node.target):
                counts[n] = counts.get(n, 0) + 1
    texts: dict[str, int] = {}
    for node in loop.body:
        if not (isinstance(node, Assign) and counts.get(node.target) == 1 and node.target.isidentifier()):
            continue
        if not reads_only_inputs(node.expr):
            continue
        ok = True

        def canonical(n: str) -> str:
            nonlocal ok
            if n == loop.index:
                return "@"
            if n in texts:  # by its number: spelt out, a chain reading each value twice doubles per statement
                return f"#{texts[n]}"
            if n in counts or n in unstable:  # assigned in the loop, or between the two loops
                ok = False
            return n

        text = substitute(node.expr, canonical)
        if ok:
            texts[node.target] = numbering.setdefault(text, len(numbering))
    return texts
