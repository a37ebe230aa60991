"""gemm_map_reduce and its block sums (its derivatives) on the cuda backend: the numpy backend's block walk
with every value on the device. Each block's matrix products run on cuBLAS (CuPy's matmul), its map and fold
as the block program's statements do on this backend (kernels where lowered, CuPy's calls otherwise), and
the running totals stay on the device; only one block's intermediates are alive at a time. Inside a map,
the walk runs once per row of the map."""

from __future__ import annotations

from fold.ir import Program
from fold.primitives import GemmBlockSum, GemmMapReduce

from ..interpreter import eval_program
from ..numpy_impl import gemm as numpy_gemm
from . import device
from .fused import prepared
from .lowering import cuda_impls


def _run_block(program: Program, inputs: list) -> list:
    """A block's outputs on the device (one computed from constants alone is copied there, counted)."""
    return device.on_device(eval_program(prepared(program), inputs))


@cuda_impls.register(GemmMapReduce)
def _gemm(prim: GemmMapReduce, args: list, depth: int) -> list:
    return numpy_gemm._gemm(prim, device.on_device(args), depth, run_block=_run_block, arrays=device)


@cuda_impls.register(GemmBlockSum)
def _gemm_block_sum(prim: GemmBlockSum, args: list, depth: int) -> list:
    return numpy_gemm._gemm_block_sum(prim, device.on_device(args), depth, run_block=_run_block, arrays=device)

