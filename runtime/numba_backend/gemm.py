"""gemm_map_reduce on the numba backend: the numpy backend's block walk (BLAS products, one block alive at a
time), with every block program prepared by the backend's fusions, so that a block's map and fold run as
compiled parallel kernels next to the products instead of one NumPy pass per operation."""

from __future__ import annotations

from fold.ir import Program
from fold.primitives import GemmBlockSum, GemmMapReduce

from ..interpreter import eval_program
from ..numpy_impl import gemm as numpy_gemm
from .lowering import numba_impls
from .passes import prepare


def _run_block(program: Program, inputs: list) -> list:
    return eval_program(prepare(program, whole_arrays=True), inputs)


@numba_impls.register(GemmMapReduce)
def _gemm(prim: GemmMapReduce, args: list, depth: int):
    return numpy_gemm._gemm(prim, args, depth, run_block=_run_block)  # inside a map: once per row


@numba_impls.register(GemmBlockSum)
def _gemm_block_sum(prim: GemmBlockSum, args: list, depth: int):
    return numpy_gemm._gemm_block_sum(prim, args, depth, run_block=_run_block)
