"""A fold over rows whose states are small vectors summed component by component, run TILE rows side by
side, so that LLVM runs the rows in SIMD lanes.

A map whose rows are summed into a vector state (each element's steps of a loop, summed per step over the
elements: the coefficients' cotangent of Horner's rule) folds one row at a time: the row's own statements
are a chain (each step of its loop waits for the last), and the state is a buffer in memory that every row
loads and stores. Run as written, 10^6 rows of a 16-step loop take 10 ms on two cores, where the same chain
mapped over the elements, the rows innermost, takes 1.7.

Here a chunk's rows go TILE at a time:

    for group:                                  (TILE rows)
        for lane < TILE:  i = row of the lane;  the row's straight-line statements;  keep what the rest reads
        for j < 16:  for lane < TILE:  state__t[j, lane] += saved__t[j, lane]
    the chunk's last rows as before;  state[j] += state__t[j, lane] for every lane

The straight-line statements (the head of the step) run with the lane innermost: independent from lane to
lane, which LLVM vectorises. Its buffers gain a lane axis; the scalars the rest of the step reads are kept in
a buffer of TILE. The rest (the tail: loops over the states' components) runs each innermost body over the
lanes, each lane adding into its own copy of the states, which are added into the states after the chunk:
the sum's terms are added in another order (rounding aside, as any parallel sum).

It applies where every state is summed, the states hold at most MAX_STATE values, no statement calls a
transcendental function that nest_lanes runs several elements per vector call (a layer's tanh: the lanes of a
tile would call it one row at a time), and the step is a head of straight-line statements and buffers, then
loops (and statements) whose innermost bodies are straight-line and assign only names they alone read, after
assigning them.
"""

from __future__ import annotations

import math
import re

import numpy as np

from fold.kernels.cpu import vector_math
from fold.runtime.loops.nest import Assign, Buffer, Loop, ParallelFold, Store, buffers, walk
from fold.runtime.loops.text import SUBSCRIPTED, assigned, closing, events, names, reads, substitute

from . import nest_lanes

TILE = 64  # rows side by side: a loop of 64 LLVM vectorises (nest_lanes.TILE)
MAX_STATE = 256  # the most values of the states: each has TILE copies, which should stay in the first-level cache
LANE, GROUP, REST = "lane__", "group__", "rest__"
TILED = "__t"



def rows_in_tiles(fold: ParallelFold, arrays: dict[str, np.dtype]) -> tuple | None:
    """The nodes folding the rows lo <= index < hi of a chunk of `fold` TILE at a time (module docstring), or
    None where the fold does not qualify. `arrays`: the kernel's arrays' dtypes (what a head scalar read from
    one holds)."""
    states = {s.name: s for s in fold.states}
    if (fold.folds or not states or not all(s.summed and s.stored for s in fold.states)
            or sum(math.prod(s.shape) for s in fold.states) > MAX_STATE):
        return None
    step = fold.step
    if vector_math.AVAILABLE and any(isinstance(n, Assign) and nest_lanes.lane_call(n.expr) for n in walk(step)):
        return None  # nest_lanes runs its transcendental functions in vector calls, which a lane's row would not
    k = 0
    while k < len(step) and isinstance(step[k], (Assign, Store, Buffer)) and not _touches(step[k], states):
        k += 1
    head, tail = step[:k], step[k:]
    if not tail or buffers(tail) or not head:
        return None
    head_names = assigned(head) | {fold.index}  # the row's index too: each lane has its own
    if head_names & assigned(tail):
        return None
    crossing = sorted(n for n in head_names if reads(tail)[n])
    laned = {b.name: b.shape for b in buffers(head)} | {s.name: s.shape for s in fold.states}
    step_names = assigned(step)
    if not all(_lane_safe(node, head_names, step_names) for node in tail):
        return None
    dtypes = _head_dtypes(head, arrays | {b.name: b.dtype for b in buffers(head)}) | {fold.index: np.dtype(np.int64)}
    if not all(n in dtypes for n in crossing):
        return None

    def moved(node, in_tail: bool = True):
        """The node on its lane's row: the buffers and states tiled, and in the tail the head's scalars too."""
        def rename(text: str) -> str:
            kept = substitute(text, lambda n: f"{n}{TILED}[{LANE}]" if n in crossing else n) if in_tail else text
            return _subscripts_with_lane(kept, laned)

        if isinstance(node, Assign):
            return Assign(node.target, rename(node.expr))
        if isinstance(node, Store) and node.target in laned:
            index = node.index if laned[node.target] else ()
            return Store(node.target + TILED, tuple(rename(i) for i in index) + (LANE,), rename(node.expr))
        return Store(node.target, tuple(rename(i) for i in node.index), rename(node.expr))

    def in_lanes(nodes: tuple) -> tuple:
        """Each innermost straight-line run of `nodes` as a loop over the lanes."""
        out, run = [], []
        for node in nodes + (None,):
            if isinstance(node, (Assign, Store)):
                run.append(moved(node))
                continue
            if run:
                out.append(Loop(LANE, TILE, tuple(run)))
                run = []
            if isinstance(node, Loop):
                out.append(Loop(node.index, node.extent, in_lanes(node.body)))
        return tuple(out)

    tiles = [Buffer(s.name + TILED, s.shape + (TILE,), s.dtype) for s in fold.states]
    tiles += [Buffer(b.name + TILED, b.shape + (TILE,), b.dtype) for b in buffers(head)]
    tiles += [Buffer(n + TILED, (TILE,), dtypes[n]) for n in crossing]
    zero = [_each(s.shape, lambda idx, s=s: Store(s.name + TILED, idx + (LANE,), f"np.{s.dtype.name}(0)"))
            for s in fold.states]
    first = (Assign(fold.index, f"lo + {GROUP} * {TILE} + {LANE}"),
             *(moved(n, in_tail=False) for n in head if not isinstance(n, Buffer)),
             *(Store(n + TILED, (LANE,), n) for n in crossing))
    groups = Loop(GROUP, f"(hi - lo) // {TILE}", (Loop(LANE, TILE, first), *in_lanes(tail)))
    rest = Loop(REST, f"(hi - lo) % {TILE}", (Assign(fold.index, f"hi - (hi - lo) % {TILE} + {REST}"), *step))
    merged = [_each(s.shape, lambda idx, s=s: Store(s.name, idx, f"np.{s.dtype.name}({_element(s.name, idx)} + "
                                                                  f"{s.name}{TILED}[{', '.join(idx + (LANE,))}])"))
              for s in fold.states]
    return (*tiles, *zero, groups, rest, *merged)


