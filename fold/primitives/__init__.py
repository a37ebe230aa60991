"""The primitives of the language, with their shape rules. Importing this package registers them all."""

from .ad_support import IndexTranspose, LoopSaving, StopGradient
from .combinators import Loop, Map, Reduce, ReduceByIndex, Scan
from .elementwise import SCALAR_OPS, Elementwise, ScalarOp
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

__all__ = [
    "SCALAR_OPS", "BroadcastTo", "IndexTranspose", "LoopSaving", "StopGradient", "Concatenate", "Convert", "Elementwise", "Gather", "GemmBlockSum", "GemmMapReduce", "Iota", "Loop", "Map",
    "MatMul", "Reduce", "ReduceByIndex", "Reshape", "ScalarOp", "Scan", "StaticIndex", "SumAxes", "Transpose",
]
