"""The fold Programs the shards run, built on the client from one statement of the sharded program.

A shard's statement is the statement's primitive applied to the shard's operands (smaller shapes): it is
traced again through `bind`, so shape rules check it and static shapes follow the chunk. Combining two
partial states is the fold's own operator, applied once (element states) or mapped over rows (the states
of a histogram or of gemm_map_reduce's rows).
"""

from __future__ import annotations

from typing import Sequence

from fold.combinators import map as fold_map
from fold.dtypes import ShapedArray
from fold.inline import inline_program
from fold.ir import Atom, Primitive, Program, Var, flat_program
from fold.tracing import bind, trace_body


def statement_program(prim: Primitive, args: Sequence[Atom], avals: Sequence[ShapedArray | None], label: str) -> Program:
    """A flat Program whose inputs are the variable operands of `args` (with `avals`) and which applies
    `prim` to them, the literal operands inlined."""
    positions = [i for i, a in enumerate(args) if isinstance(a, Var)]

    def apply(*xs):
        operands = [None if isinstance(a, Var) else a.value for a in args]
        for i, x in zip(positions, xs, strict=True):
            operands[i] = x
        return list(bind(prim, *operands))

    return flat_program(trace_body(apply, [avals[i] for i in positions], label).program)


def combine_program(op: Program, num_consts: int, state_avals: Sequence[ShapedArray], mapped: bool) -> Program:
    """(consts, left state..., right state...) -> left . right, the operator `op` (consts first) applied
    once, or to each row of the states when `mapped` (histograms, gemm_map_reduce's row states)."""
    k = len(state_avals)
    const_avals = list(op.in_avals[:num_consts])

    def combine(*flat):
        consts, left, right = list(flat[:num_consts]), list(flat[num_consts: num_consts + k]), list(flat[num_consts + k:])
        if not mapped:
            return list(inline_program(op, consts + left + right))
        return list(fold_map(lambda *ab: inline_program(op, consts + list(ab)), *left, *right))

    return flat_program(trace_body(combine, const_avals + list(state_avals) * 2, "shard combine").program)


def offset_program(op: Program, num_consts: int, elem_avals: Sequence[ShapedArray], n: int, reverse: bool) -> Program:
    """(consts, offset..., ys...) -> each row y of ys combined with the offset: offset . y for a scan,
    y . offset for a reverse scan (the local pass after the exclusive scan of chunk totals)."""
    k = len(elem_avals)
    const_avals = list(op.in_avals[:num_consts])
    rows = [a.update(shape=(n,) + a.shape) for a in elem_avals]

    def offset(*flat):
        consts, off, ys = list(flat[:num_consts]), list(flat[num_consts: num_consts + k]), list(flat[num_consts + k:])

        def one(*y):
            pair = list(y) + off if reverse else off + list(y)
            return list(inline_program(op, consts + pair))

        return list(fold_map(one, *ys))

    return flat_program(trace_body(offset, const_avals + list(elem_avals) + rows, "shard scan offset").program)
