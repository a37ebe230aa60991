"""gemm_map_reduce's block backward with every pair a part of its row's fold.

Theorem 2.1 holds for any part of a fold, so a single pair h_ij is one: its cotangent is D(A_i, h_ij, Abar_i)
with A_i the row's total. Taking the whole block as the part instead (Corollary 2.1.1, ad/gemm_rules.py)
needs the block's own totals T first: its row maxima, sums and logarithms, and for softmax-weighted sums
the block's numerator exp(S) V, one matrix product more, which cancels out of the derivative. Per pair, the
attention block backward is FlashAttention-2's: dS_ij = P_ij (dP_ij - G_i . O_i), P_ij = exp(S_ij - L_i).

A rule maps (fields, row totals A, their cotangents Abar, rows) to the fields' cotangents: a `Full` field's
as bi x bj values, a `Factored` one's as (weight cotangent or None, column cotangent). Fields that are all
`Full` take the generic rule, D applied pair by pair; a monoid whose fields may be factored (column data
times a weight, folded by matrix products) needs a rule of its own that keeps them factored: logwsum has
one. Other monoids keep the block form.
"""

from __future__ import annotations

from typing import Any, Callable

from fold import monoids, ops
from fold.combinators import map as fold_map
from fold.gemm_folds import Factored, Full, expand
from fold.inline import inline_program
from fold.rules import MonoidTable

FieldCotangents = list  # per field: bi x bj values (Full) or (weight cotangent | None, column cotangent)
ElementRule = Callable[[list, list, list, int], FieldCotangents]
FACTORED_RULES = MonoidTable("gemm pair rule")


def element_rule(monoid, all_full: bool, d_program) -> ElementRule | None:
    """The rule that differentiates a block of `monoid` pair by pair, or None (then the block form).
    `all_full`: every field of the map is held per pair (none is factored into column data)."""
    rule = FACTORED_RULES.get(monoid)
    if rule is not None:
        return rule
    if all_full:
        return lambda fields, totals, cts, bi: _generic(d_program, fields, totals, cts)
    return None


def _generic(d_program, fields: list, totals: list, cts: list) -> FieldCotangents:
    """D(A_i, h_ij, Abar_i) for every pair of the block, the fields all held in full."""
    k = len(fields)

    def one_row(*row):
        h_row, a, g = row[:k], list(row[k: 2 * k]), list(row[2 * k:])
        return fold_map(lambda *h: inline_program(d_program, a + list(h) + g), *h_row)

    return list(fold_map(one_row, *[f.value for f in fields], *totals, *cts))


def _flat_rows(x):
    """(rows, *field) -> (rows, size of field)."""
    return ops.reshape(x, (x.shape[0], -1))


def _per_row(x, ndim: int):
    """(bi,) -> (bi, 1, ...) with `ndim` axes in all, to broadcast a per-row value."""
    return ops.reshape(x, (x.shape[0],) + (1,) * (ndim - 1))


def _dots(g, field) -> Any:
    """(bi, bj) block of <g_i, c_j> with c the field's column data (Factored) or <g_i, h_ij> (Full):
    a matrix product when factored, the weight left out."""
    if isinstance(field, Factored):
        return ops.matmul(_flat_rows(g), ops.transpose(_flat_rows(field.column)))
    value = field.value
    product = value * ops.reshape(g, (g.shape[0], 1) + tuple(g.shape[1:]))
    return ops.sum(ops.reshape(product, tuple(product.shape[:2]) + (-1,)), axis=2)


def _row_scaled(p, g, field, dots) -> Any:
    """The cotangent of a field whose pair (i, j) receives p_ij g_i. Factored: the column's is p^T g (times
    the weight), the weight's p_ij <g_i, c_j>; `dots` are the <g_i, c_j> already computed."""
    if isinstance(field, Factored):
        w = p if field.weight is None else p * field.weight
        column = ops.reshape(ops.matmul(ops.transpose(w), _flat_rows(g)), tuple(field.column.shape))
        return (None if field.weight is None else p * dots, column)
    value = field.value
    return ops.reshape(p, tuple(p.shape) + (1,) * (value.ndim - 2)) * ops.reshape(g, (g.shape[0], 1) + tuple(g.shape[1:]))


@FACTORED_RULES.register(monoids.logwsum)
def _logwsum(fields, totals, cts, bi):
    """abar_z = (g_z + <g_v, a_v - c_v>) exp(a_z - c_z), abar_v = g_v exp(a_z - c_z), per pair."""
    v, z = fields  # dict leaves are sorted: "v", "z"; z is a scalar per pair, so never factored
    (total_v, total_z), (g_v, g_z) = totals, cts
    p = monoids.exp_weight(expand(z, bi), _per_row(total_z, 2))
    dots = _dots(g_v, v)
    g_dot_v = dots if isinstance(v, Full) or v.weight is None else dots * v.weight
    base = g_z - ops.sum(_flat_rows(g_v) * _flat_rows(total_v), axis=1)
    z_bar = p * (_per_row(base, 2) + g_dot_v)
    return [_row_scaled(p, g_v, v, dots), z_bar]

