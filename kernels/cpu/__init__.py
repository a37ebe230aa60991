"""Numba CPU kernel templates (parallel with prange) and their host drivers; see `kernels` for the contract.

    reduce(combine, k, identity, leaves, *, chunks=None, commutative=False, operator=None) -> k scalars
    map_reduce(mapper, m, combine, k, identity, inputs, *, chunks=None, commutative=False, operator=None)
                                                                               -> k scalars
    MapReduce(mapper, m, combine, k, input_dtypes, ...)(inputs, identity, *, chunks=None)
                    map_reduce with its functions and dtypes checked once         -> k scalars
    segmented_reduce(mapper_or_None, combine, k, identity, inputs, *, parallel=None) -> k arrays (rows,)
    scan(combine, k, identity, leaves, exclusive=False, reverse=False, *, chunks=None) -> k arrays (n,)
    map_scan(mapper, m, combine, k, identity, inputs, exclusive=False, reverse=False, *, post=None, r=None,
             step=None, live=None, chunks=None, out=None)                      -> k (or r) arrays (n,)
    histogram(combine, k, identity, n_bins, indices, leaves, *, chunks=None)   -> k arrays (n_bins,)
    map(mapper, m, k, inputs, *, consts=(), parallel=None, out=None, rows=None) -> k arrays (n,) or (rows, n)
    map_with_row_sums(mapper, m, k, inputs, *, consts=(), parallel=None, out=None)
                                                            -> (k arrays (rows, n), row sums (rows,))
    map_with_column_sums(mapper, m, k, inputs, *, consts=(), chunks=None, out=None)
                                                            -> (k arrays (rows, n), column sums (n,))
    logsumexp(x, *, chunks=None, vector=None)                                  -> a scalar
    product_fold(mapper, combine, identity, x, b, kinds, operands, *, parallel=None)
                                                                               -> an array (rows,)
    product_first_extreme(mapper, extreme, x, b, kinds, operands, fill, *, parallel=None)
                                                                               -> (values, index) (rows,)
    column_sums(x, *, chunks=None)                                             -> an array (columns,)
    scan_pair_map(combine, k, identity, leaves, mapper, r, others=(), consts=(), *, block, parallel)
                                                                               -> r arrays (n,)

The functions reduce, scan, histogram and map shadow the submodules of the same names as attributes of
this package; reach a template with `from fold.kernels.cpu.reduce import fold_kernel` (which goes through
sys.modules), not `fold.kernels.cpu.reduce.fold_kernel`.
"""

import os

if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:  # see kernels/__init__.py, Threads
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

from . import cache_stamp  # noqa: E402

cache_stamp.install()  # before any kernel is compiled with cache=True

from . import copy_propagation  # noqa: E402

copy_propagation.install()  # numba's parallel-loop passes: the same results without their deep copies

from . import codegen, host  # noqa: E402 (after the thread policy, which OpenMP reads when it starts)
from .bidirectional import scan_pair_map  # noqa: E402
from .column_map import map_with_column_sums
from .columns import column_sums
from .histogram import histogram
from .logsumexp import logsumexp
from .map import map  # noqa: A004 (the combinator's name)
from .product_fold import product_first_extreme, product_fold
from .reduce import MapReduce, map_reduce, reduce
from .row_sums import map_with_row_sums
from .scan import map_scan, scan
from .segmented import segmented_reduce


def clear_cache() -> None:
    """Forget every compiled kernel and inferred result type (and the references they hold to functions)."""
    codegen.clear_kernels()
    host.clear_result_dtypes()


__all__ = ["MapReduce", "clear_cache", "column_sums", "histogram", "logsumexp", "map", "map_reduce", "map_scan", "map_with_column_sums", "map_with_row_sums", "product_first_extreme", "product_fold", "reduce", "scan", "scan_pair_map", "segmented_reduce"]
