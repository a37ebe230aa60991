"""gemm_map_reduce on the numpy backend: a walk over (row block, column block) pairs.

For each row block, each column block's program (a BLAS matrix product, the map, the block fold) gives the
block totals, folded into the running totals with the monoid's operator; the first block's totals are the
running totals (identity . T = T, so the operator is not run on the identity). Only one block's
intermediates are alive at a time.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from fold.errors import MissingRuleError
from fold.primitives import GemmBlockSum, GemmMapReduce
from fold.primitives.gemm import split_gemm_args

from ..interpreter import eval_program, numpy_impls


def _blocks(m: int, n: int, block: tuple[int, int]):
    bi, bj = block
    for i0 in range(0, m, bi):
        yield i0, min(i0 + bi, m), [(j0, min(j0 + bj, n)) for j0 in range(0, n, bj)]


def _at_top_level(prim, depth: int) -> None:
    if depth:
        raise MissingRuleError(f"{prim.name} inside a map body is not supported by the numpy backend; call it at the top level")


BlockRunner = Callable[[object, list], list]  # (block program, its inputs) -> its outputs: how a backend runs one block


@numpy_impls.register(GemmMapReduce)
def _gemm(prim: GemmMapReduce, args: list, depth: int, run_block: BlockRunner = eval_program) -> list:
    _at_top_level(prim, depth)
    consts, identity, rows, cols = split_gemm_args(prim, args)
    m, n = rows[0].shape[0], cols[0].shape[0]
    totals = [np.empty((m,) + np.shape(e), np.asarray(e).dtype) for e in identity]
    for i0, i1, col_blocks in _blocks(m, n, prim.block):
        running = None
        row_blk = [r[i0:i1] for r in rows]
        for j0, j1 in col_blocks:
            block_totals = run_block(prim.block_program((i1 - i0, j1 - j0)), consts + row_blk + [c[j0:j1] for c in cols])
            running = block_totals if running is None else eval_program(prim.op, running + block_totals, depth=1)
        for t, r in zip(totals, identity if running is None else running, strict=True):
            t[i0:i1] = r
    return totals


def _extents(prim: GemmBlockSum, args: list) -> tuple[int, int]:
    return tuple(next(a.shape[0] for a, r in zip(args, prim.in_roles, strict=True) if r == role) for role in ("row", "col"))


def _slice(value: np.ndarray, role: str, rows: slice, cols: slice) -> np.ndarray:
    return value if role == "whole" else value[rows if role == "row" else cols]


@numpy_impls.register(GemmBlockSum)
def _gemm_block_sum(prim: GemmBlockSum, args: list, depth: int, run_block: BlockRunner = eval_program) -> list:
    _at_top_level(prim, depth)
    m, n = _extents(prim, args)
    extent = {"row": m, "col": n}
    sums = [np.zeros(a.shape if r == "whole" else (extent[r],) + a.shape[1:], a.dtype)
            for a, r in zip(prim.blocks[0][1].out_avals, prim.out_roles, strict=True)]
    for i0, i1, col_blocks in _blocks(m, n, prim.block):
        rows = slice(i0, i1)
        for j0, j1 in col_blocks:
            cols = slice(j0, j1)
            inputs = [_slice(a, r, rows, cols) for a, r in zip(args, prim.in_roles, strict=True)]
            parts = run_block(prim.block_program((i1 - i0, j1 - j0)), inputs)
            for total, part, role in zip(sums, parts, prim.out_roles, strict=True):
                _slice(total, role, rows, cols)[...] += part
    return sums
