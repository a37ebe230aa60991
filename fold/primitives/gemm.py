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


def lookup_block(table: tuple, shape: tuple[int, int]) -> Program:
    """The program of a ((bi, bj), program) table for one block shape."""
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
    keep: int = 0  # bytes of one row block's products a gradient may keep instead of recomputing them
    name = "gemm_map_reduce"

    def bodies(self) -> list[Program]:
        return [self.fn, self.op] + [p for _, p in self.blocks]

    def printed_bodies(self) -> list[Program]:
        return [self.fn]

    def block_program(self, shape: tuple[int, int]) -> Program:
        return lookup_block(self.blocks, shape)

    @property
    def num_leaves(self) -> int:
        return len(self.op.outputs)


ROLES = ("whole", "row", "col")


@dataclass(frozen=True)
class GemmBlockSum(Primitive):
    """The sum, over the blocks (i, j) of an M x N grid, of a block program's outputs, each added whole, into
    row block i, or into column block j.

    gemm_map_reduce's vjp is one (each block: recompute the block's fields, take each pair's cotangent from
    D(A, h_ij, Abar) by Theorem 2.1 and run the return sweep of the fields; or recompute the block's totals T,
    take their cotangent from D(A, T, Abar) by Corollary 2.1.1 and run the block program's return sweep). Because the sum is linear, the
    jvp and vjp of a block sum are block sums of its block programs' jvp and vjp: the construct is closed
    under differentiation, to any order, without materialising the M x N grid.

    Inputs and outputs each have a role: "whole" (every block sees, or adds to, all of it), "row" (sliced
    by row block along its leading axis of length M) or "col" (by column block, length N). `label` names
    it in printed programs.
    """

    blocks: tuple  # ((bi, bj), block program) per block shape
    block: tuple[int, int]
    in_roles: tuple[str, ...]
    out_roles: tuple[str, ...]
    label: str = "gemm_block_sum"
    name = "gemm_block_sum"

    def __post_init__(self) -> None:
        for program in (p for _, p in self.blocks):
            if len(program.inputs) != len(self.in_roles) or len(program.outputs) != len(self.out_roles):
                raise ShapeError(f"gemm_block_sum: a block program of {len(program.inputs)} inputs and "
                                 f"{len(program.outputs)} outputs for {len(self.in_roles)} input roles and "
                                 f"{len(self.out_roles)} output roles")
        unknown = (set(self.in_roles) | set(self.out_roles)) - set(ROLES)
        if unknown:
            raise ShapeError(f"gemm_block_sum: unknown roles {sorted(unknown)}; expected {ROLES}")

    def bodies(self) -> list[Program]:
        return [p for _, p in self.blocks]

    def printed_bodies(self) -> list[Program]:
        return []

    def block_program(self, shape: tuple[int, int]) -> Program:
        return lookup_block(self.blocks, shape)


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


@shape_rules.register(GemmBlockSum)
def _block_sum_shape(prim: GemmBlockSum, *avals: ShapedArray) -> list[ShapedArray]:
    extent = {}
    for role in ("row", "col"):
        sizes = {a.shape[0] for a, r in zip(avals, prim.in_roles, strict=True) if r == role}
        if len(sizes) != 1:
            raise ShapeError(f"gemm_block_sum: the {role} operands must agree on one length, got "
                             f"{[a.shape for a, r in zip(avals, prim.in_roles, strict=True) if r == role]}")
        extent[role] = sizes.pop()
    out_avals = prim.blocks[0][1].out_avals
    return [a if role == "whole" else a.update(shape=(extent[role],) + a.shape[1:])
            for a, role in zip(out_avals, prim.out_roles, strict=True)]
