"""A gemm_map_reduce and the block sum of its vjp, run as one walk that computes each product once.

The vjp of gemm_map_reduce (ad/gemm_rules.py) is a GemmBlockSum whose block programs recompute the
block's products s = L R^T: a gradient program computes every product twice, once for the forward's row
totals and once in the backward. Where the backward's cotangents do not depend on the forward's results
(the cotangent of a loss, attention's G), the two can walk the grid together: for each row block, the
forward's column blocks, keeping their products; then, the row totals of the block being final, the
backward's column blocks, reading the kept products. That is one product per block fewer: six against
seven for attention's gradient, three against four for cross-entropy's. The price is memory: the products
of one row block (rows x N values per pair) are held at once, up to the gemm's `keep` bytes (1 GiB by
default); the column blocks past that recompute theirs, as before. The results are the same bits: the
backward reads the very arrays it would have recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fold.dce import dce
from fold.ir import Let, Lit, Primitive, Program, Var, depends_on, flat_program, same_atom
from fold.primitives import BroadcastTo, Convert, Elementwise, GemmBlockSum, GemmMapReduce, MatMul, Reshape, Transpose
from fold.primitives.gemm import lookup_block, split_gemm_args
from fold.printing_rules import print_rules

from ..interpreter import eval_program, numpy_impls
from ..memory import body_extra_rules, program_peak
from ..numpy_impl.gemm import BlockSums, block_grid, empty_totals, fold_row_block, per_row, role_slice


@dataclass(frozen=True)
class GemmWithBackward(Primitive):
    """`forward` (a gemm_map_reduce) and `backward` (the block sum of its vjp) in one walk of their grid.

    Arguments: the forward's, then the backward's cotangents. Results: the forward's, then the backward's.
    The block programs are the backend's prepared ones: the forward's return the products they share
    after their own results, the backward's take those products as their last inputs, and the backward's
    own (`recompute_blocks`) serve the column blocks whose products were not kept.
    """

    forward: GemmMapReduce
    backward: GemmBlockSum
    forward_blocks: tuple  # ((bi, bj), forward block program returning its shared products too)
    backward_blocks: tuple  # ((bi, bj), backward block program taking them as inputs)
    recompute_blocks: tuple  # ((bi, bj), the backward's block program, prepared: it computes them again)
    name = "gemm_map_reduce_with_vjp"
    backend_internal = True

    def bodies(self) -> list[Program]:
        return [p for _, p in self.forward_blocks + self.backward_blocks + self.recompute_blocks]

    def printed_bodies(self) -> list[Program]:
        return []

    @property
    def num_kept(self) -> int:
        """Products kept per block."""
        return len(self.forward_blocks[0][1].outputs) - self.forward.num_leaves


@print_rules.register(GemmWithBackward)
def _print(stmt: Let, args: list[str]) -> str:
    prim = stmt.prim
    monoid = getattr(prim.forward.monoid, "name", "lifted to (value, tangent) pairs")
    return (f"{prim.name}[{monoid}, block={prim.forward.block}, shared products per block: "
            f"{prim.num_kept}, keep={prim.forward.keep}] {' '.join(args)}")


@numpy_impls.register(GemmWithBackward)
def _run(prim: GemmWithBackward, args: list, depth: int) -> list:
    """Per row block: the forward's column blocks (their products kept while they fit in `keep` bytes),
    then the backward's, reading the kept products or computing the others again."""
    if depth:
        return per_row(prim, args, depth, lambda p, row: _run(p, row, 0))
    fwd, bwd = prim.forward, prim.backward
    n_fwd = _shared_count(fwd) + fwd.num_leaves
    f_args, cts = list(args[:n_fwd]), list(args[n_fwd:])
    consts, identity, rows, cols = split_gemm_args(fwd, f_args)
    m, n = rows[0].shape[0], cols[0].shape[0]
    totals = empty_totals(identity, m)
    bwd_args = consts + rows + cols + totals + cts  # the totals are written before any backward block reads them
    sums = BlockSums(bwd, m, n)
    k = fwd.num_leaves
    for i0, i1, col_blocks in block_grid(m, n, fwd.block):
        row_slice = slice(i0, i1)
        row_blk = [r[row_slice] for r in rows]
        kept: list = []  # per column block: its products, or None where they did not fit
        kept_bytes = 0

        def forward_block(j0: int, j1: int) -> list:
            nonlocal kept_bytes
            outs = eval_program(lookup_block(prim.forward_blocks, (i1 - i0, j1 - j0)), consts + row_blk + [c[j0:j1] for c in cols])
            size = sum(p.nbytes for p in outs[k:])
            fits = kept_bytes + size <= fwd.keep
            kept.append(outs[k:] if fits else None)
            kept_bytes += size if fits else 0
            return outs[:k]

        fold_row_block(fwd, identity, totals, row_slice, col_blocks, forward_block)
        for (j0, j1), products in zip(col_blocks, kept, strict=True):
            col_slice = slice(j0, j1)
            inputs = [role_slice(a, r, row_slice, col_slice) for a, r in zip(bwd_args, bwd.in_roles, strict=True)]
            shape = (i1 - i0, j1 - j0)
            parts = (eval_program(lookup_block(prim.recompute_blocks, shape), inputs) if products is None
                     else eval_program(lookup_block(prim.backward_blocks, shape), inputs + list(products)))
            sums.add(parts, row_slice, col_slice, only_block=shape == (m, n))
    return totals + sums.finished()


