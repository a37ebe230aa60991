"""A row's minimum (maximum) and the first index holding it, folded together in one pass.

A min or max gradient asks for the extreme of a row and then for the first index where the row equals it:
ad/reduce_rules.py writes `m = min(x)`, then `min(where(x == m, iota, n))`. Built as written, the row is
read twice, and the second fold compares and selects at every element. Here the second reduce is recognised
from what the nest knows of its value (facts.py: `first_of`, a `where(x == m, index, n)` whose condition
compares x with a splat `equal_to`), and where `m` is the accumulator of a fold of the same stored row
written just before, that fold's loop becomes one fold of (value, first index) pairs: the product kernel's
question (kernels/cpu/product_fold.py), asked of any row. Its operator is commutative (the lower value
wins, the lower index among equal values), so a backend may fold it in lanes and merge them.

NaN as NumPy and the two folds have it: a row holding NaN has the extreme NaN, and no element equals it, so
the first index is `n` (no index). Rows up to MAX_PAIRED: a longer row's two folds vectorise better.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .nest import Assign, If, LaneFold, Loop

if TYPE_CHECKING:
    from .build import Scalar, Stored, Value, Writer

# the operator's comparison that makes an element the new extreme, and the identity it must start from
_BETTER = {"minimum": ("<", math.inf), "maximum": (">", -math.inf)}


# the longest row folded in pairs. The pairs run in lanes of selects; a longer row's two folds each run in
# LLVM's vector registers (extremum_loops.py), which costs about a fixed start per loop plus a fraction of a
# cycle per element. bench_ab against 8984226: natural k-means' gradient (rows of 64) 0.70x, its HVP 0.42x;
# the minimum pairwise distance's gradient (rows of 4096) 1.5x and cosine-max's (2048) 1.14x. The crossing
# between 64 and 2048 is not measured; 128 is the estimate of a select per element against the vector loops.
MAX_PAIRED = 128


@dataclass(frozen=True)
class Extreme:
    """A fold of a stored row into `acc` by `op`, written as `loop` (found again by identity)."""

    row: "Stored"
    acc: str
    op: str
    loop: Loop


def extreme_of(row: "Value", op: str | None, identity: "Value", acc: str, loop: Loop) -> Extreme | None:
    """The fold just written, where it is an extreme of a stored float row from its operator's identity."""
    from .build import Scalar, Stored, literal

    if (op not in _BETTER or not isinstance(row, Stored) or row.dtype.kind != "f" or len(row.shape) != 1
            or row.shape[0] > MAX_PAIRED):
        return None
    if not isinstance(identity, Scalar) or identity.expr != literal(_BETTER[op][1], row.dtype):
        return None
    return Extreme(row, acc, op, loop)


def first_index_with_extreme(w: "Writer", x: "Value", identity: "Value", dtype: np.dtype) -> "Scalar | None":
    """The minimum of `x` = where(row == m, index, n) as the index half of the fold that made m, now folding
    (value, first index) pairs; None where that fold is not one written just before in the open block."""
    from .build import Scalar, cast, literal

    first = getattr(x, "first_of", None)
    compared = getattr(first[1], "equal_to", None) if first is not None else None
    if first is None or first[0] != 0 or compared is None or dtype.kind not in "iu":
        return None
    row, m = compared
    extreme = w.extremes.get(m)
    if extreme is None or extreme.row is not row:
        return None
    block = w.blocks[-1]
    at = next((k for k, node in enumerate(block) if node is extreme.loop), None)
    if at is None:
        return None
    last = literal(first[2], np.dtype(np.int64))
    index = w.fresh("acc")
    block[at: at + 1] = [Assign(index, last), *_paired(w, extreme, index, last)]
    del w.extremes[m]  # its loop is gone: a later question of it builds its own
    start = cast(w.element(identity, ()), dtype, identity.dtype)
    return Scalar(w.assign(cast(f"_minimum({start}, {index})", dtype, None)), dtype)


# the longest row whose first index is folded in int32 (first_index_narrowed): every index and `n` fit
NARROWED_MAX = 2 ** 31 - 1
_INT32 = np.dtype(np.int32)


