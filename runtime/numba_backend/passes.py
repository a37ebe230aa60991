"""The rewrites the numba backend applies to a program before running it."""

from __future__ import annotations

import weakref

import numpy as np

from fold.ir import Program
from fold.primitives import MatMul
from fold.runtime.loops import fuse_loop_nests
from fold.runtime.loops.one_hot_products import one_hot_products

from .elementwise_fusion import fuse_elementwise
from .elementwise_sinking import sink_elementwise
from .first_extremes import has_first_extremes, mark_first_extremes
from .fold_producers import private_fold_producers
from .full_sums import flat_full_sums
from .gather_fusion import absorb_gathers
from .gemm_backward_fusion import fuse_gemm_backward
from .lowering import COMPILE_FROM
from .one_hots import sparse_one_hots
from .outer_products import outer_products_elementwise
from .product_fold_fusion import fuse_product_folds
from .run_merging import merge_runs
from .scale_hoisting import hoist_scales
from .scan_fusion import fuse_map_scans
from .scan_pair_fusion import fuse_scan_pairs
from .shared_views import share_views
from .unnest import unnest_maps

_prepared: "weakref.WeakKeyDictionary[Program, dict[bool, Program]]" = weakref.WeakKeyDictionary()


def prepare(program: Program, whole_arrays: bool = False) -> Program:
    """The program with the backend's fusions applied to its top level (loop nests: maps of maps, and maps
    folded by a reduce; a gemm_map_reduce with its vjp's block sum, one-hot vectors of map bodies read as index
    and value, scan pairs read by a map, scans with the maps that make their elements and read their results,
    maps of scalar maps
    as elementwise statements, scaled matrix products as products of a scaled operand, folds with private
    copies of the cheap values they read, repeated views merged, runs of elementwise statements; in a map body,
    matrix-vector products folded by one kernel); memoised, since gemm block
    programs are run many times. `whole_arrays`: the program runs on arrays of its own shapes (a jitted
    program, a gemm block; not a map body), so elementwise runs too small to compile stay unfused."""
    per_program = _prepared.setdefault(program, {})
    found = per_program.get(whole_arrays)
    if found is None:
        given = program
        nests = whole_arrays and loop_nests_on()
        program = fuse_loop_nests(program, products=nest_takes_products) if nests else program
        program = fuse_gemm_backward(program, prepare) if whole_arrays else program  # gemms run at the top level only
        sparse = sparse_one_hots(program)
        # one-hot rows that a matrix product reads (k-means' matrix form in float64 past 8 KB, which the nest leaves
        # to the product kernel) read as (index, value) make histograms of a map's results, which a nest
        # bins as the map computes them
        program = fuse_loop_nests(sparse, products=nest_takes_products) if nests and sparse is not program else sparse
        staged = hoist_scales(unnest_maps(fuse_map_scans(fuse_scan_pairs(program))))
        found = _whole_array_fusions(staged) if whole_arrays else _body_fusions(staged)
        # a program no pass changed is not stored as its own value: the entry would keep its key alive
        per_program[whole_arrays] = _UNCHANGED if found is given else found
    return program if found is _UNCHANGED else found


_UNCHANGED = object()


def prepare_jitted(program: Program) -> Program:
    """A jitted program as the backend runs it: `prepare`d, its outer products first written as elementwise
    products of broadcasts (outer_products.py). Not a gemm block's: the gemm backward fusion shares a block's
    products between the forward and backward walks, and finds them as products."""
    return prepare(outer_products_elementwise(program), whole_arrays=True)


