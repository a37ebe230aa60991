"""What every host driver shares: checking arguments, inferring element dtypes, choosing chunks.

Errors name the argument and the values involved. Only NumPy, Numba and the standard library are used.
"""

from __future__ import annotations

from typing import Any, Sequence

import numba
import numpy as np
from numba import types
from numba.core.dispatcher import Dispatcher
from numba.np.numpy_support import as_dtype

# (function, argument dtypes, count) -> result dtypes, so that a call after the first compiles nothing.
_RESULT_DTYPES: dict[tuple, tuple] = {}

# Below this many elements per chunk, splitting an array across threads costs more than it saves.
MIN_CHUNK = 1 << 14


def clear_result_dtypes() -> None:
    _RESULT_DTYPES.clear()


def check_function(fn: Any, what: str) -> None:
    if not isinstance(fn, Dispatcher):
        raise TypeError(f"{what} must be a numba.njit-compiled function, got {fn!r} of type {type(fn).__name__}")


def check_count(count: Any, what: str) -> int:
    if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {count!r}")
    return int(count)


def check_arrays(arrays: Sequence[np.ndarray], count: int, ndim: int, what: str, *,
                 any_strides: bool = False) -> list[np.ndarray]:
    """`count` NumPy arrays with `ndim` dimensions and one shape: 1-D arrays of any stride (a column of a
    wider array is read in place), 2-D arrays C-contiguous unless `any_strides` (a kernel that indexes
    both axes reads broadcast views, with stride 0, as they are)."""
    if isinstance(arrays, np.ndarray) or len(arrays) != count:
        got = "one array" if isinstance(arrays, np.ndarray) else f"{len(arrays)} arrays"
        raise ValueError(f"{what}: expected a sequence of {count} arrays, got {got}")
    for j, a in enumerate(arrays):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{what}[{j}] must be a NumPy array, got {type(a).__name__}")
        if a.ndim != ndim:
            raise ValueError(f"{what}[{j}] must be {ndim}-D, got shape {a.shape}")
        if ndim > 1 and not any_strides and not a.flags.c_contiguous:
            raise ValueError(f"{what}[{j}] must be C-contiguous (pass np.ascontiguousarray(...)), "
                             f"got strides {a.strides} for shape {a.shape}")
    shapes = [a.shape for a in arrays]
    if any(s != shapes[0] for s in shapes):
        raise ValueError(f"{what}: all arrays must have one shape, got {shapes}")
    return list(arrays)


def outputs(out: Sequence[np.ndarray] | None, dtypes: Sequence[np.dtype], n: int | tuple[int, ...], what: str,
            reads: Sequence[np.ndarray] | dict[int, np.ndarray] = ()) -> tuple:
    """The arrays a kernel fills: new ones of length (or shape) n, or the caller's `out` (any stride: a
    column of a wider array is filled in place), checked against the results' count, shape and dtypes, and
    sharing no memory with `reads`: the arrays a kernel reads at other indices than it writes (a scan reads
    its chunks again after writing them; a gathered table is read at any row), as a sequence or by input
    position."""
    shape = (n,) if isinstance(n, (int, np.integer)) else tuple(n)
    if out is None:
        return tuple(np.empty(shape, d) for d in dtypes)
    if isinstance(out, np.ndarray) or len(out) != len(dtypes):
        raise ValueError(f"{what}: expected {len(dtypes)} output arrays, got {1 if isinstance(out, np.ndarray) else len(out)}")
    for j, (a, d) in enumerate(zip(out, dtypes, strict=True)):
        if not isinstance(a, np.ndarray) or a.shape != shape or a.dtype != d or not a.flags.writeable:
            got = f"shape {a.shape}, dtype {a.dtype}" if isinstance(a, np.ndarray) else type(a).__name__
            raise ValueError(f"{what}[{j}] must be a writeable array of shape {shape} and dtype {d}, got {got}")
        for i, x in (reads.items() if isinstance(reads, dict) else enumerate(reads)):
            if np.shares_memory(a, x):
                raise ValueError(f"{what}[{j}] shares memory with input {i}, which the kernel reads after "
                                 f"writing {what}: pass a separate output array")
    return tuple(out)


def check_scalars(values: Sequence[Any], what: str) -> list:
    """NumPy scalars (0-d values of a numeric or boolean dtype), as NumPy scalars."""
    if isinstance(values, np.ndarray) or not isinstance(values, (tuple, list)):
        raise TypeError(f"{what} must be a sequence of scalars, got {type(values).__name__}")
    out = []
    for j, v in enumerate(values):
        a = np.asarray(v)
        if a.ndim != 0 or a.dtype.kind not in "biuf":
            raise ValueError(f"{what}[{j}] must be a real or boolean scalar, got {v!r} (shape {a.shape}, dtype {a.dtype})")
        out.append(a[()])
    return out


