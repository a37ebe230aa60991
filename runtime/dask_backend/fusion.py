"""Fusing a run of shard-local statements into one shard program: one Dask task per chunk, not per statement.

A sharded rule's per-chunk work (an elementwise statement, a map, a fold's per-chunk part, a scan's local
offset pass) is not submitted when the rule runs: it is recorded as a node of the open `ShardBuilder` of
its chunk (chunk k of a chunking, on its worker), and its outputs are `LazyOut` handles. Consecutive
statements on the same chunking keep adding nodes to the same builder. Only when something must cross
workers or leave the chunk (a combine's `pack`, a gather, another task's argument) is the builder flushed:
its nodes become ONE flat fold Program (cached per sharded function, compiled once per worker on the
shard backend) and ONE task per chunk, returning the tuple of the outputs still needed.

Which outputs are still needed: those whose LazyOut is alive (builders hold them by weak reference, and
the executor drops each variable after its last use), so intermediates of the run stay inside the
program and are never materialised as task results.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

from fold.inline import inline_program
from fold.ir import Program, flat_program
from fold.tracing import trace_body

from . import tasks


class Elem:
    """Element `j` of a task's tuple result (a packed state, a fused program's outputs): read by a fused
    program in place, with no task of its own to pick it out."""

    def __init__(self, packed: Any, j: int):
        self.packed, self.j = packed, j


class LazyOut:
    """Output `j` of node `node` of a ShardBuilder: a value of a chunk that no task has computed yet."""

    def __init__(self, builder: "ShardBuilder", node: int, j: int):
        self.builder, self.node, self.j = builder, node, j
        self.elem: Elem | None = None     # where it lives once its builder is flushed
        self.future: Any = None           # a future of the value alone (made only if a task needs one)

    __slots__ = ("builder", "node", "j", "elem", "future", "__weakref__")


class ShardBuilder:
    """The shard-local statements recorded for one chunk since its last flush, run as one task on flush."""

    def __init__(self, worker: str | None, label: str):
        self.worker, self.label = worker, label
        self.nodes: list[tuple[tuple, Program, list]] = []   # (cache tag, flat Program, its inputs)
        self.handed: list[tuple[int, int, weakref.ref]] = []
        self.closed = False

    def add(self, what: tuple, program: Program, inputs: Sequence[Any]) -> list[LazyOut]:
        index = len(self.nodes)
        self.nodes.append((what, program, list(inputs)))
        outs = [LazyOut(self, index, j) for j in range(len(program.outputs))]
        self.handed += [(index, j, weakref.ref(o)) for j, o in enumerate(outs)]
        return outs

    def flush(self, ctx: Any) -> None:
        """Submit the recorded nodes as one shard program (one task); alive LazyOuts learn where they live."""
        if self.closed:
            return
        self.closed = True
        sources: list[Any] = []           # the distinct futures / arrays the task receives
        source_ids: dict[int, int] = {}
        slots: list[tuple[int, int | None]] = []   # program input m: (source, element or None for the whole)
        slot_ids: dict[tuple, int] = {}
        wiring = []                       # per node, per input: ("node", i, j) or ("in", m)
        for what, program, inputs in self.nodes:
            wired = []
            for x in inputs:
                if isinstance(x, LazyOut) and x.builder is self:
                    wired.append(("node", x.node, x.j))
                    continue
                if isinstance(x, LazyOut):
                    x = ctx.elem(x)
                src, j = (x.packed, x.j) if isinstance(x, Elem) else (x, None)
                if id(src) not in source_ids:
                    source_ids[id(src)] = len(sources)
                    sources.append(src)
                slot = (source_ids[id(src)], j)
                if slot not in slot_ids:
                    slot_ids[slot] = len(slots)
                    slots.append(slot)
                wired.append(("in", slot_ids[slot]))
            wiring.append(tuple(wired))
        alive = [(i, j, ref()) for i, j, ref in self.handed]
        alive = [(i, j, o) for i, j, o in alive if o is not None]
        exports = tuple((i, j) for i, j, _ in alive)
        in_avals: list = [None] * len(slots)
        for (_, program, _), wired in zip(self.nodes, wiring):
            for aval, w in zip(program.in_avals, wired):
                if w[0] == "in":
                    in_avals[w[1]] = aval
        what = ("fused", tuple(n[0] for n in self.nodes), tuple(wiring), exports)
        key, program = ctx.program(what, lambda: fused_program(self.nodes, wiring, in_avals, exports, self.label))
        packed = ctx.submit(tasks.run_fused, key, program, ctx.backend, sources, slots, ctx.threads.get(self.worker),
                            worker=self.worker, name="shard")
        for pos, (_, _, o) in enumerate(alive):
            o.elem = Elem(packed, pos)
        self.nodes, self.handed = [], []


def fused_program(nodes: list, wiring: list, in_avals: list, exports: tuple, label: str) -> Program:
    """One flat Program: the nodes' programs inlined in order, wired to each other and to the inputs."""

    def body(*xs):
        outs: list[list] = []
        for (_, program, _), wired in zip(nodes, wiring):
            operands = [xs[w[1]] if w[0] == "in" else outs[w[1]][w[2]] for w in wired]
            outs.append(list(inline_program(program, operands)))
        return [outs[i][j] for i, j in exports]

    return flat_program(trace_body(body, in_avals, f"shard program ({label})").program)
