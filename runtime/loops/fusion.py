"""The loop-nest fusion pass: top-level statements grouped into `LoopNest` statements, each one kernel.

A map whose body nests another map (the way a user writes k-means, pairwise distances or attention: a map
of a map of a reduce) becomes a loop nest, with its consumer when it has one that folds over its rows:

- a reduce of the map's results (any operator, any number of leaves): a parallel fold, nothing of the map's
  size materialised;
- a sum over the map's axis (`sum[axes=(0,)]`, what a gradient emits to add up each row's contribution to a
  captured value): a parallel fold whose state is one row;
- a histogram (`reduce_by_index`) of the map's results, at indices computed before the map or by it (a
  k-means gradient's sums per nearest centroid, a gather's cotangent): a parallel fold whose state is the
  bins, each chunk folding into bins of its own, merged in chunk order (so a user's operator that is not
  commutative still sees each bin's elements in order);
- otherwise the map alone: a parallel map writing its rows.

A map whose other results the program reads keeps them: the parallel fold stores their rows as it folds (a
k-means gradient's points' rows beside its sum over the points for the centroids), unless its body is of
scalars, whose elementwise kernel stores a result as cheaply and computes faster.

A map of scalars that a reduce folds (`reduce(op, map(f, xs))`) is a parallel fold of the body's results too.
A map whose body folds or scans its rows with no map inside (a row's logsumexp or norm) is a nest as a map of
maps is, unless it multiplies a matrix by the row (see `_candidate`).

NumPy-style broadcasting summed over an axis is written as the maps it stands for first (broadcast_maps.py),
where each such map then becomes part of a nest.

Inside, maps, reduces, sums, matrix products and elementwise statements at any depth are loops of the nest
(build.py). A statement the nest cannot write leaves the group as it was. `LoopNest` keeps the statements it
replaced as a program of its own, which the numpy implementation runs: a backend may always decline.
"""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

import fold

from fold.ir import Let, Primitive, Program, Var, depends_on, use_counts
from fold.pytree import tree_flatten
from fold.primitives import Iota, Loop, LoopSaving, Map, MatMul, Reduce, ReduceByIndex, Reshape, Scan, SumAxes
from fold.recognize import commutative_fold, recognize_binary_op

from ..interpreter import eval_program, numpy_impls
from ..wide_operators import carried_operator, carry_for
from .broadcast_maps import maps_of_broadcasts
from .loop_maps import loops_as_maps
from .one_hot_products import one_hot_products
from .outer_sums import outer_products_as_sums
from .build import NotNestable, Pull, Scalar, Stored, Writer, cast, fold_into, lane_fold, map_row, nestable, store_rows
from .nest import Assign, Buffer, Kernel, Param, ParallelFold, ParallelMap, State, Store
from .prune import prune
from .sibling_maps import Group, join_siblings


@dataclass(frozen=True)
class LoopNest(Primitive):
    """Statements run as one loop nest; `program` is them, closed over the statement's arguments."""

    program: Program
    name = "loop_nest"
    backend_internal = True
    num_consts = 0
    body_fields = ("program",)


def _nests_a_map(program: Program) -> bool:
    return any(isinstance(s.prim, Map) or any(_nests_a_map(b) for b in s.prim.bodies()) for s in program.stmts)


_ARRAY_FOLDS = (Reduce, SumAxes, MatMul)


def _folds(program: Program, kinds: tuple = _ARRAY_FOLDS + (Scan,)) -> bool:
    """Whether a fold of these kinds (a reduce, a scan, a sum over axes, a matrix product) stands anywhere in
    `program`."""
    return any(isinstance(s.prim, kinds) or any(_folds(b, kinds) for b in s.prim.bodies()) for s in program.stmts)


# A map body of more statements than this is written once as straight-line code in a nest: the older
# per-statement expansion compiles in time that grows faster than its length (100 statements took a minute).
LONG_BODY = 64


def _statement_count(program: Program) -> int:
    return sum(1 + sum(_statement_count(b) for b in s.prim.bodies()) for s in program.stmts)


def no_products(body: Program) -> bool:
    """The default choice of `fuse_loop_nests(products=)`: no map whose body multiplies a matrix becomes a
    nest for its folds alone."""
    return False


