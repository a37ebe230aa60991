"""jvp and vjp of gemm_map_reduce: no rule per layer, only per construct.

vjp, for a commutative monoid with d: the backward primitive walks the same blocks and, per block, either
takes every pair as a part of its row's fold (Theorem 2.1: the pair's cotangent is D(A, h_ij, Abar); the
"pairs" rule, ad/gemm_element_rules.py) or the whole block (Corollary 2.1.1: recompute the block's totals T,
take their cotangent D(A, T, Abar), run the vjp of the block program; the "blocks" rule, and the fallback
where the pairs rule has no form for the block's fields). Either way ad/ derives the return sweep, matrix
products included, and the cotangents of row and column operands accumulate block by block: memory stays
O(M * |T| + block). That backward is a GemmBlockSum, a linear sum of block programs, whose jvp and vjp are
again block sums (of the blocks' jvp and vjp programs): Hessian-vector products and reverse over reverse
come with no further rule.

min and max take the pairs rule with each row's cotangent divided by its number of pairs equal to the
extreme (one more pass over the blocks counts them): D gives g to every tied pair, and a duplicated key
(two identical rows of rhs, where the function is smooth) would otherwise double the gradient.

For a monoid without d the nested map/reduce the primitive abbreviates is differentiated instead, with the
generic rule, after one warning, in row blocks of whole rows (a GemmBlockSum of N-column blocks): each
holds about a forward block's pairs, at least one row's N, times the map's values per pair (|h|, D for a
vector payload), never M x N x |h|.

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
from fold.gemm import factorization_of, fields_of_block
from fold.gemm_folds import Factored, Full
from fold.primitives import GemmBlockSum, GemmMapReduce
from fold.primitives.gemm import split_gemm_args
from fold.pytree import tree_flatten
from fold.recognize import recognize_binary_op
from fold.tracing import bind, trace_body

from .fn_vjp import vjp_of_function
from .monoid_d import call_d, check_d_result, float_as
from .gemm_element_rules import element_rule
from .jvp import jvp_inline, jvp_rules
from .vjp import current_gemm_rule, current_reduce_rule, vjp_inline, vjp_rules
from .zeros import Zero, aval_of, differentiable, instantiate

_warned: set[str] = set()


def _d_program(prim: GemmMapReduce):
    elem = prim.op.out_tree
    elems = elem.unflatten(list(prim.op.out_avals))
    traced = trace_body(lambda c, a, g: call_d(prim.monoid, c, a, g), (elems, elems, elems), f"d of {prim.monoid.name}")
    check_d_result(prim.monoid.name, traced.out_tree, list(traced.program.out_avals), elem, list(prim.op.out_avals))
    return traced.program


def _qualifies(prim) -> bool:
    m = prim.monoid
    return m is not None and m.d is not None and m.commutative


@vjp_rules.register(GemmMapReduce)
def _gemm_vjp(prim: GemmMapReduce, args, outs, residual, cts):
    if not prim.blocks:  # M or N is 0: no pair reaches an output, so no operand has a cotangent
        return [Zero(aval_of(a)) for a in args]
    consts, identity, rows, cols = split_gemm_args(prim, list(args))
    dense = [instantiate(c, aval_of(o)) for c, o in zip(cts, outs, strict=True)]
    if not _qualifies(prim):
        return _nested_vjp(prim, args, dense, "has no d (or is not commutative)")
    if recognize_binary_op(prim.op, 0) == "mul" and current_reduce_rule() != "monoid":
        # prod's D, g c / a, is 0 / 0 at a zero part; the nested reduce's * rule is exact there
        return _nested_vjp(prim, args, dense, "divides by each part in its d (NaN at a zero)")
    d = _d_program(prim)
    in_roles = ("whole",) * len(consts) + ("row",) * len(rows) + ("col",) * len(cols)
    extreme = recognize_binary_op(prim.op, 0) in ("maximum", "minimum")
    # min/max take the pairs rule whatever the setting: a block as one part would give a tie inside it to one
    # pair (the reduce rule's lowest index) and a tie across blocks to each, so no count could split it
    pairs = _pairs_rule(prim, d) if current_gemm_rule() == "pairs" or extreme else None
    if extreme and pairs is not None:
        dense = _split_among_ties(prim, consts, rows, cols, outs, dense)
    backward = GemmBlockSum(tuple((shape, _block_backward(prim, program, d, shape, pairs)) for shape, program in prim.blocks), prim.block,
                            in_roles + ("row",) * (2 * prim.num_leaves), in_roles, f"gemm_map_reduce_vjp[{prim.monoid.name}]")
    results = bind(backward, *consts, *rows, *cols, *outs, *dense)
    nc = len(consts)
    arg_cts = results[:nc] + [Zero(aval_of(i)) for i in identity] + results[nc:]
    return [ct if hasattr(a, "aval") and differentiable(aval_of(a)) else Zero(aval_of(a)) for a, ct in zip(args, arg_cts, strict=True)]


def _split_among_ties(prim, consts, rows, cols, outs, cts):
    """A min/max row's cotangent divided by the number of its pairs equal to the extreme. D = g [a == c]
    gives g to every part equal to c, so a row with a tie (two identical rows of rhs: a duplicated key or
    centroid, where the function is smooth) would get its gradient once per tied pair; split evenly, the
    tied pairs' gradients add up to one (and with identical keys to the true gradient). The count is one
    more pass over the blocks (a gemm_map_reduce of the same products), never M x N."""
    from fold import monoids
    from fold.gemm import gemm_map_reduce

    npairs = _pairs(prim)
    (extreme,), (ct,) = outs, cts
    n_row_data = len(rows) - npairs

    def is_extreme(*args):
        s, row_data, c, col_data = (args[:npairs], args[npairs: npairs + n_row_data], args[npairs + n_row_data],
                                    args[npairs + n_row_data + 1:])
        (h,) = inline_program(prim.fn, list(consts) + list(s) + list(row_data) + list(col_data))
        return ops.where(h == c, 1.0, 0.0).astype(ct.dtype)

    ties = gemm_map_reduce(monoids.sum, is_extreme, tuple(rows[:npairs]), tuple(cols[:npairs]),
                           rows=(*rows[npairs:], extreme), cols=tuple(cols[npairs:]), block=prim.block, keep=prim.keep)
    return [(ct / ops.maximum(ties, 1.0)).astype(ct.dtype)]  # a row with no pair equal to it (NaN): as it was


def _pairs_rule(prim, d):
    """(the factorization of the map, the pair rule for its fields), or None where ad/gemm_element_rules.py
    has no pair rule for them (then each block is the part)."""
    factorization = factorization_of(prim)
    rule = element_rule(prim.monoid, not factorization.factored, d)
    return None if rule is None else (factorization, rule)


def _block_backward(prim, program, d, shape, pairs):
    """One block's backward: (block operands, A rows, Abar rows) -> operand cotangents, pair by pair where
    `pairs` (from _pairs_rule) gives a rule, else with the block as one part of the fold."""
    if pairs is None:
        return _blocks_backward(prim, program, d)
    factorization, rule = pairs
    fields_program, layout = _fields_program(prim, factorization, program)
    return _pairs_backward(prim, program, fields_program, layout, rule, shape[0])


def _fields_program(prim, factorization, program):
    """The block's fields as a program of the block operands (Full values; Factored weights and columns),
    and the fields with its outputs' positions in place of their values (their layout)."""
    layout: list = []

    def fn(*flat):
        fields = fields_of_block(prim, factorization, flat)
        outs: list = []
        for f in fields:
            if isinstance(f, Full):
                layout.append(Full(len(outs)))
                outs.append(f.value)
            else:
                layout.append(Factored(None if f.weight is None else len(outs), len(outs) + (f.weight is not None)))
                outs += ([] if f.weight is None else [f.weight]) + [f.column]
        return outs

    return trace_body(fn, [v.aval for v in program.inputs], "gemm block fields").program, layout


