"""jvp and vjp of gemm_map_reduce: no rule per layer, only per construct.

vjp, for a commutative monoid with d (Corollaries 2.1.1 and 2.1.3): the backward primitive walks the same
blocks, recomputes each block's totals T, takes their cotangent D(A, T, Abar) — the block is a part of the
fold — and runs the vjp of the block program (made here by ad/, matrix products included), accumulating
the cotangents of row and column operands block by block. Memory stays O(M * |T| + block).

For a monoid without d the nested map/reduce the primitive abbreviates is differentiated instead, with the
generic rule, after one warning: that materialises M x N values.

jvp: the same primitive over (value, tangent) pairs — block programs replaced by their jvp, the operator
lifted to pairs, exactly as for reduce.
"""

from __future__ import annotations

import warnings

import numpy as np

from fold import ops
from fold.combinators import map as fold_map
from fold.combinators import reduce as fold_reduce
from fold.dce import dce
from fold.inline import inline_program
from fold.primitives import GemmMapReduce, GemmMapReduceVJP
from fold.primitives.gemm import split_gemm_args
from fold.pytree import tree_flatten
from fold.tracing import bind, trace_body

from .fn_vjp import vjp_of_function
from .jvp import jvp_inline, jvp_rules
from .vjp import vjp_inline, vjp_rules
from .zeros import Zero, aval_of, differentiable, instantiate

_warned: set[str] = set()


def _d_program(prim: GemmMapReduce):
    elem = prim.op.out_tree
    elems = elem.unflatten(list(prim.op.out_avals))
    traced = trace_body(lambda c, a, g: prim.monoid.d(c, a, g), (elems, elems, elems), f"d of {prim.monoid.name}")
    return traced.program


def _qualifies(prim) -> bool:
    m = prim.monoid
    return m is not None and m.d is not None and m.commutative


@vjp_rules.register(GemmMapReduce)
def _gemm_vjp(prim: GemmMapReduce, args, outs, residual, cts):
    consts, identity, rows, cols = split_gemm_args(prim, list(args))
    dense = [instantiate(c, aval_of(o)) for c, o in zip(cts, outs, strict=True)]
    if not _qualifies(prim):
        return _nested_vjp(prim, args, dense)
    d = _d_program(prim)
    backward = GemmMapReduceVJP(prim, tuple((shape, _block_backward(prim, program, d)) for shape, program in prim.blocks), d)
    results = bind(backward, *args, *outs, *dense)
    nc = len(consts)
    arg_cts = results[:nc] + [Zero(aval_of(i)) for i in identity] + results[nc:]
    return [ct if hasattr(a, "aval") and differentiable(aval_of(a)) else Zero(aval_of(a)) for a, ct in zip(args, arg_cts, strict=True)]


def _block_backward(prim, program, d):
    """One block's backward, one forward sweep: (block operands, A rows, Abar rows) -> operand cotangents.

    The block's totals T come out of the forward sweep, their cotangent is D(A, T, Abar) row by row, and
    the return sweep follows; where d ignores T (vsum: d = g), dead-code elimination drops the recomputation.
    """
    n_in, k = len(program.inputs), prim.num_leaves

    def fn(*flat):
        inputs, totals, total_cts = list(flat[:n_in]), list(flat[n_in: n_in + k]), list(flat[n_in + k:])

        def block_cts(block_totals):  # Corollary 2.1.1: the block is a part of the fold
            return list(fold_map(lambda *leaves: inline_program(d, list(leaves)), *totals, *block_totals, *total_cts))

        _, in_cts = vjp_inline(program, inputs, block_cts)
        return [instantiate(c, v.aval) for c, v in zip(in_cts, program.inputs, strict=True)]

    avals = [v.aval for v in program.inputs] + list(program.out_avals) * 2
    return dce(trace_body(fn, avals, "gemm block backward").program)


def _nested(prim, consts, rows, cols):
    """The nested map/reduce that gemm_map_reduce abbreviates (materialises M x N)."""
    npairs = _pairs(prim)
    ls, row_data = rows[:npairs], rows[npairs:]
    rs, col_data = cols[:npairs], cols[npairs:]

    def one_row(*row_args):
        l_i, r_i = row_args[:npairs], row_args[npairs:]

        def one_pair(*col_args):
            r_j, c_j = col_args[:npairs], col_args[npairs:]
            s = [ops.sum(a * b) for a, b in zip(l_i, r_j, strict=True)]
            return inline_program(prim.fn, list(consts) + s + list(r_i) + list(c_j))

        hs = fold_map(one_pair, *rs, *col_data)
        total = fold_reduce(prim.monoid, prim.op.out_tree.unflatten(list(hs)))
        return tree_flatten(total)[0]

    return list(fold_map(one_row, *ls, *row_data))


def _pairs(prim) -> int:
    """The number of matrix products: fn takes pairs + row data + column data, the primitive pairs + row data
    row operands and pairs + column data column operands."""
    return prim.num_row_args + prim.num_col_args - (len(prim.fn.inputs) - prim.num_consts)


