"""A run of elementwise statements as one CUDA kernel.

The numba backend's elementwise fusion (runtime/numba_backend/elementwise_fusion.py) gathers a program's
runs of array-wide elementwise statements into FusedElementwise statements; the cuda backend applies the
same pass (`prepared`) to a program and to each block program of a gemm_map_reduce, whose map is such a run
over a block of scores (an `exp(s - m)` with its guards for infinities: a dozen statements, each a pass over
the block where it runs alone). Here the run's scalar body becomes a device function, and kernels.cuda's
map_over calls it once per element of the run's shape, reading broadcast operands (a row's maximum against
the block) in place and writing only the values read after the run.

A run that ends in a reduce or a row sum, or reads gathered rows, runs its statements one by one (each on
the device): those forms have no kernel here yet.
"""

from __future__ import annotations

import weakref

import numpy as np

from fold.ir import Program
from fold.kernels.cuda.map import MAX_NDIM
from fold.runtime.numba_backend.elementwise_fusion import FusedElementwise, fuse_elementwise
from fold.runtime.numba_backend.unnest import unnest_maps

from ..loops import fuse_loop_nests
from . import device
from .device_functions import device_function
from .lowering import _decline, _run, cuda_impls
from .residency import resident

_prepared: "weakref.WeakKeyDictionary[Program, Program]" = weakref.WeakKeyDictionary()


def prepared(program: Program) -> Program:
    """The program as the cuda backend runs it: a map of a map with an elementwise scalar body (a gemm
    block's map of its scores) as the elementwise statements it amounts to (unnest.py), maps of maps with
    folds as loop nests (a reduce of a map of scalars stays two statements, a map folding its rows keeps its
    per-row kernels, and a histogram of a map its histogram kernel, where a nest would give every thread its
    own copy of the bins: see backend.py), then runs of
    elementwise statements fused. Memoised."""
    found = _prepared.get(program)
    if found is None:
        nests = fuse_loop_nests(unnest_maps(program), folds_of_scalar_maps=False, row_folds=False,
                                histograms=False)
        found = _prepared[program] = fuse_elementwise(nests)
    return found


@cuda_impls.register(FusedElementwise)
@resident
def _fused(prim: FusedElementwise, args: list, depth: int):
    if prim.gathers or prim.reduce is not None or prim.row_sum is not None or not args or not prim.region.outputs:
        return None  # the region's statements, one by one (residency.ON_DEVICE)
    values = device.on_device(args)
    shape = np.broadcast_shapes(*[tuple(v.shape) for v in values])
    if not 1 <= len(shape) <= MAX_NDIM:
        return None
    mapper, problem = device_function(prim.body)
    if mapper is None:
        return _decline(prim, f"its body cannot be compiled: {problem}")
    inputs = [device.for_kernel(device.broadcast_view(v, shape)) for v in values]
    outs = _run(prim, "map_over", mapper, inputs, shape, [v.aval.dtype for v in prim.region.outputs])
    return None if outs is None else [device.adopt(o) for o in outs]
