"""Elementwise fusion for the numba backend: a run of array-wide elementwise statements becomes one loop.

Array code outside any map (gemm_map_reduce's block programs, their gradients, top-level expressions such
as `exp(z - m) / total`) is a chain of whole-array statements, each a NumPy pass over memory on one thread.
`fuse_elementwise(program)` gathers consecutive elementwise statements (and conversions) of one shape into a
`FusedElementwise` statement: the chain as a scalar function, run by one parallel kernel over the array that
writes only the values used later. Statements in between that read none of the chain's values (the cheap
reshapes and broadcasts the tracer inserts, a row maximum of an earlier value) are moved before it.

Broadcast operands (a per-row value against a block) are read as NumPy's zero-stride views, never expanded;
an operand of one element (a 0-d value, or a sum's cotangent broadcast to the whole array) is a scalar of the
kernel, whose loop then vectorises.
A reduce that is the only reader of the run's only result joins it (the run's value is then never stored),
as does a `fold.sum` of a vector (as the sum monoid's reduce), even after a single statement; where the run
makes other values too, the reduce takes with it the members that only it reads (fold_producers.py gives
folds private copies of shared cheap members, so that this applies):
at the top level the whole array is folded (kernels.cpu.map_reduce), one map deep (a batched body, such as
k-means' minimum over the distances to every centroid, or its |p|^2) each row (kernels.cpu.segmented_reduce).
A sum over the last axis of one of the run's values (`rows_ndim`: a matrix's rows at the top level, the
batch in a map body) joins the run whoever else reads that value: the run stores what is read later and
sums that value row by row in the same pass (kernels.cpu.map_with_row_sums), as softmax's denominator.
The primitive's numpy implementation runs the statements it replaced, so declining is always possible.
"""

from __future__ import annotations

import math
import weakref
from collections import Counter
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from fold.ir import Let, Lit, Primitive, Program, Var, use_counts
from fold.primitives import Convert, Elementwise, Reduce, SumAxes
from fold.pytree import tree_flatten

from ..interpreter import eval_program, numpy_impls
from .. import donation
from .codegen import compile_scalar_program, is_scalar_program
from .lowering import decline, fold_options, numba_impls, run_kernel, sum_reduce_program, worth_compiling
from .wide_folds import WIDE, fused_fold, widened_last_output, widens

ELEMENTWISE = (Elementwise, Convert)  # the primitives a run is made of


@dataclass(frozen=True, eq=False)
class FusedElementwise(Primitive):
    """Elementwise statements over arrays of one shape, possibly ending in a reduce of their one result:
    `region` runs them on arrays (the reference) and returns the values used after it; `body` is the
    elementwise part on scalars (the kernel's function; it returns the reduced value, if there is a reduce).
    Both take the region's inputs in order."""

    region: Program
    # (table position, index position) in the arguments, per row gather the run reads in place (see
    # gather_fusion.py); the region's first statements are those gathers, in this order
    gathers: tuple[tuple[int, int], ...] = ()
    name = "elementwise"
    backend_internal = True
    body_fields = ("region",)
    num_consts = 0  # for the printer: the region is shown with all its inputs as parameters

    @property
    def reduce(self) -> Reduce | None:
        last = self.region.stmts[-1].prim
        return last if isinstance(last, Reduce) else None

    @property
    def row_sum(self) -> Let | None:
        """The closing sum over the last axis of one of the run's values (see row_sum_of), or over the first
        axis of a matrix (`sums_columns`), if there is one: the region's last output."""
        last = self.region.stmts[-1]
        return last if isinstance(last.prim, SumAxes) else None

    @property
    def sums_columns(self) -> bool:
        """Whether the closing sum is over the first axis of a matrix (a sum per column)."""
        last = self.row_sum
        return last is not None and last.args[0].aval.ndim == 2 and last.prim.axes == (0,)

    @property
    def identity(self):
        """The reduce's identity (a literal: see joinable_fold), if there is a reduce."""
        return self.region.stmts[-1].args[0].value[()]

    @property
    def run_shape(self) -> tuple:
        """The shape the elementwise statements run over (a gathered value has it too: see gather_fusion.py)."""
        return self.region.stmts[0].outs[0].aval.shape

    @cached_property
    def kernel_positions(self) -> tuple[int, ...]:
        """The argument positions the kernel reads, in the body's input order: all of them, less the indices
        of gathers that nothing else in the run reads (a table's position stands for its gathered rows)."""
        members = self.region.stmts[len(self.gathers):]
        read = {a for s in members for a in s.args} | set(self.region.outputs)
        skipped = {g for _, g in self.gathers if self.region.inputs[g] not in read}
        return tuple(p for p in range(len(self.region.inputs)) if p not in skipped)

    @cached_property
    def body(self) -> Program:
        """With a row sum: the stored values (the region's other outputs, in order), then the summed one.
        With gathers: the gathered rows in place of their tables (see kernel_positions)."""
        if self.gathers:
            gathered = {t: stmt.outs[0] for (t, _), stmt in zip(self.gathers, self.region.stmts, strict=False)}
            inputs = tuple(gathered.get(p, self.region.inputs[p]) for p in self.kernel_positions)
            return _scalar_body(Program(inputs, self.region.stmts[len(self.gathers):], self.region.outputs))
        *mapped, last = self.region.stmts
        if self.row_sum is not None:
            stored = tuple(o for o in self.region.outputs if o not in last.outs)
            return _scalar_body(Program(self.region.inputs, tuple(mapped), stored + (last.args[0],)))
        if self.reduce is None:
            return _scalar_body(self.region)
        return _scalar_body(Program(self.region.inputs, tuple(mapped), (last.args[-1],)))


