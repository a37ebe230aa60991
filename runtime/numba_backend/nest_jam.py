"""A traversal's sweeps of a shared matrix run for ROWS rows at once (unroll and jam), the rest row by row.

A map body that multiplies a captured matrix by its row (k-means' distances C @ p, a layer's W @ x, and the
same product recomputed in their gradients) sweeps the whole matrix once per row: for a matrix past the
first-level cache every element is loaded from the second level for one multiply-add. Swept for ROWS rows
at once, each element loaded serves ROWS rows (the register tile of a BLAS kernel, and of
kernels/cpu/product_fold.py):

    for group:                                    (ROWS rows: lo + group * ROWS + r, the last clamped to hi - 1)
        the sweeps, each statement that depends on the row written once per row, the others once
        for row < ROWS (fewer in a chunk's last group):  index = the row;  the rest of the step, reading
                                                         row `row` of the sweeps' buffers

A sweep is a run of the step's top-level nodes that starts with Buffers, stores only into them, and reads
nothing the rest of the step computes: only the row's index, the kernel's inputs (never written), its own
names and its buffers. It can therefore run first, for several rows, before the rest of each row's step. The
rows still run the rest in order, and each row's sweep does the same arithmetic in the same order as
before, so the results are bitwise the same.
"""

from __future__ import annotations

import re

from fold.runtime.loops.nest import Assign, Buffer, If, Loop, Store, buffers, walk
from fold.runtime.loops.text import SUBSCRIPTED, assigned, closing, names, reads, size, substitute

from . import nest_parts

ROWS = 4  # rows per group: four rows' accumulators of a vectorised sweep fit the sixteen vector registers
GROUP, ROW = "jam__g", "jam__r"
JAMMED = "__j"
# a sweep is jammed where an input it reads the same for every row is at least this large (more than 32 KB):
# past the first-level cache each element comes from the second level for one row's multiply-add, and
# jamming reuses it; within it, the rows' extra accumulators and the row values they broadcast cost more than
# they save. Measured on the 2-core VM (L1d 48 KB) in one process (benchmarks/README.md, session 70), jammed
# against row by row, k-means' matrix form over 10^5 points, forward / gradient / HVP: float64 32 x 256 (64
# KB) 0.73 / 0.66 / 0.67; at 32 KB, float64 64 x 64 forward 1.21 and a layer's W of 64 x 64 float64 1.17,
# float32 32 x 256 0.90 / 0.68 / 0.93; at 8-16 KB 1.14-1.18 forward
MIN_SHARED_BYTES = 32769


def rows_jammed(index: str, step: tuple, read_only: dict[str, int]) -> tuple | None:
    """The nodes running the rows lo <= `index` < hi of a chunk with their sweeps jammed (module docstring),
    or None where the step has no sweep worth it, or jamming would make it too long to compile whole.
    `read_only`: the bytes of each array the kernel never writes (its inputs and constants), by name."""
    sweeps = _sweeps(index, step, read_only)
    if not sweeps:
        return None
    in_sweeps = {id(n) for run in sweeps for n in run}
    jammed_buffers = [b for run in sweeps for b in _buffers_of(run)]
    rest = tuple(n for n in step if id(n) not in in_sweeps)
    base = f"lo + {GROUP} * {ROWS}"
    rows = tuple(Assign(_row_name(index, r), f"min({base} + {r}, hi - 1)") for r in range(ROWS))
    body = [*rows]
    for run in sweeps:
        body += _jammed(index, run)
    body.append(Loop(ROW, f"min({ROWS}, hi - ({base}))",
                     (Assign(index, f"{base} + {ROW}"), *_rows_of(rest, [b.name for b in jammed_buffers]))))
    nodes = (*(Buffer(b.name + JAMMED, (ROWS, *b.shape), b.dtype) for b in jammed_buffers),
             Loop(GROUP, f"(hi - lo + {ROWS - 1}) // {ROWS}", tuple(body)))
    return nodes if size(nodes) <= nest_parts.WHOLE else None


def _sweeps(index: str, step: tuple, read_only: dict[str, int]) -> list[tuple]:
    """The step's sweeps: runs of top-level nodes, each one-dimensional Buffers and the loops that fill them."""
    found, k = [], 0
    while k < len(step):
        end = k
        while end < len(step) and isinstance(step[end], Buffer) and len(step[end].shape) == 1:
            end += 1
        if end == k:
            k += 1
            continue
        filled = {b.name for b in step[k:end]}
        start = end
        while end < len(step) and _fills(step[end], filled):
            end += 1
        run = step[k:end]
        if end > start and _independent(index, run, step[:k], step[end:], read_only):
            found.append(run)
            k = end
        else:  # a run from the next Buffer on may still be one (a product's sums after a buffer of the row's own)
            k += 1
    return found


def _buffers_of(run: tuple) -> list[Buffer]:
    return [n for n in run if isinstance(n, Buffer)]


def _fills(node, buffers_: set[str]) -> bool:
    """Whether `node` is a loop that stores into `buffers_`, and only into them, with no branch."""
    return (isinstance(node, Loop) and _stores_only(node, buffers_)
            and any(isinstance(n, Store) for n in walk(node.body)))


def _stores_only(node, buffers_: set[str]) -> bool:
    if isinstance(node, If):
        return False
    if isinstance(node, Store):
        return node.target in buffers_
    if isinstance(node, Loop):
        return all(_stores_only(n, buffers_) for n in node.body)
    return True


