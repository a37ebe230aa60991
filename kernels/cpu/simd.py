"""Four float64 in one vector register, as a Numba value: loads, stores, arithmetic, and exp computed inline.

kernels.cpu.vector_math hands four scalars to libmvec and takes four back. Numba does not vectorise
straight-line code (its SLP vectoriser is off), so around each call the four values are packed and
unpacked, and the call clobbers every vector register: a loop that sums exps keeps its partial sums on the
stack. Here the four values stay one LLVM `<4 x double>` from load to accumulator (the F64x4 type), and
`exp` is written in LLVM IR, so it is inlined into the loop. Used by kernels.cpu.logsumexp (exps over
contiguous memory), and by kernels.cpu.product_fold, which accumulates a matrix product in F64x4 values
(`fma`) and maps and folds them with F64x4 forms of scalar functions: the same function with every value
four lanes wide, registered here by whoever compiles it (the numba backend's codegen writes them); and by
the wide paths of kernels.cpu.map and kernels.cpu.segmented, which map and fold with those forms. The IR
is target-independent: on a CPU without AVX2 LLVM splits each operation in two, slower but the same
results.

exp: Cody-Waite reduction x = k ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two parts), exp(r) by a polynomial
of degree 11 (a Chebyshev interpolant of exp, coefficients fitted in long double), and 2^k put into the
exponent bits. When every lane lies in [-708, 709] the result is p with k added to its exponent field;
otherwise a second path clamps x to [-746, 710], scales by 2^(k/2) twice (so that results that overflow
give inf and subnormal results round once) and passes NaN through. Within 2 ulp of glibc's exp over the
range tested (tests/test_simd.py), special values exact.
"""

from __future__ import annotations

import weakref
from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

WIDTH = 4
_DOUBLE = ir.DoubleType()
_VECTOR = ir.VectorType(_DOUBLE, WIDTH)
_INTS = ir.VectorType(ir.IntType(64), WIDTH)
_LANE = ir.IntType(32)


class F64x4Type(types.Type):
    """Four float64 lanes held in one <4 x double>."""

    def __init__(self) -> None:
        super().__init__(name="F64x4")


f64x4 = F64x4Type()


@register_model(F64x4Type)
class _F64x4Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VECTOR)


def _splat(value: float, vector: ir.VectorType = _VECTOR) -> ir.Constant:
    return ir.Constant(vector, [value] * WIDTH)


def _fma(builder: ir.IRBuilder, a, b, c):
    """a * b + c, fused where the target has FMA (llvm.fmuladd)."""
    function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VECTOR, [_VECTOR] * 3),
                                              "llvm.fmuladd.v4f64")
    return builder.call(function, [a, b, c])


_LOG2E = 1.4426950408889634
_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")  # ln 2 to 32 bits: k * _LN2_HI is exact for |k| < 2^21
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
_ROUNDER = float.fromhex("0x1.8p52")  # x + _ROUNDER rounds x to an integer, held in the low mantissa bits
_COEFFICIENTS = [float.fromhex(h) for h in (
    "0x1p+0", "0x1p+0", "0x1.0000000000001p-1", "0x1.5555555555572p-3", "0x1.55555555541ddp-5",
    "0x1.1111111102702p-7", "0x1.6c16c176d1875p-10", "0x1.a01a022151a4fp-13", "0x1.a019bfaa8354ap-16",
    "0x1.71dc92f0ede58p-19", "0x1.2889c6ad4d7edp-22", "0x1.b23f94a73ede8p-26")]


def _reduced_exp(builder: ir.IRBuilder, x):
    """(p, t) with exp(x) = p * 2^k, 0.7 < p < 1.42, and k the integer in the low bits of t's mantissa."""
    t = _fma(builder, x, _splat(_LOG2E), _splat(_ROUNDER))
    k = builder.fsub(t, _splat(_ROUNDER))
    r = _fma(builder, k, _splat(-_LN2_HI), x)
    r = _fma(builder, k, _splat(-_LN2_LO), r)
    r2 = builder.fmul(r, r)
    r4 = builder.fmul(r2, r2)
    c = [_splat(v) for v in _COEFFICIENTS]
    pairs = [builder.fadd(r, c[0])] + [_fma(builder, c[2 * i + 1], r, c[2 * i]) for i in range(1, 6)]
    quads = [_fma(builder, pairs[2 * i + 1], r2, pairs[2 * i]) for i in range(3)]
    p = _fma(builder, _fma(builder, quads[2], r4, quads[1]), r4, quads[0])
    return p, t


def _power_of_two(builder: ir.IRBuilder, k):
    """2^k for integer lanes k in the normal range."""
    return builder.bitcast(builder.shl(builder.add(k, _splat(1023, _INTS)), _splat(52, _INTS)), _VECTOR)