def _candidate(stmt: Let, folded: bool, row_folds: bool, binned: bool = False,
               products: Callable[[Program], bool] = no_products, summed: bool = False) -> bool:
    """A map the nest takes: one whose body nests a map and folds somewhere (a map of a map of a reduce), one
    whose body maps rows that are arrays and folds nothing (`_maps_rows_of_arrays`), one whose body is long,
    (`folded`: a reduce folds its results) one of scalars, or (`row_folds`) one whose body
    folds or scans its rows and multiplies no matrices unless a reduce folds its results (`folded`: nothing of
    the map's size is then stored) and `products(body)` says the nest takes them: the
    nest writes a matrix product as scalar loops, where the numba backend batches a body's products into
    BLAS calls over blocks of rows, and its float64 product kernel folds a captured matrix times the row in
    registers, 4 rows at once; the numba backend's `products` takes matrices of at most 32 KB (8 KB
    in float64: passes.nest_takes_products).
    A map of scalar maps and nothing else is elementwise over the whole array, where the backend's elementwise
    kernels run the transcendental functions several elements per vector instruction and fuse with their
    neighbours; read by a reduce, the nest's
    outer fold does the same in lanes (a backend's choice, ParallelFold.folds) and stores nothing. A map whose
    results a histogram bins (`binned`) streams into the bins whatever its body, but for a matrix product
    that `products` leaves to the backend: k-means' matrix gradient in float64, whose one-hot cotangents the
    numba backend reads as (index, value) first (one_hots.py: a row of the centroids gathered at the nearest
    one) and whose product its product kernel runs in registers. A map whose results are summed over its
    axis (`summed`) and that multiplies no matrix is a nest too: its rows are added into the state as they
    are made (a gradient's sum over the rows of each row times its cotangent, `x * g` per row, would
    otherwise be stored whole and summed after). So is one whose products `products` gives the nest and
    that reach its results only through folds, but for those with a one-hot operand (one_hot_products.py),
    which cost a row each: k-means' matrix form's gradient in float32, whose centroids' cotangent, the
    rows' outer products (outer_sums.py), adds each point at its nearest centroid's row alone (10^5 points:
    13-14 against 7-9 ms); not a layer's, whose dense products BLAS runs 2-3x faster batched."""
    body = stmt.prim.body if isinstance(stmt.prim, Map) else None
    return (body is not None and stmt.outs[0].aval.shape[0] > 0
            and ((_nests_a_map(body) and _folds(body, _ARRAY_FOLDS))
                 or (_maps_rows_of_arrays(body) and not _folds(body))
                 or (row_folds and _folds(body)
                     and (not _folds(body, (MatMul,)) or ((folded or _products_folded(body)) and products(body))
                          or _products_of_rows_only(stmt.prim)))
                 or _statement_count(body) > LONG_BODY
                 or (folded and _of_scalars(body))
                 or (summed and (not _folds(body, (MatMul,))
                                 or (products(body) and _products_folded(body, one_hot_products(body)))))
                 or (binned and (not _folds(body, (MatMul,)) or products(body)))
                 or any(isinstance(s.prim, (Loop, LoopSaving)) for s in body.stmts))
            and nestable(body) is None)


# statements whose result is smaller than what they read: a product's values past one stop being stored
_FOLDING = (Reduce, SumAxes, ReduceByIndex)


def _products_folded(body: Program, cheap: set[int] | frozenset[int] = frozenset()) -> bool:
    """Whether every matrix product in a map's `body` reaches its results only through a fold (k-means' HVP
    with respect to the points: the distances' minimum and its first position, then a row of the gradient):
    the nest then stores nothing of a product's size per row, where batched products would write them all.
    The products of `cheap` (ids) are not asked about."""
    unfolded = {s.outs[0] for s in body.stmts if isinstance(s.prim, MatMul) and id(s) not in cheap}
    for s in body.stmts:
        if not isinstance(s.prim, _FOLDING) and any(a in unfolded for a in s.args):
            unfolded.update(s.outs)
    return not unfolded.intersection(body.outputs)


def _products_of_rows_only(prim: Map) -> bool:
    """Whether every matrix product in the map's body, at its top level, multiplies two values of the row
    (a batch of matrices, each times its own vector): batched over a block of rows these are a stack of small
    products, not one BLAS call with a matrix shared by the rows, and the nest writes each row's as loops."""
    body = prim.body
    of_row = depends_on(list(body.stmts), set(body.inputs[prim.num_consts:]))
    products = [s for s in body.stmts if isinstance(s.prim, MatMul)]
    return bool(products) and all(isinstance(a, Var) and a in of_row for s in products for a in s.args)