def _independent(index: str, run: tuple, before: tuple, after: tuple, read_only: dict[str, int]) -> bool:
    """Whether `run` reads nothing the rest of the step computes (only the row's index, read-only inputs,
    its buffers and its own names, so it may run before the step's other nodes), its names are its own, its
    buffers are read after it only element by element, and its loops read an input of more than
    MIN_SHARED_BYTES the same for every row."""
    jammed, own = {b.name for b in _buffers_of(run)}, assigned(run)
    elsewhere = assigned(before) | assigned(after)
    if own & (elsewhere | set(reads(after))) or any(b.name in jammed for b in buffers(before + after)):
        return False
    for node in walk(run):
        texts = ([node.expr, *(node.index if isinstance(node, Store) else ())] if isinstance(node, (Assign, Store))
                 else [node.extent] if isinstance(node, Loop) and isinstance(node.extent, str) else [])
        for text in texts:
            if set(names(text)) & elsewhere:
                return False
            if any(a not in jammed and a not in read_only for a in SUBSCRIPTED.findall(text)):
                return False
    row = _row_dependent(index, run)
    if any(isinstance(n, Loop) and isinstance(n.extent, str) and set(names(n.extent)) & row for n in walk(run)):
        return False
    after_reads = reads(after)
    if any(after_reads[b] != sum(len(_subscripts_of(b).findall(t)) for t in _texts(after)) for b in jammed):
        return False  # a buffer read whole (its shape, or passed on): not a row of the jammed one
    shared = {a for n in _statements(run) for a in _shared_reads(n.expr, row, jammed)}
    return any(read_only[a] >= MIN_SHARED_BYTES for a in shared)


def _subscripts_of(*arrays: str) -> re.Pattern:
    """A pattern matching where any of `arrays` is subscripted (its name and the opening bracket)."""
    return re.compile(rf"(?<![\w.])({'|'.join(map(re.escape, arrays))})\[")


def _texts(nodes: tuple):
    """Every expression, index and trip count written as text in `nodes`."""
    for node in walk(nodes):
        if isinstance(node, Assign):
            yield node.expr
        elif isinstance(node, Store):
            yield from (*node.index, node.expr)
        elif isinstance(node, Loop) and isinstance(node.extent, str):
            yield node.extent
        elif isinstance(node, If):
            yield node.cond


def _shared_reads(expr: str, row: set[str], jammed: set[str]):
    """The inputs (not the jammed buffers) `expr` reads at a subscript that is the same for every row."""
    for m in SUBSCRIPTED.finditer(expr):
        if m.group(1) not in jammed and not set(names(expr[m.end():closing(expr, m.end())])) & row:
            yield m.group(1)


def _row_dependent(index: str, run: tuple) -> set[str]:
    """The names whose values differ from row to row: the index, the buffers, and what any assignment to a
    name computes from them (to a fixed point: an accumulator starting at a constant is the row's too)."""
    row = {index, *(b.name for b in _buffers_of(run))}
    statements = [n for n in _statements(run) if isinstance(n, Assign)]
    changed = True
    while changed:
        changed = False
        for node in statements:
            targets = set(names(node.target))
            if not targets <= row and set(names(node.expr)) & row:
                row |= targets
                changed = True
    return row


def _jammed(index: str, run: tuple) -> list:
    """The run's loops with each statement that depends on the row written once per row."""
    row = _row_dependent(index, run)
    jammed = {b.name for b in _buffers_of(run)}
    subscripts = _subscripts_of(*jammed)

    def copy(text: str, r: int) -> str:
        renamed = substitute(text, lambda n: _row_name(n, r) if n in row and n not in jammed else n)
        return subscripts.sub(lambda m: f"{m.group(1)}{JAMMED}[{r}, ", renamed)

    def nodes(body: tuple) -> list:
        out = []
        for node in body:
            if isinstance(node, Loop):
                out.append(Loop(node.index, node.extent, tuple(nodes(node.body))))
            elif isinstance(node, Store):
                out += [Store(node.target + JAMMED, (str(r), *(copy(i, r) for i in node.index)), copy(node.expr, r))
                        for r in range(ROWS)]
            elif set(names(node.target)) & row:
                out += [Assign(copy(node.target, r), copy(node.expr, r)) for r in range(ROWS)]
            else:
                out.append(node)
        return out

    return nodes(tuple(n for n in run if not isinstance(n, Buffer)))


def _rows_of(rest: tuple, jammed: list[str]) -> tuple:
    """The rest of the step, reading row ROW of each jammed buffer."""
    pattern = _subscripts_of(*jammed)

    def text(t: str) -> str:
        return pattern.sub(lambda m: f"{m.group(1)}{JAMMED}[{ROW}, ", t)

    def node(n):
        if isinstance(n, Assign):
            return Assign(n.target, text(n.expr))
        if isinstance(n, Store):
            if n.target in jammed:
                return Store(n.target + JAMMED, (ROW, *map(text, n.index)), text(n.expr))
            return Store(n.target, tuple(map(text, n.index)), text(n.expr))
        if isinstance(n, Loop):
            return Loop(n.index, text(n.extent) if isinstance(n.extent, str) else n.extent, tuple(map(node, n.body)),
                        n.folds)
        if isinstance(n, If):
            return If(text(n.cond), tuple(map(node, n.body)))
        return n

    return tuple(map(node, rest))


def _row_name(name: str, r: int) -> str:
    return f"{name}{JAMMED}{r}"


def _statements(nodes: tuple):
    return (n for n in walk(nodes) if isinstance(n, (Assign, Store)))


def _indices(nodes: tuple) -> set[str]:
    return {n.index for n in walk(nodes) if isinstance(n, Loop)}
