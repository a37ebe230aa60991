"""A long loop-nest body compiled as several functions of at most PART statements each, called in turn.

Numba's compile time of one function grows faster than its length (type inference and the parallel
lowering of a prange body both walk the whole function, repeatedly): a nest kernel of 573 lines took 40 s
here, most of it before LLVM. A part is a consecutive run of a block's statements (inner blocks split
first), outlined into `def part_k(inputs...)` that returns the values it assigns and something later reads;
the block then calls it. Each part is compiled on its own, and the kernel that calls the parts stays short,
so the compile time grows with the number of parts, each of bounded size.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from fold.runtime.loops.nest import Assign, Buffer, If, Loop
from fold.runtime.loops.text import defined, events, size, statement_lines

# the most statements of one part, and the fewest worth a call
PART = 48
MIN_PART = 8
# a body of at most this many statements is compiled whole: it compiles in seconds, and its hot loops call
# nothing (k-means' and the logsumexp gradient's nests are below it)
WHOLE = 400

class Outliner:
    """Splits blocks into parts; `sources` collects the parts' function texts."""

    def __init__(self, variables: set[str], total: Counter, prefix: str = "part"):
        self.variables = variables  # every name the kernel defines (the rest are module globals)
        self.total = total  # uses of each name in the whole kernel
        self.prefix = prefix
        self.sources: list[str] = []
        self.names: list[str] = []

    def block(self, nodes: tuple) -> tuple:
        """`nodes` with their inner blocks split, then their own runs of statements outlined."""
        nodes = tuple(self._inner(n) for n in nodes)
        if size(nodes) <= PART:
            return nodes
        out, run = [], []
        for node in nodes:
            if run and size(run) + size([node]) > PART:
                out += self._outlined(run)
                run = []
            run.append(node)
        out += self._outlined(run)
        return tuple(out)

    def _inner(self, node):
        if isinstance(node, Loop):
            return Loop(node.index, node.extent, self.block(node.body), node.folds)
        if isinstance(node, If):
            return If(node.cond, self.block(node.body))
        return node

    def _outlined(self, run: list) -> list:
        if size(run) < MIN_PART or any(isinstance(n, Buffer) for n in run):
            return run
        inputs, written, seen = [], [], set()
        for kind, name in (e for node in run for e in events(node)):
            if name not in self.variables:
                continue
            if name not in seen:
                seen.add(name)
                (written if kind == "write" else inputs).append(name)
            elif kind == "write" and name not in written:
                written.append(name)
        inside = uses(run)
        outputs = [n for n in written if self.total[n] > inside[n]]
        name = f"{self.prefix}{len(self.sources)}"
        body = _lines(run, 4)
        results = ", ".join(outputs) + ","
        self.sources.append("\n".join([f"def {name}({', '.join(inputs)}):", *body,
                                       f"    return ({results})" if outputs else "    return 0"]))
        self.names.append(name)
        return [Assign(results if outputs else "_", f"{name}({', '.join(inputs)})")]


def uses(nodes: Iterable) -> Counter:
    """How often each name is read, written or stored into in `nodes`."""
    return Counter(name for node in nodes for _, name in events(node))


def _lines(nodes, indent: int) -> list[str]:
    return statement_lines(tuple(nodes), indent, lambda b, i: "", hoisted=True)


def kernel_variables(*blocks: Iterable, extra: Iterable[str] = ()) -> set[str]:
    """Every name the blocks define, and `extra`."""
    return set(extra).union(*(defined(nodes) for nodes in blocks))