def _maps_rows_of_arrays(program: Program) -> bool:
    """Whether a map inside `program`, at any depth, makes arrays in its body (a batch of matrices' rows, each
    scaled). A map whose body does that and folds nothing (the gradient of a bilinear form per batch
    element: an outer product per matrix) is a nest writing each result row where it is made, in one pass;
    run one statement at a time over the whole batch, each statement wrote and read back an array of the
    batch's size (10^5 8 x 8 matrices: 21-40 against 2.3 ms). A map of scalar maps is not one: it is
    elementwise over the whole array (unnest), where the elementwise kernels fuse it with its neighbours."""
    return any((isinstance(s.prim, Map) and any(o.aval.shape for t in s.prim.body.stmts for o in t.outs))
               or any(_maps_rows_of_arrays(b) for b in s.prim.bodies()) for s in program.stmts)


def _of_scalars(body: Program) -> bool:
    """Whether the body's inputs and every value it makes are scalars."""
    return all(v.aval.shape == () for v in body.inputs) and all(
        o.aval.shape == () for s in body.stmts for o in s.outs)


def _consumers(stmt: Let, readers: dict, uses: Counter, histograms: bool) -> tuple[list[Let], list[Var]] | None:
    """The statements that fold over the map `stmt`'s rows (sums over the map's axis, one per result; or one
    reduce, or (`histograms`) one histogram, of results), each folded result read by them alone; and the map's
    other results the program reads, which the nest stores row by row as it folds (a gradient's cotangent of
    the points beside its sum over them for the centroids). None if nothing folds, and for a map of scalars
    with results kept: it stores a result as cheaply as it keeps one, and its elementwise kernel runs
    transcendentals faster than a nest's lanes (a max-shifted logsumexp's gradient, 10^6 elements: 1.13x
    slower kept in the nest)."""
    used = [v for v in stmt.outs if uses[v]]  # a result nothing reads (a jvp's primal beside its tangent) is dropped
    alone = [v for v in used if uses[v] == 1 and readers.get(v) is not None]
    sums = [readers[v] for v in alone if isinstance(readers[v].prim, SumAxes) and tuple(readers[v].prim.axes) == (0,)]
    found = None
    if sums:
        summed = {r.args[0] for r in sums}
        binned = _binning([v for v in alone if v not in summed], readers, uses) if histograms else None
        folds, read = (sums, summed) if binned is None else (sums + binned[0], summed | set(binned[1]))
        found = folds, [v for v in used if v not in read]
    for reader in () if sums else dict.fromkeys(readers[v] for v in alone):
        read = [v for v in alone if readers[v] is reader]
        bins = histograms and isinstance(reader.prim, ReduceByIndex) and _bins(reader, read)
        if bins or (isinstance(reader.prim, Reduce) and _folds_exactly(reader, read)):
            found = [reader], [v for v in used if v not in read]
            break
    binned = _binned_rows(alone, readers, uses) if histograms and found is None else None
    if binned is not None:
        found = binned[0], [v for v in used if v not in binned[1]]
    if found is not None and found[1] and _of_scalars(stmt.prim.body):
        return None
    return found


def _binning(results: list[Var], readers: dict, uses: Counter) -> tuple[list[Let], list[Var]] | None:
    """(the statements binning some of the map's `results` into one histogram: the histogram, after the
    reshapes flattening its rows where it bins rows; the results it reads), or None."""
    for reader in dict.fromkeys(readers[v] for v in results):
        read = [v for v in results if readers[v] is reader]
        if isinstance(reader.prim, ReduceByIndex) and _bins(reader, read):
            return [reader], read
    return _binned_rows(results, readers, uses)


def _binned_rows(results: list[Var], readers: dict, uses: Counter) -> tuple[list[Let], list[Var]] | None:
    """As `_binning`, for a histogram of the map's rows flattened."""
    flattened = _flattened(results, readers, uses)
    for reader in dict.fromkeys(readers[f.outs[0]] for f in flattened.values()):
        read = [v for v in results if v in flattened and readers[flattened[v].outs[0]] is reader]
        if isinstance(reader.prim, ReduceByIndex) and _bins(reader, [flattened[v].outs[0] for v in read], rows=True):
            return [flattened[v] for v in read] + [reader], read
    return None


def _folds_exactly(reader: Let, read: list[Var]) -> bool:
    """Whether the reduce `reader` folds the map's vectors `read` as its leaves and nothing else, with an
    operator the nest can write."""
    leaves = reader.args[reader.prim.num_consts + reader.prim.num_leaves:]
    return (set(leaves) == set(read) and all(v.aval.ndim == 1 for v in read)
            and nestable(reader.prim.body) is None)


