"""A loop nest's statements as Python text, which every backend compiles (Numba for the CPU, numba-cuda for
a GPU): the backends differ only in how a Buffer is allocated and how the outer traversal is split."""

from __future__ import annotations

import re
from collections import Counter
from typing import Callable, Iterable, Iterator

from .nest import Assign, Buffer, If, Loop, Store, buffers

Allocate = Callable[[Buffer, int], str]  # a Buffer and an indent -> the line that allocates it


def statement_lines(nodes: tuple, indent: int, allocate: Allocate, hoisted: bool = False) -> list[str]:
    """The nodes' lines; `hoisted`: their buffers are allocated before (allocations(...)), not where they stand."""
    pad, lines = " " * indent, []
    for node in nodes:
        if isinstance(node, Assign):
            lines.append(f"{pad}{node.target} = {node.expr}")
        elif isinstance(node, Store):
            lines.append(f"{pad}{node.target}[{', '.join(node.index) or '0'}] = {node.expr}")
        elif isinstance(node, Buffer):
            if not hoisted:
                lines.append(allocate(node, indent))
        elif isinstance(node, (Loop, If)):
            head = f"for {node.index} in range({node.extent}):" if isinstance(node, Loop) else f"if {node.cond}:"
            lines.append(pad + head)
            lines += statement_lines(node.body, indent + 4, allocate, hoisted) or [f"{pad}    pass"]
    return lines


def allocations(nodes: tuple, indent: int, allocate: Allocate) -> list[str]:
    """The lines allocating every Buffer in `nodes` (loops entered), for statement_lines(..., hoisted=True)."""
    return [allocate(b, indent) for b in buffers(nodes)]


def shape_text(shape: tuple[int, ...]) -> str:
    """A Buffer's shape as a tuple literal ((1,) for a 0-d one, which is stored at [0])."""
    return f"({', '.join(map(str, shape or (1,)))},)"


# a name in the scalar language, not an attribute (the `exp` of math.exp)
_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*")


def names(text: str) -> list[str]:
    """The names an expression (or a target list) mentions, in order."""
    return _NAME.findall(text)


def substitute(text: str, replace: Callable[[str], str]) -> str:
    """`text` with each name it mentions replaced by replace(name)."""
    return _NAME.sub(lambda m: replace(m.group(0)), text)


# names a nest assigns more than once (accumulators, fold states), and the arrays it reads that are never
# written (kernel inputs and constants): an expression reading the first, or reading any other array, is
# not pure, since what it reads may change between two places it is written
REASSIGNED = re.compile(r"(acc|s|state)\d+")
_READ_ONLY_ARRAY = re.compile(r"(in|k)\d+")
# where an array is subscripted: its name (group 1) and the opening bracket
SUBSCRIPTED = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\[")


def reads_only_inputs(expr: str) -> bool:
    """Whether every array `expr` subscripts is a kernel input or constant (never written)."""
    return all(_READ_ONLY_ARRAY.fullmatch(a) for a in SUBSCRIPTED.findall(expr))


def closing(text: str, start: int, brackets: str = "[]") -> int:
    """Where the bracket opened just before `start` closes (-1: it does not)."""
    depth = 1
    for k in range(start, len(text)):
        depth += {brackets[0]: 1, brackets[1]: -1}.get(text[k], 0)
        if depth == 0:
            return k
    return -1


def pure(expr: str) -> bool:
    """Whether `expr` has the same value wherever it is written while the names it reads are in scope."""
    return not any(REASSIGNED.fullmatch(n) for n in names(expr)) and reads_only_inputs(expr)


def events(node) -> Iterator[tuple[str, str]]:
    """("read" | "write" | "store", name) in execution order within one pass over `node`: "store" names the
    array a Store writes into (an element, not the name)."""
    if isinstance(node, Assign):
        yield from (("read", n) for n in names(node.expr))
        yield from (("write", n) for n in names(node.target))
    elif isinstance(node, Store):
        yield "store", node.target
        yield from (("read", n) for part in (*node.index, node.expr) for n in names(part))
    elif isinstance(node, (Loop, If)):
        if isinstance(node, Loop):
            yield from (("read", n) for n in names(str(node.extent)))  # a trip count written as text reads names
            yield "write", node.index
        else:
            yield from (("read", n) for n in names(node.cond))
        for inner in node.body:
            yield from events(inner)


def assigned(nodes: Iterable) -> set[str]:
    """The names `nodes` assign (loops and branches entered), loop indices and buffers not counted."""
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, Assign):
            found |= set(names(node.target))
        elif isinstance(node, (Loop, If)):
            found |= assigned(node.body)
    return found


def reads(nodes: Iterable) -> Counter:
    """How often each name is read in `nodes` (a Store's array not counted)."""
    return Counter(name for node in nodes for kind, name in events(node) if kind == "read")


def defined(nodes: Iterable) -> set[str]:
    """Every name `nodes` define: assignment targets, loop indices and buffers, loops and branches entered."""
    found = set()
    for node in nodes:
        found |= {name for kind, name in events(node) if kind == "write"}
        found |= {b.name for b in buffers((node,))}
    return found


def size(nodes: Iterable) -> int:
    """The number of nodes, loops and branches entered."""
    return sum(1 + (size(n.body) if isinstance(n, (Loop, If)) else 0) for n in nodes)


def work(nodes: Iterable) -> int:
    """How many nodes a pass over `nodes` runs: as `size`, with a loop's body counted once per iteration
    (a trip count known only at run time counts once, a branch as if taken)."""
    return sum(1 + (work(n.body) * (n.extent if isinstance(n, Loop) and isinstance(n.extent, int) else 1)
                    if isinstance(n, (Loop, If)) else 0) for n in nodes)
