"""gemm_map_reduce on the numpy backend: a walk over (row block, column block) pairs.

For each row block, the running totals start at the identity; each column block's program (a BLAS matrix
product, the map, the block fold) gives the block totals, folded in with the monoid's operator. Only one
block's intermediates are alive at a time.
"""

from __future__ import annotations

import numpy as np

from fold.errors import MissingRuleError
from fold.primitives import GemmMapReduce, GemmMapReduceVJP
from fold.primitives.gemm import split_gemm_args

from ..interpreter import eval_program, numpy_impls


def _blocks(m: int, n: int, block: tuple[int, int]):
    bi, bj = block
    for i0 in range(0, m, bi):
        yield i0, min(i0 + bi, m), [(j0, min(j0 + bj, n)) for j0 in range(0, n, bj)]


def _at_top_level(prim, depth: int) -> None:
    if depth:
        raise MissingRuleError(f"{prim.name} inside a map body is not supported by the numpy backend; call it at the top level")


@numpy_impls.register(GemmMapReduce)
def _gemm(prim: GemmMapReduce, args: list, depth: int) -> list:
    _at_top_level(prim, depth)
    consts, identity, rows, cols = split_gemm_args(prim, args)
    m, n = rows[0].shape[0], cols[0].shape[0]
    totals = [np.array(np.broadcast_to(e, (m,) + e.shape)) for e in identity]
    for i0, i1, col_blocks in _blocks(m, n, prim.block):
        running = [t[i0:i1] for t in totals]
        row_blk = [r[i0:i1] for r in rows]
        for j0, j1 in col_blocks:
            block_totals = eval_program(prim.block_program((i1 - i0, j1 - j0)), consts + row_blk + [c[j0:j1] for c in cols])
            running = eval_program(prim.op, running + block_totals, depth=1)
        for t, r in zip(totals, running, strict=True):
            t[i0:i1] = r
    return totals


@numpy_impls.register(GemmMapReduceVJP)
def _gemm_vjp(prim: GemmMapReduceVJP, args: list, depth: int) -> list:
    _at_top_level(prim, depth)
    forward = prim.forward
    n_in = forward.num_consts + forward.num_leaves + forward.num_row_args + forward.num_col_args
    consts, _, rows, cols = split_gemm_args(forward, args[:n_in])
    k = forward.num_leaves
    totals, total_cts = args[n_in: n_in + k], args[n_in + k: n_in + 2 * k]
    m, n = rows[0].shape[0], cols[0].shape[0]
    nc, nr = len(consts), len(rows)
    const_cts = [np.zeros(c.shape, c.dtype) for c in consts]
    row_cts = [np.zeros(r.shape, r.dtype) for r in rows]
    col_cts = [np.zeros(c.shape, c.dtype) for c in cols]
    for i0, i1, col_blocks in _blocks(m, n, forward.block):
        row_blk = [r[i0:i1] for r in rows]
        a_blk, g_blk = [t[i0:i1] for t in totals], [g[i0:i1] for g in total_cts]
        for j0, j1 in col_blocks:
            inputs = consts + row_blk + [c[j0:j1] for c in cols]
            cts = eval_program(prim.block_vjp((i1 - i0, j1 - j0)), inputs + a_blk + g_blk)
            for acc, ct in zip(const_cts, cts[:nc], strict=True):
                acc += ct
            for acc, ct in zip(row_cts, cts[nc: nc + nr], strict=True):
                acc[i0:i1] += ct
            for acc, ct in zip(col_cts, cts[nc + nr:], strict=True):
                acc[j0:j1] += ct
    return const_cts + row_cts + col_cts