def _bins(reader: Let, used: list[Var], rows: bool = False) -> bool:
    """Whether the histogram `reader` bins the map's results `used` (each once, as its values, or as its
    indices) and nothing else the map makes, with an operator the nest can write. `rows`: `used` are the
    map's rows flattened, indices and values alike."""
    rbi = reader.prim
    k, nc = rbi.num_leaves, rbi.num_consts
    indices, leaves = reader.args[nc + k], reader.args[nc + k + 1:]
    from_map = set(leaves) | ({indices} & set(used))
    return (rbi.n > 0 and from_map == set(used) and indices.aval.ndim == 1 and nestable(rbi.body) is None
            and (not rows or indices in used))


def _flattened(results: list[Var], readers: dict, uses: Counter) -> dict[Var, Let]:
    """The map's results of rows of vectors that one reshape flattens, read once ({result: the reshape}): a
    scatter-add per row summed over the rows (fold/scatter_sums.py) bins them all."""
    found = {}
    for v in results:
        reader = readers[v]
        if (isinstance(reader.prim, Reshape) and len(v.aval.shape) == 2 and uses[reader.outs[0]] == 1
                and tuple(reader.prim.shape) == (v.aval.shape[0] * v.aval.shape[1],)
                and readers.get(reader.outs[0]) is not None):
            found[v] = reader
    return found


def _as_reduces(consumers: list[Let]) -> list[Let]:
    """The consumers, a lone sum of a vector (`fold.sum` of a map's scalar results) written as the sum monoid's
    reduce: the nest then folds it as any commutative reduce (in lanes, float32 carried in float64)."""
    if len(consumers) != 1 or not isinstance(consumers[0].prim, SumAxes):
        return consumers
    (stmt,) = consumers
    x = stmt.args[0]
    if x.aval.ndim != 1 or x.aval.dtype.kind != "f":
        return consumers
    dtype = x.aval.dtype
    if dtype not in _SUM_REDUCES:
        _SUM_REDUCES[dtype] = fold.trace(lambda v: fold.reduce(fold.monoids.sum, v), np.zeros(2, dtype)).stmts[0]
    template = _SUM_REDUCES[dtype]
    return [Let(stmt.outs, template.prim, (template.args[0], x))]


_SUM_REDUCES: dict[np.dtype, Let] = {}


def fuse_loop_nests(program: Program, folds_of_scalar_maps: bool = True, row_folds: bool = True,
                    histograms: bool = True, products: Callable[[Program], bool] = no_products) -> Program:
    """`program` with its nested maps (and their folding consumers) as LoopNest statements; memoised.
    `folds_of_scalar_maps`: whether a reduce of a map of scalars becomes a nest too; `row_folds`: whether a map
    whose body folds or scans its rows, with no map inside, does; `histograms`: whether a map binned by a
    reduce_by_index does (a backend's choices: one whose nest folds are slower than its own reduce, per-row
    or histogram kernels keeps the statements apart); `products(body)`: whether a map whose body folds and
    multiplies a matrix becomes a nest (not where the backend's own product kernel runs that body faster)."""
    memo = _fused.setdefault((folds_of_scalar_maps, row_folds, histograms, products), weakref.WeakKeyDictionary())
    found = memo.get(program)
    if found is None:
        found = _fuse_with_lifted_maps(program, folds_of_scalar_maps, row_folds, histograms, products)
        # an unchanged program is not stored as its own value: the entry would keep its key alive
        memo[program] = _UNCHANGED if found is program else found
    return program if found is _UNCHANGED else found


_UNCHANGED = object()


_fused: "dict[tuple, weakref.WeakKeyDictionary[Program, Program]]" = {}


def _fuse_with_lifted_maps(program: Program, *choices) -> Program:
    """The program's nests, with NumPy-style broadcasting written as maps (broadcast_maps.py), loops over
    vectors written as maps of loops over scalars (loop_maps.py) and products over a map's axis as sums of
    its rows' outer products (outer_sums.py) where every map so written becomes part of a nest; otherwise
    the program's own statements, where the backend's kernels for broadcasting, elementwise statements,
    loops and products run them as before."""
    fused = None  # the nests of `program`, where a kept rewrite already made them
    for rewrite in (maps_of_broadcasts, loops_as_maps, outer_products_as_sums):
        lifted, maps = rewrite(program)
        if maps:
            tried = _fuse(lifted, *choices)
            if not any(isinstance(s.prim, Map) and s.outs[0] in maps for s in tried.stmts):
                program, fused = lifted, tried
    return fused if fused is not None else _fuse(program, *choices)


