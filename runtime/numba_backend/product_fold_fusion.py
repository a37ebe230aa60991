"""A matrix-vector product in a map body whose only reader is a fold: one kernel, the products never stored.

k-means' body, `reduce(min, |p|^2 - 2 C p + |c|^2)` for a point p, reads after elementwise fusion

    i = reshape(p, (K, 1));  j = matmul(C, i);  k = reshape(j, (m,));  d = elementwise-fold(k, ...)

(or `p @ B` with a (K, m) matrix B: reshape(p, (1, K)), matmul, reshape). Batched over a block of points,
that is a (rows, K) @ (K, m) BLAS product written to memory, then read again by the fold's kernel.
`fuse_product_folds(body)` writes the four statements as one `ProductFold`, which the numba backend runs
with kernels.cpu.product_fold: the products in vector registers, mapped and folded there. A min/max
gradient's first position of the extreme (first_extremes.py's FirstExtreme, of an elementwise map of the
product) is fused alike, run by kernels.cpu.product_first_extreme.

It applies where the kernel can run the fold: every value float64, a commutative operator (the kernel
folds the columns in another order), and F64x4 forms of the elementwise function and the operator
(runtime/numba_backend/codegen.py writes them for +, -, *, /, negation, exp, maximum and minimum). At run
time the matrix must be the same for every row (captured) and the other operands per row, per column,
scalars or full (rows, m) arrays; otherwise, and outside a batched map body, the statement runs the
statements it replaced (its numpy implementation).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from fold.ir import Let, Lit, Primitive, Program, Var, use_counts, with_statements_replaced
from fold.primitives import MatMul, Reshape

from ..interpreter import eval_program, numpy_impls
from .codegen import compile_scalar_program, has_f64x4_form
from .elementwise_fusion import ELEMENTWISE, FusedElementwise, as_run
from .first_extremes import FirstExtreme
from .lowering import is_commutative, numba_impls, run_kernel, worth_compiling


@dataclass(frozen=True, eq=False)
class ProductFold(Primitive):
    """`fold` (a FusedElementwise with a reduce) reading the product of a matrix and a vector at argument
    `product`, or a FirstExtreme of an elementwise map (a FusedElementwise without a reduce) reading it
    there: `region` runs the original statements (the reference). Arguments: the matrix, the vector, then
    the map's other arguments in order (then a FirstExtreme's positions). `vector_first`: the product is
    vector @ matrix (a (K, m) matrix), else matrix @ vector (an (m, K) one)."""

    region: Program
    product: int
    vector_first: bool
    name = "product_fold"
    backend_internal = True
    body_fields = ("region",)
    num_consts = 0

    @property
    def first_extreme(self) -> FirstExtreme | None:
        last = self.region.stmts[-1].prim
        return last if isinstance(last, FirstExtreme) else None

    @property
    def fold(self) -> FusedElementwise:
        """The fold (a FusedElementwise with a reduce); with a first_extreme, the map of the product."""
        return self.region.stmts[-2 if self.first_extreme else -1].prim


def _product_of(value: Var, producer: dict, uses: Counter) -> tuple[list[Let], Var, Var, bool] | None:
    """(the statements making `value`, the matrix, the vector, vector_first) if `value` is an (m,) matrix-vector
    product made by reshape(matmul(...)) whose product nothing else reads (the vector's reshape may have
    other readers: the region gets a copy of it)."""
    flat = producer.get(value)
    if flat is None or not isinstance(flat.prim, Reshape) or not isinstance(flat.args[0], Var):
        return None
    product = producer.get(flat.args[0])
    if product is None or not isinstance(product.prim, MatMul) or uses[flat.args[0]] != 1:
        return None
    left, right = product.args
    vector_first = product.outs[0].aval.shape[0] == 1
    column = left if vector_first else right
    matrix = right if vector_first else left
    lift = producer.get(column) if isinstance(column, Var) else None
    if lift is None or not isinstance(lift.prim, Reshape) or not isinstance(lift.args[0], Var):
        return None
    vector = lift.args[0]
    if vector.aval.ndim != 1 or value.aval.ndim != 1:
        return None
    return [lift, product, flat], matrix, vector, vector_first


def _float64_with_forms(prim: FusedElementwise) -> bool:
    """Whether the kernel can run this map: float64 throughout, with F64x4 forms (of its reduce's too)."""
    f64 = np.dtype(np.float64)
    values = list(prim.region.inputs) + [o for s in prim.region.stmts for o in s.outs]
    return (all(v.aval.dtype == f64 for v in values) and has_f64x4_form(prim.body)
            and (prim.reduce is None or has_f64x4_form(prim.reduce.body)))


def _folds_of_maps(stmt: Let, producer: dict, uses: Counter) -> tuple[list[Let], list[Let]] | None:
    """(the statements, ending with `stmt`, that map values elementwise and fold them, the first being the
    map; the program's statements they replace besides `stmt`) if the kernel can run them: a
    FusedElementwise with a commutative reduce, or a FirstExtreme alone reading an elementwise map's one
    result."""
    prim = stmt.prim
    if isinstance(prim, FusedElementwise):
        fusable = prim.reduce is not None and is_commutative(prim.reduce) and _float64_with_forms(prim)
        return ([stmt], []) if fusable else None
    if isinstance(prim, FirstExtreme):  # (x the product itself, with no map between, is not taken)
        x = stmt.args[0]
        source = mapped = producer.get(x) if isinstance(x, Var) else None
        if mapped is not None and isinstance(mapped.prim, ELEMENTWISE) and len(mapped.outs) == 1:
            mapped = as_run(mapped)  # a single statement (x = product + bias), which elementwise fusion leaves
        if (mapped is not None and uses[x] == 1 and isinstance(mapped.prim, FusedElementwise)
                and mapped.prim.reduce is None and mapped.prim.row_sum is None and mapped.outs == (x,)
                and _float64_with_forms(mapped.prim)):
            return [mapped, stmt], [source]
    return None


def fuse_product_folds(program: Program) -> Program:
    """The program with each fold that alone reads a matrix-vector product fused with it (see the module)."""
    uses = use_counts(program)
    producer = {v: s for s in program.stmts for v in s.outs}
    replaced: dict[int, Let] = {}
    removed: set[int] = set()
    for stmt in program.stmts:
        found_chain = _folds_of_maps(stmt, producer, uses)
        if found_chain is None:
            continue
        chain, sources = found_chain
        mapped, extra = chain[0], list(stmt.args[1:]) if len(chain) > 1 else []
        for position, arg in enumerate(mapped.args):
            found = _product_of(arg, producer, uses) if isinstance(arg, Var) and uses[arg] == 1 else None
            if found is None or sum(a is arg for a in mapped.args) != 1:
                continue
            made, matrix, vector, vector_first = found
            others = [a for a in mapped.args if a is not arg] + extra
            if any(a is matrix or a is vector for a in others) or matrix is vector:
                continue  # the region's inputs must be distinct
            outer = [matrix, *others]
            params = [Var(a.aval) if isinstance(a, Lit) else a for a in outer]  # an array closed over: an input
            renamed = dict(zip(map(id, outer), params, strict=True))
            statements = [Let(s.outs, s.prim, tuple(renamed.get(id(a), a) for a in s.args)) for s in (*made, *chain)]
            region = Program((params[0], vector, *params[1:]), tuple(statements), stmt.outs)
            replaced[id(stmt)] = Let(stmt.outs, ProductFold(region, position, vector_first), (matrix, vector, *others))
            removed.update(id(s) for s in (*made, *sources) if s is not made[0] or uses[s.outs[0]] == 1)
            break
    return with_statements_replaced(program, replaced, removed)


@numpy_impls.register(ProductFold)
def _reference(prim: ProductFold, args: list, depth: int) -> list:
    return eval_program(prim.region, args, depth)


# (strides of the operand broadcast to (rows, m) are zero) -> its kind in kernels.cpu.product_fold
_KIND_BY_ZERO_STRIDES = {(True, True): "scalar", (False, True): "row", (True, False): "column", (False, False): "full"}


def _operand(x: np.ndarray, rows: int, m: int) -> tuple[str, np.ndarray]:
    """(kind, the array the kernel reads) for one of the fold's other operands, (rows or 1, m) one map deep."""
    wide = np.broadcast_to(x, (rows, m))
    zero = (wide.strides[0] == 0 or rows == 1, wide.strides[1] == 0 or m == 1)
    kind = _KIND_BY_ZERO_STRIDES[zero]
    view = {"scalar": wide[:1, 0], "row": wide[:, 0], "column": wide[0], "full": wide}[kind]
    return kind, view


@numba_impls.register(ProductFold)
def _product_fold(prim: ProductFold, args: list, depth: int):
    """One map deep (each value with a leading batch axis, of size 1 for a captured one) with a captured
    matrix, from COMPILE_FROM products: the kernel; else None (the region runs)."""
    extreme = prim.first_extreme
    matrix, vector, *others = args[:-1] if extreme else args  # a first extreme's positions: the kernel counts
    if (depth != 1 or matrix.ndim != 3 or matrix.shape[0] != 1 or vector.ndim != 2 or any(a.ndim != 2 for a in others)
            or any(a.dtype != np.float64 for a in (matrix, vector, *others))):
        return None
    b = matrix[0].T if prim.vector_first else matrix[0]  # (m, K)
    rows, m = max(a.shape[0] for a in (vector, *others)), b.shape[0]
    if not worth_compiling(rows * m):
        return None  # NumPy's product and the fold's own statement cost less than compiling at this size
    operands = [_operand(x, rows, m) for x in others]
    kinds = [kind for kind, _ in operands]
    kinds.insert(prim.product, "product")
    fold = prim.fold
    mapper = compile_scalar_program(fold.body)
    x = np.broadcast_to(vector, (rows, vector.shape[1]))
    if extreme is not None:
        if m == 0:
            return None  # no position to find: the statements give the identity and int64's maximum
        out = run_kernel(prim, "product_first_extreme", mapper, extreme.extreme, x, b, kinds,
                         [a for _, a in operands], extreme.fill)
        return None if out is None else list(out)
    combine = compile_scalar_program(fold.reduce.body)
    out = run_kernel(prim, "product_fold", mapper, combine, fold.identity, x, b, kinds, [a for _, a in operands])
    return None if out is None else [out]