def _scalar_body(region: Program) -> Program:
    """The region's statements on 0-d values: what one element goes through."""
    scalar = {v: Var(v.aval.update(shape=()), v.hint) for v in region.inputs}
    stmts = []
    for stmt in region.stmts:
        outs = tuple(Var(o.aval.update(shape=()), o.hint) for o in stmt.outs)
        scalar.update(zip(stmt.outs, outs, strict=True))
        stmts.append(Let(outs, stmt.prim, tuple(a if isinstance(a, Lit) else scalar[a] for a in stmt.args)))
    outputs = tuple(a if isinstance(a, Lit) else scalar[a] for a in region.outputs)
    return Program(tuple(scalar[v] for v in region.inputs), tuple(stmts), outputs)


def _region(members: list[Let], used_later: set[Var]) -> Let:
    """The members as one statement. An array the traced function closed over (a Lit of some shape) is an
    operand like any other: the statement reads it, its region takes it as an input, its scalar body one
    element of it."""
    produced = {o for s in members for o in s.outs}
    inputs = list(dict.fromkeys(a for s in members for a in s.args if isinstance(a, Var) and a not in produced))
    arrays: dict[int, tuple[Lit, Var]] = {}
    members = [_with_arrays_as_inputs(s, arrays) for s in members]
    outputs = tuple(o for s in members for o in s.outs if o in used_later)
    region = Program(tuple(inputs) + tuple(v for _, v in arrays.values()), tuple(members), outputs)
    return Let(outputs, FusedElementwise(region), tuple(inputs) + tuple(lit for lit, _ in arrays.values()))


def as_run(stmt: Let) -> Let:
    """One elementwise statement as a FusedElementwise of itself, for a rewrite that fuses runs further
    (fuse_elementwise leaves a run of one statement as it is, with nothing to gain on its own)."""
    return _region([stmt], set(stmt.outs))


def _with_arrays_as_inputs(stmt: Let, arrays: dict[int, tuple[Lit, Var]]) -> Let:
    """`stmt` reading a Var in place of each array Lit (the same Var for the same Lit, recorded in `arrays`)."""
    if not any(isinstance(a, Lit) and a.value.shape for a in stmt.args):
        return stmt
    args = tuple(arrays.setdefault(id(a), (a, Var(a.aval)))[1] if isinstance(a, Lit) and a.value.shape else a
                 for a in stmt.args)
    return Let(stmt.outs, stmt.prim, args)


