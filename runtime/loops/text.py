"""A loop nest's statements as Python text, which every backend compiles (Numba for the CPU, numba-cuda for
a GPU): the backends differ only in how a Buffer is allocated and how the outer traversal is split."""

from __future__ import annotations

from typing import Callable

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
