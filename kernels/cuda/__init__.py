"""Numba CUDA kernel templates and their host drivers; see `kernels` for the contract they share with
kernels.cpu, and the differences below.

    reduce(combine, k, identity, leaves, *, threads=None, items=None, blocks=None, commutative=False,
           keep_on_device=False)                                                 -> k scalars (or k device arrays (1,))
    scan(combine, k, identity, leaves, exclusive=False, reverse=False, *, threads=None, items=None)
                                                                                 -> k arrays (n,)
    segmented_reduce(combine, k, identity, leaves, *, threads=None)             -> k arrays (rows,)
    segmented_scan(combine, k, identity, leaves, exclusive=False, reverse=False, *, threads=None)
                                                                                 -> k arrays (rows, length)
    histogram(combine, k, identity, n_bins, indices, leaves, *, operator=None, workers=None, threads=None)
                                                                                 -> k arrays (n_bins,)
    map(mapper, inputs, out_dtypes, *, consts=(), threads=None)                  -> arrays (n,)

Differences from kernels.cpu:

- `combine` and `mapper` are CUDA device functions (`numba.cuda.jit(device=True)`); a combine of k == 1
  leaves returns a scalar, of k > 1 a k-tuple. A map is told its results' dtypes (`out_dtypes`): a device
  function's result types are not inferred here.
- Leaves and inputs are 1-D arrays (the segmented folds' 2-D, a fold per row): NumPy arrays, copied to
  the GPU and the results back, or device arrays (Numba's, CuPy's through `numba.cuda.as_cuda_array`, or
  the simulator's), which stay on the GPU: results are device arrays then (reduce's scalars are copied).
- Folds run in float32 where the leaves are float32 (no float64 carry).
- `threads` (a power of two, at most 1024) and `items` per thread set a block's span, threads * items
  consecutive elements; the defaults are 256 x 8 on a GPU and 32 x 2 under Numba's CUDA simulator
  (NUMBA_ENABLE_CUDASIM=1), where every thread is a Python thread. A block's partials live in static
  shared memory, threads x the element's bytes, at most 48 KiB: the default takes fewer threads for wide
  elements, and a `threads` that does not fit is an error.
- NVVM contracts a * b + c into one fused multiply-add (numba cannot turn that off), so a GPU's results
  may differ from NumPy's separately rounded ones in the last bit; the simulator computes as NumPy does.

Order: each thread folds `items` consecutive elements, a block's threads combine their partials pairwise
in order in shared memory, and the block totals are folded (or scanned) the same way, so a non-commutative
operator is applied with its operands in order, a before b, everywhere. A reduce runs exactly two launches:
a bounded grid (`blocks`, default enough to fill the GPU) each of whose blocks walks a contiguous run of
tiles in order, then one block for their totals; with `commutative=True` (the caller's promise) the first
level instead reads the elements in a coalesced grid-stride order (see fold.py).
"""

from .fold import reduce
from .histogram import histogram
from .map import map, map_over  # noqa: A004 (the combinator's name)
from .scan import scan
from .segmented import segmented_reduce, segmented_scan

__all__ = ["histogram", "map", "map_over", "reduce", "scan", "segmented_reduce", "segmented_scan"]