def _nested_vjp(prim, args, cts):
    name = prim.monoid.name if prim.monoid is not None else "operator"
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"gemm_map_reduce: monoid {name} has no d (or is not commutative), so its gradient differentiates "
                      f"the nested map/reduce with the generic rule, which holds M x N intermediates", stacklevel=3)
    consts, identity, rows, cols = split_gemm_args(prim, list(args))
    nc, nr = len(consts), len(rows)
    diff = [i for i, a in enumerate(args) if hasattr(a, "aval") and differentiable(aval_of(a))]
    arg_cts = vjp_of_function(lambda *xs: _nested(prim, list(xs[:nc]), list(xs[nc + len(identity): nc + len(identity) + nr]),
                                                  list(xs[nc + len(identity) + nr:])), list(args), cts)
    return [arg_cts[i] if i in diff else Zero(aval_of(a)) for i, a in enumerate(args)]


def _paired(program, in_groups: list[int], out_groups: list[int], label: str):
    """The jvp of `program` with each group of inputs, and of outputs, followed by its tangents (dense)."""
    avals = [v.aval for v in program.inputs]

    def fn(*flat):
        primals, tangents, pos = [], [], 0
        for g in in_groups:
            primals += list(flat[pos: pos + g])
            tangents += list(flat[pos + g: pos + 2 * g])
            pos += 2 * g
        outs, touts = jvp_inline(program, primals, _z(tangents, primals))
        result, pos = [], 0
        for g in out_groups:
            result += list(outs[pos: pos + g]) + [instantiate(t, aval_of(o)) for t, o in zip(touts[pos: pos + g], outs[pos: pos + g], strict=True)]
            pos += g
        return result

    layout, pos = [], 0
    for g in in_groups:
        layout += avals[pos: pos + g] * 2
        pos += g
    return trace_body(fn, layout, label).program


def _lifted_op(prim: GemmMapReduce):
    """The monoid's operator on (value, tangent) pairs: (a, ta) . (b, tb)."""
    k = prim.num_leaves
    return _paired(prim.op, [k, k], [k], "lifted monoid operator")


def _dense_tangents(ts, xs):
    return [instantiate(t, aval_of(x)) if differentiable(aval_of(x)) else np.zeros(aval_of(x).shape, aval_of(x).dtype)
            for t, x in zip(ts, xs, strict=True)]


def _lifted_forward(prim: GemmMapReduce, blocks: tuple) -> GemmMapReduce:
    """The primitive over (value, tangent) pairs: every operand group doubled, the operator lifted."""
    return GemmMapReduce(prim.fn, blocks, _lifted_op(prim), None, 2 * prim.num_consts, 2 * prim.num_row_args,
                         2 * prim.num_col_args, prim.block)


@jvp_rules.register(GemmMapReduce)
def _gemm_jvp(prim: GemmMapReduce, primals, tangents):
    consts, identity, rows, cols = split_gemm_args(prim, list(primals))
    t_consts, _, t_rows, t_cols = (_dense_tangents(t, x) if i != 1 else t for i, (t, x) in
                                   enumerate(zip(split_gemm_args(prim, list(tangents)), (consts, identity, rows, cols), strict=True)))
    groups = [len(consts), len(rows), len(cols)]
    k = prim.num_leaves
    lifted = _lifted_forward(prim, tuple((s, _paired(p, groups, [k], "gemm block jvp")) for s, p in prim.blocks))
    zeros = [np.zeros(aval_of(e).shape, aval_of(e).dtype) for e in identity]
    outs = bind(lifted, *consts, *t_consts, *identity, *zeros, *rows, *t_rows, *cols, *t_cols)
    return outs[:k], outs[k:]


@jvp_rules.register(GemmMapReduceVJP)
def _gemm_backward_jvp(prim: GemmMapReduceVJP, primals, tangents):
    """Forward over reverse through gemm_map_reduce: the backward's blocks replaced by their jvp, the
    accumulation unchanged (it is linear). Hessian-vector products of gemm layers go through here."""
    fwd = prim.forward
    k = fwd.num_leaves
    n_in = fwd.num_consts + k + fwd.num_row_args + fwd.num_col_args
    consts, identity, rows, cols = split_gemm_args(fwd, list(primals[:n_in]))
    t_consts, _, t_rows, t_cols = split_gemm_args(fwd, list(tangents[:n_in]))
    totals, total_cts = list(primals[n_in: n_in + k]), list(primals[n_in + k:])
    t_totals, t_total_cts = list(tangents[n_in: n_in + k]), list(tangents[n_in + k:])
    groups = [len(consts), len(rows), len(cols)]
    blocks = tuple((s, _paired(p, groups + [k, k], groups, "gemm block backward jvp")) for s, p in prim.block_vjps)
    lifted = GemmMapReduceVJP(_lifted_forward(fwd, fwd.blocks), blocks, prim.d)
    zeros = [np.zeros(aval_of(e).shape, aval_of(e).dtype) for e in identity]
    results = bind(lifted, *consts, *_dense_tangents(t_consts, consts), *identity, *zeros, *rows, *_dense_tangents(t_rows, rows),
                   *cols, *_dense_tangents(t_cols, cols), *totals, *_dense_tangents(t_totals, totals),
                   *total_cts, *_dense_tangents(t_total_cts, total_cts))
    outs, touts, pos = [], [], 0
    for g in groups:
        outs += results[pos: pos + g]
        touts += results[pos + g: pos + 2 * g]
        pos += 2 * g
    return outs, touts


def _z(ts, xs):
    return [t if differentiable(aval_of(x)) else Zero(aval_of(x)) for t, x in zip(ts, xs, strict=True)]