def _pairs_backward(prim, program, fields_program, layout, rule, bi: int):
    """Theorem 2.1 with each pair a part: the fields' cotangents from `rule`, then the return sweep of the
    block's fields (the map and the matrix products), with no block totals recomputed."""
    n_in, k = len(program.inputs), prim.num_leaves

    def fn(*flat):
        inputs, totals, total_cts = list(flat[:n_in]), list(flat[n_in: n_in + k]), list(flat[n_in + k:])

        def field_cts(values):
            fields = [Full(values[f.value]) if isinstance(f, Full) else
                      Factored(None if f.weight is None else values[f.weight], values[f.column]) for f in layout]
            cts: list = [None] * len(values)
            for f, ct in zip(layout, rule(fields, totals, total_cts, bi), strict=True):
                if isinstance(f, Full):
                    cts[f.value] = ct
                else:
                    weight_ct, cts[f.column] = ct
                    if f.weight is not None:
                        cts[f.weight] = weight_ct
            return [None if c is None else float_as(c, aval_of(v).dtype) for c, v in zip(cts, values, strict=True)]

        _, in_cts = vjp_inline(fields_program, inputs, field_cts)
        return [instantiate(c, v.aval) for c, v in zip(in_cts, program.inputs, strict=True)]

    avals = [v.aval for v in program.inputs] + list(program.out_avals) * 2
    return dce(trace_body(fn, avals, "gemm block backward (pairs)").program)


