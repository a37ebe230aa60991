"""Scalar functions with NumPy's semantics (NaN propagation, -inf for log(0), stable logaddexp and sigmoid),
which the generated scalar programs call where Python's own operators and math functions differ from NumPy.

They are plain njit functions, inlined by LLVM where they are called, not by Numba (`inline="always"`),
which copies a helper's Numba IR into every call site before type inference: that copying was a sixth of
the compile time of the monoid tests (84 of 505 s under cProfile), and LLVM inlines functions this small
anyway (the kernels calling them ran as fast: benchmarks/README.md, session 59)."""

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

LOG2 = math.log(2.0)

HELPERS = ("_maximum", "_minimum", "_logaddexp", "_sigmoid", "_log", "_log1p", "_sqrt", "_sign", "_mod", "_floordiv")


@numba.njit
def _maximum(a, b):
    return a if (a >= b or a != a) else b


@numba.njit
def _minimum(a, b):
    return a if (a <= b or a != a) else b


@numba.njit
def _logaddexp(a, b):
    if a == b:  # NumPy's case too: equal infinities give themselves (inf - inf would be NaN below)
        return a + LOG2
    hi = a if a >= b else b
    if hi == -math.inf:
        return hi
    return hi + math.log1p(math.exp(-abs(a - b)))


@numba.njit
def _sigmoid(x):
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@numba.njit
def _log(x):
    if x > 0:
        return math.log(x)
    return -math.inf if x == 0 else math.nan


@numba.njit
def _log1p(x):
    if x > -1:
        return math.log1p(x)
    return -math.inf if x == -1 else math.nan


@numba.njit
def _sqrt(x):
    return math.sqrt(x) if x >= 0 else math.nan


@numba.njit
def _sign(x):
    # integers, not booleans, subtracted: NumPy refuses True - False, which the CUDA simulator runs as NumPy
    return (1 if x > 0 else 0) - (1 if x < 0 else 0) if x == x else x


def _mod(a, b):
    """NumPy's remainder, with the sign of b: for floats from fmod (exact, however large a / b; x % inf is x
    for x >= 0), for integers 0 where b is 0 or -1 (as NumPy, which also warns; a // b overflows at -1)."""
    return np.remainder(a, b)


@overload(_mod)
def _mod_typed(a, b):
    if isinstance(a, types.Integer) and isinstance(b, types.Integer):
        def integer_remainder(a, b):
            if b == 0 or b == -1:
                return a * 0
            return a % b
        return integer_remainder

    def float_remainder(a, b):
        mod = np.fmod(a, b)
        if b == 0:
            return mod
        if mod == 0:
            return math.copysign(0.0, b)
        if (b < 0) != (mod < 0):
            return mod + b
        return mod
    return float_remainder


def _floordiv(a, b):
    """NumPy's floor division: for integers, the minimum integer divided by -1 wraps to itself (as NumPy,
    which also warns), where a compiled // gives 0; otherwise Python's // (x // 0 is 0 under Numba's NumPy
    error model, as in NumPy)."""
    return np.floor_divide(a, b)


@overload(_floordiv)
def _floordiv_typed(a, b):
    if isinstance(a, types.Integer) and isinstance(b, types.Integer):
        def integer_quotient(a, b):
            if b == -1:
                return -a
            return a // b
        return integer_quotient

    def quotient(a, b):
        return a // b
    return quotient


# For the loops LLVM vectorises (extremum_loops.py): NumPy's minimum and maximum as LLVM's NaN-propagating
# llvm.minimum and llvm.maximum, a fold of which its loop vectoriser runs several lanes at a time (a fold of
# the forms above stays one serial chain of compares and selects: LLVM vectorises that only with fast-math
# flags, which would drop the NaN), and a trip count it cannot see, so that it vectorises a short loop
# rather than unrolling it into scalars. Elsewhere the forms above are faster: without AVX-512 a scalar
# llvm.minimum is several instructions. Unlike NumPy's, these order -0.0 below +0.0.
VECTORISED_HELPERS = ("_vector_maximum", "_vector_minimum", "_unseen")
_NUMBERS = (types.Float, types.Integer, types.Boolean)


def _vector_extremum(float_intrinsic: str, predicate: str):
    @intrinsic
    def extremum(typingctx, a, b):
        result = typingctx.unify_pairs(a, b) if isinstance(a, _NUMBERS) and isinstance(b, _NUMBERS) else None
        if not isinstance(result, _NUMBERS):
            return None

        def codegen(context, builder, signature, args):
            x, y = (context.cast(builder, v, t, result) for v, t in zip(args, signature.args, strict=True))
            if isinstance(result, types.Float):
                kind = x.type
                name = f"{float_intrinsic}.{'f32' if kind == ir.FloatType() else 'f64'}"
                function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(kind, [kind, kind]), name)
                return builder.call(function, [x, y])
            signed = isinstance(result, types.Integer) and result.signed
            compare = builder.icmp_signed if signed else builder.icmp_unsigned
            return builder.select(compare(predicate, x, y), x, y)

        return result(a, b), codegen

    return extremum


_vector_maximum = _vector_extremum("llvm.maximum", ">=")
_vector_minimum = _vector_extremum("llvm.minimum", "<=")


@intrinsic
def _unseen(typingctx, n):
    """n, through an empty inline-assembly statement that LLVM cannot look into."""
    if not isinstance(n, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        value = context.cast(builder, args[0], signature.args[0], types.intp)
        return builder.asm(ir.FunctionType(value.type, [value.type]), "", "=r,0", [value], side_effect=False)

    return types.intp(n), codegen
