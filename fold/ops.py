"""The array operations users call: elementwise math, broadcasting, indexing, reshaping, products.

They take tracers, NumPy arrays and Python numbers alike. Promotion follows NumPy 2 (Python numbers are
"weak" and adopt the array's dtype); the dtype conversions and broadcasts it implies are recorded as explicit
statements, so every elementwise statement sees arguments of one shape and one dtype.
"""

from __future__ import annotations

import builtins
import math
import numbers
from typing import Any, Callable, Sequence

import numpy as np

from .dtypes import SUPPORTED_DTYPES, check_dtype, is_static_int, native_byte_order
from .errors import FoldIndexError, FoldTypeError, ShapeError
from .primitives import (
    SCALAR_OPS,
    BroadcastTo,
    Concatenate,
    Convert,
    Elementwise,
    Gather,
    Iota,
    MatMul,
    Reshape,
    StaticIndex,
    StopGradient,
    SumAxes,
    Transpose,
)
from .primitives.structural import broadcast_shapes
from .tracing import STATIC_HINT, Tracer, bind

ArrayLike = Any  # a Tracer, a NumPy array or a Python number


def _is_weak(x: Any) -> bool:
    """Python numbers, and NumPy scalars such as `1 / np.sqrt(d)`, adopt the dtype of the arrays they meet.

    (NumPy 2 makes its scalars strong, so `np.float64(2) * float32_array` is float64; in fold a scale
    computed with NumPy must not silently turn a float32 layer into float64.)
    """
    return isinstance(x, numbers.Number) and not isinstance(x, np.ndarray)


def as_value(x: Any, where: str) -> Any:
    """A tracer, a NumPy array of a supported dtype, or a Python number (kept weak for promotion)."""
    if isinstance(x, Tracer) or _is_weak(x):
        if isinstance(x, complex):
            raise FoldTypeError(f"{where}: complex numbers are not supported ({x!r})")
        return x
    if isinstance(x, (np.ndarray, np.generic, list, tuple)):
        try:
            array = native_byte_order(np.asarray(x))
        except ValueError as err:
            raise FoldTypeError(f"{where}: {type(x).__name__} is not a rectangular array: {err}") from None
        check_dtype(array.dtype, where)
        return array
    raise FoldTypeError(f"{where}: expected an array or a number, got {type(x).__name__} ({x!r:.60})")


def shape_of(x: Any) -> tuple[int, ...]:
    return () if _is_weak(x) else tuple(x.shape)


