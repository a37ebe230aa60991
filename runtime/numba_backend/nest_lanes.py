"""A loop nest's innermost loops rewritten to run WIDTH iterations side by side, so that a transcendental
function (exp, log, tanh, logaddexp, ...) is computed for WIDTH elements in one call of kernels.cpu.vector_math
(WIDE where the loop's transcendentals are all float32 ones with an eight-lane form: one AVX2 register).

Numba calls libm once per element inside a loop, and LLVM cannot vectorise around the call (the vector
library option has no effect in Numba's llvmlite; see vector_math). The elementwise kernels avoid that with a
mapper's lane form (kernels.cpu.lanes); this is the same for the statements of a loop nest, written as nest
nodes, so every backend that prints them (kernel_source) needs nothing more.

A loop is rewritten where its body is straight-line (assignments and stores) and some statement with a lane
rule (codegen.LANE_RULES) does not depend on a value carried from one iteration to the next. Per group of
WIDTH iterations:

1. every statement that depends on no carried value, statement by statement across the lanes, the ones with
   a lane rule as one vector call;
2. then, lane after lane in iteration order, the statements that read or write a carried value, and the
   stores: a non-commutative fold still sees its elements in order.

A commutative fold's accumulators (the Loop's LaneFolds) are not carried: each lane folds into a copy of its
own, started at the identity, and the copies are combined with the fold's operator after the loop, so a
logaddexp or a sum over a row runs WIDTH elements at a time. That reassociates the fold, which its
operator's commutativity and associativity allow (rounding aside). The iterations that do not fill a group run the loop's body
as it was.

The outer traversal runs in lanes the same way (outer_in_lanes) where its body has a transcendental function
that no innermost loop would run in lanes: tanh of each row's dot product, a log-sigmoid of a row's score.
WIDTH rows then go side by side through the body; its inner loops run once for all of them, each statement
written once per lane (a lane rule's as one vector call), so each row folds its own elements in its own
order, and only the outer fold's commutative states are split.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from typing import Iterable

from fold.kernels.cpu import vector_math
from fold.runtime.loops.nest import Assign, Buffer, If, LaneFold, Loop, ParallelFold, ParallelMap, Store, buffers
from fold.runtime.loops.text import assigned as written, events, names, reads, size

from .codegen import LANE_RULES

# four iterations side by side (the intrinsics' four-lane forms); eight (WIDE) where every transcendental of
# the loop is a float32 one libmvec computes eight at a time in an AVX2 register (half the calls), as long as
# the statements it adds fit the budget (MAX_ADDED), else four
WIDTH = 4
WIDE = 8
# the fewest iterations of a loop per call (its extent times its enclosing loops') that take eight lanes: each
# pays half a nanosecond less per exp, and a kernel written in eight lanes compiles 0.1-0.6 s longer (the
# natural row-wise logsumexp's gradient 1.1 -> 1.6 s), which a small program would never win back
WIDE_MIN_ITERATIONS = 2 ** 20
# the fewest iterations worth a rewrite: at least two groups
MIN_EXTENT = 2 * WIDTH
# the most statements the rewrites may add to one kernel: Numba's compile time grows faster than the text
# (a three-deep nest's Hessian-vector product: 357 lines, 13 s; all its loops in lanes, 1177 lines, 60-90 s)
MAX_ADDED = 300
# a commutative fold over at least this many elements (a row's maximum, a dot product) is split into a copy
# per lane even where no statement has a lane rule: WIDTH independent chains of its operator, where one
# chain waits for each previous result (a row maximum of 8192 float32: 16 ms serial, 8 in lanes, per 2048 rows)
SPLIT_EXTENT = 16

# the scalar language's call of an operation (runtime/loops/scalar_language.py) -> the operation
_CALLS = {"math.exp": "exp", "math.expm1": "expm1", "_log": "log", "_log1p": "log1p", "math.sin": "sin",
          "math.cos": "cos", "math.tanh": "tanh", "_sigmoid": "sigmoid", "_logaddexp": "logaddexp"}
IMPORTS = vector_math.NAMES


def in_lanes(nodes: tuple, reads_outside: Counter | None = None, runs: int = 1) -> tuple:
    """`nodes` with the innermost loops that gain from it run in lanes, in order while the statements they
    add stay within MAX_ADDED (the rest as they were). `runs`: how often `nodes` run per call of the kernel
    (the traversal's extent)."""
    if not vector_math.AVAILABLE:
        return nodes
    return _in_lanes(nodes, reads(nodes) if reads_outside is None else reads_outside, [MAX_ADDED], runs)


def _in_lanes(nodes: tuple, total: Counter, budget: list[int], runs: int) -> tuple:
    out = []
    for node in nodes:
        if isinstance(node, Loop):
            iterations = runs * (1 if isinstance(node.extent, str) else node.extent)  # a dynamic one: at least once
            node = Loop(node.index, node.extent, _in_lanes(node.body, total, budget, iterations), node.folds)
            long_fold = node.folds and not isinstance(node.extent, str) and node.extent >= SPLIT_EXTENT
            laned = _laned(node, total, split_alone=bool(long_fold), iterations=iterations)
            added = size(laned) - size([node])
            if added > budget[0]:  # eight lanes add twice the statements of four
                laned = _laned(node, total, split_alone=bool(long_fold), width=WIDTH)
                added = size(laned) - size([node])
            if added > budget[0]:
                laned = [node]
            else:
                budget[0] -= added
            out += laned
        elif isinstance(node, If):
            out.append(If(node.cond, _in_lanes(node.body, total, budget, runs)))
        else:
            out.append(node)
    return tuple(out)


def lane_call(expr: str) -> tuple[str, str, list[str]] | None:
    """(operation, dtype, argument texts) of `np.<dtype>(<call>(<args>))`, where <call> has a lane form."""
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None
    if not (isinstance(tree, ast.Call) and len(tree.args) == 1 and isinstance(tree.func, ast.Attribute)
            and isinstance(tree.func.value, ast.Name) and tree.func.value.id == "np"
            and tree.func.attr in ("float32", "float64") and isinstance(tree.args[0], ast.Call)):
        return None
    call = tree.args[0]
    op = _CALLS.get(ast.unparse(call.func))
    if op is None:
        return None
    dtype = tree.func.attr
    if (op, dtype) not in LANE_RULES and (op, "float64") not in LANE_RULES:
        return None
    return op, dtype, [ast.unparse(a) for a in call.args]


def outer_in_lanes(outer: ParallelMap | ParallelFold, reads_outside: Counter) -> tuple | None:
    """The nodes running the indices lo <= index < hi of a chunk of `outer` WIDTH at a time, where its body has
    loops and transcendental functions that no innermost loop would run in lanes (_pays_outside); None where
    it has none, a value is carried that a lane cannot have its own copy of, or the body would grow by more
    than MAX_ADDED statements. A fold's commutative states are split into a copy per lane."""
    body = outer.body if isinstance(outer, ParallelMap) else outer.step
    if not vector_math.AVAILABLE or all(isinstance(n, (Assign, Store)) for n in body) or not _pays_outside(body):
        return None
    loop = _chunk_loop(outer.index, body, () if isinstance(outer, ParallelMap) else outer.folds)
    total = reads_outside + reads([loop])
    laned = _laned(loop, total, nested=True, iterations=outer.extent)
    if size(laned) - size([loop]) > MAX_ADDED:
        laned = _laned(loop, total, nested=True, width=WIDTH)
    if laned == [loop] or size(laned) - size([loop]) > MAX_ADDED:
        return None
    return tuple(laned)


def _chunk_loop(index: str, body: tuple, folds: tuple) -> Loop:
    """A chunk's indices lo <= index < hi as one loop of a dynamic extent."""
    offset = f"{index}__c"
    return Loop(offset, "hi - lo", (Assign(index, f"lo + {offset}"), *body), folds)


def _pays_outside(nodes: tuple) -> bool:
    """Whether the statements with a lane rule that in_lanes leaves scalar (outside any loop, or in a loop
    that is not an innermost straight-line one long enough for lanes) run more often than those it runs in
    lanes: a row's tanh after its dot product, not a row's log after a thousand exps (there the row's own
    loop in lanes reads its elements contiguously and folds them in copies; side by side, a logsumexp
    gradient over rows of 1000 took 1.07-1.21x as long)."""
    left, laned = _lane_calls(nodes, 1)
    return left > laned


def _lane_calls(nodes: tuple, runs: int) -> tuple[int, int]:
    """(left scalar, run in lanes by in_lanes): the statements with a lane rule, each counted as often as its
    loops run it per pass over `nodes` (a loop of a dynamic extent counted as MIN_EXTENT iterations)."""
    left = laned = 0
    for node in nodes:
        if isinstance(node, Assign) and lane_call(node.expr):
            left += runs
        elif isinstance(node, (Loop, If)):
            trips = 1 if isinstance(node, If) else (MIN_EXTENT if isinstance(node.extent, str) else node.extent)
            innermost = isinstance(node, Loop) and all(isinstance(n, (Assign, Store)) for n in node.body)
            inner_left, inner_laned = _lane_calls(node.body, runs * trips)
            if innermost and trips >= MIN_EXTENT:
                inner_left, inner_laned = 0, inner_left
            left, laned = left + inner_left, laned + inner_laned
    return left, laned


def chunk_in_lanes(fold: ParallelFold, reads_outside: Counter) -> tuple | None:
    """The nodes folding the elements lo <= index < hi of a chunk of `fold` in lanes: its commutative states
    (ParallelFold.folds) split into a copy per lane, so that the chunk's running values no longer wait for one
    another (a float sum's add waits for the last one in a single accumulator) and its transcendental functions
    run WIDTH at a time; None where the step cannot be (not straight-line, no such state)."""
    if not fold.folds:
        return None
    loop = _chunk_loop(fold.index, fold.step, fold.folds)
    total = reads_outside + reads([loop])
    if vector_math.AVAILABLE and any(lane_call(n.expr) for n in fold.step if isinstance(n, Assign)):
        laned = _laned(loop, total, split_alone=True, iterations=fold.extent)
        return None if laned == [loop] else tuple(laned)
    return _tiled(loop, {s.name: s.dtype for s in fold.states}, total, fold.index)


# Copies of a fold's accumulators in the tiled form: a loop of 32 or fewer iterations LLVM unrolls into scalar
# chains; one of 64 it vectorises (kernels.cpu.reduce.TILE, checked there in the assembly)
TILE = 64


def _tiled(loop: Loop, dtypes: dict, reads_total: Counter, index: str) -> tuple | None:
    """The loop (of a dynamic extent) with its folds' accumulators in TILE-element buffers, element j folding
    the iterations j mod TILE: the loop over one tile is elementwise, which LLVM turns into SIMD instructions
    (Numba leaves the SLP vectoriser off, so WIDTH scalar copies would stay scalar). Within a tile, arrays
    are subscripted by `index` as an unsigned integer: Numba checks a signed one for a negative index to wrap,
    and LLVM does not vectorise a loop with that branch in it (a sum of squares of 10^7 float32: 6.6 ms
    signed, 2.8 ms unsigned). None where a value other than the accumulators is carried from one iteration to
    the next, or the body stores."""
    body = loop.body
    if not all(isinstance(n, Assign) for n in body) or not all(
            isinstance(n, Assign) for fold in loop.folds for n in fold.merge):
        return None
    accs = [acc for fold in loop.folds for acc in fold.accs]
    assigned, seen = {n.target for n in body}, set()
    for node in body:
        if {n for n in names(node.expr) if n in assigned and n not in seen} - set(accs):
            return None  # read before it is assigned: carried
        seen.add(node.target)
    body_reads = reads(body)
    if any(reads_total[n] > body_reads[n] for n in assigned - set(accs)):
        return None
    n, group, lane = f"{loop.index}__n", f"{loop.index}__g", f"{loop.index}__t"
    tiles = {acc: f"{acc}__tile" for acc in accs}
    nodes: list = [Assign(n, str(loop.extent))]
    for fold in loop.folds:  # element 0 goes on from the accumulator's value, the others from the identity
        for acc, identity in zip(fold.accs, fold.identities):
            nodes += [Buffer(tiles[acc], (TILE,), dtypes[acc]),
                      Loop(lane, TILE, (Store(tiles[acc], (lane,), identity),)), Store(tiles[acc], ("0",), acc)]
    unsigned, subscript = f"{index}__u", re.compile(rf"\[{re.escape(index)}(?=[\],])")
    within = []
    for node in body:
        within.append(Assign(node.target, subscript.sub(f"[{unsigned}", node.expr)))
        if node.target == index:
            within.append(Assign(unsigned, f"np.uint64({index})"))
    per_element = [Assign(loop.index, f"{group} * {TILE} + {lane}"),
                   *(Assign(acc, f"{tiles[acc]}[{lane}]") for acc in accs), *within,
                   *(Store(tiles[acc], (lane,), acc) for acc in accs)]
    nodes.append(Loop(group, f"{n} // {TILE}", (Loop(lane, TILE, tuple(per_element)),)))
    merged = []
    for fold in loop.folds:
        merged += [Assign(left, acc) for left, acc in zip(fold.left, fold.accs)]
        merged += [Assign(right, f"{tiles[acc]}[{lane} + 1]") for right, acc in zip(fold.right, fold.accs)]
        merged += list(fold.merge) + [Assign(acc, r) for acc, r in zip(fold.accs, fold.results)]
    nodes += [Assign(acc, f"{tiles[acc]}[0]") for acc in accs]
    nodes.append(Loop(lane, TILE - 1, tuple(merged)))
    rest = f"{loop.index}__r"
    nodes.append(Loop(rest, f"{n} % {TILE}", (Assign(loop.index, f"({n} - {n} % {TILE}) + {rest}"), *body)))
    return tuple(nodes)


def _laned(loop: Loop, reads_total: Counter, split_alone: bool = False, nested: bool = False,
           width: int | None = None, iterations: int = 0) -> list:
    """The loop run in lanes (its group loop, the fold copies' merge, then the rest), or [loop] unchanged.
    `split_alone`: splitting the folds pays even where no statement has a lane rule. `nested`: the body may
    hold loops, buffers and branches (the outer traversal's body); a loop that reads nothing carried runs
    once for all lanes, its statements written per lane. `width`: the lanes, or None for the widest its
    vector calls and `iterations` (per call of the kernel) make worth it (_lanes_for)."""
    body = loop.body
    dynamic = isinstance(loop.extent, str)
    if ((not dynamic and loop.extent < MIN_EXTENT)
            or not all(isinstance(n, (Assign, Store)) for n in body) and not nested
            or not all(isinstance(n, Assign) for fold in loop.folds for n in fold.merge)):
        return [loop]
    own = {b.name for b in buffers(body)}  # a lane gets its own copy
    stored = {n for node in body for kind, n in events(node) if kind == "store"} - own
    body_reads = reads(body)
    if stored & set(body_reads):
        return [loop]
    split = {acc for fold in loop.folds for acc in fold.accs}
    assigned = written(body)
    indices = {n.index for n in _nodes_of(Loop, body)}
    carried = read_first(body, assigned | own, set())
    carried |= {n for n in assigned | own if reads_total[n] > body_reads[n]}
    carried -= split
    serial = _serial(body, carried, own)
    parallel = [node for node in body if node not in serial]
    if not (split_alone and split) and not _has_lane_call(parallel):
        return [loop]
    if width is None:
        width = _lanes_for(parallel, loop.extent, iterations)
    local = (assigned - carried - indices) | (own - carried) | {loop.index} | split
    if any(isinstance(n.extent, str) and set(names(n.extent)) & local for n in _nodes_of(Loop, parallel)):
        return [loop]  # an inner loop whose trip count differs from lane to lane
    rename = _renamer(local)
    group = f"{loop.index}__g"
    extent = f"{loop.index}__n" if dynamic else loop.extent
    first = f"({extent} - {extent} % {width})" if dynamic else loop.extent - loop.extent % width
    lines = [Assign(rename(loop.index, lane), f"{group} * {width} + {lane}") for lane in range(width)]
    for node in parallel:
        lines += _side_by_side(node, rename, width)
    lines += [_renamed(node, rename, lane) for lane in range(width) for node in body if node in serial]
    nodes = [Assign(extent, loop.extent)] if dynamic else []
    nodes += [Assign(rename(acc, lane), acc if lane == 0 else identity)
              for fold in loop.folds for lane in range(width) for acc, identity in zip(fold.accs, fold.identities)]
    nodes.append(Loop(group, f"{extent} // {width}" if dynamic else first // width, tuple(lines)))
    for fold in loop.folds:
        nodes += _merged(fold, rename, width)
    if dynamic or first < loop.extent:
        rest = f"{loop.index}__r"
        nodes.append(Loop(rest, f"{extent} % {width}" if dynamic else loop.extent - first,
                          (Assign(loop.index, f"{first} + {rest}"), *body), loop.folds))
    return nodes


def _lanes_for(parallel: list, extent, iterations: int) -> int:
    """WIDE where the statements run side by side call vector math, all of it float32 with an eight-lane
    form, the loop (if of a known extent) fills two groups of eight, and it runs at least
    WIDE_MIN_ITERATIONS times per call; else WIDTH."""
    if iterations < WIDE_MIN_ITERATIONS or not isinstance(extent, str) and extent < 2 * WIDE:
        return WIDTH
    calls = [lane_call(n.expr) for n in _nodes_of(Assign, parallel)]
    calls = [c for c in calls if c]
    eight = calls and all(dtype == "float32" and (op, dtype) in LANE_RULES for op, dtype, _ in calls)
    return WIDE if eight else WIDTH


def _nodes_of(kind: type, nodes: Iterable) -> Iterable:
    """The nodes of this kind among `nodes` and inside their loops and branches, in order."""
    for node in nodes:
        if isinstance(node, kind):
            yield node
        if isinstance(node, (Loop, If)):
            yield from _nodes_of(kind, node.body)


def read_first(nodes: tuple, candidates: set[str], seen: set[str]) -> set[str]:
    """The candidates read before `nodes` (one pass, in order) surely write them: values carried from the
    previous pass. A branch's writes, or those of a loop that may not run, are not sure; `seen` grows."""
    carried = set()
    for node in nodes:
        if isinstance(node, (Assign, Store)):
            carried |= {n for kind, n in events(node) if kind == "read" and n in candidates and n not in seen}
            seen |= set(names(node.target)) if isinstance(node, Assign) else set()
        elif isinstance(node, Loop):
            runs = not isinstance(node.extent, str) and node.extent > 0
            carried |= {n for n in names(str(node.extent)) if n in candidates and n not in seen}
            inner = seen | {node.index}
            carried |= read_first(node.body, candidates, inner)
            if runs:
                seen |= inner
        elif isinstance(node, If):
            carried |= {n for n in names(node.cond) if n in candidates and n not in seen}
            carried |= read_first(node.body, candidates, set(seen))
        elif isinstance(node, Buffer):
            seen.add(node.name)  # its elements are stored before they are read (Buffer)
    return carried


def _has_lane_call(nodes: Iterable) -> bool:
    return any((isinstance(n, Assign) and lane_call(n.expr)) or (isinstance(n, (Loop, If)) and _has_lane_call(n.body))
               for n in nodes)


def _serial(body: tuple, carried: set[str], own: set[str] = frozenset()) -> set:
    """The nodes that read or write a carried value (or read one that does), and every store into an array
    the lanes share."""
    tainted, serial = set(carried), set()
    for node in body:
        touched = {n for _, n in events(node)}
        shared_store = isinstance(node, Store) and node.target not in own
        if shared_store or touched & tainted:
            serial.add(node)
            tainted |= {n for kind, n in events(node) if kind in ("write", "store")}
    return serial


def _side_by_side(node, rename, width: int) -> list:
    """A node that reads nothing carried, for every lane: a loop runs once, its statements per lane."""
    if isinstance(node, Assign):
        return _parallel_statement(node, rename, width)
    if isinstance(node, Loop):
        inner = [line for n in node.body for line in _side_by_side(n, rename, width)]
        return [Loop(node.index, node.extent, tuple(inner))]
    return [_renamed(node, rename, lane) for lane in range(width)]


def _renamer(local: set[str]):
    if not local:
        return lambda text, lane: text
    pattern = re.compile(r"(?<![\w.])(" + "|".join(sorted(map(re.escape, local), key=len, reverse=True)) + r")(?!\w)")

    def rename(text: str, lane) -> str:
        return pattern.sub(lambda m: f"{m.group(1)}__{lane}", text)

    return rename


def _renamed(node, rename, lane):
    if isinstance(node, Assign):
        return Assign(rename(node.target, lane), rename(node.expr, lane))
    if isinstance(node, Store):
        return Store(rename(node.target, lane), tuple(rename(i, lane) for i in node.index), rename(node.expr, lane))
    if isinstance(node, Buffer):
        return Buffer(rename(node.name, lane), node.shape, node.dtype)
    if isinstance(node, If):
        return If(rename(node.cond, lane), tuple(_renamed(n, rename, lane) for n in node.body))
    return Loop(node.index, rename(str(node.extent), lane) if isinstance(node.extent, str) else node.extent,
                tuple(_renamed(n, rename, lane) for n in node.body))


def _parallel_statement(node: Assign, rename, width: int) -> list[Assign]:
    """One statement for every lane: a lane rule's vector call where it has one, else once per lane."""
    call = lane_call(node.expr)
    if call is None:
        return [_renamed(node, rename, lane) for lane in range(width)]
    op, dtype, args = call
    targets = [rename(node.target, lane) for lane in range(width)]
    lanes = [[rename(a, lane) for lane in range(width)] for a in args]
    if (op, dtype) in LANE_RULES:
        return [_assignment(line) for line in LANE_RULES[(op, dtype)](targets, lanes)]
    wide = [f"{t}_wide" for t in targets]  # computed in float64 (as the scalar helper computes), then rounded
    lines = LANE_RULES[(op, "float64")](wide, lanes)
    return [_assignment(line) for line in lines] + [Assign(t, f"np.{dtype}({w})") for t, w in zip(targets, wide)]


def _assignment(line: str) -> Assign:
    target, expr = line.split(" = ", 1)
    return Assign(target, expr)


def _merged(fold: LaneFold, rename, width: int) -> list[Assign]:
    """Lane 0's copies of the accumulators folded with every other lane's, then back in the accumulators."""
    temporaries = _renamer({n.target for n in fold.merge if isinstance(n, Assign)} - set(fold.left) - set(fold.right))
    nodes = []
    for lane in range(1, width):
        states = dict(zip(fold.left, (rename(a, 0) for a in fold.accs)))
        states.update(zip(fold.right, (rename(a, lane) for a in fold.accs)))
        nodes += [Assign(s, value) for s, value in states.items()]
        for node in fold.merge:
            nodes.append(Assign(temporaries(node.target, f"m{lane}"), temporaries(node.expr, f"m{lane}")))
        nodes += [Assign(rename(acc, 0), temporaries(r, f"m{lane}")) for acc, r in zip(fold.accs, fold.results)]
    nodes += [Assign(acc, rename(acc, 0)) for acc in fold.accs]
    return nodes