def _fuse(program: Program, folds_of_scalar_maps: bool, row_folds: bool, histograms: bool,
          products: Callable[[Program], bool]) -> Program:
    uses = use_counts(program)
    readers = {a: s for s in program.stmts for a in s.args if isinstance(a, Var)}
    produced_by = {v: s for s in program.stmts for v in s.outs}
    all_readers: dict[int, list[Let]] = {}
    for s in program.stmts:
        for a in s.args:
            if isinstance(a, Var) and a in produced_by:
                all_readers.setdefault(id(produced_by[a]), []).append(s)
    absorbed: set[int] = set()
    stmts: list[Let] = []
    groups: list[Group] = []
    for stmt in program.stmts:
        if id(stmt) in absorbed:
            continue
        found = _consumers(stmt, readers, uses, histograms) if isinstance(stmt.prim, Map) else None
        placed = None if found is None else _placed_around(program, stmt, *found, absorbed)
        consumers, kept = found if placed is not None else (None, [])
        folding = None if consumers is None else _as_reduces(consumers)
        folded = folds_of_scalar_maps and folding is not None and isinstance(folding[0].prim, Reduce)
        binned = consumers is not None and isinstance(consumers[-1].prim, ReduceByIndex)
        summed = consumers is not None and all(isinstance(c.prim, SumAxes) for c in consumers)
        if not _candidate(stmt, folded, row_folds, binned, products, summed):
            stmts.append(stmt)
            continue
        consumers = consumers or []
        if not consumers and any(isinstance(r.prim, Scan) for r in all_readers.get(id(stmt), ())):
            # a scan's producer is left to the scan's fusion (numba_backend/scan_fusion.py), which reads its
            # rows as it scans: the nest's scans are a row's sequential loops, not a parallel scan, and it
            # would store them
            stmts.append(stmt)
            continue
        group = [stmt] + (folding or consumers)
        iotas = _iotas_read(stmt, produced_by)
        nest = _loop_nest(group, kept, iotas)
        if nest is None:
            stmts.append(stmt)
            continue
        before, after = placed or ([], [])
        absorbed.update(id(r) for r in consumers)
        absorbed.update(id(s) for s in before + after)
        groups.append(Group(group, list(kept), iotas, len(stmts) + len(before), nest))
        stmts += before + [nest] + after
    stmts = join_siblings(stmts, groups, _loop_nest)
    if len(stmts) == len(program.stmts) and all(a is b for a, b in zip(stmts, program.stmts)):
        return program
    read = {a for s in stmts for a in s.args} | set(program.outputs)
    stmts = [s for s in stmts if not (isinstance(s.prim, Iota) and s.outs[0] not in read)]  # made in the nests now
    return Program(program.inputs, tuple(stmts), program.outputs, program.in_tree, program.out_tree, dict(program.meta))


def _iotas_read(stmt: Let, produced_by: dict) -> list[Let]:
    """The iotas the map `stmt` maps over: the nest makes their elements (its index) instead of reading
    arrays of them, and knows their bounds (a gather at such an index needs no check)."""
    xs = stmt.args[stmt.prim.num_consts:]
    return list(dict.fromkeys(produced_by[a] for a in xs if isinstance(a, Var) and a in produced_by
                              and isinstance(produced_by[a].prim, Iota)))


def _placed_around(program: Program, stmt: Let, consumers: list[Let], kept: list[Var], absorbed: set[int]):
    """(the statements between the map `stmt` and its last consumer that go before the nest, those that go
    after it): what the consumers read beside the map's rows (an identity, captured values) is computed
    before the nest; what reads a result the nest keeps or folds, after it. None where a consumer reads such a later
    value: the nest cannot be placed."""
    last = max(program.stmts.index(r) for r in consumers)
    ids = {id(r) for r in consumers}
    between = [s for s in program.stmts[program.stmts.index(stmt) + 1: last] if id(s) not in absorbed | ids]
    made = {v for r in consumers for v in r.outs}
    later = set(kept) | made  # what the nest makes
    before, after = [], []
    for s in between:
        if any(isinstance(a, Var) and a in later for a in s.args):
            later.update(s.outs)
            after.append(s)
        else:
            before.append(s)
    if any(isinstance(a, Var) and a in later and a not in kept and a not in made for r in consumers for a in r.args):
        return None
    return before, after