def _blocks_backward(prim, program, d):
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
    """The nested map/reduce that gemm_map_reduce abbreviates (materialises rows x N x |h|: called per row block)."""
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


def _nested_vjp(prim, args, cts, why: str):
    """The gradient of the nested map/reduce the primitive abbreviates (the generic reduce rules), walked in
    row blocks: a GemmBlockSum whose blocks are `_nested_rows` whole rows by all N columns.

    Row i's total depends only on row i's operands (and all columns), so the rows' gradients are independent:
    each row block's nested vjp gives its rows' cotangents, and the column and whole operands' cotangents
    are sums over the row blocks. Differentiated over all M rows at once, the generic rule held several
    arrays of M x N x |h| (the map's values per pair, the prefix and suffix scans of the row folds): with a
    vector payload of D entries that is M x N x D (26.8 GiB at M = N = 30000, D = 4, float64), more than
    the M x N the docs promise. Per row block it holds row-block x N x |h|."""
    name = prim.monoid.name if prim.monoid is not None else "operator"
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"gemm_map_reduce: monoid {name} {why}, so its gradient differentiates the nested "
                      f"map/reduce with the reduce rules, a block of whole rows at a time (never M x N x |h| values at once)", stacklevel=3)
    consts, identity, rows, cols = split_gemm_args(prim, list(args))
    nc, nr, ncol = len(consts), len(rows), len(cols)
    m, n = aval_of(rows[0]).shape[0], aval_of(cols[0]).shape[0]
    per_block = _nested_rows(prim, m, n)
    shapes = sorted({min(per_block, m - i0) for i0 in range(0, m, per_block)})

    def block_program(ri: int):
        def fn(*flat):
            operands, block_cts = list(flat[: nc + nr + ncol]), list(flat[nc + nr + ncol:])
            got = vjp_of_function(lambda *xs: _nested(prim, list(xs[:nc]), list(xs[nc: nc + nr]), list(xs[nc + nr:])),
                                  operands, block_cts)
            return [instantiate(c, aval_of(x)) for c, x in zip(got, operands, strict=True)]

        with_rows = lambda xs: [aval_of(x).update(shape=(ri,) + aval_of(x).shape[1:]) for x in xs]  # noqa: E731
        avals = [aval_of(x) for x in consts] + with_rows(rows) + [aval_of(x) for x in cols] + with_rows(cts)
        return dce(trace_body(fn, avals, f"gemm nested vjp block {ri}x{n}").program)

    in_roles = ("whole",) * nc + ("row",) * nr + ("col",) * ncol
    backward = GemmBlockSum(tuple(((ri, n), block_program(ri)) for ri in shapes), (per_block, n),
                            in_roles + ("row",) * len(cts), in_roles, f"gemm_map_reduce_nested_vjp[{name}]")
    results = bind(backward, *consts, *rows, *cols, *cts)
    arg_cts = results[:nc] + [Zero(aval_of(i)) for i in identity] + results[nc:]
    return [ct if hasattr(a, "aval") and differentiable(aval_of(a)) else Zero(aval_of(a)) for a, ct in zip(args, arg_cts, strict=True)]