def _shape(stmt: Let, scalars: bool) -> tuple | None:
    """The shape the statement runs over, if it is elementwise over an array (over a scalar, with `scalars`)."""
    if not isinstance(stmt.prim, ELEMENTWISE) or len(stmt.outs) != 1 or (stmt.outs[0].aval.ndim == 0) != scalars:
        return None
    return stmt.outs[0].aval.shape


def joinable_fold(stmt: Let) -> Let | None:
    """`stmt` as a reduce a run can join — of scalar elements, one leaf, an identity known when the program
    is written; a sum over the whole of a vector (`fold.sum(p * p)` in a map body) as the sum monoid's
    reduce — or None."""
    fold = _as_sum_reduce(stmt)
    prim = fold.prim
    if not isinstance(prim, Reduce) or prim.num_consts or prim.num_leaves != 1 or not is_scalar_program(prim.body):
        return None
    identity = fold.args[0]
    return fold if isinstance(identity, Lit) and identity.value.shape == () else None


def row_sum_of(stmt: Let, values: set[Var], ndim: int) -> Var | None:
    """The value of `values` that `stmt` sums over its last axis, if it is such a sum of an `ndim`-D number
    (`ndim` = 2 for whole arrays, whose rows are their first axis; 1 in a map body, whose rows are the
    batch), or over its first axis where `ndim` = 2 (a matrix's column sums), keeping its dtype; else None."""
    if not isinstance(stmt.prim, SumAxes) or not isinstance(stmt.args[0], Var) or stmt.args[0] not in values:
        return None
    x = stmt.args[0]
    axes = ((ndim - 1,), (0,)) if ndim == 2 else ((ndim - 1,),)
    ok = (x.aval.ndim == ndim and stmt.prim.axes in axes and x.aval.dtype.kind in "iuf"
          and stmt.outs[0].aval.dtype == x.aval.dtype)
    return x if ok else None


def _folds_only_result(fold: Let, results: Counter) -> bool:
    """Whether a joinable fold's input is the run's only result and read by nothing else (then the run's
    value is never needed whole). `results`: the run's values read after it, with their numbers of readers."""
    return results == Counter({fold.args[-1]: 1})


def _as_sum_reduce(stmt: Let) -> Let:
    """A sum over the whole of a vector of numbers as the equivalent reduce with the sum monoid; any other
    statement as it is."""
    if not isinstance(stmt.prim, SumAxes) or not isinstance(stmt.args[0], Var):
        return stmt
    x = stmt.args[0]
    if x.aval.ndim != 1 or stmt.prim.axes != (0,) or x.aval.dtype.kind not in "fiu" or stmt.outs[0].aval.dtype != x.aval.dtype:
        return stmt
    (reduce,) = sum_reduce_program(x.aval.dtype).stmts
    return Let(stmt.outs, reduce.prim, (reduce.args[0], x))