def first_index_narrowed(w: "Writer", x: "Value", identity: "Value", dtype: np.dtype) -> "Scalar | None":
    """The minimum of `x` = where(cond, index, n) over a row of 1 <= n < 2^31 elements, not paired with the
    fold of its extreme (a long row's two folds each run vectorised), folded in int32 and widened once: its
    elements are indices and n, so the fold is exact, and LLVM's vectors hold twice the int32 lanes (k-means'
    matrix-form gradient over 256 centroids: 0.60-0.65x the time in float32, 0.79x in float64). None where
    `x` is not such a row."""
    from .build import Scalar, cast, fold_into, lane_fold

    first = getattr(x, "first_of", None)
    n = x.shape[0] if len(x.shape) == 1 else 0
    if first is None or first[0] != 0 or dtype.kind not in "iu" or not 1 <= n <= NARROWED_MAX \
            or not 0 <= first[2] <= NARROWED_MAX:
        return None
    operator = _int32_minimum()
    start = f"np.int32({first[2]})"  # no smaller than every element: the fold of a row of n >= 1 elements
    acc = w.assign(start, "acc")
    folds = (lane_fold(w, operator, [], [acc], [start], [_INT32]),)

    def step(i: str) -> None:
        element = w.assign(f"np.int32({w.element(x, (i,))})")
        fold_into(w, operator, [], [acc], [_INT32], [Scalar(element, _INT32)])

    w.loop(n, step, folds)
    widened = f"np.int64({acc})"
    return Scalar(w.assign(cast(f"_minimum({cast(w.element(identity, ()), np.dtype(np.int64), identity.dtype)}, "
                                f"{widened})", dtype, np.dtype(np.int64))), dtype)


@functools.cache
def _int32_minimum():
    """`minimum` on two int32 scalars, as a fold's operator body."""
    import fold

    return fold.trace(lambda a, b: fold.minimum(a, b), np.int32(0), np.int32(0))


def _paired(w: "Writer", extreme: Extreme, index: str, last: str) -> list:
    """The extreme's loop folding (value, first index, NaN seen), then the NaN's result, and the first index
    of a row whose extreme is the identity (all +inf for a minimum: no element beats it, yet each equals it),
    found by a fold of its own that only such rows run. Bitwise `|`: `or` would branch at every element."""
    from .build import literal

    better = _BETTER[extreme.op][0]
    j, v, row, n = extreme.loop.index, extreme.acc, extreme.row, extreme.loop.extent
    identity = literal(_BETTER[extreme.op][1], row.dtype)
    nan, element, take = w.fresh("acc"), w.fresh("e"), w.fresh("t")
    body = (Assign(element, f"{row.name}[{j}]"),
            Assign(take, f"{element} {better} {v}"),
            Assign(v, f"({element} if {take} else {v})"),
            Assign(index, f"(np.int64({j}) if {take} else {index})"),
            Assign(nan, f"{nan} | ({element} != {element})"))
    lv, lk, ln, rv, rk, rn, wins, mv, mk, mn = (w.fresh(p) for p in "lllrrrtttt")
    merge = (Assign(wins, f"({rv} {better} {lv}) | (({rv} == {lv}) & ({rk} < {lk}))"),
             Assign(mv, f"({rv} if {wins} else {lv})"),
             Assign(mk, f"({rk} if {wins} else {lk})"),
             Assign(mn, f"{ln} | {rn}"))
    fold = LaneFold((v, index, nan), (identity, last, "False"), (lv, lk, ln), (rv, rk, rn), merge, (mv, mk, mn))
    q = w.fresh("i")
    at_identity = Loop(q, n, (Assign(index, f"np.int64(_minimum({index}, np.int64({q}) if {row.name}[{q}] == {v} "
                                            f"else {last}))"),))
    return [Assign(nan, "False"), Loop(j, n, body, (fold,)),
            If(f"{index} == {last} and not {nan}", (at_identity,)),
            Assign(v, f"({literal(math.nan, row.dtype)} if {nan} else {v})"),
            Assign(index, f"({last} if {nan} else {index})")]