@body_extra_rules.register(GemmWithBackward)
def _memory(stmt: Let, mult: int) -> int:
    """The kept products of a row block (all of its column blocks', up to `keep` bytes) and one block
    program's intermediates at a time."""
    prim = stmt.prim
    _, _, rows, cols = split_gemm_args(prim.forward, list(stmt.args))
    m, n = rows[0].aval.shape[0], cols[0].aval.shape[0]
    bi, bj = prim.forward.block
    stripe = sum(a.aval.nbytes for j0 in range(0, n, bj)
                 for a in lookup_block(prim.forward_blocks, (min(bi, m), min(bj, n - j0))).outputs[prim.forward.num_leaves:])
    return mult * min(stripe, prim.forward.keep) + max(program_peak(p, mult, count_inputs=False) for p in prim.bodies())


def _shared_count(fwd: GemmMapReduce) -> int:
    """How many of the forward's operands (consts, rows, cols; not the identity) the backward takes first."""
    return fwd.num_consts + fwd.num_row_args + fwd.num_col_args


# ------------------------------------------------------------------------------------------ the rewrite

_KEYED = (MatMul, Transpose, Elementwise, Reshape, BroadcastTo, Convert)


def _value_keys(program: Program, shared: int) -> dict[Var, Any]:
    """A key for each variable computed from the first `shared` inputs and literals by structural
    statements alone: two variables with one key, in two programs with the same first inputs, hold the
    same values."""
    keys: dict[Var, Any] = {v: ("input", i) for i, v in enumerate(program.inputs[:shared])}

    def key_of(atom):
        if isinstance(atom, Lit):
            value = np.asarray(atom.value)
            return ("literal", value.dtype.str, value.shape, value.tobytes())
        return keys.get(atom)

    for stmt in program.stmts:
        if not isinstance(stmt.prim, _KEYED) or len(stmt.outs) != 1:
            continue
        arg_keys = tuple(key_of(a) for a in stmt.args)
        if all(k is not None for k in arg_keys):
            keys[stmt.outs[0]] = (stmt.prim, arg_keys)
    return keys


def _share_products(forward: Program, backward: Program, shared: int) -> tuple[Program, Program] | None:
    """(the forward block program returning the products the backward recomputes, the backward taking
    them as inputs instead), or None where the backward recomputes none."""
    fkeys = _value_keys(forward, shared)
    by_key = {fkeys[s.outs[0]]: s.outs[0] for s in forward.stmts
              if isinstance(s.prim, MatMul) and s.outs[0] in fkeys}
    bkeys = _value_keys(backward, shared)
    recomputed = [s for s in backward.stmts if isinstance(s.prim, MatMul) and bkeys.get(s.outs[0]) in by_key]
    if not recomputed:
        return None
    kept = [by_key[bkeys[s.outs[0]]] for s in recomputed]
    new_forward = flat_program(Program(forward.inputs, forward.stmts, tuple(forward.outputs) + tuple(kept),
                                       forward.in_tree, forward.out_tree, dict(forward.meta)))
    dropped = {id(s) for s in recomputed}
    new_backward = flat_program(dce(Program(tuple(backward.inputs) + tuple(s.outs[0] for s in recomputed),
                                            tuple(s for s in backward.stmts if id(s) not in dropped), backward.outputs,
                                            backward.in_tree, backward.out_tree, dict(backward.meta))))
    return new_forward, new_backward