def _touches(node, states: dict) -> bool:
    """Whether the head's candidate `node` reads, writes or stores into a state."""
    return node.name in states if isinstance(node, Buffer) else any(n in states for _, n in events(node))


def _lane_safe(node, head_names: set[str], step_names: set[str], outer: frozenset = frozenset()) -> bool:
    """Whether `node` of the tail is a loop (or a statement) whose innermost bodies are straight-line and read
    only what they assign before, the head's names, the loops' indices and names the step never assigns."""
    if isinstance(node, Loop):
        inner = outer | {node.index}
        if all(isinstance(n, (Assign, Store)) for n in node.body):
            return _straight_line_safe(node.body, head_names, step_names, inner)
        return all(isinstance(n, Loop) and _lane_safe(n, head_names, step_names, inner) for n in node.body)
    return isinstance(node, (Assign, Store)) and _straight_line_safe((node,), head_names, step_names, outer)


def _straight_line_safe(body: tuple, head_names: set[str], step_names: set[str], indices: frozenset) -> bool:
    """Whether each name `body` reads that the step assigns is assigned earlier in `body`, by the head, or is
    an index of the loops around it."""
    local: set[str] = set()
    for node in body:
        read = names(node.expr) + ([n for i in node.index for n in names(i)] if isinstance(node, Store) else [])
        if any(n in step_names and n not in local | head_names | indices for n in read):
            return False
        if isinstance(node, Assign):
            local |= set(names(node.target))
    return True


# a head statement's value: a cast to a dtype, or an element of an array
_CAST = re.compile(r"np\.(\w+)\(")


def _head_dtypes(head: tuple, arrays: dict[str, np.dtype]) -> dict[str, np.dtype]:
    """The dtypes of the head's scalars that it is plain which are: a cast's, an array element's, a copy's."""
    found: dict[str, np.dtype] = {}
    for node in head:
        if not isinstance(node, Assign) or not node.target.isidentifier():
            continue
        expr = node.expr.strip()
        cast = _CAST.match(expr)
        element = SUBSCRIPTED.match(expr)
        if cast and closing(expr, cast.end(), "()") == len(expr) - 1 and hasattr(np, cast.group(1)):
            found[node.target] = np.dtype(cast.group(1))
        elif element and element.group(1) in arrays and closing(expr, element.end()) == len(expr) - 1:
            found[node.target] = np.dtype(arrays[element.group(1)])
        elif expr in found:
            found[node.target] = found[expr]
    return found


def _each(shape: tuple, make):
    """A Store made by make(index) for every index of `shape` and every lane, as loops."""
    indices = tuple(f"j{k}__" for k in range(len(shape)))
    node = Loop(LANE, TILE, (make(indices),))
    for k in reversed(range(len(shape))):
        node = Loop(indices[k], shape[k], (node,))
    return node


def _element(name: str, idx: tuple) -> str:
    return f"{name}[{', '.join(idx) or '0'}]"


def _subscripts_with_lane(text: str, laned: dict[str, tuple]) -> str:
    """`text` with each subscript of an array in `laned` read from its tiled copy at the lane."""
    out, pos = [], 0
    for m in SUBSCRIPTED.finditer(text):
        if m.start() < pos:
            continue
        end = closing(text, m.end())
        if end < 0:
            raise ValueError(f"unbalanced subscript in {text!r}")
        inner = _subscripts_with_lane(text[m.end(): end], laned)
        name = m.group(1)
        out.append(text[pos: m.start()])
        if name in laned:
            index = f"{inner}, {LANE}" if laned[name] else LANE
            out.append(f"{name}{TILED}[{index}]")
        else:
            out.append(f"{name}[{inner}]")
        pos = end + 1
    out.append(text[pos:])
    return "".join(out)

