"""The loop nest: the form of a fused computation that a compiled backend lowers, whatever the backend.

A `Kernel` is one traversal of an index space `0 <= i < extent`, with its iterations independent
(`ParallelMap`: each writes its own rows of the outputs) or folded (`ParallelFold`: each contributes an element
to folds whose states are combined in order). Inside, everything is scalar statements over loops with static
trip counts: `Assign` (a scalar), `Loop` (a sequential loop), `Buffer` (a small local array, for a value that is
read more than once and costs a loop to compute) and `Store` (an element written). Expressions are text in the
scalar language the backends share (runtime/numba_backend/codegen.py's templates: Python operators, `math.*`,
NumPy casts and the NaN-aware helpers `_minimum`, `_logaddexp`, ...), so a backend needs only to say how the
outer traversal is split over its workers: chunks of a prange on the CPU, thread blocks on a GPU.

Every value the nest does not store is recomputed where it is read: a map feeding a reduce streams, and
nothing of the map's size exists. What is stored, and its bytes, is what `describe` prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np


@dataclass(frozen=True)
class Assign:
    target: str
    expr: str


@dataclass(frozen=True)
class LaneFold:
    """A commutative fold carried by a Loop: its accumulators `accs` start at `identities`, and each iteration
    folds one element in. A backend may fold the iterations into several copies of the accumulators (lanes,
    run side by side) and combine the copies after the loop: `merge` computes `results` from the states
    `left` and `right`, written in the names given here."""

    accs: tuple[str, ...]
    identities: tuple[str, ...]
    left: tuple[str, ...]
    right: tuple[str, ...]
    merge: tuple
    results: tuple[str, ...]


@dataclass(frozen=True)
class Loop:
    index: str
    extent: int | str  # a static trip count, or (only where a backend writes the loop) the text of one
    body: tuple
    folds: tuple[LaneFold, ...] = ()  # the commutative folds whose accumulators the body updates


@dataclass(frozen=True)
class Buffer:
    """A local array of a static shape, allocated where it stands (once per iteration of the loops around it)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class Store:
    target: str
    index: tuple[str, ...]
    expr: str


@dataclass(frozen=True)
class If:
    """body, where cond holds (a one-hot array's index in range)."""

    cond: str
    body: tuple


Node = Union[Assign, Loop, Buffer, Store, If]


@dataclass(frozen=True)
class Param:
    """A kernel argument: an input of the fused statements, an array constant, or an output."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    role: str  # "input", "constant" or "output"


@dataclass(frozen=True)
class ParallelMap:
    """for index in 0..extent (iterations independent): body, which stores each output's row `index`."""

    index: str
    extent: int
    body: tuple


@dataclass(frozen=True)
class State:
    """A fold's state: a scalar, or an array folded component by component (a sum over the outer axis)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    output: str  # the output parameter the final state is written to
    stored: bool = False  # a Buffer (of shape, or (1,) where shape is ()) rather than a scalar
    # folded by adding it up component by component (a sum over the outer axis, starting at zero): the merge
    # of the chunks' partials is their sum over chunks, which a backend may run as an array reduction
    summed: bool = False


@dataclass(frozen=True)
class ParallelFold:
    """The folds of an element per index: `init` sets every state to the identity, `step` folds in the
    element at `index`, `merge` folds in the states of chunk `chunk` (named `partial` + state name), in order,
    so a non-commutative operator sees its operands in order. `folds`: the states folded by a commutative
    operator, which a backend may fold in lanes within a chunk as it does an inner Loop's (LaneFold). The
    step may also store row `index` of outputs that are no state's (a map's results kept beside its folds,
    as a Futhark screma maps and reduces in one traversal)."""

    index: str
    extent: int
    states: tuple[State, ...]
    init: tuple
    step: tuple
    merge: tuple
    chunk: str = "chunk"
    partial: str = "partial_"
    folds: tuple[LaneFold, ...] = ()


Outer = Union[ParallelMap, ParallelFold]


@dataclass(frozen=True)
class Kernel:
    """`checked`: (input, low, high) for each input whose elements the kernel reads at as indices without a
    check of its own (a label per row): a backend runs the kernel only where they lie in [low, high], and
    otherwise the statements it replaced, whose gathers raise the error naming the index."""

    params: tuple[Param, ...]
    outer: Outer
    checked: tuple[tuple[str, int, int], ...] = ()

    @property
    def inputs(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.role != "output")

    @property
    def outputs(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.role == "output")

    @property
    def folded(self) -> tuple[Param, ...]:
        """The outputs a ParallelFold's states are written to after the traversal."""
        states = {s.output for s in self.outer.states} if isinstance(self.outer, ParallelFold) else set()
        return tuple(p for p in self.outputs if p.name in states)

    @property
    def mapped(self) -> tuple[Param, ...]:
        """The outputs the traversal writes row by row (all of a ParallelMap's)."""
        folded = {p.name for p in self.folded}
        return tuple(p for p in self.outputs if p.name not in folded)


