"""fold.gemm_map_reduce: fold a monoid over a mapped matrix product without materialising it.

For every row i, A_i = fold over j of fn(s_ij, *rows_i, *cols_j) with s = lhs @ rhs.T (one s per pair when
lhs and rhs are tuples). The meaning is the nested map/reduce it abbreviates; the execution is blocked: a
block of s by one matrix product, the map over the whole block, the block folded along j (with matrix
products for fields that are column data times a weight) and combined into the running row totals.
Memory: O(M * |T| + block), never M x N.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from . import ops
from .combinators import map as fold_map
from .dtypes import ShapedArray, is_static_int
from .errors import FoldTypeError, ShapeError, StructureError
from .factorize import Factorization, factorize
from .gemm_folds import Factored, Full, fold_block
from .inline import inline_program
from .monoid import Monoid, identity_leaves
from .primitives import GemmMapReduce
from .pytree import leaf_paths, tree_flatten
from .tracing import abstractify, bind, check_callable, trace_body

# What a gemm_map_reduce may hold at once beyond its operands and results (`budget`): one block's
# intermediates and, in a gradient that runs its forward and backward together (numba), the products it keeps
# for the backward. By default the cap, MAX_BUDGET (a 128 MiB block and 1 GiB of kept products: sized for
# speed). FOLD_GEMM_BUDGET=auto asks for a fraction of the product s it never materialises (M x N values per
# pair, the term that dominates the naive formula's memory, which holds it several times), at least a floor
# (below it, blocks get small enough for their per-block overhead to show): the paper's MLP (B = K = 8192,
# D = 128, float32: a 256 MiB product) then gets 16 MiB, and its gradient's peak falls from 18% to under 5% of
# the naive formula's, at up to 1.9x the time (benchmarks/README.md).
BUDGET_FRACTION = 1 / 16
MIN_BUDGET = 16 * 2**20
MAX_BUDGET = 2**30 + 128 * 2**20
BUDGET_VARIABLE = "FOLD_GEMM_BUDGET"  # overrides the default budget: bytes, or with a K, M or G suffix (64M)
AUTO = "auto"  # FOLD_GEMM_BUDGET=auto: the budget a fraction of the products never materialised

# Of the budget, the share one block's estimated intermediates aim for (the rest holds kept products), up to
# MAX_BLOCK_BYTES. 128 MiB: on the numba backend blocks of 128 MiB ran attention's gradient 8-10% faster at
# 1024 and 4096 than blocks of 32 MiB, and cross-entropy's 5% (fewer statements run per pair); the numpy
# backend, fastest at 32 MiB, is 6% slower.
BLOCK_SHARE = 1 / 2
MAX_BLOCK_BYTES = 128 * 2**20

# Bytes of products s a gradient may keep, per row block, instead of computing them again in the backward
# (a backend that runs the forward and the backward together: numba), at most: what the budget leaves beside
# one block's intermediates bounds it too.
DEFAULT_KEEP = 2**30

_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def budget_from_environment() -> int | None:
    """The budget FOLD_GEMM_BUDGET sets (bytes: an integer, optionally followed by K, M or G), or None where
    it is unset or empty."""
    text = os.environ.get(BUDGET_VARIABLE, "").strip()
    if not text or text.lower() == AUTO:
        return None
    number, suffix = (text[:-1], text[-1].upper()) if text[-1].upper() in "KMG" else (text, "")
    try:
        value = int(number) * _SUFFIXES[suffix]
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{BUDGET_VARIABLE} must be a positive number of bytes, optionally with a K, M or G "
                         f"suffix (e.g. 67108864 or 64M), or auto, got {text!r}")
    return value


def default_budget(m: int, n: int, pairs: int, itemsize: int) -> int:
    """The memory budget of a gemm_map_reduce of an (m, n) product (`pairs` of them, `itemsize` bytes per
    value) when none is given: FOLD_GEMM_BUDGET's bytes where set; where it is `auto`, BUDGET_FRACTION of the
    bytes of the products it never materialises, at least MIN_BUDGET and at most MAX_BUDGET (memory first:
    smaller blocks, slower); else MAX_BUDGET (speed first: 128 MiB blocks and 1 GiB of kept products)."""
    if os.environ.get(BUDGET_VARIABLE, "").strip().lower() == AUTO:
        return int(min(max(m * n * pairs * itemsize * BUDGET_FRACTION, MIN_BUDGET), MAX_BUDGET))
    configured = budget_from_environment()
    return MAX_BUDGET if configured is None else configured


_block_cap: contextvars.ContextVar[int] = contextvars.ContextVar("fold_gemm_block_cap", default=0)


def block_cap() -> int:
    """The most bytes of intermediates an automatic block aims for: MAX_BLOCK_BYTES, or the cap of the backend
    a program is being traced for (`blocks_of_at_most`)."""
    return _block_cap.get() or MAX_BLOCK_BYTES


@contextlib.contextmanager
def blocks_of_at_most(cap: int | None) -> Iterator[None]:
    """Automatic blocks of up to `cap` bytes for the gemm_map_reduces traced inside (None: MAX_BLOCK_BYTES).
    A backend whose every block costs more than the CPU's (the cuda backend launches each block's statements
    from Python) asks for larger ones; fold.jit traces a program once per cap."""
    token = _block_cap.set(int(cap or 0))
    try:
        yield
    finally:
        _block_cap.reset(token)


def block_bytes(budget: int) -> int:
    """Bytes of intermediates the automatic block size aims for under `budget`."""
    return int(min(budget * BLOCK_SHARE, block_cap()))


def kept_bytes_allowed(budget: int, block: tuple[int, int], per_pair_bytes: int, keep: int) -> int:
    """Bytes of products a gradient may keep per row block: `keep`, and no more than the budget leaves
    beside one block's estimated intermediates (block rows x columns x `per_pair_bytes`)."""
    return max(0, min(keep, budget - block[0] * block[1] * per_pair_bytes))


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _matrices(where: str, name: str, xs: tuple) -> tuple[list, list[ShapedArray]]:
    leaves, _, avals = abstractify(xs, where)
    for i, a in enumerate(avals):
        if a.ndim != 2:
            raise ShapeError(f"{where}: {name}[{i}] must be a matrix, got shape {a.shape}")
    return leaves, avals