def _pair_of(bwd_stmt: Let, producer: dict) -> Let | None:
    """The gemm_map_reduce statement whose vjp `bwd_stmt` is (the layout ad/gemm_rules.py emits: the
    forward's consts, rows and cols, its results, then their cotangents), or None."""
    for arg in bwd_stmt.args:
        fwd_stmt = producer.get(arg) if isinstance(arg, Var) else None
        if fwd_stmt is None or not isinstance(fwd_stmt.prim, GemmMapReduce):
            continue
        fwd, bwd = fwd_stmt.prim, bwd_stmt.prim
        shared, k = _shared_count(fwd), fwd.num_leaves
        consts, _, rows, cols = split_gemm_args(fwd, list(fwd_stmt.args))
        # the operands sliced as the forward slices them, and its totals read by row block (a backward block
        # reads only its own rows' totals, which are final when it runs)
        roles = ("whole",) * fwd.num_consts + ("row",) * fwd.num_row_args + ("col",) * fwd.num_col_args
        if (len(bwd_stmt.args) == shared + 2 * k and bwd.block == fwd.block
                and tuple(bwd.in_roles[: shared + k]) == roles + ("row",) * k
                and all(same_atom(a, b) for a, b in zip(bwd_stmt.args[:shared], consts + rows + cols, strict=True))
                and all(a is b for a, b in zip(bwd_stmt.args[shared: shared + k], fwd_stmt.outs, strict=True))
                and sorted(s for s, _ in bwd.blocks) == sorted(s for s, _ in fwd.blocks)):
            return fwd_stmt
    return None



def _fused_statement(fwd_stmt: Let, bwd_stmt: Let, prepare) -> Let | None:
    fwd, bwd = fwd_stmt.prim, bwd_stmt.prim
    if fwd.keep == 0:
        return None
    shared = _shared_count(fwd)
    forward_blocks, backward_blocks, recompute_blocks = {}, {}, {}
    for shape, program in fwd.blocks:
        recompute_blocks[shape] = prepare(bwd.block_program(shape), whole_arrays=True)
        pair = _share_products(prepare(program, whole_arrays=True), recompute_blocks[shape], shared)
        if pair is None:
            return None
        forward_blocks[shape], backward_blocks[shape] = pair
    prim = GemmWithBackward(fwd, bwd, tuple(forward_blocks.items()), tuple(backward_blocks.items()),
                            tuple(recompute_blocks.items()))
    cts = bwd_stmt.args[shared + fwd.num_leaves:]
    return Let(tuple(fwd_stmt.outs) + tuple(bwd_stmt.outs), prim, tuple(fwd_stmt.args) + tuple(cts))


def fuse_gemm_backward(program: Program, prepare) -> Program:
    """`program` with each gemm_map_reduce whose vjp's block sum it also runs, on cotangents that do not
    depend on the gemm's results, replaced by one GemmWithBackward at the gemm's place (the statements
    computing those cotangents moved before it). Top level only; `prepare` prepares the block programs.
    A gemm with `keep=0`, or whose backward computes no product its forward does, is left as it is."""
    stmts = list(program.stmts)
    changed = True
    while changed:
        changed = False
        producer = {v: s for s in stmts for v in s.outs}
        for b, bwd_stmt in enumerate(stmts):
            if not isinstance(bwd_stmt.prim, GemmBlockSum):
                continue
            fwd_stmt = _pair_of(bwd_stmt, producer)
            if fwd_stmt is None:
                continue
            f = next(i for i, s in enumerate(stmts) if s is fwd_stmt)
            between = stmts[f + 1: b]
            cts = [a for a in bwd_stmt.args[_shared_count(fwd_stmt.prim) + fwd_stmt.prim.num_leaves:] if isinstance(a, Var)]
            if any(c in depends_on(between, set(fwd_stmt.outs)) for c in cts):
                continue
            fused = _fused_statement(fwd_stmt, bwd_stmt, prepare)
            if fused is None:
                continue
            needed, moved = set(cts), set()
            for stmt in reversed(between):
                if any(v in needed for v in stmt.outs):
                    moved.add(id(stmt))
                    needed.update(a for a in stmt.args if isinstance(a, Var))
            stmts = (stmts[:f] + [s for s in between if id(s) in moved] + [fused]
                     + [s for s in between if id(s) not in moved] + stmts[b + 1:])
            changed = True
            break
    if len(stmts) == len(program.stmts):
        return program
    return Program(program.inputs, tuple(stmts), program.outputs, program.in_tree, program.out_tree, dict(program.meta))
