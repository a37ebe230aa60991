"""How each primitive runs when an operand is split: one rule per primitive type (a RuleTable).

A rule takes the context, the statement (and its index, for keys and errors) and its operands'
placements, submits the statement's work, and returns its outputs' placements. A statement none of whose
operands is split runs whole on one worker (executor.py). A primitive with no rule here, or a rule that
meets a split it cannot run, raises ShardingError naming the statement and the axis: nothing is ever
gathered onto one worker to make a statement run.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from fold.ir import Let, Program
from fold.primitives.ad_support import StopGradient
from fold.primitives.combinators import Map, Reduce, ReduceByIndex, Scan
from fold.primitives.elementwise import Elementwise
from fold.primitives.gemm import GemmBlockSum, GemmMapReduce, split_gemm_args
from fold.primitives.structural import BroadcastTo, Convert, MatMul, Reshape, SumAxes, Transpose
from fold.rules import RuleTable
from fold.tracing import trace_body

from . import tasks
from .combine import Partial, exclusive_prefix, tree_combine
from .context import Context
from .placement import Rep, Split, describe
from .spec import ShardingError

shard_rules = RuleTable("sharded execution")


def refuse(index: int, stmt: Let, position: int, placement: Split, why: str) -> ShardingError:
    """The error for a split `stmt` cannot run with: the statement, the operand, its split, and why."""
    aval = stmt.args[position].aval
    return ShardingError(f"fold.shard: statement {index} ({stmt.prim.name}) reads operand {position} ({aval}) "
                         f"{describe(placement)}: {why}. Split another argument or axis, or pass this one whole")


def common_split(index: int, stmt: Let, args: Sequence, positions: Sequence[int], axis: int | None) -> Split | None:
    """The split shared by the operands at `positions` (each split on `axis`, or whole), None if none is."""
    found = None
    for i in positions:
        p = args[i]
        if not isinstance(p, Split):
            continue
        if axis is not None and p.axis != axis:
            raise refuse(index, stmt, i, p, f"{stmt.prim.name} can only run split on axis {axis}")
        if found is not None and (p.chunks != found.chunks or p.axis != found.axis):
            raise refuse(index, stmt, i, p, f"another operand is {describe(found)}; operands must be split alike")
        found = found or p
    return found


def shard_values(ctx: Context, args: Sequence, split: Split, k: int, sliced: dict[int, int]) -> tuple[list, list]:
    """Shard k's operands: split ones' chunk k, whole ones cut along `sliced[i]` where listed, else whole."""
    values, avals = [], []
    worker = split.workers[k]
    for i, p in enumerate(args):
        if isinstance(p, Split):
            values.append(p.parts[k])
            avals.append(p.chunk_aval(k))
        elif i in sliced:
            axis = sliced[i]
            values.append(ctx.sliced(p, axis, split.chunks, split.workers)[k])
            shape = list(p.aval.shape)
            shape[axis] = split.chunks[k]
            avals.append(p.aval.update(shape=tuple(shape)))
        else:
            values.append(p.on(worker))
            avals.append(p.aval)
    return values, avals


def chunk_group(split: Split, k: int) -> tuple:
    """Names chunk k of `split`'s chunking: the shard-local work of one group is fused into one program."""
    return (k, split.chunks, split.workers)


def per_shard(ctx: Context, index: int, stmt: Let, args: Sequence, split: Split, sliced: dict[int, int],
              prim_for=None, tag: str = "shard") -> list[list]:
    """Run the statement (or `prim_for(k)`) on every shard; per shard, its outputs (LazyOuts: recorded in
    the chunk's shard program, fused with the shard-local statements around it, see fusion.py)."""
    results = []
    for k in range(len(split.chunks)):
        values, avals = shard_values(ctx, args, split, k, sliced)
        prim = prim_for(k) if prim_for else stmt.prim
        results.append(ctx.run_shard(index, tag, prim, stmt.args, values, avals, split.workers[k], chunk_group(split, k),
                                     len(stmt.outs)))
    return results


def as_split(stmt: Let, results: list[list], split: Split, axes: Sequence[int]) -> list[Split]:
    return [Split(axes[j], split.chunks, tuple(r[j] for r in results), split.workers, out.aval)
            for j, out in enumerate(stmt.outs)]


def combined(ctx: Context, index: int, stmt: Let, results: list[list], split: Split, op, num_consts: int,
             consts: list, mapped: bool) -> list[Rep]:
    """Outputs from per-shard partial states: combined in a tree with `op`, in order."""
    parts = [Partial(ctx.pack(r, split.workers[k]), split.workers[k]) for k, r in enumerate(results)]
    total = tree_combine(ctx, (index,), op, num_consts, consts, [o.aval for o in stmt.outs], parts, mapped)
    return [Rep(ctx.submit(tasks.item, total.packed, j, worker=total.worker, name="item"), o.aval, total.worker)
            for j, o in enumerate(stmt.outs)]