def emit_exp(builder: ir.IRBuilder, x):
    """IR for exp of the four lanes of x (a <4 x double>)."""
    inside = builder.and_(builder.fcmp_ordered(">", x, _splat(-708.0)), builder.fcmp_ordered("<", x, _splat(709.0)))
    every_lane_inside = builder.icmp_unsigned("==", builder.bitcast(inside, ir.IntType(WIDTH)),
                                              ir.Constant(ir.IntType(WIDTH), 2**WIDTH - 1))
    with builder.if_else(every_lane_inside, likely=True) as (common, rare):
        with common:
            p, t = _reduced_exp(builder, x)
            exponent = builder.shl(builder.bitcast(t, _INTS), _splat(52, _INTS))
            common_value = builder.bitcast(builder.add(builder.bitcast(p, _INTS), exponent), _VECTOR)
            common_block = builder.block
        with rare:
            nan = builder.fcmp_unordered("uno", x, x)
            clamped = builder.select(builder.fcmp_ordered(">", x, _splat(710.0)), _splat(710.0), x)
            clamped = builder.select(builder.fcmp_ordered("<", clamped, _splat(-746.0)), _splat(-746.0), clamped)
            p, t = _reduced_exp(builder, builder.select(nan, _splat(0.0), clamped))
            k = builder.sub(builder.bitcast(t, _INTS), builder.bitcast(_splat(_ROUNDER), _INTS))
            half = builder.ashr(k, _splat(1, _INTS))
            scaled = builder.fmul(builder.fmul(p, _power_of_two(builder, half)),
                                  _power_of_two(builder, builder.sub(k, half)))
            rare_value = builder.select(nan, x, scaled)
            rare_block = builder.block
    result = builder.phi(_VECTOR)
    result.add_incoming(common_value, common_block)
    result.add_incoming(rare_value, rare_block)
    return result


@intrinsic
def splat(typingctx, value):
    """Four lanes of one float (converted to float64)."""
    if not isinstance(value, types.Float):
        return None

    def codegen(context, builder, signature, args):
        scalar = context.cast(builder, args[0], signature.args[0], types.float64)
        one = builder.insert_element(ir.Constant(_VECTOR, ir.Undefined), scalar, ir.Constant(_LANE, 0))
        return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(_LANE, WIDTH), [0] * WIDTH))

    return f64x4(value), codegen


@intrinsic
def load(typingctx, array, index):
    """array[index : index + 4] as float64 lanes (a 1-D float or boolean array of any stride; no bounds
    check). Booleans become 0.0 and 1.0, the form's truth values (see `select`)."""
    if not (isinstance(array, types.Array) and array.ndim == 1 and isinstance(array.dtype, (types.Float, types.Boolean))):
        return None

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        view = context.make_array(array_type)(context, builder, args[0])
        element = context.get_data_type(array_type.dtype)  # a boolean is one byte in memory
        first = cgutils.get_item_pointer(context, builder, array_type, view, [args[1]], wraparound=False)
        if array_type.layout == "C":
            packed = builder.load(builder.bitcast(first, ir.VectorType(element, WIDTH).as_pointer()), align=1)
        else:
            packed = ir.Constant(ir.VectorType(element, WIDTH), ir.Undefined)
            for lane in range(WIDTH):
                at = builder.add(args[1], ir.Constant(args[1].type, lane))
                pointer = cgutils.get_item_pointer(context, builder, array_type, view, [at], wraparound=False)
                packed = builder.insert_element(packed, builder.load(pointer), ir.Constant(_LANE, lane))
        if isinstance(array_type.dtype, types.Boolean):
            return builder.uitofp(packed, _VECTOR)
        return packed if element == _DOUBLE else builder.fpext(packed, _VECTOR)

    return f64x4(array, types.intp), codegen


@intrinsic
def store(typingctx, array, index, value):
    """array[index : index + 4] = the lanes of value (a 1-D float64 array of any stride; no bounds check)."""
    if not (isinstance(array, types.Array) and array.ndim == 1 and array.dtype == types.float64
            and array.mutable and value == f64x4):
        return None

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        view = context.make_array(array_type)(context, builder, args[0])
        first = cgutils.get_item_pointer(context, builder, array_type, view, [args[1]], wraparound=False)
        if array_type.layout == "C":
            builder.store(args[2], builder.bitcast(first, _VECTOR.as_pointer()), align=1)
        else:
            for lane in range(WIDTH):
                at = builder.add(args[1], ir.Constant(args[1].type, lane))
                pointer = cgutils.get_item_pointer(context, builder, array_type, view, [at], wraparound=False)
                builder.store(builder.extract_element(args[2], ir.Constant(_LANE, lane)), pointer)
        return context.get_dummy_value()

    return types.none(array, types.intp, f64x4), codegen


def _lanewise(emit, doc: str):
    @intrinsic
    def operation(typingctx, a, b):
        if a != f64x4 or b != f64x4:
            return None
        return f64x4(f64x4, f64x4), lambda context, builder, signature, args: emit(builder, *args)

    operation.__doc__ = doc
    return operation


