"""A matrix product folded row by row without being stored: each row's products mapped and combined.

    s = x @ b.T                                                    (x: rows x K, b: m x K)
    out[r] = f(s[r, 0], operands at (r, 0)) . ... . f(s[r, m-1], operands at (r, m-1))

with `.` a commutative operator and f a function of the product and of operands that are per row, per
column, one scalar, or a full (rows, m) array. k-means' cost per point: s = P C^T,
f(s, |p|^2, |c|^2) = |p|^2 - 2 s + |c|^2, `.` = minimum.

With a short inner dimension (k-means' 16) BLAS runs far below the machine's FMA rate, and its (rows, m)
result is written to memory and read back by the fold. Here each block of ROWS rows by COLUMNS columns of s is
accumulated in vector registers (kernels.cpu.simd's F64x4: an element of b loaded once for ROWS rows, an
element of x broadcast once for COLUMNS columns, one FMA per lane and term), then mapped and folded by f's
and `.`'s F64x4 forms (kernels.cpu.simd.vector_form) while still in registers. Lane l of a row's
accumulator folds the columns j = l (mod 4); the four lanes, then the last m mod COLUMNS columns (with the
scalar f and `.`, their products summed in order without FMA) are combined at the end: an order other than
the columns', hence the commutative operator. Row blocks run in parallel: T contiguous runs of them, one
per prange iteration, each a call of `row_blocks` (compiled serially: the parfor passes then see a small
body, see kernels.cpu.codegen.compile_kernel). A last partial block computes its missing rows as copies of
the last row and does not store them.

product_first_extreme runs the same tiles for a min or max gradient's question: the extreme of the mapped
row and the first column holding it. Each lane keeps its best value and that value's column (as a float64),
and a flag for NaN. The lanes are combined by (value, column).

Why this is not a loop nest (runtime/loops): here a 4 x 8 tile of the product stays in registers across the
whole shared axis, and f's F64x4 form maps it there. The nest sweeps b four rows at once only past 32 KB
(runtime/numba_backend/nest_jam.py, session 70), its accumulators a buffer loaded and stored per block of
steps, and maps the row after: it beats this kernel on k-means at 32 x 256 (forward / gradient / HVP 0.86 /
0.82 / 0.88) but not between 8 and 32 KB (32 x 64 forward 1.10, 16 x 128 HVP 1.20) nor on a layer's
sum(tanh(W @ x)) (forward 1.29-1.32), so the numba backend gives the nest float64 bodies of at most 8 KB.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import host, simd
from .codegen import compile_kernel, indent, simd_import

ROWS = 4
COLUMNS = 8
KINDS = ("product", "row", "column", "scalar", "full")


def _argument(kind: str, a: int, r: int, half: int) -> str:
    """How the vector form's argument `a` of kind `kind` is read for row r of the block, columns j + 4 half."""
    return {"product": f"s{r}_{half}", "row": f"row{a}_{r}", "column": f"load(o{a}, j + {4 * half})",
            "scalar": f"scalar{a}", "full": f"load(o{a}[i{r}], j + {4 * half})"}[kind]


def _scalar_argument(kind: str, a: int, r: int) -> str:
    return {"product": "s", "row": f"o{a}[i{r}]", "column": f"o{a}[j]", "scalar": f"o{a}[0]",
            "full": f"o{a}[i{r}, j]"}[kind]


# the comparison that makes a value the new extreme, per kind of extreme (ties go to the lower column)
_BETTER = {"minimum": ("less", "<"), "maximum": ("greater", ">")}


def _fold_lines(kinds: tuple[str, ...], extreme: str | None, r: int, half: int) -> list[str]:
    """Folding the mapped columns j + 4 half .. j + 4 half + 3 of row r of the block into its accumulator."""
    args = ", ".join(_argument(kind, a, r, half) for a, kind in enumerate(kinds))
    if extreme is None:
        return [f"acc{r} = combine_f64x4(acc{r}, mapper_f64x4({args}))"]
    better = _BETTER[extreme][0]
    return [f"mapped = mapper_f64x4({args})",
            f"col = add(splat(float(j + {4 * half})), lanes)",
            f"take = {better}(mapped, acc{r})",
            f"acc{r} = select(take, mapped, acc{r})",
            f"at{r} = select(take, col, at{r})",
            f"nan{r} = maximum(nan{r}, not_equal(mapped, mapped))"]


