"""Sharded rules of gemm_map_reduce and of its gradient's block sums.

Split over rows (the lhs and row data split alike): data parallel, each shard's rows folded where they
live. Split over columns (the rhs and column data split alike: vocabulary- or sequence-parallel): each
shard folds its columns into partial row states, combined in a tree with the monoid's operator mapped over
the rows (M x state bytes per merge). The gradient's block sum runs per shard the same way: outputs of the
split side stay split, those of the other side (and whole ones) are partial sums added in a tree.

A shard runs the statement's own block programs, so its chunks must hold whole blocks: every chunk but the
last a multiple of the block size along the split side (pass `block=` to gemm_map_reduce to choose it).
"""

from __future__ import annotations

from fold.primitives.gemm import GemmBlockSum, GemmMapReduce, split_gemm_args

from .placement import Rep, Split
from .rules import as_split, combined, common_split, per_shard, refuse, shard_rules, summed


def _check_blocks(index, stmt, position: int, split: Split, size: int, side: str) -> None:
    if any(c % size for c in split.chunks[:-1]):
        raise refuse(index, stmt, position, split, f"gemm blocks are {size} {side} wide, and every chunk but the last "
                     f"must hold whole blocks (chunks that are multiples of {size}, or block= that divides them)")


def _side(index, stmt, args, positions: list[int]) -> Split | None:
    return common_split(index, stmt, args, positions, 0)


@shard_rules.register(GemmMapReduce)
def _gemm(ctx, index, stmt, args):
    prim = stmt.prim
    nc, k = prim.num_consts, prim.num_leaves
    positions = list(range(len(args)))
    consts_ids, _, rows, cols = split_gemm_args(prim, positions)
    for i in consts_ids + positions[nc: nc + k]:
        if isinstance(args[i], Split):
            raise refuse(index, stmt, i, args[i], "gemm_map_reduce's map captures it; a captured value must be whole")
    row_split, col_split = _side(index, stmt, args, rows), _side(index, stmt, args, cols)
    if row_split is not None and col_split is not None:
        i = next(i for i in cols if isinstance(args[i], Split))
        raise refuse(index, stmt, i, args[i], "the rows are split too; split gemm_map_reduce over rows or over columns, not both")
    if row_split is not None:  # data parallel over rows
        _check_blocks(index, stmt, rows[0], row_split, prim.block[0], "rows")
        sliced = {i: 0 for i in rows if isinstance(args[i], Rep)}
        return as_split(stmt, per_shard(ctx, index, stmt, args, row_split, sliced), row_split, [0] * k)
    _check_blocks(index, stmt, cols[0], col_split, prim.block[1], "columns")
    sliced = {i: 0 for i in cols if isinstance(args[i], Rep)}
    results = per_shard(ctx, index, stmt, args, col_split, sliced)  # per shard: (M, state) partial row states
    return combined(ctx, index, stmt, results, col_split, prim.op, 0, [], mapped=True)


@shard_rules.register(GemmBlockSum)
def _block_sum(ctx, index, stmt, args):
    prim = stmt.prim
    by_role = {role: [i for i, r in enumerate(prim.in_roles) if r == role] for role in ("whole", "row", "col")}
    for i in by_role["whole"]:
        if isinstance(args[i], Split):
            raise refuse(index, stmt, i, args[i], f"{prim.label} reads it whole in every block")
    row_split, col_split = _side(index, stmt, args, by_role["row"]), _side(index, stmt, args, by_role["col"])
    if row_split is not None and col_split is not None:
        i = next(i for i in by_role["col"] if isinstance(args[i], Split))
        raise refuse(index, stmt, i, args[i], f"the rows of {prim.label} are split too; split over rows or columns, not both")
    side, split = ("row", row_split) if row_split is not None else ("col", col_split)
    _check_blocks(index, stmt, by_role[side][0], split, prim.block[0 if side == "row" else 1], f"{side}s")
    sliced = {i: 0 for i in by_role[side] if isinstance(args[i], Rep)}
    results = per_shard(ctx, index, stmt, args, split, sliced)
    kept = [j for j, r in enumerate(prim.out_roles) if r == side]
    sums = summed(ctx, index, stmt, results, split, [j for j in range(len(stmt.outs)) if j not in kept])
    outs = as_split(stmt, results, split, [0] * len(stmt.outs))
    return [outs[j] if j in kept else sums[j] for j in range(len(stmt.outs))]
