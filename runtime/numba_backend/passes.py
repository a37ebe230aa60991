"""The rewrites the numba backend applies to a program before running it."""

from __future__ import annotations

import weakref

from fold.ir import Program

from .elementwise_fusion import fuse_elementwise
from .fold_producers import private_fold_producers
from .fusion import fuse
from .scale_hoisting import hoist_scales
from .scan_fusion import fuse_map_scans
from .scan_pair_fusion import fuse_scan_pairs
from .unnest import unnest_maps

_prepared: "weakref.WeakKeyDictionary[Program, Program]" = weakref.WeakKeyDictionary()


def prepare(program: Program) -> Program:
    """The program with the backend's fusions applied to its top level (scan pairs read by a map, scans
    with the maps that make their elements and read their results, maps read by a reduce, maps of scalar maps
    as elementwise statements, scaled matrix products as products of a scaled operand, folds with private
    copies of the cheap values they read, runs of elementwise statements); memoised, since gemm block
    programs are run many times."""
    found = _prepared.get(program)
    if found is None:
        found = _prepared[program] = fuse_elementwise(private_fold_producers(hoist_scales(unnest_maps(fuse(fuse_map_scans(
            fuse_scan_pairs(program)))))))
    return found
