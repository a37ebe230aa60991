"""exp, log, sin, ... of four float64 (or float32) values at once, from glibc's vector math library (libmvec).

Numba calls libm once per element for a transcendental function: LLVM vectorises the loop around it to
`llvm.exp.v4f64` and the backend splits that back into four scalar calls, because the llvmlite that Numba
uses does not honour a vector library (`-vector-library=` has no effect; `llvmlite.binding.has_svml` is
False). libmvec has the vector variants themselves (the x86-64 vector function ABI: `_ZGVdN4v_exp` takes
and returns four doubles in one AVX2 register, `_ZGVbN4v_expf` four floats in one SSE register, within
4 ulp of the exact result). The functions here are
Numba intrinsics that pack four scalars into that register, call the variant and unpack the result, so a
generated loop body that handles four elements per iteration (see kernels.cpu.lanes) computes each
transcendental once per four elements: about 7x faster for sin and exp on this machine.

SUPPORTED says whether this machine has them: libmvec loads, the host has AVX2 and FMA, and Numba compiles
for the host CPU (code compiled for another target would pass the register differently). Where it has
not, each function calls libm's scalar function four times instead: always correct, never faster.
AVAILABLE says whether fold should use them: SUPPORTED, unless FOLD_VECTOR_MATH=0 (then the kernels call
libm per element, as before).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic

WIDTH = 4

# fold's elementwise operation -> libmvec's four-lane variant for float64 (AVX2) and for float32 (SSE). Each
# has the IEEE special values of libm's scalar function (exp(-inf) = 0, log(0) = -inf, log(-1) = nan,
# log1p(-1) = -inf, sin(inf) = nan).
OPERATIONS = ("exp", "expm1", "log", "log1p", "sin", "cos", "tanh")
SYMBOLS = {op: f"_ZGVdN4v_{op}" for op in OPERATIONS}
SYMBOLS_F32 = {op: f"_ZGVbN4v_{op}f" for op in OPERATIONS}


def _load() -> bool:
    if config.CPU_NAME not in (None, "host") or config.CPU_FEATURES is not None:
        return False
    features = llvm.get_host_cpu_features()
    if not (features.get("avx2") and features.get("fma")):
        return False
    name = ctypes.util.find_library("mvec")
    if name is None:
        return False
    try:
        library = ctypes.CDLL(name)
        if not all(hasattr(library, symbol) for symbol in [*SYMBOLS.values(), *SYMBOLS_F32.values()]):
            return False
        llvm.load_library_permanently(name)
    except (OSError, RuntimeError):
        return False
    return True


SUPPORTED = _load()
REQUESTED = os.environ.get("FOLD_VECTOR_MATH", "1") != "0"  # also switches kernels.cpu.simd's paths
AVAILABLE = SUPPORTED and REQUESTED


def _four_lane_call(symbol: str, scalar: str, dtype: types.Float):
    """An intrinsic f(a, b, c, d) -> (f(a), f(b), f(c), f(d)) of `dtype`: one call of the vector `symbol`,
    or four of libm's `scalar` where vector math is not SUPPORTED."""
    element = ir.DoubleType() if dtype == types.float64 else ir.FloatType()

    @intrinsic
    def call(typingctx, a, b, c, d):
        result = types.UniTuple(dtype, WIDTH)

        def codegen(context, builder, signature, args):
            if not SUPPORTED:
                function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(element, [element]), scalar)
                return context.make_tuple(builder, result, [builder.call(function, [a]) for a in args])
            vector = ir.VectorType(element, WIDTH)
            lanes = [ir.Constant(ir.IntType(32), lane) for lane in range(WIDTH)]
            packed = ir.Constant(vector, ir.Undefined)
            for lane, value in zip(lanes, args):
                packed = builder.insert_element(packed, value, lane)
            function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vector, [vector]), symbol)
            out = builder.call(function, [packed])
            return context.make_tuple(builder, result, [builder.extract_element(out, lane) for lane in lanes])

        return result(dtype, dtype, dtype, dtype), codegen

    return call


vexp = _four_lane_call(SYMBOLS["exp"], "exp", types.float64)
vexpm1 = _four_lane_call(SYMBOLS["expm1"], "expm1", types.float64)
vlog = _four_lane_call(SYMBOLS["log"], "log", types.float64)
vlog1p = _four_lane_call(SYMBOLS["log1p"], "log1p", types.float64)
vsin = _four_lane_call(SYMBOLS["sin"], "sin", types.float64)
vcos = _four_lane_call(SYMBOLS["cos"], "cos", types.float64)
vtanh = _four_lane_call(SYMBOLS["tanh"], "tanh", types.float64)
vexpf = _four_lane_call(SYMBOLS_F32["exp"], "expf", types.float32)
vexpm1f = _four_lane_call(SYMBOLS_F32["expm1"], "expm1f", types.float32)
vlogf = _four_lane_call(SYMBOLS_F32["log"], "logf", types.float32)
vlog1pf = _four_lane_call(SYMBOLS_F32["log1p"], "log1pf", types.float32)
vsinf = _four_lane_call(SYMBOLS_F32["sin"], "sinf", types.float32)
vcosf = _four_lane_call(SYMBOLS_F32["cos"], "cosf", types.float32)
vtanhf = _four_lane_call(SYMBOLS_F32["tanh"], "tanhf", types.float32)

# The names generated code imports, per operation and dtype.
FUNCTIONS = {op: f"v{op}" for op in OPERATIONS}
FUNCTIONS_F32 = {op: f"v{op}f" for op in OPERATIONS}