def _dtype_key(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()  # as a Python number, so that NumPy's promotion treats it as weak too
    return x if _is_weak(x) else x.dtype


# ------------------------------------------------------------------------- static (trace-time) arguments
# Sizes, shapes and axes are fixed when a function is traced. Only ints and NumPy integers are taken: int() would
# truncate a float (2.9 -> 2) and a bool would count as 0 or 1, both silently, giving another program than meant.


def _is_sequence(x: Any) -> bool:
    return isinstance(x, Sequence) or (isinstance(x, np.ndarray) and x.ndim > 0)


def _static_int(value: Any, where: str, what: str, within: Any = None) -> int:
    """`value` as a Python int, or a FoldTypeError naming `where`, `what`, the value and `within` (the argument)."""
    if is_static_int(value):
        return int(value)
    if isinstance(value, (bool, np.bool_)):
        why = "a bool is not taken as 0 or 1"
    elif isinstance(value, (float, np.floating)):
        why = "floats are refused, even whole ones such as 2.0; write int(...) if truncation is meant"
    elif isinstance(value, Tracer):
        why = STATIC_HINT
    else:
        why = f"a {type(value).__name__}"
    context = "" if within is None else f" in {within!r}"
    raise FoldTypeError(f"{where}: {what} must be an integer, got {value!r}{context} ({why})")


def _static_size(value: Any, where: str, what: str) -> int:
    """A non-negative static int (a length, a count)."""
    n = _static_int(value, where, what)
    if n < 0:
        raise ShapeError(f"{where}: {what} must be non-negative, got {n}")
    return n


def _static_shape(shape: Any, where: str, infer: bool = False) -> tuple[int, ...]:
    """`shape` (an int or a sequence of ints) as a tuple of non-negative ints; with `infer`, one entry may be -1."""
    if isinstance(shape, (numbers.Number, np.generic)):
        sizes = (_static_int(shape, where, "shape"),)
    elif _is_sequence(shape):
        sizes = tuple(_static_int(s, where, "each shape entry", within=shape) for s in shape)
    else:
        kind = type(shape).__name__
        raise FoldTypeError(f"{where}: shape must be an int or a sequence of ints, got {shape!r:.60} ({kind})")
    bad = [s for s in sizes if s < -1 or (s == -1 and not infer)]
    if bad:
        allowed = " (or one -1, to infer that dimension)" if infer else ""
        raise ShapeError(f"{where}: shape entries must be non-negative{allowed}, got {bad[0]} in {sizes}")
    if sizes.count(-1) > 1:
        raise ShapeError(f"{where}: shape {sizes} has more than one -1 (only one dimension can be inferred)")
    return sizes


def _static_axis(axis: Any, shape: tuple[int, ...], where: str, within: Any = None) -> int:
    """`axis` of an array of `shape`, made non-negative. NumPy's range, -ndim <= axis < ndim: wrapping an axis
    around with `axis % ndim` alone would silently pick another one."""
    a = _static_int(axis, where, "axis", within)
    if not -len(shape) <= a < len(shape):
        raise ShapeError(f"{where}: axis {a} is out of range for an array of shape {shape}")
    return a % len(shape)


def _static_axes(axes: Any, shape: tuple[int, ...], where: str) -> tuple[int, ...]:
    """`axes` (an axis or a sequence of them) of an array of `shape`, made non-negative; none may appear twice."""
    if not _is_sequence(axes):
        return (_static_axis(axes, shape, where),)
    out = tuple(_static_axis(a, shape, where, within=axes) for a in axes)
    for i, a in enumerate(out):
        if a in out[:i]:
            raise ShapeError(f"{where}: axis {a} appears more than once in {axes!r} (array shape {shape})")
    return out


def convert(x: ArrayLike, dtype: Any) -> ArrayLike:
    """`x` as `dtype` (a no-op if it already is)."""
    dtype = check_dtype(np.dtype(dtype), "convert")
    x = as_value(x, "convert")
    if _is_weak(x):
        number = x.item() if isinstance(x, np.generic) else x  # NumPy wraps a scalar's cast; a number's it checks
        try:
            return np.asarray(number, dtype=dtype)
        except OverflowError:
            raise FoldTypeError(f"the number {number!r} does not fit in {dtype.name}, the dtype it takes from the "
                                f"arrays it meets (numbers are weak); convert those arrays first") from None
    if x.dtype == dtype:
        return x
    if isinstance(x, Tracer):
        return bind(Convert(dtype), x)[0]
    return x.astype(dtype)


def broadcast_to(x: ArrayLike, shape: Sequence[int]) -> ArrayLike:
    """`x` broadcast to `shape` (NumPy rules), as an explicit statement."""
    x = as_value(x, "broadcast_to")
    shape = _static_shape(shape, "fold.broadcast_to")
    if shape_of(x) == shape:
        return x
    if _is_weak(x):
        x = np.asarray(x)
    try:
        fits = broadcast_shapes(shape_of(x), shape) == shape
    except ShapeError:
        fits = False
    if not fits:
        raise ShapeError(f"broadcast_to: shape {shape_of(x)} cannot be broadcast to {shape}")
    return bind(BroadcastTo(shape), x)[0]


def _result_dtype(values: Sequence[Any], kind: str, op: str) -> np.dtype:
    dtype = np.result_type(*[_dtype_key(v) for v in values])
    if dtype not in SUPPORTED_DTYPES:  # e.g. a weak Python float with nothing else: float64 already
        dtype = np.dtype("float64") if dtype.kind == "f" else np.dtype("int64")
    if kind == "float" and dtype.kind != "f":
        return np.dtype("float64")
    if kind == "logical":
        if dtype != np.dtype(bool):
            raise FoldTypeError(f"{op}: needs boolean arguments, got {[np.result_type(_dtype_key(v)).name for v in values]}")
        return dtype
    if kind in ("arith", "compare") and dtype == np.dtype(bool) and op not in ("maximum", "minimum", "eq", "ne", "mul", "where", "concatenate"):
        raise FoldTypeError(f"{op}: not defined on booleans; use & | ~ or convert to a number first")
    return dtype


def elementwise(op: str, *args: ArrayLike) -> ArrayLike:
    """Apply the scalar operation `op` elementwise, with NumPy promotion and broadcasting."""
    spec = SCALAR_OPS[op]
    values = [as_value(a, op) for a in args]
    if len(values) != spec.arity:
        raise FoldTypeError(f"{op} takes {spec.arity} arguments, got {len(values)}")
    if spec.kind == "select":
        cond, rest = values[0], values[1:]
        if _dtype_key(cond) is not bool and np.result_type(_dtype_key(cond)) != np.dtype(bool):
            raise FoldTypeError(f"where: the condition must be boolean, got {np.result_type(_dtype_key(cond)).name}")
        dtype = _result_dtype(rest, "arith" if all(np.result_type(_dtype_key(v)) != bool for v in rest) else "compare", op)
        values = [convert(cond, bool)] + [convert(v, dtype) for v in rest]
    else:
        dtype = _result_dtype(values, spec.kind, op)
        values = [convert(v, dtype) for v in values]
    try:
        shape = broadcast_shapes(*[shape_of(v) for v in values])
    except ShapeError:
        raise ShapeError(f"{op}: shapes {', '.join(str(shape_of(v)) for v in values)} do not broadcast together") from None
    values = [v if (shape_of(v) == () and not isinstance(v, Tracer)) else broadcast_to(v, shape) for v in values]
    if not any(isinstance(v, Tracer) for v in values):
        values = [np.asarray(v) for v in values]
    return bind(Elementwise(op), *values)[0]


def _unary(op: str):
    def fn(x: ArrayLike) -> ArrayLike:
        return elementwise(op, x)

    fn.__name__ = op
    fn.__doc__ = f"Elementwise {op}."
    return fn


def _binary(op: str):
    def fn(x: ArrayLike, y: ArrayLike) -> ArrayLike:
        return elementwise(op, x, y)

    fn.__name__ = op
    fn.__doc__ = f"Elementwise {op}, with NumPy broadcasting."
    return fn


exp, log, log1p, expm1 = _unary("exp"), _unary("log"), _unary("log1p"), _unary("expm1")
sin, cos, tanh, sqrt = _unary("sin"), _unary("cos"), _unary("tanh"), _unary("sqrt")
abs, sign, negative, logical_not = _unary("abs"), _unary("sign"), _unary("neg"), _unary("not")  # noqa: A001
sigmoid = _unary("sigmoid")
add, subtract, multiply, divide = _binary("add"), _binary("sub"), _binary("mul"), _binary("div")
power, maximum, minimum, logaddexp = _binary("pow"), _binary("maximum"), _binary("minimum"), _binary("logaddexp")
less, less_equal, greater, greater_equal = _binary("lt"), _binary("le"), _binary("gt"), _binary("ge")
equal, not_equal, logical_and, logical_or = _binary("eq"), _binary("ne"), _binary("and"), _binary("or")


def where(cond: ArrayLike, x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """`x` where `cond` holds, else `y`, elementwise with broadcasting (gradients flow to the chosen side)."""
    return elementwise("where", cond, x, y)


def iota(n: int, dtype: Any = "int64") -> ArrayLike:
    """The array [0, 1, ..., n-1] (of a number dtype: a bool array cannot count past 1)."""
    n = _static_size(n, "fold.iota", "n")
    dtype = check_dtype(np.dtype(dtype), "fold.iota")
    if dtype == np.dtype(bool):
        raise FoldTypeError(f"fold.iota: dtype must be a number type (int32, int64, float32, float64), got {dtype.name}")
    return bind(Iota(n, dtype))[0]


def reshape(x: ArrayLike, shape: Sequence[int] | int) -> ArrayLike:
    """`x` with a new shape of the same size; one dimension may be -1."""
    x = as_value(x, "reshape")
    shape = _static_shape(shape, "fold.reshape", infer=True)
    size = int(np.prod(shape_of(x), dtype=np.int64))
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
        if known == 0 or size % known:
            raise ShapeError(f"reshape: cannot reshape {shape_of(x)} ({size} elements) to {shape}")
        shape = tuple(size // known if s == -1 else s for s in shape)
    if shape == shape_of(x):
        return x
    return bind(Reshape(shape), np.asarray(x) if _is_weak(x) else x)[0]


def transpose(x: ArrayLike, axes: Sequence[int] | None = None) -> ArrayLike:
    """Permute the axes of `x` (reverse them by default)."""
    x = as_value(x, "transpose")
    ndim = len(shape_of(x))
    perm = tuple(range(ndim))[::-1] if axes is None else _static_axes(axes, shape_of(x), "fold.transpose")
    if len(perm) != ndim:
        raise ShapeError(f"fold.transpose: axes {axes!r} are not a permutation of the {ndim} axes of {shape_of(x)}")
    if perm == tuple(range(ndim)):
        return x
    return bind(Transpose(perm), x)[0]


def concatenate(xs: Sequence[ArrayLike], axis: int = 0) -> ArrayLike:
    """Join arrays along an existing axis."""
    values = [as_value(x, "concatenate") for x in xs]
    if not values:
        raise ShapeError("concatenate: needs at least one array")
    ndim = len(shape_of(values[0]))
    if ndim == 0:
        raise ShapeError("concatenate: cannot concatenate 0-d arrays")
    axis = _static_axis(axis, shape_of(values[0]), "fold.concatenate")
    dtype = _result_dtype(values, "compare", "concatenate") if all(np.result_type(_dtype_key(v)) == bool for v in values) else _result_dtype(values, "arith", "concatenate")
    values = [convert(v, dtype) for v in values]
    if len(values) == 1:
        return values[0]
    return bind(Concatenate(axis), *values)[0]


def sum(x: ArrayLike, axis: int | Sequence[int] | None = None) -> ArrayLike:  # noqa: A001
    """Sum over the given axes (all by default)."""
    x = as_value(x, "sum")
    shape = shape_of(x)
    axes = tuple(range(len(shape))) if axis is None else tuple(sorted(_static_axes(axis, shape, "fold.sum")))
    if shape and np.result_type(_dtype_key(x)) == bool:
        x = convert(x, "int64")
    if not axes:
        return x
    return bind(SumAxes(axes), np.asarray(x) if _is_weak(x) else x)[0]


def matmul(a: ArrayLike, b: ArrayLike) -> ArrayLike:
    """Matrix product of 1-d or 2-d arrays with NumPy's conventions (use `map` for batches)."""
    a, b = as_value(a, "matmul"), as_value(b, "matmul")
    sa, sb = shape_of(a), shape_of(b)
    if not (1 <= len(sa) <= 2 and 1 <= len(sb) <= 2):
        raise ShapeError(f"matmul: operands must be 1-d or 2-d, got shapes {sa} and {sb} (map over a batch axis instead)")
    ka, kb = sa[-1], sb[0]
    if ka != kb:
        raise ShapeError(f"matmul: inner dimensions differ: {sa} @ {sb} ({ka} != {kb})")
    dtype = _result_dtype([a, b], "arith", "matmul")
    a2 = reshape(convert(a, dtype), (1, ka) if len(sa) == 1 else sa)
    b2 = reshape(convert(b, dtype), (kb, 1) if len(sb) == 1 else sb)
    out = bind(MatMul(), a2, b2)[0]
    out_shape = sa[:-1] + sb[1:]  # a vector operand contributes no axis
    return reshape(out, out_shape)


dot = matmul


def stop_gradient(x: ArrayLike) -> ArrayLike:
    """`x` itself, treated as a constant by differentiation (its tangent and cotangent are zero).

    For values a result does not really depend on, such as the shift of a numerically stable logsumexp.
    """
    x = as_value(x, "stop_gradient")
    if not isinstance(x, Tracer):
        return x
    return bind(StopGradient(), x)[0]


def replicate(n: int, x: ArrayLike) -> ArrayLike:
    """`n` copies of `x` stacked along a new leading axis."""
    n = _static_size(n, "fold.replicate", "n")
    x = as_value(x, "replicate")
    return broadcast_to(reshape(x, (1,) + shape_of(x)), (n,) + shape_of(x))


# ---------------------------------------------------------------------------------------------- indexing


def _normalise_key(key: Any, shape: tuple[int, ...]) -> list:
    key = key if isinstance(key, tuple) else (key,)
    if builtins.sum(k is Ellipsis for k in key) > 1:
        raise FoldIndexError("an index can only have a single ellipsis ('...')")
    used = builtins.sum(1 for k in key if k is not None and k is not Ellipsis)
    if used > len(shape):
        raise FoldIndexError(f"too many indices ({used}) for an array of shape {shape}")
    out: list = []
    for k in key:
        if k is Ellipsis:
            out.extend([slice(None)] * (len(shape) - used))
        else:
            out.append(k)
    return out


def _static_slice(sl: slice, axis: int, shape: tuple[int, ...]) -> slice:
    """`sl`, once its bounds and step are known to be ints (or None) and the step not 0."""
    for part in ("start", "stop", "step"):
        value = getattr(sl, part)
        if isinstance(value, Tracer):
            raise FoldIndexError(f"a slice {part} must be a static int, not a traced value (axis {axis} of shape "
                                 f"{shape}): its length would depend on the data; use fold.where or a gather instead")
        if value is not None and not is_static_int(value):
            raise FoldIndexError(f"a slice {part} must be an int or None, got {value!r} ({type(value).__name__}) "
                                 f"for axis {axis} of shape {shape}")
    if sl.step == 0:
        raise FoldIndexError(f"a slice step cannot be 0 (axis {axis} of shape {shape})")
    return sl


def getitem(x: ArrayLike, key: Any) -> ArrayLike:
    """NumPy-style indexing: ints, slices, `None`, `...`, and one integer index array (traced or not)."""
    x = as_value(x, "indexing")
    shape = shape_of(x)
    entries = _normalise_key(key, shape)
    dynamic = [i for i, k in enumerate(entries) if isinstance(k, (Tracer, np.ndarray, list))]
    if len(dynamic) > 1:
        raise FoldIndexError("only one index array per indexing expression is supported; index twice, or use map")
    if dynamic and any(k is None for k in entries):
        raise FoldIndexError("mixing None (new axes) with an index array is not supported")
    static: list = []
    out_shape: list[int] = []
    axis = 0
    for pos, k in enumerate(entries):
        if k is None:
            out_shape.append(1)
            continue
        size = shape[axis]
        if pos in dynamic or isinstance(k, slice):
            sl = slice(None) if pos in dynamic else _static_slice(k, axis, shape)
            start, stop, step = sl.indices(size)
            static.append((start, stop, step))
            out_shape.append(len(range(start, stop, step)))
        elif is_static_int(k):
            if not -size <= k < size:
                raise FoldIndexError(f"index {k} is out of range for axis {axis} of size {size} (array shape {shape})")
            static.append(int(k) % size)
        else:
            raise FoldIndexError(f"unsupported index {k!r} ({type(k).__name__}) for axis {axis} of shape {shape}")
        axis += 1
    out_shape.extend(shape[axis:])
    result = x
    if any(e != (0, s, 1) for e, s in zip(static, shape, strict=False)):
        result = bind(StaticIndex(tuple(static)), np.asarray(x) if _is_weak(x) else x)[0]
    if dynamic:
        pos = dynamic[0]
        dyn_axis = builtins.sum(1 for k in entries[:pos] if not is_static_int(k))
        return _gather_axis(result, entries[pos], dyn_axis)
    return reshape(result, tuple(out_shape))


def _gather_axis(x: ArrayLike, index: Any, axis: int) -> ArrayLike:
    size = shape_of(x)[axis]
    if not isinstance(index, Tracer):
        empty_list = isinstance(index, (list, tuple)) and len(index) == 0
        index = np.asarray(index, dtype=np.int64) if empty_list else np.asarray(index)  # [] is float64 to NumPy
        if index.dtype == bool:
            raise FoldIndexError("boolean mask indexing gives a data-dependent shape; use fold.where instead")
        if index.dtype.kind not in "iu":
            raise FoldIndexError(f"index arrays must be integers, got {index.dtype.name}")
        if index.size and (index.min() < -size or index.max() >= size):
            bad = index[(index < -size) | (index >= size)].ravel()[0]
            raise FoldIndexError(f"index {bad} is out of range for axis {axis} of size {size} (array shape {shape_of(x)})")
        index = np.where(index < 0, index + size, index).astype(np.int64)
    elif index.dtype == bool:
        raise FoldIndexError("a traced boolean mask selects a number of elements known only when the program runs: "
                             "write x[mask] alone (a selection to reduce: np.sum(x[mask])), np.where(mask, x, 0), or "
                             "a reduction's where=mask")
    elif index.dtype.kind not in "iu":
        raise FoldIndexError(f"index arrays must be integers, got {index.dtype.name}")
    ndim = len(shape_of(x))
    moved = transpose(x, (axis,) + tuple(a for a in range(ndim) if a != axis))
    gathered = bind(Gather(), moved, index)[0]
    k = len(shape_of(index))
    # gathered: index dims, then the other axes in order; put the index dims where `axis` was
    perm = tuple(range(k, k + axis)) + tuple(range(k)) + tuple(range(k + axis, k + ndim - 1))
    return transpose(gathered, perm)


# ---------------------------------------------------------------------------------------- tracer methods

_UFUNCS = {
    np.add: "add", np.subtract: "sub", np.multiply: "mul", np.true_divide: "div", np.power: "pow",
    np.remainder: "mod", np.floor_divide: "floordiv", np.maximum: "maximum", np.minimum: "minimum",
    np.logaddexp: "logaddexp", np.negative: "neg", np.absolute: "abs", np.sign: "sign", np.exp: "exp",
    np.log: "log", np.log1p: "log1p", np.expm1: "expm1", np.sin: "sin", np.cos: "cos", np.tanh: "tanh",
    np.sqrt: "sqrt", np.less: "lt", np.less_equal: "le", np.greater: "gt", np.greater_equal: "ge",
    np.equal: "eq", np.not_equal: "ne", np.logical_and: "and", np.logical_or: "or", np.logical_not: "not",
}


def _reciprocal(x: ArrayLike) -> ArrayLike:
    if np.result_type(_dtype_key(x)).kind != "f":
        raise FoldTypeError(f"np.reciprocal of a {np.result_type(_dtype_key(x))} array truncates to an integer in NumPy; "
                            "write 1.0 / x for the float reciprocal")
    return elementwise("div", 1.0, x)


# Ufuncs that are exact compositions of the primitives (up to rounding: log2(8) may differ from 3 by an ulp),
# so that they differentiate with no rule of their own
_COMPOSITE_UFUNCS: dict[Any, Callable[[ArrayLike], ArrayLike]] = {
    np.square: lambda x: elementwise("mul", x, x),
    np.positive: lambda x: x,
    np.reciprocal: _reciprocal,
    np.log2: lambda x: elementwise("div", elementwise("log", x), math.log(2.0)),
    np.log10: lambda x: elementwise("div", elementwise("log", x), math.log(10.0)),
    np.exp2: lambda x: elementwise("exp", elementwise("mul", x, math.log(2.0))),
    np.tan: lambda x: elementwise("div", elementwise("sin", x), elementwise("cos", x)),
    np.sinh: lambda x: elementwise("mul", elementwise("sub", elementwise("expm1", x), elementwise("expm1", elementwise("neg", x))), 0.5),
    np.cosh: lambda x: elementwise("mul", elementwise("add", elementwise("exp", x), elementwise("exp", elementwise("neg", x))), 0.5),
    np.isnan: lambda x: elementwise("ne", x, x),
}


def _infinity_test(name: str, of_numbers: bool, compare: str) -> Callable[[ArrayLike], ArrayLike]:
    """isinf / isfinite: `compare`(|x|, inf) on floats; integers and booleans are never infinite, so
    `of_numbers` everywhere (abs is not defined on booleans)."""
    def test(x: ArrayLike) -> ArrayLike:
        x = as_value(x, name)
        if np.result_type(_dtype_key(x)).kind in "biu":
            return broadcast_to(np.asarray(of_numbers), shape_of(x))
        return elementwise(compare, elementwise("abs", x), math.inf)

    return test


_COMPOSITE_UFUNCS[np.isinf] = _infinity_test("isinf", False, "eq")
_COMPOSITE_UFUNCS[np.isfinite] = _infinity_test("isfinite", True, "lt")


_TRACED_UFUNCS = (*_UFUNCS, *_COMPOSITE_UFUNCS, np.matmul)


def _array_ufunc(self: Tracer, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
    if any(getattr(type(x), "__fold_defer__", False) for x in inputs):
        return NotImplemented  # a boolean-mask selection among the inputs: NumPy asks it next
    if method == "__call__" and not kwargs:
        if ufunc is np.matmul:
            return matmul(*inputs)
        if ufunc in _UFUNCS:
            return elementwise(_UFUNCS[ufunc], *inputs)
        if ufunc in _COMPOSITE_UFUNCS:
            return _COMPOSITE_UFUNCS[ufunc](*inputs)
    call = f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
    if method == "__call__" and ufunc in _TRACED_UFUNCS:
        call += f" with {', '.join(f'{k}=' for k in kwargs)}"
    names = ", ".join(sorted({u.__name__ for u in _TRACED_UFUNCS}))
    raise FoldTypeError(f"{call} is not supported on traced arrays; the ufuncs fold traces (called plainly) are {names}; "
                        "for folds over an axis use fold.reduce or fold.scan")


def _reshape_method(self: Tracer, *shape: Any) -> ArrayLike:
    """x.reshape(2, 3) or x.reshape((2, 3)), as NumPy's method."""
    if not shape:
        raise FoldTypeError(f"reshape() needs the new shape, as x.reshape(2, 3) or x.reshape((2, 3)); the array has shape {self.shape}")
    return reshape(self, shape[0] if len(shape) == 1 else shape)


def _transpose_method(self: Tracer, *axes: Any) -> ArrayLike:
    """x.transpose(), x.transpose(1, 0) or x.transpose((1, 0)), as NumPy's method."""
    return transpose(self, (axes[0] if len(axes) == 1 else axes) or None)


def _xor(a: ArrayLike, b: ArrayLike) -> ArrayLike:
    """a ^ b on booleans (a != b); like & | ~, not defined on numbers."""
    values = [as_value(a, "xor"), as_value(b, "xor")]
    _result_dtype(values, "logical", "xor")  # raises, naming the dtypes, unless both are boolean
    return elementwise("ne", *values)


def _no_assignment(self: Tracer, key: Any, value: Any) -> None:
    raise FoldTypeError(f"a traced array ({self.aval}) cannot be assigned to (x[...] = v): traced values are "
                        "immutable; build the new array instead, with fold.where(mask, v, x), fold.concatenate "
                        "or fold.map")


def _install_tracer_methods() -> None:
    def binop(op: str, reflected: bool = False):
        def method(self: Tracer, other: Any) -> Any:
            if getattr(type(other), "__fold_defer__", False):  # a boolean-mask selection (numpy_masks.py)
                return NotImplemented
            return elementwise(op, other, self) if reflected else elementwise(op, self, other)
        return method

    for name, op in [("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div"), ("pow", "pow"),
                     ("mod", "mod"), ("floordiv", "floordiv"), ("and", "and"), ("or", "or")]:
        setattr(Tracer, f"__{name}__", binop(op))
        setattr(Tracer, f"__r{name}__", binop(op, reflected=True))
    for name, op in [("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge"), ("eq", "eq"), ("ne", "ne")]:
        setattr(Tracer, f"__{name}__", binop(op))
    Tracer.__neg__ = lambda self: elementwise("neg", self)
    Tracer.__pos__ = lambda self: self
    Tracer.__abs__ = lambda self: elementwise("abs", self)
    Tracer.__invert__ = lambda self: elementwise("not", self)
    Tracer.__xor__ = lambda self, other: _xor(self, other)
    Tracer.__rxor__ = lambda self, other: _xor(other, self)
    Tracer.__setitem__ = _no_assignment
    Tracer.__matmul__ = lambda self, other: matmul(self, other)
    Tracer.__rmatmul__ = lambda self, other: matmul(other, self)
    Tracer.__getitem__ = getitem
    Tracer.__array_ufunc__ = _array_ufunc
    Tracer.T = property(transpose)
    Tracer.reshape = _reshape_method
    Tracer.transpose = _transpose_method
    Tracer.astype = convert
    Tracer.sum = sum


_install_tracer_methods()
