"""Sharded rules of the combinators: map (data parallel), reduce and reduce_by_index (chunks folded where
they live, partial states combined in a tree with the operator, in order), scan (the chunks' totals
scanned exclusively, then each chunk's local scan offset by its prefix).

These are also what make gradients local: the monoid rule's gradient is a reduce (the total, combined)
and then a map reading the total (broadcast to each shard, D applied locally); the generic rule's is two
exclusive scans, whose cross-shard parts are exactly the exclusive scan of the shard totals.
"""

from __future__ import annotations

from fold.primitives.combinators import Map, Reduce, ReduceByIndex, Scan

from .combine import Partial, exclusive_prefix
from .placement import Rep, Split
from .programs import offset_program
from .fusion import Elem
from .rules import as_split, chunk_group, combined, common_split, per_shard, refuse, shard_rules


def _whole_consts(index, stmt, args, count: int, what: str) -> None:
    for i in range(count):
        if isinstance(args[i], Split):
            raise refuse(index, stmt, i, args[i], f"the {stmt.prim.name}'s {what} captures it; a captured value must be whole")


@shard_rules.register(Map)
def _map(ctx, index, stmt, args):
    nc = stmt.prim.num_consts
    _whole_consts(index, stmt, args, nc, "body")
    split = common_split(index, stmt, args, range(nc, len(args)), 0)
    sliced = {i: 0 for i in range(nc, len(args)) if isinstance(args[i], Rep)}
    return as_split(stmt, per_shard(ctx, index, stmt, args, split, sliced), split, [0] * len(stmt.outs))


def _fold_split(index, stmt, args, first_operand: int) -> tuple[Split, dict]:
    nc = stmt.prim.num_consts
    _whole_consts(index, stmt, args, first_operand, "operator (or its identity)")
    split = common_split(index, stmt, args, range(first_operand, len(args)), 0)
    return split, {i: 0 for i in range(first_operand, len(args)) if isinstance(args[i], Rep)}


@shard_rules.register(Reduce)
def _reduce(ctx, index, stmt, args):
    prim = stmt.prim
    split, sliced = _fold_split(index, stmt, args, prim.num_consts + prim.num_leaves)
    results = per_shard(ctx, index, stmt, args, split, sliced)
    consts = [a.on(None) for a in args[: prim.num_consts]]
    return combined(ctx, index, stmt, results, split, prim.body, prim.num_consts, consts, mapped=False)


@shard_rules.register(ReduceByIndex)
def _reduce_by_index(ctx, index, stmt, args):
    prim = stmt.prim
    split, sliced = _fold_split(index, stmt, args, prim.num_consts + prim.num_leaves)
    results = per_shard(ctx, index, stmt, args, split, sliced)  # one histogram per shard, all n bins
    consts = [a.on(None) for a in args[: prim.num_consts]]
    return combined(ctx, index, stmt, results, split, prim.body, prim.num_consts, consts, mapped=True)


@shard_rules.register(Scan)
def _scan(ctx, index, stmt, args):
    prim = stmt.prim
    nc, k = prim.num_consts, prim.num_leaves
    split, sliced = _fold_split(index, stmt, args, nc + k)
    consts = [a.on(None) for a in args[:nc]]
    total = Reduce(prim.body, nc, prim.monoid)
    totals = per_shard(ctx, index, stmt, args, split, sliced, lambda _: total, "chunk total")
    locals_ = per_shard(ctx, index, stmt, args, split, sliced, tag="local scan")  # same shard program as the totals
    totals = [Partial(ctx.pack(t[:k], split.workers[s]), split.workers[s]) for s, t in enumerate(totals)]
    identity = Partial(tuple(a.value for a in args[nc: nc + k]), None)
    elem_avals = [a.aval for a in args[nc: nc + k]]
    offsets = exclusive_prefix(ctx, (index, "prefix"), prim.body, nc, consts, elem_avals, identity, totals, prim.reverse)
    first = len(split.chunks) - 1 if prim.reverse else 0  # its offset is the identity: its local scan is final
    parts = []
    for s, local in enumerate(locals_):
        if s == first:
            parts.append(local)
            continue
        n = split.chunks[s]
        what = (index, "offset", n)
        _, program = ctx.program(what, lambda n=n: offset_program(prim.body, nc, elem_avals, n, prim.reverse))
        offset = [Elem(offsets[s].packed, j) for j in range(k)]  # the local pass: a node of the chunk's next program
        parts.append(ctx.shard_node(chunk_group(split, s), split.workers[s], what, program, consts + offset + list(local)))
    return as_split(stmt, parts, split, [0] * k)