def _loop_nest(group: list[Let], kept: Sequence[Var] = (), made_inside: Sequence[Let] = ()) -> Let | None:
    """The group as one LoopNest statement (its results: the map's `kept` results, then its consumers'), or
    None if the nest cannot be built for it. `made_inside`: statements of no arguments (iotas) the map
    reads, which the nest makes again itself."""
    # a reshape flattening the map's rows for a histogram is read inside the nest alone
    outs = (tuple(kept) + tuple(v for s in group[1:] if not isinstance(s.prim, Reshape) for v in s.outs)
            if len(group) > 1 else tuple(group[0].outs))
    group = list(made_inside) + list(group)
    inner = {v for s in group for v in s.outs}
    args = list(dict.fromkeys(a for s in group for a in s.args if isinstance(a, Var) and a not in inner))
    remap = {a: Var(a.aval) for a in args}
    stmts = tuple(Let(s.outs, s.prim, tuple(remap.get(a, a) if isinstance(a, Var) else a for a in s.args)) for s in group)
    _, in_tree = tree_flatten(tuple(range(len(args))))
    _, out_tree = tree_flatten(tuple(range(len(outs))))
    program = Program(tuple(remap[a] for a in args), stmts, outs, in_tree, out_tree, {})
    prim = LoopNest(program)
    try:
        kernel_of(prim)
    except NotNestable:
        return None
    return Let(outs, prim, tuple(args))


# per statement: its kernel and the constants the kernel reads. Two statements may build equal kernels (the
# same text) reading different constants, so the constants are kept with the statement, not the kernel.
_kernels: "weakref.WeakKeyDictionary[LoopNest, tuple[Kernel, dict]]" = weakref.WeakKeyDictionary()


def kernel_of(prim: LoopNest) -> Kernel:
    """The loop nest of a LoopNest statement (memoised); NotNestable if a statement has no rule."""
    found = _kernels.get(prim)
    if found is None:
        found = _kernels[prim] = _build(prim.program)
    return found[0]


def constants_of(prim: LoopNest) -> dict[str, np.ndarray]:
    """The values of the kernel's "constant" parameters (arrays the traced program closed over)."""
    kernel_of(prim)
    return _kernels[prim][1]


def _build(program: Program) -> tuple[Kernel, dict]:
    params: list[Param] = []

    def constant(value: np.ndarray) -> str:
        name = f"k{len(params)}"
        params.append(Param(name, value.shape, value.dtype, "constant", ))
        constants[name] = value
        return name

    constants: dict[str, np.ndarray] = {}
    w = Writer(constant)
    env = {}
    for j, v in enumerate(program.inputs):
        name = f"in{j}"
        params.append(Param(name, tuple(v.aval.shape), v.aval.dtype, "input"))
        env[v] = Stored(name, tuple(v.aval.shape), v.aval.dtype, is_input=True)
    made_inside = list(itertools.takewhile(lambda s: not isinstance(s.prim, Map), program.stmts))
    for stmt in made_inside:  # iotas (fuse's _iotas_read): their elements are the index
        (env[stmt.outs[0]],) = w.body(Program((), (stmt,), stmt.outs, None, None, {}), [])
    map_stmt, readers = program.stmts[len(made_inside)], program.stmts[len(made_inside) + 1:]
    prim = map_stmt.prim
    values = [w.value(a, env) for a in map_stmt.args]
    consts, xs = values[: prim.num_consts], values[prim.num_consts:]
    for v in (consts + xs):
        if not isinstance(v, (Stored, Scalar)) and not (isinstance(v, Pull) and not v.heavy):
            raise NotNestable("a map's argument that is not stored")
    n = int(map_stmt.outs[0].aval.shape[0])
    outputs = [f"out{j}" for j in range(len(program.outputs))]
    for name, v in zip(outputs, program.outputs, strict=True):
        params.append(Param(name, tuple(v.aval.shape), v.aval.dtype, "output"))
    index = "i"
    w.blocks.append([])
    rows = map_row(w, prim.body, consts, xs, index)
    if not readers:
        store_rows(w, outputs, rows, (index,))
        outer = ParallelMap(index, n, tuple(w.blocks.pop()))
        return prune(_checked(Kernel(tuple(params), outer), w)), constants
    # the map's results kept beside the folds: stored row by row as the fold runs
    by_var = dict(zip(map_stmt.outs, rows, strict=True))
    kept = [v for v in program.outputs if v in by_var]
    store_rows(w, outputs[: len(kept)], [by_var[v] for v in kept], (index,))
    folded = outputs[len(kept):]
    sums = list(itertools.takewhile(lambda r: isinstance(r.prim, SumAxes), readers))
    rest = readers[len(sums):]
    # each fold's statements go into the one step; its states, their start and their merge are its own
    parts = [_sums(w, sums, by_var, folded[: len(sums)])] if sums else []
    if rest and isinstance(rest[-1].prim, ReduceByIndex):
        flattened = {r.outs[0]: r.args[0] for r in rest[:-1]}  # the map's rows flattened (_flattened)
        parts.append(_histogram(w, rest[-1], by_var, env, folded[len(sums):], index, flattened))
    elif rest:
        parts.append(_fold(w, rest[0], by_var, env, folded[len(sums):]))
    step = tuple(w.blocks.pop())
    outer = ParallelFold(index, n, tuple(st for part in parts for st in part.states),
                         tuple(node for part in parts for node in part.init), step,
                         tuple(node for part in parts for node in part.merge),
                         folds=tuple(f for part in parts for f in part.folds) if len(parts) == 1 else ())
    return prune(_checked(Kernel(tuple(params), outer), w)), constants