def _finish_lines(kinds: tuple[str, ...], extreme: str | None, r: int) -> list[str]:
    """Combining row r's lanes and its last m mod COLUMNS columns, and storing the row's result."""
    scalar_args = ", ".join(_scalar_argument(kind, a, r) for a, kind in enumerate(kinds))
    product = ["    s = 0.0", "    for q in range(K):", f"        s += x[i{r}, q] * bt[q, j]"]
    if extreme is None:
        return [f"total = as_scalar(combine(as_scalar(combine(lane(acc{r}, 0), lane(acc{r}, 1))),"
                f" as_scalar(combine(lane(acc{r}, 2), lane(acc{r}, 3)))))",
                "for j in range(tiled, m):", *product,
                f"    total = as_scalar(combine(total, as_scalar(mapper({scalar_args}))))",
                f"if i0 + {r} < rows:",
                f"    out[i0 + {r}] = total"]
    op = _BETTER[extreme][1]
    lines = [f"best = lane(acc{r}, 0)", f"where = lane(at{r}, 0)",
             f"seen_nan = lane(nan{r}, 0) + lane(nan{r}, 1) + lane(nan{r}, 2) + lane(nan{r}, 3) > 0.0"]
    for lane_index in range(1, simd.WIDTH):
        lines += [f"v = lane(acc{r}, {lane_index})", f"c = lane(at{r}, {lane_index})",
                  f"if v {op} best or (v == best and c < where):", "    best = v", "    where = c"]
    lines += ["for j in range(tiled, m):", *product,
              f"    v = as_scalar(mapper({scalar_args}))",
              "    if v != v:", "        seen_nan = True",
              f"    elif v {op} best:", "        best = v", "        where = float(j)",
              f"if i0 + {r} < rows:",
              "    if seen_nan:",
              f"        out[i0 + {r}] = np.nan",
              f"        index[i0 + {r}] = fill",
              "    else:",
              f"        out[i0 + {r}] = best",
              f"        index[i0 + {r}] = 0 if where == m else int(where)"]
    return lines


def _block_source(kinds: tuple[str, ...], extreme: str | None) -> str:
    """The body of one row block (starting at row i0)."""
    operands = [(a, kind) for a, kind in enumerate(kinds) if kind != "product"]
    half_count = COLUMNS // simd.WIDTH
    lines = [f"i{r} = min(i0 + {r}, rows - 1)" for r in range(ROWS)]
    lines += [f"row{a}_{r} = splat(o{a}[i{r}])" for a, kind in operands if kind == "row" for r in range(ROWS)]
    lines += [f"scalar{a} = splat(o{a}[0])" for a, kind in operands if kind == "scalar"]
    lines += [f"acc{r} = splat(identity)" for r in range(ROWS)]
    if extreme is not None:  # the column each lane's extreme is at (m: none yet), whether a lane has seen NaN
        # (a lane's columns come in increasing order and only a strictly better value is taken: the first of
        # equal values stays; a lane of only the identity, +-inf, takes none, and if every lane and column
        # is the identity, the first column, 0, holds it)
        lines.append("lanes = load(offsets, 0)")
        lines += [f"at{r} = splat(float(m))" for r in range(ROWS)] + [f"nan{r} = splat(0.0)" for r in range(ROWS)]
    lines.append(f"for j in range(0, tiled, {COLUMNS}):")
    tile = [f"s{r}_{h} = splat(0.0)" for r in range(ROWS) for h in range(half_count)]
    tile.append("for q in range(K):")
    step = ["b_row = bt[q]"] + [f"b{h} = load(b_row, j + {4 * h})" for h in range(half_count)]
    for r in range(ROWS):
        step.append(f"x_rq = splat(x[i{r}, q])")
        step += [f"s{r}_{h} = fma(x_rq, b{h}, s{r}_{h})" for h in range(half_count)]
    tile += [f"    {line}" for line in step]
    for r in range(ROWS):
        for h in range(half_count):
            tile += _fold_lines(kinds, extreme, r, h)
    lines += [f"    {line}" for line in tile]
    for r in range(ROWS):
        lines += _finish_lines(kinds, extreme, r)
    return "\n".join(lines)