def choose_block(m: int, n: int, per_pair_bytes: int, budget: int) -> tuple[int, int]:
    """(rows, columns) of a block whose intermediates (`per_pair_bytes` per pair) take about `budget` bytes:
    side x 2 side pairs, and where there are fewer columns than that (k-means' 64 centroids), as many more
    rows as the budget holds, so that few columns do not mean a thousand small blocks, each paying its
    per-block overhead. Never fewer than 32 x 64 pairs (where the matrix has them)."""
    per_pair = max(per_pair_bytes, 1)
    side = max(int(math.sqrt(budget / (2 * per_pair))), 32)
    cols = max(min(n, side * 2), 1)
    return max(min(m, max(side, budget // (per_pair * cols))), 1), cols


def _check_block(where: str, block: Any) -> tuple[int, int] | None:
    if block is None:
        return None
    pair = (block, block) if isinstance(block, (int, np.integer)) else tuple(block) if isinstance(block, (tuple, list)) else ()
    if len(pair) != 2 or not all(is_static_int(b) for b in pair):
        raise FoldTypeError(f"{where}: block must be an int or a pair of ints (rows, columns), got {block!r}")
    if min(pair) <= 0:
        raise ShapeError(f"{where}: block sizes must be positive, got {block!r}")
    return int(pair[0]), int(pair[1])


def _check_bytes(where: str, name: str, value: Any, what: str, least: int) -> int:
    """A byte count argument (`budget`, `keep`): an int of at least `least`."""
    if not is_static_int(value):
        raise FoldTypeError(f"{where}: {name} must be an int ({what}), got {value!r}")
    if value < least:
        raise ShapeError(f"{where}: {name} must be a number of bytes, {least} or more, got {value!r}")
    return int(value)


def _operands(extra: Any) -> tuple:
    """rows= / cols= as a tuple of operands: a tuple or list as it is, anything else (one array) as one operand."""
    return tuple(extra) if isinstance(extra, (tuple, list)) else (extra,)


def gemm_map_reduce(monoid: Monoid, fn: Callable[..., Any], lhs: Any, rhs: Any, *, rows: Sequence[Any] = (),
                    cols: Sequence[Any] = (), block: int | tuple[int, int] | None = None,
                    budget: int | None = None, keep: int = DEFAULT_KEEP) -> Any:
    """Row folds of a mapped matrix product: A_i = fold_j fn(<lhs_i, rhs_j>, *rows_i, *cols_j).

    `lhs` (M x F) and `rhs` (N x F) may be tuples of the same length (then fn receives one s per pair);
    `rows` are arrays with leading axis M, `cols` arrays with leading axis N (a tuple of them, or one). The result has the monoid's
    element structure with a leading axis M.

    Memory: `budget` bounds the bytes the gemm holds at once beyond its operands and results: one block's
    intermediates (about BLOCK_SHARE of it, at most 128 MiB, which sets the block size) and, in a gradient that runs the
    forward and the backward together, the products of a row block it keeps to read again instead of
    recomputing them (at most `keep` bytes, and what the budget leaves; `keep=0`: recompute all). By
    default (None) the budget is `default_budget`: FOLD_GEMM_BUDGET (bytes, or 64M-style) where set; with
    FOLD_GEMM_BUDGET=auto, 1/16 of the bytes of the M x N products it never materialises, between 16 MiB and
    1.125 GiB; else 1.125 GiB (blocks sized for speed). `block`
    (an int or (rows, cols)) gives the block size instead.

    >>> import numpy as np, fold
    >>> Q, K = np.random.rand(3, 4), np.random.rand(5, 4)
    >>> lse = fold.gemm_map_reduce(fold.monoids.logaddexp, lambda s: s, Q, K)
    >>> bool(np.allclose(lse, np.log(np.exp(Q @ K.T).sum(axis=1))))
    True
    """
    where = "fold.gemm_map_reduce"
    if not isinstance(monoid, Monoid):
        raise FoldTypeError(f"{where}: the first argument must be a fold.Monoid, got {type(monoid).__name__}")
    lhs_t, rhs_t = _as_tuple(lhs), _as_tuple(rhs)
    if len(lhs_t) != len(rhs_t) or not lhs_t:
        raise ShapeError(f"{where}: lhs and rhs must be matrices or tuples of the same length, got {len(lhs_t)} and {len(rhs_t)}")
    lhs_leaves, lhs_avals = _matrices(where, "lhs", lhs_t)
    rhs_leaves, rhs_avals = _matrices(where, "rhs", rhs_t)
    for i, (a, b) in enumerate(zip(lhs_avals, rhs_avals, strict=True)):
        if a.shape[1] != b.shape[1]:
            raise ShapeError(f"{where}: inner dimensions differ: lhs[{i}] has shape {a.shape}, rhs[{i}] has shape {b.shape} ({a.shape[1]} != {b.shape[1]})")
    m, n = lhs_avals[0].shape[0], rhs_avals[0].shape[0]
    for i, (a, b) in enumerate(zip(lhs_avals, rhs_avals, strict=True)):
        if a.shape[0] != m or b.shape[0] != n:
            raise ShapeError(f"{where}: all lhs must have {m} rows and all rhs {n} rows; lhs[{i}] is {a.shape}, rhs[{i}] is {b.shape}")
    dtype = np.result_type(*[a.dtype for a in lhs_avals + rhs_avals])
    dtype = dtype if dtype.kind == "f" else np.dtype("float64")
    lhs_leaves = [ops.convert(x, dtype) for x in lhs_leaves]
    rhs_leaves = [ops.convert(x, dtype) for x in rhs_leaves]

    rows, cols = _operands(rows), _operands(cols)
    label = f"gemm_map_reduce map {getattr(fn, '__name__', 'fn')}"
    check_callable(fn, len(lhs_t) + len(rows) + len(cols), label)  # fn(s.., *rows, *cols)
    row_leaves, row_def, row_avals = abstractify(rows, where)
    col_leaves, col_def, col_avals = abstractify(cols, where)
    _check_leading(where, "rows", row_def, row_avals, m, "M (the rows of lhs)")
    _check_leading(where, "cols", col_def, col_avals, n, "N (the rows of rhs)")
    row_elems = [a.update(shape=a.shape[1:]) for a in row_avals]
    col_elems = [a.update(shape=a.shape[1:]) for a in col_avals]
    s_avals = [ShapedArray((), dtype)] * len(lhs_t)

    body = trace_body(lambda *args: fn(*args[: len(lhs_t)], *row_def.unflatten(list(args[len(lhs_t): len(lhs_t) + len(row_elems)])),
                                         *col_def.unflatten(list(args[len(lhs_t) + len(row_elems):]))),
                      s_avals + row_elems + col_elems, label)
    fn_program, out_tree = body.program, body.out_tree
    identity_def = tree_flatten(monoid.identity)[1]
    if out_tree != identity_def:
        raise StructureError(f"{where}: the map returns structure {out_tree}, but the monoid {monoid.name} has elements {identity_def}")
    elems = list(fn_program.out_avals)
    identity = identity_leaves(where, monoid.identity, out_tree, elems)
    op = trace_body(lambda a, b: monoid.op(a, b), (out_tree.unflatten(elems),) * 2, f"monoid {monoid.name}")
    if op.consts or list(op.program.out_avals) != elems:
        raise StructureError(f"{where}: the monoid {monoid.name} must map two elements {out_tree.unflatten([str(e) for e in elems])} to one such element")

    nc, npairs = len(body.consts), len(lhs_t)
    inputs = list(fn_program.inputs)
    col_inputs = inputs[nc + npairs + len(row_elems):]
    factorization = factorize(fn_program, col_inputs, inputs[:nc])
    per_pair = dtype.itemsize * (len(factorization.pointwise.stmts) + npairs + 4) + sum(
        e.nbytes for i, e in enumerate(elems) if i in factorization.full)
    budget = (default_budget(m, n, npairs, dtype.itemsize) if budget is None
              else _check_bytes(where, "budget", budget, "bytes the gemm may hold beyond its operands and results", 1))
    bi, bj = _check_block(where, block) or choose_block(m, n, per_pair, block_bytes(budget))
    keep = kept_bytes_allowed(budget, (bi, bj), per_pair, _check_bytes(where, "keep", keep, "bytes of products a gradient may keep", 0))
    shapes = sorted({(min(bi, m - i0), min(bj, n - j0)) for i0 in range(0, m, bi) for j0 in range(0, n, bj)})
    const_avals = [v.aval for v in inputs[:nc]]

    def block_program(shape):
        ri, rj = shape

        def run(*flat):
            flat = list(flat)
            consts, flat = flat[:nc], flat[nc:]
            ls, flat = flat[:npairs], flat[npairs:]
            row_blk, flat = flat[: len(row_elems)], flat[len(row_elems):]
            rs, col_blk = flat[:npairs], flat[npairs:]
            return _fold_one_block(monoid, out_tree, fn_program, factorization, consts, ls, rs, row_blk, col_blk, ri, elems)

        avals = (const_avals + [ShapedArray((ri, a.shape[1]), dtype) for a in lhs_avals]
                 + [a.update(shape=(ri,) + a.shape[1:]) for a in row_avals]
                 + [ShapedArray((rj, a.shape[1]), dtype) for a in rhs_avals]
                 + [a.update(shape=(rj,) + a.shape[1:]) for a in col_avals])
        traced = trace_body(run, avals, f"gemm_map_reduce block {ri}x{rj}")
        assert not traced.consts
        return traced.program

    prim = GemmMapReduce(fn_program, tuple((s, block_program(s)) for s in shapes), op.program, monoid, nc,
                         npairs + len(row_leaves), npairs + len(col_leaves), (bi, bj), keep)
    outs = bind(prim, *body.consts, *identity, *lhs_leaves, *row_leaves, *rhs_leaves, *col_leaves)
    return out_tree.unflatten(outs)


def _check_leading(where: str, name: str, treedef, avals: list[ShapedArray], size: int, what: str) -> None:
    for path, aval in zip(leaf_paths(treedef, name), avals, strict=True):
        if aval.ndim == 0 or aval.shape[0] != size:
            raise ShapeError(f"{where}: {path} has shape {aval.shape}; its leading axis must be {what} = {size}")


def _fold_one_block(monoid, out_tree, fn_program, factorization, consts, ls, rs, row_blk, col_blk, bi: int, elems) -> list:
    """Inside a block program: s = L R^T, the map over the block, the block folded along j."""
    fields = block_fields(fn_program, factorization, consts, ls, rs, row_blk, col_blk, elems)
    return fold_block(monoid, fields, out_tree, bi)


def block_fields(fn_program, factorization, consts, ls, rs, row_blk, col_blk, elems) -> list:
    """The map over one block as its fields (one per leaf of the monoid's element): `Full` (bi x bj values)
    or `Factored` (a bi x bj weight, or none, times bj column values)."""
    npairs = len(ls)
    s_blocks = [ops.matmul(lhs, ops.transpose(rhs)) for lhs, rhs in zip(ls, rs, strict=True)]

    def per_pair(*args):
        return inline_program(factorization.pointwise, list(consts) + list(args))

    def per_row(*args):
        s_row, row = list(args[:npairs]), list(args[npairs:])
        return fold_map(lambda *sc: per_pair(*sc[:npairs], *row, *sc[npairs:]), *s_row, *col_blk)

    pointwise = list(fold_map(per_row, *s_blocks, *row_blk)) if factorization.pointwise.outputs else []
    columns = []
    if factorization.columns.outputs:
        placeholders = [np.zeros(v.aval.shape, v.aval.dtype) for v in fn_program.inputs[len(consts): len(fn_program.inputs) - len(col_blk)]]
        columns = list(fold_map(lambda *c: inline_program(factorization.columns, list(consts) + placeholders + list(c)), *col_blk))
    fields: list = [None] * len(elems)
    for k, leaf in enumerate(factorization.full):
        fields[leaf] = Full(pointwise[k])
    for k, f in enumerate(factorization.factored):
        weight = None if f.weight_output is None else pointwise[f.weight_output]
        fields[f.leaf] = Factored(weight, columns[k])
    return fields


def _operand_counts(prim: GemmMapReduce) -> tuple[int, int, int]:
    """(consts, matrix pairs, row data leaves) of `prim`."""
    nc = prim.num_consts
    npairs = prim.num_row_args + prim.num_col_args - (len(prim.fn.inputs) - nc)
    return nc, npairs, prim.num_row_args - npairs


def factorization_of(prim: GemmMapReduce) -> Factorization:
    """How `prim`'s map splits into fields held per pair and fields that are (weight) x column data, the
    same for every block shape."""
    nc, npairs, n_rows = _operand_counts(prim)
    inputs = list(prim.fn.inputs)
    return factorize(prim.fn, inputs[nc + npairs + n_rows:], inputs[:nc])


def fields_of_block(prim: GemmMapReduce, factorization: Factorization, flat: Sequence[Any]) -> list:
    """`block_fields` for a block of `prim`, from the block program's inputs (consts, lhs blocks, row data,
    rhs blocks, column data): what a backward pass that takes each pair as a part of the fold differentiates."""
    nc, npairs, n_rows = _operand_counts(prim)
    flat = list(flat)
    consts, ls = flat[:nc], flat[nc: nc + npairs]
    row_blk, rs, col_blk = flat[nc + npairs: nc + npairs + n_rows], flat[nc + npairs + n_rows: nc + 2 * npairs + n_rows], flat[nc + 2 * npairs + n_rows:]
    return block_fields(prim.fn, factorization, consts, ls, rs, row_blk, col_blk, list(prim.fn.out_avals))
