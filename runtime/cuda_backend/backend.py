"""The cuda backend: a program interpreted statement by statement, with the folds and maps that
lowering.py lowers run as Numba CUDA kernels, the loop nests of maps of maps (runtime/loops) as kernels of
their own (loop_nests.py), and every other statement on the numpy implementation.

Values live on the device from the first statement to the last (device.py: CuPy arrays on a GPU, the
simulator's device arrays under NUMBA_ENABLE_CUDASIM=1): NumPy inputs are copied to the device once when a
call starts, lowered statements take and return device arrays, and the results are copied to the host at
the end, or left on the device (`fold.jit(f, backend="cuda", results="device")`). A statement that is not
lowered runs on the host, its inputs copied there and its results back (residency.py). Every copy is
counted: `with fold.runtime.cuda_backend.counting_transfers() as t: ...`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fold.errors import FoldRuntimeError
from fold.ir import Program

from .. import numpy_impl  # noqa: F401  (the reference implementations it falls back to)
from ..interpreter import eval_program, lowering
from . import device
from . import gemm  # noqa: F401  (registers gemm_map_reduce's rules)
from .fused import prepared
from . import loop_nests  # noqa: F401  (registers the loop nest's rule)
from .lowering import cuda_impls


_TOOLCHAIN: list = []  # the probe's answer, once per process


def toolchain_problem() -> str | None:
    """Why numba-cuda cannot compile a kernel here (None if it can), from compiling a one-line kernel once.

    A numba-cuda that cannot compile at all (numba-cuda 0.30 with NumPy 2.5, whose typing module reads
    np.row_stack, which NumPy 2.5 removed) would otherwise decline every statement with a warning of its own."""
    if not _TOOLCHAIN:
        _TOOLCHAIN.append(_probe())
    return _TOOLCHAIN[0]


def _probe() -> str | None:
    from numba import config, cuda

    if config.ENABLE_CUDASIM:
        return None  # the simulator runs kernels as Python: nothing to compile

    def double(x):
        x[0] = 2.0 * x[0]

    try:
        cuda.compile_ptx_for_current_device(double, "void(float64[::1])")
    except Exception as err:  # noqa: BLE001 - whatever breaks the compiler, the user needs its text
        stack = f"numba {_version('numba')}, numba-cuda {_version('numba-cuda')}, NumPy {np.__version__}"
        return (f"the cuda backend cannot compile a kernel with this stack ({stack}): {type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}. Install a NumPy that this numba-cuda supports "
                f"(numba-cuda 0.30 needs NumPy < 2.5: pip install 'numpy<2.5') or a newer numba-cuda; "
                f"`pip install 'fold[gpu]'` pins a pair that works")
    return None


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


class CudaBackend:
    name = "cuda"
    # gemm_map_reduce's automatic blocks of up to 512 MiB of intermediates (the CPU backends' 128 MiB, fold.gemm):
    # each block's statements are launched from Python, milliseconds a block. Attention at M = N = 16384 on an
    # H200 (benchmarks/results/gpu_logs/profile_gemm_h200_session54.json): forward 205 -> 62 ms, forward and
    # backward 516 -> 106 ms, working memory 43 -> 158 MB and 56 -> 172 MB (torch's SDPA holds 4 GB there)
    gemm_block_bytes = 512 * 2**20

    def __init__(self) -> None:
        from numba import cuda

        if not cuda.is_available():
            raise FoldRuntimeError("the cuda backend needs an NVIDIA GPU with a working CUDA driver, and "
                                   "numba.cuda.is_available() is False here; set NUMBA_ENABLE_CUDASIM=1 (before "
                                   "Numba is first imported) to run it on Numba's CUDA simulator instead")
        problem = toolchain_problem()
        if problem is not None:
            raise FoldRuntimeError(problem)
        device.use_memory_pool()

    def compile(self, program: Program) -> "CudaProgram":
        return CudaProgram(program)

    @staticmethod
    def is_device_value(x: object) -> bool:
        """Whether `x` is a device array this backend takes as an argument as it is (no copy)."""
        return device.is_device(x)


class CudaProgram:
    """A program compiled for the cuda backend. Called on arrays (NumPy or device), it returns NumPy arrays;
    `on_device` returns device arrays instead. Each call copies its NumPy inputs to the device once."""

    def __init__(self, program: Program):
        # maps of maps and their folds as loop nests (loop_nests.py), runs of elementwise statements as one
        # kernel each (fused.py). A reduce of a map of scalars stays two statements: the nest's fold gives
        # each thread a run of consecutive elements (a warp's reads are not coalesced) and merges the runs on
        # one thread, where the reduce kernel reads grid-stride (issue 40)
        self.program = prepared(program)

    def __call__(self, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        return device.on_host(self.on_device(args))

    def on_device(self, args: Sequence[object]) -> list:
        """The program's outputs as device arrays (an output that is a literal, or an input, is copied: a
        result is never an argument itself)."""
        inputs = device.on_device(args)
        with lowering(cuda_impls):
            outs = eval_program(self.program, inputs)
        seen: set[int] = {id(a) for a in args}
        finished = []
        for o in outs:
            o = device.to_device(o)
            if id(o) in seen:
                o = device.copy(o)
            seen.add(id(o))
            finished.append(o)
        return finished