def summed(ctx: Context, index: int, stmt: Let, results: list[list], split: Split, outs: Sequence[int]) -> dict[int, Rep]:
    """The outputs at `outs` as sums over the shards (partial sums added in a tree)."""
    reps = {}
    for j in outs:
        aval = stmt.outs[j].aval
        parts = [Partial(ctx.pack([r[j]], split.workers[k]), split.workers[k]) for k, r in enumerate(results)]
        total = tree_combine(ctx, (index, j, "add"), _adder(aval), 0, [], [aval], parts, False)
        reps[j] = Rep(ctx.submit(tasks.item, total.packed, 0, worker=total.worker, name="item"), aval, total.worker)
    return reps


def _adder(aval) -> "Program":
    """(a, b) -> a + b on values of `aval`: the combine of partial sums."""
    return trace_body(lambda a, b: a + b, [aval, aval], "partial sum").program


# ---------------------------------------------------------------- elementwise and structural: data parallel

@shard_rules.register(Elementwise, Convert, StopGradient)
def _elementwise(ctx, index, stmt, args):
    out_ndim = stmt.outs[0].aval.ndim
    split = common_split(index, stmt, args, [i for i, a in enumerate(args) if a.aval.ndim == out_ndim], None)
    sliced = {i: split.axis for i, a in enumerate(args) if isinstance(a, Rep) and a.aval.ndim == out_ndim}
    return as_split(stmt, per_shard(ctx, index, stmt, args, split, sliced), split, [split.axis] * len(stmt.outs))


@shard_rules.register(Transpose)
def _transpose(ctx, index, stmt, args):
    split = args[0]
    return as_split(stmt, per_shard(ctx, index, stmt, args, split, {}), split, [stmt.prim.perm.index(split.axis)])


@shard_rules.register(Reshape)
def _reshape(ctx, index, stmt, args):
    """A reshape that keeps the axes up to the split one, or merges the split axis with the axes after it (a
    gradient's scatter entries, rows of k flattened: fold/scatter_sums.py), each shard reshaped on its own."""
    split, new = args[0], tuple(stmt.prim.shape)
    old, a = tuple(split.aval.shape), split.axis
    if new[:a + 1] == old[:a + 1]:
        merged = a + 1  # the axes after the split one reshaped as they may be
    else:
        merged = next((m for m in range(a + 2, len(old) + 1) if new[:a] == old[:a] and new[a + 1:] == old[m:]
                       and new[a:a + 1] == (math.prod(old[a:m]),)), None)
    if merged is None:
        raise refuse(index, stmt, 0, split, f"reshape to {new} neither keeps axes 0..{a} of {old} nor merges "
                                            f"axis {a} with the axes after it")
    factor = math.prod(old[a + 1:merged])  # each row of the split axis becomes this many
    chunks = tuple(c * factor for c in split.chunks)

    def prim_for(k):
        return dataclasses.replace(stmt.prim, shape=new[:a] + (chunks[k],) + new[a + 1:])

    results = per_shard(ctx, index, stmt, args, split, {}, prim_for, "reshape")
    return as_split(stmt, results, dataclasses.replace(split, chunks=chunks), [a])


@shard_rules.register(BroadcastTo)
def _broadcast(ctx, index, stmt, args):
    split, new = args[0], stmt.prim.shape
    axis = len(new) - split.aval.ndim + split.axis
    if new[axis] != split.aval.shape[split.axis]:
        raise refuse(index, stmt, 0, split, f"broadcast to {new} stretches the split axis")

    def prim_for(k):
        return dataclasses.replace(stmt.prim, shape=new[:axis] + (split.chunks[k],) + new[axis + 1:])

    return as_split(stmt, per_shard(ctx, index, stmt, args, split, {}, prim_for, "broadcast"), split, [axis])


@shard_rules.register(SumAxes)
def _sum_axes(ctx, index, stmt, args):
    split = args[0]
    results = per_shard(ctx, index, stmt, args, split, {})
    if split.axis in stmt.prim.axes:  # each shard sums its rows; the partial sums are added in a tree
        return [summed(ctx, index, stmt, results, split, [0])[0]]
    return as_split(stmt, results, split, [split.axis - sum(a < split.axis for a in stmt.prim.axes)])


@shard_rules.register(MatMul)
def _matmul(ctx, index, stmt, args):
    a, b = args
    if isinstance(a, Split) and isinstance(b, Split):
        if a.axis != 1 or b.axis != 0 or a.chunks != b.chunks:
            raise refuse(index, stmt, 1, b, f"the lhs is {describe(a)}; a product of two split matrices needs the "
                         f"lhs split on axis 1 and the rhs on axis 0, alike")
        return [summed(ctx, index, stmt, per_shard(ctx, index, stmt, args, a, {}), a, [0])[0]]  # Megatron's all-reduce
    if isinstance(a, Split):
        if a.axis != 0:
            raise refuse(index, stmt, 0, a, "the lhs of a product with a whole rhs must be split on axis 0 (rows)")
        return as_split(stmt, per_shard(ctx, index, stmt, args, a, {}), a, [0])
    if b.axis != 1:
        raise refuse(index, stmt, 1, b, "the rhs of a product with a whole lhs must be split on axis 1 (columns)")
    return as_split(stmt, per_shard(ctx, index, stmt, args, b, {}), b, [1])
