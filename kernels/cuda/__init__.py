"""Numba CUDA kernel templates and their host drivers; see `kernels` for the contract they share with
kernels.cpu, and the differences below.

    reduce(combine, k, identity, leaves, *, threads=None, items=None)            -> k scalars
    scan(combine, k, identity, leaves, exclusive=False, reverse=False, *, threads=None, items=None)
                                                                                 -> k arrays (n,)
    map(mapper, inputs, out_dtypes, *, consts=(), threads=None)                  -> arrays (n,)

Differences from kernels.cpu:

- `combine` and `mapper` are CUDA device functions (`numba.cuda.jit(device=True)`); a combine of k == 1
  leaves returns a scalar, of k > 1 a k-tuple. A map is told its results' dtypes (`out_dtypes`): a device
  function's result types are not inferred here.
- Leaves and inputs are 1-D NumPy arrays (copied to the GPU and the results back) or device arrays (Numba's,
  CuPy's through `numba.cuda.as_cuda_array`, or the simulator's), which stay on the GPU: results are
  device arrays then, and reduce's scalars are still copied back.
- Folds run in float32 where the leaves are float32 (no float64 carry).
- `threads` (a power of two, at most 1024) and `items` per thread set a block's span, threads * items
  consecutive elements; the defaults are 256 x 8 on a GPU and 32 x 2 under Numba's CUDA simulator
  (NUMBA_ENABLE_CUDASIM=1), where every thread is a Python thread.

Order: each thread folds `items` consecutive elements, a block's threads combine their partials pairwise
in order in shared memory, and the block totals are folded (or scanned) the same way, recursively, so a
non-commutative operator is applied with its operands in order, a before b, everywhere.
"""

from .fold import reduce
from .map import map  # noqa: A004 (the combinator's name)
from .scan import scan

__all__ = ["map", "reduce", "scan"]