@dataclass(frozen=True)
class _FoldPart:
    """One fold of a nest's outer loop: its states, the statements starting them in each chunk and merging
    the chunks' partial states, and (a lone commutative reduce) its lanes (ParallelFold.folds)."""

    states: tuple
    init: tuple
    merge: tuple
    folds: tuple = ()


def _checked(kernel: Kernel, w: Writer) -> Kernel:
    """The kernel with the ranges its inputs must lie in (Writer.require) recorded."""
    return dataclasses.replace(kernel, checked=tuple((name, low, high) for name, (low, high) in w.required.items()))


def _sums(w: Writer, readers: list[Let], by_var: dict, outputs: list[str]) -> _FoldPart:
    """Sums over the map's axis, one per result: each state is one row, added to."""
    states, init, merge = [], [], []
    for reader, output in zip(readers, outputs, strict=True):
        row, aval = by_var[reader.args[0]], reader.outs[0].aval
        carried = (carry_for("add", [aval.dtype]) or (aval.dtype,))[0]  # float32 added up in float64, as _fold
        state = State(w.fresh("state"), tuple(aval.shape), carried, output, stored=True, summed=True)
        dt = carried.name
        w.each_nonzero(row, lambda idx: w.emit(Store(
            state.name, idx, f"np.{dt}({_at(state.name, idx)} + {w.element(row, idx)})")))
        init += _fill(w, state, lambda idx: f"np.{dt}(0)")
        w.blocks.append(merge)
        w.each_index(state.shape, lambda idx: w.emit(Store(
            state.name, idx, f"np.{dt}({_at(state.name, idx)} + {_at('partial_' + state.name, ('chunk',) + (idx or ('0',)))})")))
        w.blocks.pop()
        states.append(state)
    return _FoldPart(tuple(states), tuple(init), tuple(merge))


def _fold(w: Writer, reader: Let, by_var: dict, env: dict, outputs: list[str]) -> _FoldPart:
    """The reduce `reader` over the map's rows."""
    red = reader.prim
    k, nc = red.num_leaves, red.num_consts
    values = [w.value(a, env) for a in reader.args[: nc + k]]
    consts, identity, leaves = values[:nc], values[nc:], reader.args[nc + k:]
    # float32 folds carried in float64 and rounded once, as the backends' other folds (wide_operators.py)
    operator, carried = carried_operator(red.body, nc, [a.aval.dtype for a in reader.outs])
    dtypes = list(carried or [a.aval.dtype for a in reader.outs])
    states = tuple(State(w.fresh("state"), (), d, out) for d, out in zip(dtypes, outputs, strict=True))
    elements = [by_var[v] for v in leaves]
    _combine(w, operator, consts, states, elements)
    init_parts: list = []
    w.blocks.append(init_parts)
    identities = [w.element(e, ()) if e.dtype == s.dtype else f"np.{s.dtype.name}({w.element(e, ())})"
                  for s, e in zip(states, identity, strict=True)]  # a carried state starts in its own dtype
    for s, e in zip(states, identities, strict=True):
        w.emit(Assign(s.name, e))
    w.blocks.pop()
    merge_parts = []
    w.blocks.append(merge_parts)
    _combine(w, operator, consts, states, [Scalar(f"partial_{s.name}[chunk]", s.dtype) for s in states])
    w.blocks.pop()
    commutative = commutative_fold(red)
    folds = (lane_fold(w, operator, consts, [s.name for s in states], identities, dtypes),) if commutative else ()
    return _FoldPart(states, tuple(init_parts), tuple(merge_parts), folds)


