"""A loop whose every iteration folds an inner loop, run with the two loops swapped, so that the iterations
of the outer one, which are independent, become the innermost loop and LLVM runs them in SIMD lanes.

The k-means cost written with nested maps is, per point, a loop over the centroids whose body sums the
squared differences over the dimensions (an inner loop) and then folds that sum into the point's minimum:

    for c < 64:  acc = 0;  for j < 16: acc = acc + (p[j] - C[c, j])^2;  best = min(best, acc)

Each centroid's sum waits for its previous add, and the sixteen of them run one after the other: scalar code
at the latency of an add. Swapped, with each centroid's accumulator in a buffer of the centroids' length:

    for c < 64: acc_[c] = 0
    for j < 16: for c < 64: acc_[c] = acc_[c] + (p[j] - C^T[j, c])^2     (independent in c: SIMD)
    for c < 64: acc = acc_[c];  best = min(best, acc)

Where the inner loop is short and the matrix small (sixteen dimensions, 64 centroids), its steps are
written out under the swapped loop instead, each centroid's sum a register loaded and stored once:

    for c < 64:  acc = acc_[c];  acc = acc + (p[0] - C^T[0, c])^2;  ...;  acc = acc + (p[15] - C^T[15, c])^2;
                 acc_[c] = acc

LLVM vectorises the centroid loop around the sixteen steps, where the form above loads and stores every
centroid's sum at each step (a store per step bounds it). The steps are written out rather than left to
LLVM's unroller, which keeps a loop of 32 steps of four statements a loop (a scalar chain per centroid).
A longer inner loop (a layer's 64 inputs per unit) is written out a block of steps at a time, the blocks
run in turn, each sum loaded and stored once per block: a map of sum(tanh(W @ x)) over 16384 rows, W of
64 x 64 float32, 5.5 -> 1.4-1.9 ms (2-core VM; BLAS over blocks of rows 2.9-3.5). Blocks are written only in
a body compiled whole (loop_nests.as_run).

Every accumulator still folds its elements in the same order, so the results are the same bits; only the
order in which independent work is done changes. A matrix the inner statements read as [c, j] is read from
its transpose, copied once per kernel call, so that consecutive c are consecutive in memory; the inner index
is unsigned, since Numba's check of a signed index for a negative value to wrap keeps LLVM from vectorising
(nest_lanes.TILE says the same of the tiled folds).

It applies where the outer loop's body is statements setting the accumulators (and others no inner loop
reads, which move after them, reading an earlier inner loop's final sum if they like), inner loops of
straight-line statements, then statements, stores and loops (an MLP gradient's row stored per unit) reading
what the inner loops left. Where a loop follows, the straight-line statements before it run as a loop of
their own, keeping in buffers what the later part reads, so that their tanh or exp runs in vector calls; the
sums are read back under names of their own for the same reason (nest_lanes takes a name two loops assign
for one carried between them). Without a transpose, the swapped loop's trip count is read from an input
the inner statements index along that axis, where there is one. Several inner loops (a Hessian-vector product sums the distance, then its tangent)
are distributed: each is swapped in turn, and a later one reads an earlier one's final sums from their
buffer. It applies where no value but the accumulators passes from one inner iteration to the next or from
the outer iteration's last statements to its first, and where no inner loop calls a function that nest_lanes
would run several elements per vector call (a loop of exponentials is better in lanes than swapped into
scalar calls).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

import numpy as np

from fold.runtime.loops.nest import Assign, Buffer, If, Kernel, Loop, ParallelFold, ParallelMap, Store
from fold.runtime.loops.text import assigned, names, reads, substitute

from . import nest_lanes

# the fewest outer iterations worth a swap (a vector's worth of float32), and the most: each accumulator's
# buffer should stay in the first-level cache while the inner loop sweeps it
MIN_EXTENT = 8
MAX_EXTENT = 4096
# LLVM unrolls a loop of a constant trip count up to this into scalar statements, which Numba's LLVM does not
# vectorise (its SLP vectoriser is off): the swapped loop's trip count is read from an array's shape instead,
# and without one to read it from, a loop this short is not swapped (k-means over 32 centroids: 24 ms
# unswapped, 41 swapped with a constant trip count)
UNROLLED = 32
# an inner loop of at most UNROLLED steps is written out under the swapped loop (_around) where its statements
# number at most UNROLLED_STATEMENTS in all (Numba's compile time grows with the text), and the elements a
# sweep of the swapped loop reads per step, times the steps, at most SHORT_AREA: the sweep reads a row of the
# transposed matrix per step side by side, and rows of 2048 float32 (attention's keys, 32 dimensions) lie 8 KB
# apart, which the first-level cache holds in one set (their sums swept step by step: 9.9 against 14.5 ms).
# Written out, the float32 Mahalanobis distance (32 x 32) took 2.3 against 4.0 ms swapped (12.9 as a loop of
# 32 steps LLVM did not unroll), the natural k-means cost (16 dimensions, 64 centroids) 27 against 55
UNROLLED_STATEMENTS = 192
SHORT_AREA = 4096
# the fewest steps of a longer inner loop written out at a time (_block_steps)
MIN_BLOCK = 8
# the fewest steps of the inner loop per kernel call (times the swapped loop's and the loops' around it) for
# which its steps are written out: Numba compiles each copy (the Mahalanobis distance's Hessian-vector
# product, three sums of 32 steps: first call 1.8 -> 3.3 s), which a small program would never win back
WRITTEN_MIN_ITERATIONS = 2 ** 20
TRANSPOSED = "__T"

_SUBSCRIPT = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\[([^\[\]]*)\]")
_READ_ONLY = re.compile(r"(in|k)\d+")
_TYPED = re.compile(r"np\.(float32|float64|int64|int32|uint64|bool_)\((.*)\)")


def interchanged(kernel: Kernel, blocks: bool = True) -> Kernel:
    """`kernel` with every loop that qualifies swapped with its inner loop (see the module's docstring);
    `blocks`: an inner loop longer than one block of steps (_block_steps) is written out a block at a time."""
    outer = kernel.outer
    body = outer.body if isinstance(outer, ParallelMap) else outer.step
    outside = Counter(s.name for s in outer.states) + reads(outer.init + outer.merge) \
        if isinstance(outer, ParallelFold) else Counter()
    shapes = {p.name: tuple(p.shape) for p in kernel.inputs}
    swapped = _block(body, reads(body) + outside, shapes, outer.extent, blocks)
    if swapped == body:
        return kernel
    changed = (dataclasses.replace(outer, body=swapped) if isinstance(outer, ParallelMap)
               else dataclasses.replace(outer, step=swapped))
    return dataclasses.replace(kernel, outer=changed)


def transposed(kernel: Kernel) -> list[str]:
    """The arrays whose transposes the kernel reads (copied before its traversal, named name + TRANSPOSED)."""
    found: set[str] = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, (Loop, If)):
                visit(node.body)
            elif isinstance(node, (Assign, Store)):
                text = node.expr if isinstance(node, Assign) else " ".join((node.expr, *node.index))
                found.update(n[: -len(TRANSPOSED)] for n in names(text) if n.endswith(TRANSPOSED))

    outer = kernel.outer
    visit(outer.body if isinstance(outer, ParallelMap) else outer.step)
    return sorted(found)


def _block(nodes: tuple, total: Counter, shapes: dict[str, tuple], runs: int, blocks: bool) -> tuple:
    """`nodes` (run `runs` times per kernel call) with every loop that qualifies swapped."""
    out: list = []
    for node in nodes:
        if isinstance(node, Loop):
            trips = 1 if isinstance(node.extent, str) else node.extent  # a dynamic one: at least once
            node = dataclasses.replace(node, body=_block(node.body, total, shapes, runs * trips, blocks))
            out += _swapped(node, total, shapes, runs, blocks) or [node]
        elif isinstance(node, If):
            out.append(dataclasses.replace(node, body=_block(node.body, total, shapes, runs, blocks)))
        else:
            out.append(node)
    return tuple(out)


def _swapped(loop: Loop, total: Counter, shapes: dict[str, tuple], runs: int, blocks: bool) -> list | None:
    """The loop as (accumulators set, each inner loop swapped, the rest per outer iteration), or None."""
    if isinstance(loop.extent, str) or not MIN_EXTENT <= loop.extent <= MAX_EXTENT:
        return None
    at = [k for k, n in enumerate(loop.body) if not isinstance(n, (Assign, Store))]
    if not at or not all(isinstance(loop.body[k], Loop) for k in at):
        return None
    # the inner loops swapped are the leading ones of straight-line assignments; loops after them (an MLP
    # gradient's row stored per unit) run per outer iteration with the statements after the sums
    folding = 0
    while folding < len(at) and all(isinstance(n, Assign) for n in loop.body[at[folding]].body):
        folding += 1
    if not folding:
        return None
    at = at[:folding]
    inners = [loop.body[k] for k in at]
    before, post = [n for n in loop.body[: at[-1]] if not isinstance(n, Loop)], loop.body[at[-1] + 1:]
    if not all(isinstance(n, Assign) for n in before):
        return None
    if any(not isinstance(k.extent, str) and k.extent >= nest_lanes.MIN_EXTENT and any(
            nest_lanes.lane_call(n.expr) for n in k.body) for k in inners):
        return None  # nest_lanes runs that loop's transcendental functions in vector calls
    own = [assigned(k.body) for k in inners]
    if any(own[a] & own[b] for a in range(len(own)) for b in range(a)):
        return None  # two inner loops assign one name
    accs = assigned(before) & set().union(*own)
    # the outer iteration's statements before the inner loops that set no accumulator run after them instead
    # (a mixture's log-weight, read once its component's sum is done), where nothing before reads them
    pre = tuple(n for n in before if n.target in accs)
    deferred = tuple(n for n in before if n.target not in accs)
    post = deferred + tuple(post)
    if not accs or len(pre) != len(accs) or (accs | set().union(*own)) & set(reads(pre)):
        return None  # an accumulator set twice, or read (with an inner loop's values) before the inner loops end
    # a deferred statement may read the final sum of an inner loop before it (a Hessian-vector product's
    # tanh of the first sum, written before the tangent's sum), not a later loop's value nor be read by one
    position = {id(n): k for k, n in enumerate(loop.body)}
    owner = {name: at[m] for m in range(len(inners)) for name in own[m]}
    if any(owner.get(name, -1) > position[id(d)] for d in deferred for name in reads((d,))):
        return None
    if any(set(reads(k.body)) & assigned(deferred) for k in inners):
        return None
    if assigned(post) & set(reads(pre + tuple(inners))) or any(
            set(names(str(k.extent))) & (accs | assigned(post)) for k in inners):
        return None  # carried from one outer iteration's last statements to the next one's first
    dtypes = {}
    for m, inner in enumerate(inners):
        mine, earlier = own[m] & accs, accs & set().union(*own[:m])
        if nest_lanes.read_first(inner.body, own[m], set()) - mine:
            return None  # a value other than the accumulators is carried from one inner iteration to the next
        inner_reads = reads(inner.body)
        if set(inner_reads) & (accs - mine - earlier):
            return None  # a later inner loop's accumulator, not yet folded
        if any(total[n] > inner_reads[n] for n in own[m] - accs) or (own[m] - accs) & assigned(post):
            return None  # read after the inner loop: it would hold the last outer iteration's value only
        dtypes.update({acc: _dtype(acc, pre, inner.body) for acc in mine})
    if any(d is None for d in dtypes.values()):  # not `None in`: a dtype equals None (np.dtype(None) is float64)
        return None
    index, unsigned = loop.index, f"{loop.index}__u"
    kept = {acc: f"{acc}__x" for acc in sorted(accs)}
    flipped: set[str] = set()
    bodies = []
    for m, inner in enumerate(inners):
        inner_reads = reads(inner.body)
        loaded = [a for a in kept if a in own[m] or a in inner_reads]
        head = [Assign(unsigned, f"np.uint64({index})"), *(Assign(a, f"{kept[a]}[{unsigned}]") for a in loaded)]
        steps = [Assign(n.target, _subscripts(n.expr, index, unsigned, shapes, flipped)) for n in inner.body]
        bodies.append((head, steps, [Store(kept[a], (unsigned,), a) for a in kept if a in own[m]]))
    # a trip count LLVM cannot see: it vectorises the loop instead of unrolling it into scalars
    extent = f"{min(flipped)}{TRANSPOSED}.shape[1]" if flipped else _shape_read(bodies, unsigned, loop.extent, shapes)
    if extent is None:
        extent = loop.extent
        if extent <= UNROLLED:
            return None
    start = [Buffer(kept[a], (loop.extent,), dtypes[a]) for a in kept]
    start.append(Loop(index, loop.extent, (*pre, *(Store(kept[a], (index,), a) for a in kept))))
    swapped = [node for k, parts in zip(inners, bodies)
               for node in _around(k, index, extent, loop.extent, runs, parts, blocks)]
    # the sums are read back under names of their own where nothing after the loop reads them: the swapped
    # loops assign the accumulators too, and nest_lanes would take a name assigned in two loops for one
    # carried between them (and run the loop's tanh or exp per element instead of in vector calls)
    own_reads = reads(loop.body)
    fresh = {a: f"{a}__r" for a in kept if total[a] <= own_reads[a]}
    rest = (*(Assign(fresh.get(a, a), f"{kept[a]}[{index}]") for a in kept), *(_renamed(n, fresh) for n in post))
    acc_dtypes = {fresh.get(a, a): dtypes[a] for a in kept}
    split = _distributed(Loop(index, loop.extent, rest, loop.folds), acc_dtypes)
    return [*start, *swapped, *(split or [Loop(index, loop.extent, rest, loop.folds)])]


def _around(inner: Loop, index: str, extent, sweep: int, runs: int, parts: tuple[list, list, list],
            blocks: bool = True) -> list:
    """The outer loop's sweep (`sweep` iterations, the loop run `runs` times per kernel call) of one inner
    loop's sums. Where the kernel is long enough to win back the compile time (WRITTEN_MIN_ITERATIONS), the
    inner loop's steps are written out under the outer loop, a block of them at a time (`_block_steps`: at
    most UNROLLED steps, UNROLLED_STATEMENTS statements, SHORT_AREA elements read per sweep): each
    accumulator a register, loaded and stored once per block, the steps vectorised across the outer
    iterations; a longer inner loop runs its blocks in turn. Otherwise the inner loop runs outermost, each of
    its steps a vectorised sweep through the accumulators' buffer (a load and a store per accumulator and
    step). The inner loop's folds are dropped either way: each accumulator folds its elements in order."""
    head, steps, stores = parts
    block = _block_steps(inner.extent, len(steps), sweep)
    if not blocks and block is not None and block < inner.extent:
        block = None
    if block is None or runs * sweep * inner.extent < WRITTEN_MIN_ITERATIONS:
        return [Loop(inner.index, inner.extent, (Loop(index, extent, (*head, *steps, *stores)),))]

    def written(first, count: int) -> list:
        """Steps first, ..., first + count - 1 (`first` a number or the text of one) as statements."""
        def at(k: int) -> str:
            return str(first + k) if isinstance(first, int) else f"{first} + {k}"

        return [Assign(n.target, substitute(n.expr, lambda name, k=k: at(k) if name == inner.index else name))
                for k in range(count) for n in steps]

    whole, rest = divmod(inner.extent, block)
    if whole == 1:
        out = [Loop(index, extent, (*head, *written(0, block), *stores))]
    else:
        start = f"{inner.index}__b"
        out = [Loop(f"{inner.index}__k", whole, (
            Assign(start, f"{inner.index}__k * {block}"),
            Loop(index, extent, (*head, *written(start, block), *stores))))]
    if rest:
        out.append(Loop(index, extent, (*head, *written(whole * block, rest), *stores)))
    return out