def fuse_elementwise(program: Program, min_size: int = 0, scalars: bool = False, rows_ndim: int | None = None) -> Program:
    """The program with each run of at least two elementwise statements of one shape as one statement, and
    each run (of one statement or more) that a reduce alone reads as one statement with that reduce.

    While a run is open, a statement that reads none of it runs before it; one that reads it (a sum of one
    of its values, say) waits until the run ends, and the run goes on past it as long as no later member
    needs what waits. `min_size`: statements over fewer elements are left alone, for programs whose shapes
    are the arrays' own (not a map body's, whose rows come on top), where the fused statement would only
    decline to run them one by one. `scalars`: fuse the runs of statements over scalars instead (in a map
    body, where each is a pass over the rows; a second pass, after the arrays' runs, so that neither kind
    of run splits the other). `rows_ndim`: a sum over the last axis of a run's value of this many
    dimensions (see row_sum_of) joins the run, which then stores its other values as before (the summed
    one too, if anything else reads it) and sums that one row by row."""
    uses = use_counts(program)
    readers: dict[Var, list[Let]] = {}
    for s in program.stmts:
        for a in {a for a in s.args if isinstance(a, Var)}:
            readers.setdefault(a, []).append(s)
    stmts: list[Let] = []
    members: list[Let] = []
    produced: set[Var] = set()
    waiting: list[Let] = []
    waiting_outs: set[Var] = set()
    fused = False

    def outside_uses() -> Counter:
        inside = Counter(a for s in members for a in s.args if isinstance(a, Var))
        return Counter({v: uses[v] - inside[v] for v in produced if uses[v] > inside[v]})

    def close() -> None:
        """End the run, then emit what waited for it; the first waiting reader joins the run if it is a
        reduce (or a sum of a vector) that alone reads the run's only result."""
        nonlocal fused
        reader = next((s for s in waiting if reads(s, produced)), None)
        fold_stmt = None if reader is None else joinable_fold(reader)
        summed = None if reader is None or rows_ndim is None or scalars else row_sum_of(reader, produced, rows_ndim)
        if fold_stmt is not None and members and _folds_only_result(fold_stmt, outside_uses()):
            stmts.append(_region(members + [fold_stmt], set(reader.outs)))
            waiting.remove(reader)
            fused = True
        elif summed is not None:
            stmts.append(_region(members + [reader], set(outside_uses() - Counter({summed: 1})) | set(reader.outs)))
            waiting.remove(reader)
            fused = True
        elif sum(isinstance(s.prim, ELEMENTWISE) for s in members) >= 2:
            stmts.append(_region(members, set(outside_uses())))
            fused = True
        else:
            stmts.extend(members)
        stmts.extend(waiting)
        for group in (members, waiting):
            group.clear()
        for found in (produced, waiting_outs):
            found.clear()

    def split_off_fold(stmt: Let) -> bool:
        """If `stmt` folds a value of the open run that it alone reads, made by members nothing else reads:
        emit those members with the fold as one statement now, and go on with the rest of the run."""
        nonlocal fused
        fold_stmt = joinable_fold(stmt)
        x = None if fold_stmt is None else fold_stmt.args[-1]
        if not isinstance(x, Var) or x not in produced or reads(stmt, waiting_outs):
            return False
        maker = {o: m for m in members for o in m.outs}
        own, pending = {}, [x]
        while pending:
            m = maker.get(pending.pop())
            if m is not None and id(m) not in own:
                own[id(m)] = m
                pending.extend(a for a in m.args if isinstance(a, Var))
        own_stmts = [m for m in members if id(m) in own]
        inside = Counter(a for m in own_stmts for a in m.args if isinstance(a, Var))
        outside = Counter({o: uses[o] - inside[o] for m in own_stmts for o in m.outs if uses[o] > inside[o]})
        if not _folds_only_result(fold_stmt, outside):
            return False
        stmts.append(_region(own_stmts + [fold_stmt], set(stmt.outs)))
        members[:] = [m for m in members if id(m) not in own]
        produced.difference_update(o for m in own_stmts for o in m.outs)
        fused = True
        return True

    def reads(stmt: Let, values: set[Var]) -> bool:
        return any(isinstance(a, Var) and a in values for a in stmt.args)

    def read_after_what_waits(stmt: Let) -> bool:
        """Whether `stmt` reads nothing of the open run and a reader of its value reads what waits for the run
        to end: that reader runs after the run, in a run of its own, so `stmt` joining this run would write
        its value only for that one to read back (batch normalisation's X - mu, beside the variance's run);
        it opens the next run instead, where its reader fuses with it."""
        return (not reads(stmt, produced) and bool(waiting_outs)
                and any(reads(r, waiting_outs) for o in stmt.outs for r in readers.get(o, ())))

    for stmt in program.stmts:
        shape = _shape(stmt, scalars)
        if shape is not None and math.prod(shape) < min_size:
            shape = None
        if (shape is not None and members and shape == members[0].outs[0].aval.shape and not reads(stmt, waiting_outs)
                and not read_after_what_waits(stmt)):
            members.append(stmt)
            produced.update(stmt.outs)
        elif shape is not None:
            close()
            members.append(stmt)
            produced.update(stmt.outs)
        elif reads(stmt, produced) or reads(stmt, waiting_outs):
            waiting.append(stmt)
            waiting_outs.update(stmt.outs)
            if split_off_fold(stmt):
                waiting.pop()
                waiting_outs.difference_update(stmt.outs)
        else:
            stmts.append(stmt)  # independent of the open run: it runs before the run's statement
    close()
    if not fused:
        return program
    return Program(program.inputs, tuple(stmts), program.outputs, program.in_tree, program.out_tree, dict(program.meta))