def result_dtypes(fn: Dispatcher, arg_dtypes: Sequence[np.dtype], count: int, what: str) -> list[np.dtype]:
    """Compile `fn` for scalars of `arg_dtypes` and return the dtypes of its `count` results (memoised)."""
    key = (fn, tuple(np.dtype(d) for d in arg_dtypes), count)
    found = _RESULT_DTYPES.get(key)
    if found is None:
        found = _RESULT_DTYPES[key] = _infer_result_dtypes(fn, key[1], count, what)
    return list(found)


def _infer_result_dtypes(fn: Dispatcher, arg_dtypes: tuple, count: int, what: str) -> tuple:
    unsupported = [str(d) for d in arg_dtypes if np.dtype(d).kind not in "biuf" or np.dtype(d).itemsize > 8
                   or np.dtype(d) == np.float16]
    if unsupported:
        raise TypeError(f"{what}: the kernels take boolean, integer, float32 and float64 values, got "
                        f"{', '.join(dict.fromkeys(unsupported))}")
    argtys = tuple(numba.from_dtype(np.dtype(d)) for d in arg_dtypes)
    try:
        fn.compile(argtys)
    except Exception as e:  # a typing error inside the caller's function: say which one and for what
        raise TypeError(f"{what} does not compile for arguments {[str(t) for t in argtys]}: {e}") from e
    ret = fn.overloads[argtys].signature.return_type
    items = list(ret.types) if isinstance(ret, types.BaseTuple) else [ret]
    if len(items) != count:
        raise ValueError(f"{what} must return {count} value(s), "
                         f"got {len(items)} for arguments {[str(t) for t in argtys]}: {ret}")
    try:
        return tuple(np.dtype(as_dtype(t)) for t in items)
    except Exception as e:
        raise TypeError(f"{what} returns {ret}, which is not a tuple of NumPy scalars") from e


def check_combine(combine: Dispatcher, dtypes: Sequence[np.dtype]) -> None:
    """The combine of k leaves takes 2k scalars and returns k, each of a kind its leaf holds: partial
    results are stored in the leaves' dtypes, so a combine whose float result an integer leaf truncates
    would give answers that depend on the chunks (a narrower type of the same kind, as Numba's int64 sum of
    int32 values, is cast back)."""
    found = result_dtypes(combine, list(dtypes) * 2, len(dtypes), "combine")
    for j, (got, leaf) in enumerate(zip(found, dtypes, strict=True)):
        if not np.can_cast(got, leaf, casting="same_kind"):
            raise TypeError(f"combine returns {got} for leaf {j}, whose elements are {np.dtype(leaf)}: the partial "
                            f"results could not be stored (make the leaf {got}, or return {np.dtype(leaf)})")


def carried_dtypes(carry: Sequence[Any] | None, dtypes: Sequence[np.dtype]) -> list[np.dtype]:
    """The dtypes a fold keeps its running values in: `carry` (one per leaf, each the leaf's dtype or a wider
    float for a float leaf), or the leaves' own. A float32 fold carried in float64 rounds each result once
    instead of at every combine: over 10^6 near-equal terms a float32 chain drifts by up to 1e-3 relative."""
    if carry is None:
        return [np.dtype(d) for d in dtypes]
    if isinstance(carry, (str, np.dtype, type)) or len(carry) != len(dtypes):
        raise ValueError(f"carry must be a sequence of {len(dtypes)} dtype(s) (one per leaf), got {carry!r}")
    out = []
    for j, (wide, leaf) in enumerate(zip(carry, dtypes, strict=True)):
        wide, leaf = np.dtype(wide), np.dtype(leaf)
        if wide != leaf and not (leaf.kind == wide.kind == "f" and wide.itemsize > leaf.itemsize):
            raise ValueError(f"carry[{j}] = {wide} cannot carry leaf {j}, whose elements are {leaf}: it must be "
                             f"{leaf} or a wider float")
        out.append(wide)
    return out


def cast_identity(identity: Sequence[Any], dtypes: Sequence[np.dtype]) -> tuple:
    """The identity as NumPy scalars of the element dtypes; a value that does not survive the cast is an error."""
    if not isinstance(identity, (tuple, list)) or len(identity) != len(dtypes):
        raise ValueError(f"identity must be a tuple of {len(dtypes)} scalar(s) (one per leaf), got {identity!r}")
    out = []
    for j, (value, dtype) in enumerate(zip(identity, dtypes, strict=True)):
        if type(value) is dtype.type:  # already a scalar of the element dtype (the backend's case): nothing to cast
            out.append(value)
            continue
        if np.asarray(value).dtype.kind not in "biuf":
            raise ValueError(f"identity[{j}] = {value!r} is not a real or boolean scalar")
        with np.errstate(all="ignore"):
            cast = np.asarray(value).astype(dtype)[()] if np.ndim(value) == 0 else None
        if cast is None or not _same_value(cast, value):
            raise ValueError(f"identity[{j}] = {value!r} does not fit the element dtype {dtype} "
                             f"(cast gives {cast!r})")
        out.append(cast)
    return tuple(out)


