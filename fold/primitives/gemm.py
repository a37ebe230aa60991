"""gemm_map_reduce as a primitive, and the backward primitive its vjp emits.

Argument layout: consts, identity leaves, row-blocked operands (the lhs matrices, then the row data),
column-blocked operands (the rhs matrices, then the column data). The runtime walks the (M, N) index space
block by block: a block program (one per block shape that occurs) maps the blocks of its operands to the
block's row totals, and `op` (the monoid's operator) folds those into the running totals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..dtypes import ShapedArray
from ..errors import ShapeError
from ..ir import Primitive, Program
from ..tracing import shape_rules


def _lookup(table: tuple, shape: tuple[int, int]) -> Program:
    for key, program in table:
        if key == shape:
            return program
    raise KeyError(shape)


@dataclass(frozen=True)
class GemmMapReduce(Primitive):
    fn: Program  # the user's map, element level (what the primitive means; printed)
    blocks: tuple  # ((bi, bj), block program) per block shape
    op: Program  # the monoid operator, element level
    monoid: Any
    num_consts: int
    num_row_args: int
    num_col_args: int
    block: tuple[int, int]
    name = "gemm_map_reduce"

    def bodies(self) -> list[Program]:
        return [self.fn, self.op] + [p for _, p in self.blocks]

    def printed_bodies(self) -> list[Program]:
        return [self.fn]

    def block_program(self, shape: tuple[int, int]) -> Program:
        return _lookup(self.blocks, shape)

    @property
    def num_leaves(self) -> int:
        return len(self.op.outputs)


@dataclass(frozen=True)
class GemmMapReduceVJP(Primitive):
    """Per block: recompute the block's totals T, take T's cotangent from D(A, T, Abar) (Corollary 2.1.1), and
    run the block program's return sweep; cotangents of row (column) operands are accumulated per row (column)
    block. Each block's backward program maps (block operands, A rows, Abar rows) to the operands' cotangents."""

    forward: GemmMapReduce
    block_vjps: tuple  # ((bi, bj), backward program of that block)
    d: Program  # the monoid's d(c, a, g), element level
    name = "gemm_map_reduce_vjp"

    def bodies(self) -> list[Program]:
        return [self.d] + [p for _, p in self.block_vjps]

    def printed_bodies(self) -> list[Program]:
        return []

    def block_vjp(self, shape: tuple[int, int]) -> Program:
        return _lookup(self.block_vjps, shape)


def split_gemm_args(prim, args: list) -> tuple[list, list, list, list]:
    nc, k = prim.num_consts, prim.num_leaves
    consts, identity = args[:nc], args[nc: nc + k]
    rows = args[nc + k: nc + k + prim.num_row_args]
    cols = args[nc + k + prim.num_row_args: nc + k + prim.num_row_args + prim.num_col_args]
    return list(consts), list(identity), list(rows), list(cols)


@shape_rules.register(GemmMapReduce)
def _gemm_shape(prim: GemmMapReduce, *avals: ShapedArray) -> list[ShapedArray]:
    consts, identity, rows, cols = split_gemm_args(prim, list(avals))
    if len(avals) != prim.num_consts + prim.num_leaves + prim.num_row_args + prim.num_col_args:
        raise ShapeError("gemm_map_reduce: wrong number of operands")
    m = {a.shape[0] for a in rows}
    n = {a.shape[0] for a in cols}
    if len(m) != 1 or len(n) != 1:
        raise ShapeError(f"gemm_map_reduce: row operands {[a.shape for a in rows]} / column operands {[a.shape for a in cols]} disagree on M / N")
    if list(identity) != list(prim.op.out_avals):
        raise ShapeError("gemm_map_reduce: identity does not match the monoid's elements")
    size = m.pop()
    return [a.update(shape=(size,) + a.shape) for a in identity]


@shape_rules.register(GemmMapReduceVJP)
def _gemm_vjp_shape(prim: GemmMapReduceVJP, *avals: ShapedArray) -> list[ShapedArray]:
    forward = prim.forward
    n_in = forward.num_consts + forward.num_leaves + forward.num_row_args + forward.num_col_args
    consts, _, rows, cols = split_gemm_args(forward, list(avals[:n_in]))
    return list(consts) + list(rows) + list(cols)