def _block_steps(steps: int | str, statements: int, sweep: int) -> int | None:
    """How many of an inner loop's `steps` (each of `statements` statements) are written out at a time under
    a sweep of `sweep` iterations, or None where too few would be (a block of fewer than MIN_BLOCK steps
    saves little of the accumulators' loads and stores)."""
    if isinstance(steps, str) or not statements:
        return None
    block = min(steps, UNROLLED, UNROLLED_STATEMENTS // statements, SHORT_AREA // sweep)
    return block if block >= min(steps, MIN_BLOCK) else None


def _distributed(rest: Loop, acc_dtypes: dict[str, np.dtype]) -> list | None:
    """The loop after the swapped sums as two: its straight-line statements first, where they call a
    function nest_lanes runs in vector calls (tanh of each unit's sum), storing what the rest reads in
    buffers; then the rest (loops storing a row per unit). None where that does not apply or pay."""
    first = next((k for k, n in enumerate(rest.body) if isinstance(n, (Loop, If))), None)
    if first is None:
        return None
    head, tail = rest.body[:first], rest.body[first:]
    if not any(isinstance(n, Assign) and nest_lanes.lane_call(n.expr) for n in head):
        return None
    fold_accs = {a for f in rest.folds for a in f.accs}
    if assigned(tail) & reads(head).keys() or (assigned(head) & fold_accs and assigned(tail) & fold_accs):
        return None  # a value carried from the rest of one iteration to the start of the next, or split folds
    tail_reads = reads(tail)
    crossing = [n.target for n in head if isinstance(n, Assign) and tail_reads[n.target]]
    once = Counter(n.target for n in head if isinstance(n, Assign))
    copies = {n.target: n.expr for n in head if isinstance(n, Assign) and once[n.target] == 1}
    types = {name: _cast(name, copies, acc_dtypes) for name in crossing}
    if any(t is None for t in types.values()):  # assigned twice, or not as a cast
        return None
    index, extent = rest.index, rest.extent
    buffered = {name: f"{name}__y" for name in crossing}
    read_back = {name: f"{name}__b" for name in crossing}
    folds_first = bool(assigned(head) & fold_accs) or not (assigned(tail) & fold_accs)
    return [*(Buffer(buffered[n], (extent,), types[n]) for n in crossing),
            Loop(index, extent, (*head, *(Store(buffered[n], (index,), n) for n in crossing)),
                 rest.folds if folds_first else ()),
            Loop(index, extent, (*(Assign(read_back[n], f"{buffered[n]}[{index}]") for n in crossing),
                                 *(_renamed(n, read_back) for n in tail)), () if folds_first else rest.folds)]


def _renamed(node, fresh: dict[str, str]):
    """A node with the names in `fresh` replaced (loops and branches entered)."""
    def sub(text: str) -> str:
        return substitute(text, lambda name: fresh.get(name, name))

    if isinstance(node, Assign):
        return Assign(fresh.get(node.target, node.target), sub(node.expr))
    if isinstance(node, Store):
        return Store(node.target, tuple(sub(i) for i in node.index), sub(node.expr))
    if isinstance(node, Loop):
        extent = sub(node.extent) if isinstance(node.extent, str) else node.extent
        return dataclasses.replace(node, extent=extent, body=tuple(_renamed(n, fresh) for n in node.body))
    if isinstance(node, If):
        return If(sub(node.cond), tuple(_renamed(n, fresh) for n in node.body))
    return node


def _dtype(acc: str, pre: tuple, inner: tuple):
    """The NumPy type every assignment of `acc` gives it (its first and each inner one, followed through
    copies), or None where one is not written as a cast: a buffer of another type would round it."""
    by_target = {n.target: n.expr for n in pre + inner if n.target != acc}
    found = {_cast(n.expr, by_target) for n in pre + inner if n.target == acc}
    # not `None in`: a dtype equals None (np.dtype(None) is float64)
    return found.pop() if len(found) == 1 and not any(t is None for t in found) else None


def _cast(expr: str, copies: dict[str, str], known: dict | None = None):
    """The NumPy type of `expr`: a cast, a name of a `known` type, or a name `copies` maps to such an
    expression (followed through eight copies at most); None otherwise."""
    for _ in range(8):
        if known and expr in known:
            return known[expr]
        match = _TYPED.fullmatch(expr)
        if match is not None and _balanced(match.group(2)):
            return np.dtype(match.group(1))
        if expr not in copies:
            return None
        expr = copies[expr]
    return None


def _balanced(text: str) -> bool:
    """Whether `text`'s parentheses pair up (the cast's own closing one is the last character)."""
    depth = 0
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            return False
    return depth == 0


def _shape_read(bodies: list, unsigned: str, extent: int, shapes: dict[str, tuple]) -> str | None:
    """The trip count as the length of an input's axis the swapped loop reads it along (a matrix read as
    [row, index], as attention's values are by its weighted sum over their rows), or None where none is."""
    for node in (n for pieces in bodies for piece in pieces for n in piece):
        for match in _SUBSCRIPT.finditer(node.expr if isinstance(node, Assign) else ""):
            array, parts = match.group(1), match.group(2).split(", ")
            axis = len(parts) - 1
            if (parts[-1] == unsigned and _READ_ONLY.fullmatch(array) and len(shapes.get(array, ())) == len(parts)
                    and shapes[array][axis] == extent):
                return f"{array}.shape[{axis}]"
    return None


def _subscripts(expr: str, index: str, unsigned: str, shapes: dict[str, tuple], flipped: set[str]) -> str:
    """`expr` reading a read-only matrix subscripted [index, j] from its transpose at [j, index] (the matrix
    added to `flipped`), and every subscript by `index` alone by its unsigned copy."""
    def one(match: re.Match) -> str:
        array, parts = match.group(1), match.group(2).split(", ")
        if (len(parts) == 2 and parts[0] == index and index not in names(parts[1])
                and _READ_ONLY.fullmatch(array) and len(shapes.get(array, ())) == 2):
            flipped.add(array)
            array, parts = array + TRANSPOSED, [parts[1], index]
        return f"{array}[{', '.join(unsigned if p == index else p for p in parts)}]"

    return _SUBSCRIPT.sub(one, expr)