def _same_value(cast: Any, value: Any) -> bool:
    if cast == value:
        return True
    return cast.dtype.kind in "fc" and bool(np.isnan(cast)) and bool(np.isnan(np.asarray(value, dtype=float)))


def num_chunks(n: int, chunks: int | None, min_chunk: int = MIN_CHUNK) -> int:
    """How many contiguous chunks to split n >= 1 elements into.

    Default: one per Numba thread, but never chunks smaller than `min_chunk` elements (so small inputs run
    as one chunk). An explicit `chunks` (for tests and tuning) is honoured up to n.
    """
    if chunks is not None:
        return min(check_count(chunks, "chunks"), n)
    if n < 2 * min_chunk:  # one chunk whatever the thread count (asking Numba for it costs a microsecond)
        return 1
    return max(1, min(numba.get_num_threads(), n // min_chunk))


def column_groups(arrays: Sequence[np.ndarray]) -> tuple[list[np.ndarray], tuple[int, ...]]:
    """The 1-D arrays as few arguments as their memory allows: each run of consecutive views of one array
    (one base), of one dtype, length and stride, whose starts are evenly spaced (the columns of one wider
    array, as the backend passes a record's vector leaf) becomes one 2-D view whose rows they are; any
    other array stays itself. Returns the arguments and each one's count of arrays (1: the array itself).
    The grouping depends on how the arrays were made, never on where an allocator happened to put them,
    which would compile the kernel again for each new placement.

    Numba's compile time grows faster than linearly in a function's arguments, and a prange loop's body is
    a function of all it reads; a kernel unpacks the rows again (kernels.cpu.codegen.grouped)."""
    out: list[np.ndarray] = []
    sizes: list[int] = []
    i = 0
    while i < len(arrays):
        first, end = arrays[i], i + 1
        views = end < len(arrays) and first.base is not None and arrays[end].base is first.base
        step = _address(arrays[end]) - _address(first) if views else 0  # (addresses cost a dict each)
        while end < len(arrays) and step != 0 and _is_column_of(arrays[end], first, (end - i) * step):
            end += 1
        if end - i > 1:
            out.append(np.lib.stride_tricks.as_strided(first, shape=(end - i, first.shape[0]),
                                                       strides=(step, first.strides[0]),
                                                       writeable=first.flags.writeable))
        else:
            out.append(first)
        sizes.append(end - i)
        i = end
    return out, tuple(sizes)


def _is_column_of(a: np.ndarray, first: np.ndarray, offset: int) -> bool:
    """Whether 1-D `a` is a view of the array `first` views, `offset` bytes after it, laid out as it is."""
    return (first.ndim == 1 and first.base is not None and a.base is first.base and a.dtype == first.dtype
            and a.shape == first.shape and a.strides == first.strides and _address(a) == _address(first) + offset)


def packed_rows(dtypes: Sequence[np.dtype], length: int) -> tuple[list[np.ndarray], tuple[int, ...]]:
    """New scratch arrays of `length` elements, one per dtype, as a kernel's arguments: the rows of one array
    where the dtypes are all one (fewer arguments, see column_groups). Returns the arguments and the group
    sizes."""
    if len(dtypes) > 1 and len(set(dtypes)) == 1:
        return [np.empty((len(dtypes), length), dtypes[0])], (len(dtypes),)
    return [np.empty(length, d) for d in dtypes], (1,) * len(dtypes)


def packed_values(values: Sequence[Any], dtypes: Sequence[np.dtype]) -> tuple[list[Any], tuple[int, ...]]:
    """Scalars as a kernel's arguments: one array of them where their dtypes are all one (see packed_rows),
    else each itself. Returns the arguments and the group sizes."""
    if len(values) > 1 and len(set(dtypes)) == 1:
        return [np.array(values, dtypes[0])], (len(values),)
    return list(values), (1,) * len(values)


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def check_summing_map(mapper: Any, m: int, k: int, inputs: Sequence[np.ndarray], consts: Sequence[Any]) -> tuple:
    """The arguments of a map that stores k results and sums one more along an axis of its 2-D inputs
    (map_with_row_sums, map_with_column_sums), checked: (inputs, consts, the consts' dtypes, the k + 1
    result dtypes)."""
    check_function(mapper, "mapper")
    m = check_count(m, "m")
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 0:
        raise ValueError(f"k must be an integer >= 0 (the results stored besides the summed one), got {k!r}")
    inputs = check_arrays(inputs, m, 2, "inputs", any_strides=True)
    consts = check_scalars(consts, "consts")
    const_dtypes = [np.asarray(v).dtype for v in consts]
    dtypes = result_dtypes(mapper, const_dtypes + [a.dtype for a in inputs], k + 1, "mapper")
    if dtypes[k].kind not in "iuf":
        raise TypeError(f"the summed (last) result of mapper must be a number, got dtype {dtypes[k]}")
    return inputs, consts, const_dtypes, dtypes