# the most bytes of a matrix that a loop nest multiplies by each row of a map that a reduce folds. The nest
# writes a product as scalar loops (a long shared axis a block of steps at a time, nest_interchange.py), where
# the backend batches a body's products into BLAS calls over blocks of rows, and in float64 folds a captured
# matrix times the rows in F64x4 registers, four rows at once (product_fold_fusion.py): a float64 body has the
# faster alternative, so its limit is lower. Measured on the 2-core VM (session 68, benchmarks/README.md;
# benchmarks/product_forms.py), k-means' matrix form over 10^5 points, forward / gradient / HVP in ms: float32
# 32 x 64 (8 KB) 10-14 / 23-26 / 20-29 batched against 4 / 7 / 7 in the nest, 32 x 256 (32 KB) 29-33 / 68-80 /
# 62-63 against 10-12 / 41-49 / 37-40; a map of sum(tanh(W @ x)), W of 90 x 90 float32 (32 KB), at parity,
# 128 x 128 (64 KB) 1.5-1.8 against 2.0-2.3 forward (BLAS ahead). Float64: 16 x 64 (8 KB) at parity with the
# product kernel, 32 x 64 (16 KB) 5.6-6.7 against 6.9-8.1 forward, 32 x 256 23 / 35 / 31 against 33 / 131 / 69
MAX_NEST_PRODUCT_BYTES = 32768
MAX_NEST_PRODUCT_BYTES_FLOAT64 = 8192
# Past the float32 limit, a product whose shared axis is at most this long goes to the nest too, which sweeps a
# matrix past the first-level cache four rows at once (nest_jam.py): on a short shared axis BLAS runs far below
# its rate. In one process (session 70, benchmarks/README.md), the nest against BLAS over blocks of rows,
# forward / gradient / HVP: k-means' matrix form over 10^5 points, 64 x 256 0.78 / 0.46 / 0.55, 32 x 512 0.50
# / 0.29 / 0.26; a map of sum(tanh(W @ x)), W of 512 x 32 forward 0.74, 256 x 64 0.96; with a long shared axis
# (W of 128 x 128) the nest's forward took 1.43x BLAS's. Not in float64, whose alternative is the product
# kernel's register tile: there k-means at 32 x 256 gained (0.87 / 0.71 / 0.85) but a layer's forward lost
# (W of 256 x 32: 1.09, 128 x 64: 1.26; its tanh, not its product: the two share the product's shape).
SHORT_SHARED_AXIS = 64


def nest_takes_products(body: Program) -> bool:
    """Whether a loop nest runs a map body that multiplies matrices: where each product's operands are small
    (MAX_NEST_PRODUCT_BYTES; MAX_NEST_PRODUCT_BYTES_FLOAT64 for a float64 product), or past the limit its
    shared axis is short (SHORT_SHARED_AXIS, not in float64), or it multiplies by a one-hot operand (a row of
    the other operand: one_hot_products.py)."""
    products = [s for s in _statements(body) if isinstance(s.prim, MatMul)]
    past = [s for s in products if not _in_nest(s)]
    if not products or not past:
        return bool(products)
    one_hot = one_hot_products(body)  # followed only where it decides
    return all(id(s) in one_hot for s in past)


def _in_nest(product) -> bool:
    largest = max(a.aval.size * a.aval.dtype.itemsize for a in product.args)
    if largest <= _product_limit(product):
        return True
    return product.outs[0].aval.dtype != np.float64 and product.args[0].aval.shape[-1] <= SHORT_SHARED_AXIS


def _product_limit(product) -> int:
    return MAX_NEST_PRODUCT_BYTES_FLOAT64 if product.outs[0].aval.dtype == np.float64 else MAX_NEST_PRODUCT_BYTES


def _statements(program: Program):
    for s in program.stmts:
        yield s
        for b in s.prim.bodies():
            yield from _statements(b)


def loop_nests_on() -> bool:
    """Loop nests (runtime/loops) run unless FOLD_LOOP_NESTS=0, the switch that compares them with the older
    passes alone."""
    import os

    return os.environ.get("FOLD_LOOP_NESTS", "1") != "0"


def _whole_array_fusions(program: Program) -> Program:
    arrays = sink_elementwise(share_views(private_fold_producers(flat_full_sums(program))))
    runs = merge_runs(fuse_elementwise(arrays, COMPILE_FROM, rows_ndim=2))
    return absorb_gathers(runs, 2)


def _body_fusions(program: Program) -> Program:
    """A map body's last fusions. A min/max gradient's first extreme is worth marking only where it then
    joins a product kernel; otherwise its two folds fuse with their maps as usual (the unmarked body)."""
    def fusions(body: Program) -> Program:
        arrays = fuse_product_folds(fuse_elementwise(share_views(private_fold_producers(body)), 0, rows_ndim=1))
        arrays = absorb_gathers(arrays, 1)
        return fuse_elementwise(arrays, 0, scalars=True)

    marked = mark_first_extremes(program)
    if marked is not program:
        candidate = fusions(marked)
        if not has_first_extremes(candidate):
            return candidate
    return fusions(program)