def _propagating(builder: ir.IRBuilder, a, b, keep_a: str):
    """a where `a keep_a b` holds or a is NaN, else b: NumPy's minimum ("<=") or maximum (">="), NaN from
    either operand."""
    keep = builder.or_(builder.fcmp_ordered(keep_a, a, b), builder.fcmp_unordered("uno", a, a))
    return builder.select(keep, a, b)


add = _lanewise(lambda builder, a, b: builder.fadd(a, b), "a + b per lane.")
sub = _lanewise(lambda builder, a, b: builder.fsub(a, b), "a - b per lane.")
mul = _lanewise(lambda builder, a, b: builder.fmul(a, b), "a * b per lane.")
div = _lanewise(lambda builder, a, b: builder.fdiv(a, b), "a / b per lane.")
maximum = _lanewise(lambda builder, a, b: builder.select(builder.fcmp_ordered(">", b, a), b, a),
                    "The larger of a and b per lane; a where b is NaN or equal (NaN propagates from a only).")
nan_maximum = _lanewise(lambda builder, a, b: _propagating(builder, a, b, ">="),
                        "NumPy's maximum per lane: NaN where either is NaN.")
nan_minimum = _lanewise(lambda builder, a, b: _propagating(builder, a, b, "<="),
                        "NumPy's minimum per lane: NaN where either is NaN.")


def _comparison(predicate: str, doc: str):
    """A comparison per lane giving the form's truth values, 1.0 or 0.0 (NaN compares as in Python)."""
    return _lanewise(lambda builder, a, b: builder.uitofp(builder.fcmp_ordered(predicate, a, b)
                                                          if predicate != "!=" else builder.fcmp_unordered("!=", a, b),
                                                          _VECTOR), doc)


less = _comparison("<", "1.0 where a < b, else 0.0, per lane.")
less_equal = _comparison("<=", "1.0 where a <= b, else 0.0, per lane.")
greater = _comparison(">", "1.0 where a > b, else 0.0, per lane.")
greater_equal = _comparison(">=", "1.0 where a >= b, else 0.0, per lane.")
equal = _comparison("==", "1.0 where a == b, else 0.0, per lane.")
not_equal = _comparison("!=", "1.0 where a != b (or either is NaN), else 0.0, per lane.")


@intrinsic
def select(typingctx, condition, a, b):
    """a where the condition lane is true (not 0.0), else b, per lane: a boolean value of an F64x4 form is a
    lane of 1.0 or 0.0 (comparisons give them, `load` makes them of a boolean array)."""
    if condition != f64x4 or a != f64x4 or b != f64x4:
        return None

    def codegen(context, builder, signature, args):
        truth = builder.fcmp_unordered("!=", args[0], _splat(0.0))
        return builder.select(truth, args[1], args[2])

    return f64x4(f64x4, f64x4, f64x4), codegen


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c per lane, rounded once where the target has FMA (else twice: llvm.fmuladd)."""
    if a != f64x4 or b != f64x4 or c != f64x4:
        return None
    return f64x4(f64x4, f64x4, f64x4), lambda context, builder, signature, args: _fma(builder, *args)


@intrinsic
def neg(typingctx, a):
    """-a per lane (the sign bit flipped, as Python's unary minus: -0.0 for 0.0)."""
    if a != f64x4:
        return None
    return f64x4(f64x4), lambda context, builder, signature, args: builder.fneg(args[0])


@intrinsic
def exp(typingctx, a):
    """exp of each lane (see the module docstring)."""
    if a != f64x4:
        return None
    return f64x4(f64x4), lambda context, builder, signature, args: emit_exp(builder, args[0])


@intrinsic
def lane(typingctx, a, index):
    """One lane of a, as a float64."""
    if a != f64x4:
        return None
    return types.float64(f64x4, types.intp), lambda context, builder, signature, args: builder.extract_element(*args)


# F64x4 forms of compiled scalar functions: the same function with every float64 argument and result
# four lanes wide. Whoever compiles a scalar function that has one registers it here; kernels that hold
# four lanes of every operand in registers (kernels.cpu.product_fold) look it up.
_FORMS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def register_form(fn: Any, vector_fn: Any) -> None:
    """Record `vector_fn` as the F64x4 form of `fn` (both Numba-compiled)."""
    _FORMS[fn] = vector_fn


def vector_form(fn: Any) -> Any | None:
    """The registered F64x4 form of `fn`, or None."""
    return None if fn is None else _FORMS.get(fn)


__all__ = ["WIDTH", "add", "div", "emit_exp", "equal", "exp", "f64x4", "fma", "greater", "greater_equal", "lane", "less",
           "less_equal", "load", "maximum", "mul", "nan_maximum", "nan_minimum", "neg", "not_equal", "register_form",
           "select", "splat", "store", "sub", "vector_form"]