def checked_inputs_hold(kernel: Kernel, args: list) -> bool:
    """Whether each input the kernel reads at as indices unchecked lies in its range (Kernel.checked); `args`:
    the values of its "input" parameters, in order (NumPy or CuPy arrays: one min and max each)."""
    values = dict(zip((p.name for p in kernel.inputs if p.role == "input"), args))
    return all(values[name].size == 0 or (low <= int(values[name].min()) and int(values[name].max()) <= high)
               for name, low, high in kernel.checked)


def walk(nodes: tuple):
    """Every node of `nodes`, each before those of its body, loops and branches entered."""
    for node in nodes:
        yield node
        if isinstance(node, (Loop, If)):
            yield from walk(node.body)


def buffers(nodes: tuple) -> list[Buffer]:
    """Every Buffer in `nodes`, loops entered."""
    return [node for node in walk(nodes) if isinstance(node, Buffer)]


def describe(kernel: Kernel) -> str:
    """The nest as indented text: the traversal, its loops and statements, and what is materialised."""
    outer = kernel.outer
    lines = [f"kernel({', '.join(f'{p.name}: {p.dtype.name}{list(p.shape)}' for p in kernel.inputs)})"
             f" -> {', '.join(f'{p.name}: {p.dtype.name}{list(p.shape)}' for p in kernel.outputs)}"]
    if isinstance(outer, ParallelMap):
        lines.append(f"  parallel map {outer.index} < {outer.extent}:")
        lines += _describe_nodes(outer.body, 4)
        body_buffers = buffers(outer.body)
    else:
        states = ", ".join(f"{s.name}: {s.dtype.name}{list(s.shape)}" for s in outer.states)
        lines.append(f"  parallel fold {outer.index} < {outer.extent} into {states}, chunks merged in order:")
        lines += _describe_nodes(outer.init, 4) + [f"    for {outer.index}:"] + _describe_nodes(outer.step, 6)
        body_buffers = buffers(outer.step)
    stored = [f"{b.name}: {b.dtype.name}{list(b.shape)} ({_nbytes(b.shape, b.dtype)} bytes per iteration)"
              for b in body_buffers]
    lines.append("  materialised: " + (", ".join(stored) if stored else "nothing but the outputs"))
    if kernel.checked:
        lines.append("  runs where " + ", ".join(f"{low} <= {name} <= {high}" for name, low, high in kernel.checked)
                     + " (checked first; else the statements it replaced)")
    return "\n".join(lines)


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _describe_nodes(nodes: tuple, indent: int) -> list[str]:
    pad, lines = " " * indent, []
    for node in nodes:
        if isinstance(node, Assign):
            lines.append(f"{pad}{node.target} = {node.expr}")
        elif isinstance(node, Store):
            lines.append(f"{pad}{node.target}[{', '.join(node.index)}] = {node.expr}")
        elif isinstance(node, Buffer):
            lines.append(f"{pad}{node.name} = buffer {node.dtype.name}{list(node.shape)}")
        elif isinstance(node, If):
            lines.append(f"{pad}if {node.cond}:")
            lines += _describe_nodes(node.body, indent + 2)
        else:
            lines.append(f"{pad}for {node.index} < {node.extent}:")
            lines += _describe_nodes(node.body, indent + 2)
    return lines