def _source(kinds: tuple[str, ...], extreme: str | None) -> str:
    operands = ", ".join(f"o{a}" for a, kind in enumerate(kinds) if kind != "product")
    block = _block_source(kinds, extreme)
    helpers = ("fma", "lane", "load", "splat") + (() if extreme is None else
                                                   ("add", "greater", "less", "maximum", "not_equal", "select"))
    results = "out" if extreme is None else "offsets, fill, out, index"
    params = f"x, bt, {operands + ', ' if operands else ''}identity, {results}"
    return f"""{simd_import(*helpers)}

def row_blocks(first, last, rows, K, m, tiled, {params}):
    for block in range(first, last):
        i0 = block * {ROWS}
{indent(block, 8)}


def kernel(T, {params}):
    rows, K = x.shape
    m = bt.shape[1]
    tiled = m - m % {COLUMNS}
    blocks = (rows + {ROWS - 1}) // {ROWS}
    if T == 1:
        row_blocks(np.int64(0), blocks, rows, K, m, tiled, {params})
    else:
        for t in prange(T):
            row_blocks(np.int64(t) * blocks // T, (np.int64(t) + 1) * blocks // T, rows, K, m, tiled, {params})
"""


def product_fold_kernel(mapper: Any, combine: Any, kinds: tuple[str, ...], parallel: bool,
                        extreme: str | None = None) -> Any:
    """The compiled kernel(T, x, bt, operands.., identity, out) for these functions and argument kinds; with
    an `extreme`, kernel(T, x, bt, operands.., identity, offsets, fill, out, index) (combine unused)."""
    forms = {"mapper_f64x4": simd.vector_form(mapper), "combine_f64x4": simd.vector_form(combine)}
    return compile_kernel(("product_fold", mapper, combine, kinds, parallel, extreme), lambda: _source(kinds, extreme),
                          {"mapper": mapper, "combine": combine, **forms}, parallel=parallel, helpers=("row_blocks",))


def _checked_operands(mapper: Any, x: np.ndarray, b: np.ndarray, kinds: Sequence[str],
                      operands: Sequence[np.ndarray]) -> tuple[tuple[str, ...], list[np.ndarray]]:
    """(kinds, operands) as the kernels take them, after checking what both entry points are given."""
    host.check_function(mapper, "mapper")
    if simd.vector_form(mapper) is None:
        raise ValueError("mapper must have an F64x4 form registered with kernels.cpu.simd.register_form")
    kinds = tuple(kinds)
    if kinds.count("product") != 1 or any(kind not in KINDS for kind in kinds):
        raise ValueError(f"kinds must name exactly one 'product' and otherwise {KINDS[1:]}, got {kinds}")
    host.result_dtypes(mapper, [np.float64] * len(kinds), 1, f"mapper (of {len(kinds)} arguments, kinds {kinds})")
    for what, a in (("x", x), ("b", b)):
        if not isinstance(a, np.ndarray) or a.ndim != 2 or a.dtype != np.float64:
            raise ValueError(f"{what} must be a 2-D float64 array, got {getattr(a, 'dtype', type(a).__name__)} "
                             f"of shape {getattr(a, 'shape', None)}")
    rows, m = x.shape[0], b.shape[0]
    if b.shape[1] != x.shape[1]:
        raise ValueError(f"x has {x.shape[1]} columns and b {b.shape[1]}: x @ b.T needs them equal")
    operands = list(operands)
    expected = {"row": (rows,), "column": (m,), "scalar": (1,), "full": (rows, m)}
    shapes = [expected[kind] for kind in kinds if kind != "product"]
    if len(operands) != len(shapes):
        raise ValueError(f"kinds {kinds} take {len(shapes)} operands, got {len(operands)}")
    for j, (a, shape) in enumerate(zip(operands, shapes, strict=True)):
        if not isinstance(a, np.ndarray) or a.shape != shape or a.dtype != np.float64:
            raise ValueError(f"operands[{j}] must be a float64 array of shape {shape}, got "
                             f"{getattr(a, 'dtype', type(a).__name__)} of shape {getattr(a, 'shape', None)}")
    return kinds, operands