@numpy_impls.register(FusedElementwise)
def _fused_reference(prim: FusedElementwise, args: list, depth: int) -> list:
    return eval_program(prim.region, args, depth)


@numba_impls.register(FusedElementwise)
def _fused(prim: FusedElementwise, args: list, depth: int):
    """At the top level, or one map deep (a batched map body: the rows are the first axis)."""
    if depth > 1 or not args or not prim.region.outputs:
        return None
    if prim.gathers:
        return _fused_gathered(prim, args, depth)
    shape = np.broadcast_shapes(*[x.shape for x in args])
    run_ndim = len(prim.run_shape)
    if len(shape) not in (1, 2) or len(shape) != depth + run_ndim or not worth_compiling(math.prod(shape)):
        return None  # NumPy's passes are cheap at this size; the kernel is for large arrays
    if prim.reduce is not None and prim.row_sum is None:
        fn = _kernel_function(prim, prim.body, ())
        return None if fn is None else _fused_reduce(prim, fn, [np.broadcast_to(x, shape) for x in args], depth)
    # one-element operands (a gradient's cotangent of a sum, broadcast to the whole array) are passed as
    # scalars: read through a view with zero strides, they kept the loop from vectorising (2.5x slower)
    single = [k for k, x in enumerate(args) if _one_element(x)]
    single = tuple(single) if len(single) < len(args) else ()
    consts = [np.asarray(args[k]).flat[0] for k in single]
    if prim.row_sum is not None:
        summed = _fused_column_sums if prim.sums_columns and depth == 0 else _fused_row_sums
        return summed(prim, [np.broadcast_to(x, shape) for k, x in enumerate(args) if k not in single], single, consts)
    fn = _kernel_function(prim, prim.body, single)
    if fn is None:
        return None
    # before the operands' views are made (each would hold its operand): a dead operand may take a result
    outs = donation.outputs(args, shape, [v.aval.dtype for v in prim.region.outputs])
    inputs = [np.broadcast_to(x, shape) for k, x in enumerate(args) if k not in single]
    done = run_kernel(prim, "map", fn, len(inputs), len(outs), inputs, consts=consts, out=outs)
    return None if done is None else outs


def _kernel_function(prim: FusedElementwise, body: Program, single: tuple[int, ...]):
    """`body` compiled as the kernel's scalar function, its inputs at positions `single` taken first (the
    kernel's constants); None after declining where it does not compile."""
    try:
        return compile_scalar_program(_scalars_first(body, single) if single else body)
    except Exception as err:  # noqa: BLE001
        return decline(prim, f"its body does not compile: {type(err).__name__}")


def _one_element(x) -> bool:
    """Whether `x` holds one value, whatever its shape (a broadcast of one element has no nonzero stride)."""
    x = np.asarray(x)
    return x.size == 1 or (x.size > 0 and not any(x.strides))


_reordered: "weakref.WeakKeyDictionary[Program, dict[tuple[int, ...], Program]]" = weakref.WeakKeyDictionary()


def _scalars_first(body: Program, single: tuple[int, ...]) -> Program:
    """`body` taking its inputs at positions `single` first (the map kernels' constants), then the others in
    order; memoised, so that a run's kernel function is made once."""
    per_body = _reordered.setdefault(body, {})
    found = per_body.get(single)
    if found is None:
        order = list(single) + [k for k in range(len(body.inputs)) if k not in single]
        inputs = tuple(body.inputs[k] for k in order)
        _, in_tree = tree_flatten(tuple(range(len(inputs))))
        found = per_body[single] = Program(inputs, body.stmts, body.outputs, in_tree, body.out_tree, dict(body.meta))
    return found


