"""Dead temporaries removed from a loop nest.

A map body's element is written whole where any of its results is read, so a loop that reads one result of a
jvp's map (the value, for a maximum) also holds the statements of the others (the tangent). Numba's LLVM
drops dead scalar arithmetic, but not a vector call that the lanes rewrite makes of a dead transcendental,
and every statement costs compile time and counts against the lanes' budget: they go here, before any
backend sees the nest. So do buffers nothing reads, with the stores into them (a loop saving every state
where a later map over its steps reads one of them, loop_maps.py).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable

from .nest import Assign, Buffer, If, Kernel, Loop, ParallelFold, Store, buffers
from .text import events, names

# the temporaries build.py names (t: a statement's value, e: an element), each assigned once
_TEMPORARY = re.compile(r"[te]\d+")


def prune(kernel: Kernel) -> Kernel:
    """`kernel` without the assignments to temporaries that nothing reads, nor the loops and branches left
    empty by that."""
    outer = kernel.outer
    fields = ("init", "step", "merge") if isinstance(outer, ParallelFold) else ("body",)
    while True:
        read = set()
        for f in fields:
            read |= _reads(getattr(outer, f))
        states = {s.name for s in outer.states} if isinstance(outer, ParallelFold) else set()
        unread = {b.name for f in fields for b in buffers(getattr(outer, f))} - read - states
        pruned = {f: _without_dead(getattr(outer, f), read, unread) for f in fields}
        if all(pruned[f] == getattr(outer, f) for f in fields):
            return dataclasses.replace(kernel, outer=outer)
        outer = dataclasses.replace(outer, **pruned)


def _reads(nodes: Iterable) -> set[str]:
    found = set()
    for node in nodes:
        found |= {name for kind, name in events(node) if kind == "read"}
        for loop in _loops(node):
            for fold in loop.folds:
                found |= _reads(fold.merge) | set(fold.results)
                found |= {n for identity in fold.identities for n in names(identity)}
    return found


def _loops(node) -> Iterable[Loop]:
    if isinstance(node, Loop):
        yield node
    if isinstance(node, (Loop, If)):
        for inner in node.body:
            yield from _loops(inner)


def _without_dead(nodes: tuple, read: set[str], unread: set[str]) -> tuple:
    kept = []
    for node in nodes:
        if isinstance(node, Assign) and _TEMPORARY.fullmatch(node.target) and node.target not in read:
            continue
        if isinstance(node, (Buffer, Store)) and (node.name if isinstance(node, Buffer) else node.target) in unread:
            continue
        if isinstance(node, (Loop, If)):
            body = _without_dead(node.body, read, unread)
            if not body and not (isinstance(node, Loop) and node.folds):
                continue
            node = dataclasses.replace(node, body=body)
        kept.append(node)
    return tuple(kept)