def _threads(x: np.ndarray, b: np.ndarray, parallel: bool | None) -> int:
    return host.num_chunks(x.shape[0] * b.shape[0] * x.shape[1], None) if parallel is None else 1 + bool(parallel)


def product_fold(mapper: Any, combine: Any, identity: float, x: np.ndarray, b: np.ndarray, kinds: Sequence[str],
                 operands: Sequence[np.ndarray], *, parallel: bool | None = None) -> np.ndarray:
    """out[r] = fold over j of mapper(arguments at (r, j)), the argument of kind "product" being (x @ b.T)[r, j].

    x (rows, K) and b (m, K) are float64. `kinds` names each of mapper's arguments: exactly one "product";
    "row" (an operand of shape (rows,)), "column" (m,), "scalar" (1,) or "full" (rows, m), the operands
    given in that order. mapper and combine are njit functions of float64 scalars with F64x4 forms
    registered in kernels.cpu.simd; combine must be commutative and associative, with `identity` its
    identity. Returns a float64 array of length rows (the identity in every row when m == 0).
    """
    host.check_function(combine, "combine")
    if simd.vector_form(combine) is None:
        raise ValueError("combine must have an F64x4 form registered with kernels.cpu.simd.register_form")
    kinds, operands = _checked_operands(mapper, x, b, kinds, operands)
    out = np.empty(x.shape[0], np.float64)
    if x.shape[0] == 0:
        return out
    T = _threads(x, b, parallel)
    kernel = product_fold_kernel(mapper, combine, kinds, T > 1)
    kernel(T, np.ascontiguousarray(x), np.ascontiguousarray(b.T), *operands, float(identity), out)
    return out


def product_first_extreme(mapper: Any, extreme: str, x: np.ndarray, b: np.ndarray, kinds: Sequence[str],
                          operands: Sequence[np.ndarray], fill: int, *,
                          parallel: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(values, index): per row r, the extreme ("minimum" or "maximum") over j of v_j = mapper(arguments at
    (r, j)) (the product argument as in product_fold) and the first column j holding it.

    What a gradient of a min or max reads, `m = min(v)`, `first = min(where(v == m, iota, fill))`, in one
    pass over the product: a row holding NaN gives (NaN, fill), as those statements do. Needs m >= 1
    columns (of no column the statements give the extreme's identity and the int64 maximum, which is not
    an index). Ties and equal zeros of either sign go to the lower column; the value is the one stored there.
    """
    if extreme not in _BETTER:
        raise ValueError(f"extreme must be one of {sorted(_BETTER)}, got {extreme!r}")
    kinds, operands = _checked_operands(mapper, x, b, kinds, operands)
    if not isinstance(fill, (int, np.integer)) or isinstance(fill, bool):
        raise TypeError(f"fill must be an integer (the index given to a row holding NaN), got {fill!r}")
    rows, m = x.shape[0], b.shape[0]
    if m == 0:
        raise ValueError("product_first_extreme needs b to have at least one row (a column to find), got 0")
    values, index = np.empty(rows, np.float64), np.empty(rows, np.int64)
    if rows == 0:
        return values, index
    T = _threads(x, b, parallel)
    kernel = product_fold_kernel(mapper, None, kinds, T > 1, extreme)
    identity = np.inf if extreme == "minimum" else -np.inf
    kernel(T, np.ascontiguousarray(x), np.ascontiguousarray(b.T), *operands, identity, np.arange(simd.WIDTH, dtype=np.float64),
           int(fill), values, index)
    return values, index