def _fused_reduce(prim: FusedElementwise, fn, inputs: list[np.ndarray], depth: int):
    dtype = prim.region.outputs[-1].aval.dtype
    try:  # a float32 sum: summed in float64; another float32 fold: carried in float64 (wide_folds.py)
        combine, wide, carry = fused_fold(prim.reduce, dtype)
        fn = compile_scalar_program(widened_last_output(prim.body)) if wide else fn
    except Exception as err:  # noqa: BLE001
        return decline(prim, f"its reduce operator does not compile: {type(err).__name__}")
    identity = (WIDE.type(prim.identity),) if wide else (prim.identity,)
    if depth == 0:  # the whole run folded to one value
        total = run_kernel(prim, "map_reduce", fn, len(inputs), combine, 1, identity, inputs, carry=carry,
                           **fold_options(prim.reduce))
        return None if total is None else [np.asarray(total[0]).astype(dtype, copy=False)]
    rows = run_kernel(prim, "segmented_reduce", fn, combine, 1, identity, inputs,  # one fold per row
                      commutative=fold_options(prim.reduce)["commutative"], carry=carry)
    return None if rows is None else [rows[0].astype(dtype, copy=False)]


def _fused_row_sums(prim: FusedElementwise, inputs: list[np.ndarray], single: tuple[int, ...], consts: list):
    """The run's stored values, then the row sums (the region's outputs in order), from one pass; the body's
    inputs at positions `single` are the scalars `consts`."""
    if inputs[0].ndim != 2:
        return None
    dtype = prim.region.outputs[-1].aval.dtype
    body = widened_last_output(prim.body) if widens("add", dtype) else prim.body  # float32 row sums: in float64
    fn = _kernel_function(prim, body, single)
    if fn is None:
        return None
    stored = [np.empty(inputs[0].shape, v.aval.dtype) for v in prim.region.outputs[:-1]]
    found = run_kernel(prim, "map_with_row_sums", fn, len(inputs), len(stored), inputs, consts=consts, out=stored)
    return None if found is None else [*found[0], found[1].astype(dtype, copy=False)]


def _fused_column_sums(prim: FusedElementwise, inputs: list[np.ndarray], single: tuple[int, ...], consts: list):
    """The run's stored values, then the column sums, from one pass (kernels.cpu.map_with_column_sums, whose
    float partial sums are float64 already)."""
    if inputs[0].ndim != 2:
        return None
    fn = _kernel_function(prim, prim.body, single)
    if fn is None:
        return None
    stored = [np.empty(inputs[0].shape, v.aval.dtype) for v in prim.region.outputs[:-1]]
    found = run_kernel(prim, "map_with_column_sums", fn, len(inputs), len(stored), inputs, consts=consts, out=stored)
    return None if found is None else [*found[0], found[1]]


def _fused_gathered(prim: FusedElementwise, args: list, depth: int):
    """A run reading rows of small tables through per-row indices (see gather_fusion.py): one map kernel that
    reads each row where its index points. The tables must be the same for every row of a map body. The
    kernel's driver checks the indices: if one is out of range the reference runs, and its gather names it."""
    tables: dict[int, np.ndarray] = {}
    rows: dict[int, np.ndarray] = {}
    for t, g in prim.gathers:
        table, idx = args[t], args[g]
        if table.ndim != depth + 2 or any(b != 1 for b in table.shape[:depth]) or idx.ndim != 1:
            return None
        if idx.dtype.kind not in "iu":
            return None
        tables[t], rows[t] = table.reshape(table.shape[depth:]), idx
    shape = np.broadcast_shapes(*[args[p].shape for p in prim.kernel_positions if p not in tables],
                                *[rows[t].shape + tables[t].shape[1:] for t in tables])
    if len(shape) != 2 or not worth_compiling(math.prod(shape)):
        return None
    try:
        fn = compile_scalar_program(prim.body)
    except Exception as err:  # noqa: BLE001
        return decline(prim, f"its body does not compile: {type(err).__name__}")
    inputs = [tables[p] if p in tables else np.broadcast_to(args[p], shape) for p in prim.kernel_positions]
    gathered = [np.broadcast_to(rows[p], shape[:1]) if p in tables else None for p in prim.kernel_positions]
    outs = [np.empty(shape, v.aval.dtype) for v in prim.region.outputs]
    done = run_kernel(prim, "map", fn, len(inputs), len(outs), inputs, out=outs, rows=gathered)
    return None if done is None else outs
