"""The primitives of the language, with their shape rules. Importing this package registers them all."""

from .ad_support import IndexTranspose, LoopSaving, StopGradient
from .combinators import Loop, Map, Reduce, ReduceByIndex, Scan
from .elementwise import SCALAR_OPS, TRANSCENDENTAL, Elementwise, ScalarOp
from .gemm import GemmBlockSum, GemmMapReduce
from .structural import (
    BroadcastTo,
    Concatenate,
    Convert,
    Gather,
    Iota,
    MatMul,
    Reshape,
    StaticIndex,
    SumAxes,
    Transpose,
)

# the statements that run a loop over an array (within a map body: per row)
LOOPING = (Map, Reduce, Scan, SumAxes, MatMul)

__all__ = [
    "LOOPING", "SCALAR_OPS", "TRANSCENDENTAL", "BroadcastTo", "IndexTranspose", "LoopSaving", "StopGradient", "Concatenate", "Convert", "Elementwise", "Gather", "GemmBlockSum", "GemmMapReduce", "Iota", "Loop", "Map",
    "MatMul", "Reduce", "ReduceByIndex", "Reshape", "ScalarOp", "Scan", "StaticIndex", "SumAxes", "Transpose",
]
