"""How each monoid folds one block of H along j (the columns), written with fold operations.

A field of the block is `Full` (bi x bj x field shape) or `Factored` (a bi x bj weight times bj x field
column data, weight None meaning 1). Monoids with a rule here fold factored fields with a matrix product, so
the bi x bj x D block is never formed; any other monoid gets the generic rule (factored fields expanded, then
a reduce along j). Since gemm_map_reduce's gradient differentiates these block programs with ad/, the matrix
products reappear in the backward pass as matrix products, with no rule written for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import monoids, ops
from .combinators import map as fold_map
from .combinators import reduce as fold_reduce
from .rules import MonoidTable


@dataclass
class Full:
    value: Any  # (bi, bj, *field)


@dataclass
class Factored:
    weight: Any  # (bi, bj), or None for 1
    column: Any  # (bj, *field)


BlockFold = Callable[[list, int], list]  # (fields, rows in the block) -> row totals
BLOCK_FOLDS = MonoidTable("gemm block fold")


def _column_vector(x):
    """(bi,) -> (bi, 1), to broadcast a per-row value along j."""
    return ops.reshape(x, (x.shape[0], 1))


def expand(field, bi: int) -> Any:
    """A field as a full (bi, bj, *field) block."""
    if isinstance(field, Full):
        return field.value
    column = field.column
    bj, shape = column.shape[0], tuple(column.shape[1:])
    full = ops.broadcast_to(ops.reshape(column, (1, bj) + shape), (bi, bj) + shape)
    if field.weight is None:
        return full
    return ops.reshape(field.weight, (bi, bj) + (1,) * len(shape)) * full


def weighted_column_sum(weight, field) -> Any:
    """sum_j weight_ij * field_ij, a matrix product when the field is factored."""
    if isinstance(field, Factored):
        w = weight if field.weight is None else weight * field.weight
        column = field.column
        flat = ops.reshape(column, (column.shape[0], -1))
        return ops.reshape(ops.matmul(w, flat), (w.shape[0],) + tuple(column.shape[1:]))
    value = field.value
    shape = tuple(value.shape[2:])
    return ops.sum(ops.reshape(weight, tuple(weight.shape) + (1,) * len(shape)) * value, axis=1)


def row_max(x):
    return fold_map(lambda row: fold_reduce(monoids.max, row), x)


def _log_weights(z):
    """(row totals, e = exp(z - row max), the rows' sums of e, whether each row is empty) of a (bi, bj)
    block. A row of -inf is empty: it gives (-inf, 0, 0, True). A NaN gives its row a NaN total and a +inf a
    +inf one, as the nested logaddexp fold does (only a weight of exactly 0 counts as empty: NaN > 0 is
    false); in a row whose maximum is +inf, each +inf element weighs 1 and every other 0."""
    m = ops.stop_gradient(row_max(z))  # the shift cancels, so its derivative is zero: do not compute it
    m_safe = ops.where(ops.abs(m) == np.inf, 0.0, m)
    m_col = _column_vector(m)
    # a +inf element weighs 1 and the finite ones 0, as monoids.exp_weight says (inf - inf would be NaN)
    at_infinite_max = (z == m_col) & (m_col == np.inf)
    e = ops.exp(ops.where(at_infinite_max, 0.0, z - ops.where(m_col == np.inf, m_col, _column_vector(m_safe))))
    total_weight = ops.sum(e, axis=1)
    empty = total_weight == 0
    safe_weight = ops.where(empty, 1.0, total_weight)
    total = ops.where(empty, -np.inf, ops.where(m == np.inf, np.inf, m_safe + ops.log(safe_weight)))
    return total, e, empty, safe_weight


def stable_logsumexp_rows(z):
    """The row totals log sum_j exp(z_ij) of a (bi, bj) block; rows of -inf give -inf."""
    return _log_weights(z)[0]


def softmax_weighted_sum(z, field):
    """(row totals of z, sum_j softmax(z_i)_j field_ij): the unnormalised weights summed with the field (a
    matrix product when it is factored), then divided by their row sums, once per row and field entry
    rather than over the (bi, bj) block. Rows of -inf give (-inf, 0)."""
    total, e, empty, safe_weight = _log_weights(z)
    summed = weighted_column_sum(e, field)
    scale = ops.where(empty, 0.0, 1.0 / safe_weight)
    return total, summed * ops.reshape(scale, (scale.shape[0],) + (1,) * (summed.ndim - 1))


def _sum_field(field, bi: int):
    if isinstance(field, Factored):
        weight = field.weight
        if weight is None:
            weight = ops.broadcast_to(np.ones((), np.dtype(field.column.dtype)), (bi, field.column.shape[0]))
        return weighted_column_sum(weight, Factored(None, field.column))
    return ops.sum(field.value, axis=1)


@BLOCK_FOLDS.register(monoids.sum)
def _sum_block(fields, bi):
    (f,) = fields
    return [_sum_field(f, bi)]


@BLOCK_FOLDS.register(monoids.vsum)
def _vsum_block(fields, bi):
    (f,) = fields
    return [_sum_field(f, bi)]


@BLOCK_FOLDS.register(monoids.logaddexp)
def _logaddexp_block(fields, bi):
    (f,) = fields
    return [stable_logsumexp_rows(expand(f, bi))]


@BLOCK_FOLDS.register(monoids.logwsum)
def _logwsum_block(fields, bi):
    v, z = fields  # dict leaves are sorted: "v", "z"
    total, summed = softmax_weighted_sum(expand(z, bi), v)
    return [summed, total]


@BLOCK_FOLDS.register(monoids.cross_entropy)
def _cross_entropy_block(fields, bi):
    n, p = fields
    return [_sum_field(n, bi), stable_logsumexp_rows(expand(p, bi))]


@BLOCK_FOLDS.register(monoids.cross_entropy_dist)
def _cross_entropy_dist_block(fields, bi):
    n, p, q = fields
    p_total, n_summed = softmax_weighted_sum(expand(p, bi), n)
    return [n_summed, p_total, stable_logsumexp_rows(expand(q, bi))]


def generic_block_fold(monoid, fields: list, treedef, bi: int) -> list:
    """Any monoid: expand every field, then reduce each row along j with the monoid."""
    from .pytree import tree_flatten

    full = [expand(f, bi) for f in fields]
    per_row = fold_map(lambda *row: tree_flatten(fold_reduce(monoid, treedef.unflatten(list(row))))[0], *full)
    return list(per_row)


def fold_block(monoid, fields: list, treedef, bi: int) -> list:
    rule = BLOCK_FOLDS.get(monoid)
    if rule is not None:
        return rule(fields, bi)
    return generic_block_fold(monoid, fields, treedef, bi)