def _nested_rows(prim, m: int, n: int) -> int:
    """Rows per block of the nested gradient: about as many pairs as a forward block (prim.block, sized by
    the memory budget for the forward's per-pair intermediates), and at least one whole row of N pairs."""
    bi, bj = prim.block
    return max(1, min(m, (bi * bj) // max(n, 1)))


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
                         2 * prim.num_col_args, prim.block, prim.keep)


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


def _doubled(roles: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(r for r in roles for _ in range(2))


@jvp_rules.register(GemmBlockSum)
def _block_sum_jvp(prim: GemmBlockSum, primals, tangents):
    """A block sum over (value, tangent) pairs: each block program replaced by its jvp (the sum is linear).
    Hessian-vector products of gemm layers (forward over reverse) go through here."""
    n_in, n_out = len(prim.in_roles), len(prim.out_roles)
    blocks = tuple((s, _paired(p, [1] * n_in, [1] * n_out, "gemm block sum jvp")) for s, p in prim.blocks)
    lifted = GemmBlockSum(blocks, prim.block, _doubled(prim.in_roles), _doubled(prim.out_roles), f"jvp({prim.label})")
    pairs = [x for pair in zip(primals, _dense_tangents(tangents, primals), strict=True) for x in pair]
    results = bind(lifted, *pairs)
    return results[0::2], results[1::2]


def _block_transpose(program, label: str):
    """(block inputs, cotangents of the block's outputs) -> cotangents of the block inputs (dense)."""
    n_in = len(program.inputs)

    def fn(*flat):
        _, in_cts = vjp_inline(program, list(flat[:n_in]), list(flat[n_in:]))
        return [instantiate(c, v.aval) for c, v in zip(in_cts, program.inputs, strict=True)]

    return dce(trace_body(fn, [v.aval for v in program.inputs] + list(program.out_avals), label).program)


@vjp_rules.register(GemmBlockSum)
def _block_sum_vjp(prim: GemmBlockSum, args, outs, residual, cts):
    """A block sum of the blocks' vjps: each block's output cotangents are sliced like its outputs, and its
    inputs' cotangents are summed like inputs. Reverse over reverse through gemm layers goes through here."""
    dense = [instantiate(c, aval_of(o)) for c, o in zip(cts, outs, strict=True)]
    blocks = tuple((s, _block_transpose(p, "gemm block sum vjp")) for s, p in prim.blocks)
    transposed = GemmBlockSum(blocks, prim.block, prim.in_roles + prim.out_roles, prim.in_roles, f"vjp({prim.label})")
    results = bind(transposed, *args, *dense)
    return [ct if hasattr(a, "aval") and differentiable(aval_of(a)) else Zero(aval_of(a)) for a, ct in zip(args, results, strict=True)]


def _z(ts, xs):
    return [t if differentiable(aval_of(x)) else Zero(aval_of(x)) for t, x in zip(ts, xs, strict=True)]