def _histogram(w: Writer, reader: Let, by_var: dict, env: dict, outputs: list[str], index: str,
               flattened: dict | None = None) -> _FoldPart:
    """The histogram `reader` of the map's rows: each state is the bins of one leaf,
    (bins,) + the element's shape; an index outside the bins is ignored, as reduce_by_index says. Where the
    histogram reads the rows flattened (`flattened`: the reshape's result -> the map's), each row's
    elements are binned in order."""
    rbi = reader.prim
    k, nc = rbi.num_leaves, rbi.num_consts
    values = [w.value(a, env) for a in reader.args[: nc + k]]
    consts, identity = values[:nc], values[nc:]
    by_var = dict(by_var) | {flat: by_var[v] for flat, v in (flattened or {}).items()}
    at = reader.args[nc + k]
    leaves = [by_var[v] for v in reader.args[nc + k + 1:]]
    dtypes = [a.aval.dtype for a in reader.outs]
    # float32 bins carried in float64 and rounded once, as the backends' other folds (wide_operators.py)
    operator, carried = carried_operator(rbi.body, nc, dtypes)
    carried = list(carried or dtypes)
    states = tuple(State(w.fresh("state"), tuple(a.aval.shape), d, out, stored=True)
                   for a, d, out in zip(reader.outs, carried, outputs, strict=True))
    componentwise = recognize_binary_op(operator, nc) is not None
    where = by_var[at] if at in by_var else w.value(at, env)

    def bin_one(lead: tuple, leaves: list) -> None:
        b = w.assign(f"np.int64({w.element(where, lead)})", "h")
        w.guarded(f"0 <= {b} < {rbi.n}", lambda: _into_bin(w, operator, consts, states, b, leaves, componentwise))

    if flattened:  # a row of elements, each binned in turn
        w.loop(where.shape[0], lambda j: bin_one((j,), [_element_of(w, leaf, j) for leaf in leaves]))
    else:
        bin_one(() if at in by_var else (index,), leaves)
    init = tuple(node for s, e, d in zip(states, identity, dtypes, strict=True)
                 for node in _fill(w, s, lambda idx, s=s, e=e, d=d: cast(w.element(e, idx[1:]), s.dtype, d)))
    merge: list = []
    w.blocks.append(merge)
    partials = [_bin_view(f"partial_{s.name}", ("chunk",), s) for s in states]
    w.loop(rbi.n, lambda bin_: _into_bin(w, operator, consts, states, bin_, [p(bin_) for p in partials], componentwise))
    w.blocks.pop()
    return _FoldPart(states, init, tuple(merge))


def _element_of(w: Writer, row, j: str):
    """Element j of a map's row (a vector of scalars, or of arrays), read here."""
    if len(row.shape) == 1:
        return Scalar(w.element(row, (j,)), row.dtype)
    return Pull(row.shape[1:], row.dtype, lambda w, idx: w.element(row, (j,) + idx), getattr(row, "heavy", False))


def _bin_view(name: str, lead: tuple, state: State):
    """bin -> the element of array `name` at `lead` + (bin,): a Scalar, or a Pull of the element's shape."""
    shape = state.shape[1:]

    def view(bin_: str):
        if not shape:
            return Scalar(f"{name}[{', '.join(lead + (bin_,))}]", state.dtype)
        return Pull(shape, state.dtype, lambda w, idx: f"{name}[{', '.join(lead + (bin_,) + idx)}]", False)

    return view


def _into_bin(w: Writer, operator: Program, consts: list, states, bin_: str, elements: list, componentwise: bool) -> None:
    """Each state's bin `bin_` = operator(consts, the bins, elements). Every result is computed before any bin
    is written (an operator may read a bin's other components), unless the operator is componentwise."""
    bins = [_bin_view(s.name, (), s)(bin_) for s in states]
    results = w.body(operator, list(consts) + bins + list(elements))
    if not componentwise:
        results = [Scalar(w.assign(w.element(r, ())), r.dtype) if r.shape == () else w.materialise(r) for r in results]
    for s, r in zip(states, results, strict=True):
        w.each_index(s.shape[1:], lambda idx, s=s, r=r: w.emit(Store(s.name, (bin_,) + idx, cast(w.element(r, idx), s.dtype, r.dtype))))


def _combine(w: Writer, body: Program, consts, states, elements) -> None:
    """states = body(consts, states, elements), written here."""
    fold_into(w, body, consts, [s.name for s in states], [s.dtype for s in states], list(elements))


def _at(name: str, idx: tuple) -> str:
    return f"{name}[{', '.join(idx)}]" if idx else f"{name}[0]"


def _fill(w: Writer, state: State, element: Callable[[tuple], str]) -> tuple:
    """A stored state's buffer, each index set to `element(index)`."""
    parts: list = [Buffer(state.name, state.shape or (1,), state.dtype)]
    w.blocks.append(parts)
    w.each_index(state.shape, lambda idx: w.emit(Store(state.name, idx, element(idx))))
    w.blocks.pop()
    return tuple(parts)


@numpy_impls.register(LoopNest)
def _reference(prim: LoopNest, args: list, depth: int) -> list:
    """The statements the nest replaced, as they were: what a backend that declines runs."""
    return eval_program(prim.program, args, depth)
