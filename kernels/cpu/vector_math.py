"""exp, log, sin, ... of eight float32 (or float64) values at once, from glibc's vector math library (libmvec).

Numba calls libm once per element for a transcendental function: LLVM vectorises the loop around it to
`llvm.exp.v4f64` and the backend splits that back into four scalar calls, because the llvmlite that Numba
uses does not honour a vector library (`-vector-library=` has no effect; `llvmlite.binding.has_svml` is
False). libmvec has the vector variants themselves (the x86-64 vector function ABI: `_ZGVdN8v_expf` takes
and returns eight floats in one AVX2 register, `_ZGVdN4v_exp` four doubles, within 4 ulp of the exact
result). The functions here are Numba intrinsics of WIDTH scalars: they pack them into such registers (one
for float32, two for float64), call the variant and unpack the result, so a generated loop body that
handles WIDTH elements per iteration (see kernels.cpu.lanes) computes each transcendental once per register
of elements: about 7x faster for sin and exp on float64 than libm per element. WIDTH is eight, a float32
register's lanes: against four float32 lanes in an SSE register (the variant fold called before session
61), exp of 2^24 float32 took 9.5 against 18 ms mapped and 17 against 27 ms summed (2 threads), log1p 1.08
against 2.58 ns per element (one thread).

SUPPORTED says whether this machine has them: libmvec loads, the host has AVX2 and FMA, and Numba compiles
for the host CPU (code compiled for another target would pass the register differently). Where it has
not, each function calls libm's scalar function WIDTH times instead: always correct, never faster.
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

# The lanes an intrinsic here takes: four (a loop nest's lanes, runtime/numba_backend/nest_lanes.py) or eight
# (a mapper's lane form, kernels.cpu.lanes).
WIDTHS = (4, 8)

# fold's elementwise operation -> libmvec's variants: float64 four lanes in an AVX2 register; float32 four in
# an SSE register or eight in an AVX2 one. Each has the IEEE special values of libm's scalar function
# (exp(-inf) = 0, log(0) = -inf, log(-1) = nan, log1p(-1) = -inf, sin(inf) = nan).
OPERATIONS = ("exp", "expm1", "log", "log1p", "sin", "cos", "tanh")
SYMBOLS = {op: f"_ZGVdN4v_{op}" for op in OPERATIONS}
SYMBOLS_F32 = {op: f"_ZGVbN4v_{op}f" for op in OPERATIONS}
SYMBOLS_F32_WIDE = {op: f"_ZGVdN8v_{op}f" for op in OPERATIONS}


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
        symbols = [*SYMBOLS.values(), *SYMBOLS_F32.values(), *SYMBOLS_F32_WIDE.values()]
        if not all(hasattr(library, symbol) for symbol in symbols):
            return False
        llvm.load_library_permanently(name)
    except (OSError, RuntimeError):
        return False
    return True


SUPPORTED = _load()
REQUESTED = os.environ.get("FOLD_VECTOR_MATH", "1") != "0"  # also switches kernels.cpu.simd's paths
AVAILABLE = SUPPORTED and REQUESTED


def _lanes_call(symbol: str, per_call: int, scalar: str, dtype: types.Float, width: int):
    """An intrinsic f(x_0, ..., x_{width-1}) -> (f(x_0), ..., f(x_{width-1})) of `dtype`: width / per_call
    calls of the vector `symbol` (of per_call lanes), or `width` of libm's `scalar` where vector math is not
    SUPPORTED."""
    element = ir.DoubleType() if dtype == types.float64 else ir.FloatType()

    def codegen(context, builder, signature, args):
        result = signature.return_type
        if not SUPPORTED:
            function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(element, [element]), scalar)
            return context.make_tuple(builder, result, [builder.call(function, [a]) for a in args])
        vector = ir.VectorType(element, per_call)
        function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vector, [vector]), symbol)
        outs = []
        for start in range(0, width, per_call):
            packed = ir.Constant(vector, ir.Undefined)
            for lane in range(per_call):
                packed = builder.insert_element(packed, args[start + lane], ir.Constant(ir.IntType(32), lane))
            out = builder.call(function, [packed])
            outs += [builder.extract_element(out, ir.Constant(ir.IntType(32), lane)) for lane in range(per_call)]
        return context.make_tuple(builder, result, outs)

    def typer(typingctx, *lanes):
        return types.UniTuple(dtype, width)(*([dtype] * width)), codegen

    # Numba's intrinsic takes its arity from the typing function's parameters: one per lane, written out
    names = ", ".join(f"x{lane}" for lane in range(width))
    scope: dict = {"typer": typer}
    exec(f"def call(typingctx, {names}):\n    return typer(typingctx, {names})", scope)
    return intrinsic(scope["call"])


def function_name(op: str, dtype: str, width: int) -> str:
    """The name of the intrinsic computing `op` on `width` lanes of `dtype` ("float64" or "float32"):
    vexp, vexpf (four lanes), vexp8, vexpf8 (eight)."""
    return f"v{op}{'f' if dtype == 'float32' else ''}{'' if width == 4 else width}"


def _variant(op: str, dtype: str, width: int) -> tuple[str, int]:
    """(libmvec's symbol, its lanes per call) for `op` on `width` lanes of `dtype`."""
    if dtype == "float64":
        return SYMBOLS[op], 4
    return (SYMBOLS_F32_WIDE[op], 8) if width == 8 else (SYMBOLS_F32[op], 4)


for _op in OPERATIONS:
    for _dtype, _type, _scalar in (("float64", types.float64, _op), ("float32", types.float32, _op + "f")):
        for _width in WIDTHS:
            _symbol, _per_call = _variant(_op, _dtype, _width)
            globals()[function_name(_op, _dtype, _width)] = _lanes_call(_symbol, _per_call, _scalar, _type, _width)

# The names generated code imports: every operation, dtype and width.
NAMES = tuple(sorted(function_name(op, dtype, width) for op in OPERATIONS for dtype in ("float64", "float32")
                     for width in WIDTHS))
