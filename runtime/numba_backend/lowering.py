"""Which statements the numba backend runs as compiled kernels, and how (kernels/cpu does the work).

A rule returns the statement's outputs, or None to decline — then the numpy implementation runs. Rules
decline, silently, where NumPy already has the fast path (a recognised + reduction, a BLAS product, ...).
Where a kernel was the plan but the statement cannot be compiled (elements that are not scalars, an operator
that captures values, a typing failure), the rule declines with one warning naming the primitive and why.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
import dataclasses
import weakref
from typing import Callable

import numpy as np

import fold
from fold.ir import Program, Var
from fold.primitives import BroadcastTo, Loop, LoopSaving, Map, Reduce, ReduceByIndex, Scan, SumAxes
from fold.recognize import recognize_binary_op
from fold.rules import RuleTable

from fold.runtime.interpreter import numpy_impls
from fold.runtime.numpy_impl.control import _map as batched_map

from .captured_operands import capture_problem, carrying, carrying_args, same_for_every_fold
from .codegen import compile_problem, compile_scalar_program, is_scalar_program
from .compile_clock import compile_seconds_so_far
from ..wide_operators import carried_operator
from .wide_folds import wide_add, widen, widens

numba_impls = RuleTable("numba backend")
_warned: set[tuple[str, str, str]] = set()


def decline(prim, reason: str, backend: str = "numba") -> None:
    """None, after warning once per (backend, primitive, reason) that the statement runs on the numpy backend."""
    key = (backend, prim.name, reason)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"{backend} backend: {prim.name} runs on the numpy backend ({reason})", stacklevel=2)
    return None


def per_statement(memo: "weakref.WeakKeyDictionary", prim, make: Callable):
    """make(prim), computed once per statement (primitive) while it lives: what a rule derives from the
    statement alone, not from its arguments, costs microseconds that a small call would pay every time."""
    found = memo.get(prim)
    if found is None:
        found = memo[prim] = make(prim)
    return found


_SCALAR_OPERATORS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _scalar_operator(prim):
    """(the operator compiled as a function of its elements' scalar components, the kernels' `carry`, None),
    or (None, None, the reason it cannot be). Float32 leaves are folded in float64 (wide_folds.py): the
    operator is then compiled on float64 running values, and `carry` says so; otherwise it is None."""
    return per_statement(_SCALAR_OPERATORS, prim, _make_scalar_operator)


def _make_scalar_operator(prim):
    if prim.num_consts:
        return None, None, capture_problem(prim) or "its operator captures values"
    problem = compile_problem(prim.body)
    if problem is not None:
        return None, None, f"its operator cannot be compiled: {problem}"
    components = [v.aval.dtype for v in prim.body.inputs[: prim.num_leaves] for _ in range(components_of(v.aval.shape))]
    body, carry = carried_operator(prim.body, prim.num_consts, components)
    try:
        return compile_scalar_program(body), carry, None
    except Exception as err:  # noqa: BLE001 - any compile failure means: use the reference implementation
        return None, None, f"its operator does not compile: {type(err).__name__}"


def with_captures_as_operands(deepest: int, backend: str = "numba") -> Callable[[Callable], Callable]:
    """A fold's rule (which runs kernels for statements up to `deepest` maps deep) that also runs folds whose
    operator captures a few values, as folds whose elements carry them (captured_operands.py); their
    carried results are dropped. `backend` names the backend in its warning."""
    def wrap(rule: Callable) -> Callable:
        @functools.wraps(rule)
        def lowered(prim, args: list, depth: int):
            if not prim.num_consts or depth > deepest or capture_problem(prim) is not None:
                return rule(prim, args, depth)
            if not same_for_every_fold(prim, args):
                return decline(prim, "its operator captures a value that differs from row to row", backend)
            outs = rule(carrying(prim), carrying_args(prim, args, depth), depth)
            return None if outs is None else outs[: prim.num_leaves]

        return lowered

    return wrap


def _element_shapes(prim) -> list[tuple[int, ...]]:
    return [v.aval.shape for v in prim.body.inputs[: prim.num_leaves]]


def _identity(identity: list[np.ndarray], shapes: list[tuple]) -> tuple | None:
    """The identity's scalar components (NumPy scalars of its dtype, which the kernels take as they are), or
    None if it differs from row to row (an identity inside a map)."""
    parts = []
    for e, shape in zip(identity, shapes, strict=True):
        if e.ndim == 0 and shape == ():  # a scalar identity outside any map: the common case, made cheap
            parts.append(e[()])
            continue
        batch = e.shape[: e.ndim - len(shape)]
        if any(b != 1 for b in batch):
            return None
        parts += list(e.reshape(-1))
    return tuple(parts)


def _split(leaves: list[np.ndarray], shapes: list[tuple], lead: int) -> list[np.ndarray]:
    """Each leaf (lead dims + element shape) as its element's scalar components. Large 1-D inputs are passed
    as views (columns, read in place by the kernels); small ones, and the segmented kernel's 2-D rows, as
    contiguous copies, which cost little and keep one compiled layout for all of them."""
    out = []
    for x, shape in zip(leaves, shapes, strict=True):
        in_place = lead == 1 and x.ndim >= 1 and worth_compiling(x.shape[0])
        flat = x.reshape(x.shape[:lead] + (components_of(shape),))  # explicit: the lead dims may be empty
        columns = [x] if shape == () else [flat[..., c] for c in range(flat.shape[-1])]
        out += columns if in_place else [np.ascontiguousarray(c) for c in columns]
    return out


def _allocate(n: int, avals: list) -> tuple[list[np.ndarray], Callable[[], list[np.ndarray]]]:
    """Arrays for a kernel to fill with the scalar components of n elements of these avals, and the function
    that returns the leaves once filled: large outputs are filled in place as columns of the leaves, small
    ones as contiguous arrays joined afterwards (one compiled layout, as in `_split`)."""
    if not worth_compiling(n):
        columns = [np.empty(n, a.dtype) for a in avals for _ in range(components_of(a.shape))]
        return columns, lambda: _join(columns, [a.shape for a in avals])
    leaves = [np.empty((n,) + a.shape, a.dtype) for a in avals]
    return [column for leaf, a in zip(leaves, avals, strict=True) for column in _split([leaf], [a.shape], 1)], lambda: leaves


def _join(parts: list, shapes: list[tuple]) -> list[np.ndarray]:
    """The inverse of `_split` on results: component arrays (or scalars) back into leaves of the element shapes."""
    out, pos = [], 0
    for shape in shapes:
        c = components_of(shape)
        group = [np.asarray(v) for v in parts[pos: pos + c]]
        pos += c
        out.append(group[0] if shape == () else np.stack(group, axis=-1).reshape(group[0].shape + shape))
    return out


def _joined(parts, shapes: list[tuple]) -> list[np.ndarray] | None:
    return None if parts is None else _join(list(parts), shapes)


def components_of(shape: tuple) -> int:
    return math.prod(int(s) for s in shape)


def run_kernel(prim, kernel: str, *args, **kwargs):
    """fold.kernels.cpu.<kernel>(*args), or None after declining with a warning if Numba cannot compile it (without
    one if the driver rejects indices)."""
    try:
        return getattr(_kernels(), kernel)(*args, **kwargs)
    except IndexError:  # indices a driver rejects (a gathered row out of range): the reference runs and names them
        return None
    except Exception as err:  # noqa: BLE001 - a kernel that does not compile: the reference implementation runs
        return decline(prim, f"its kernel does not compile: {type(err).__name__}: {str(err).splitlines()[0][:200]}")


def _contiguous(xs) -> list[np.ndarray]:
    return [np.ascontiguousarray(x) for x in xs]


def _kernels():
    from fold.kernels import cpu

    return cpu


def _operator_and_identity(prim, args: list):
    """(compiled operator, identity scalars, carry: see _scalar_operator), or None after declining (with a
    warning if a kernel was the plan)."""
    combine, carry, why = _scalar_operator(prim)
    if combine is None:
        return decline(prim, why)
    ident = _identity(args[prim.num_consts: prim.num_consts + prim.num_leaves], _element_shapes(prim))
    return None if ident is None else (combine, ident, carry)


# Recognised reductions NumPy runs on one thread, which a parallel kernel beats on large inputs without
# changing the answer beyond rounding (+ stays with NumPy's pairwise summation, which is also more accurate).
_PARALLEL_RECOGNISED = ("mul", "maximum", "minimum", "logaddexp")


def _parallel_beats_numpy(op: str, args: list, depth: int) -> bool:
    """At the top level a 1-D fold; one map deep a fold of each row of a matrix (the segmented kernel: no
    logaddexp there). NumPy's reduction runs on one thread: the kernels win where they use two or more."""
    x = args[-1]
    if op not in _PARALLEL_RECOGNISED or x.ndim != depth + 1 or x.size == 0 or depth > 1:
        return False
    if depth and op == "logaddexp":
        return False
    return (op != "logaddexp" or x.dtype == np.float64) and _kernels().host.num_chunks(x.size, None) > 1


def is_commutative(prim: Reduce) -> bool:
    """Whether a reduce's operator is commutative, so a kernel may fold its elements in any order: its monoid
    says so, or it is a recognised operator (+, *, maximum, minimum, logaddexp: commutative in IEEE arithmetic)."""
    return bool(getattr(prim.monoid, "commutative", False)) or recognize_binary_op(prim.body, prim.num_consts) is not None


def fold_options(prim: Reduce) -> dict:
    """What a fold kernel may assume of a reduce's operator: `commutative` (see is_commutative), and
    `operator`, the name of a recognised operation the kernel writes inline and vectorises (+ and *)."""
    return dict(per_statement(_FOLD_OPTIONS, prim, _make_fold_options))


_FOLD_OPTIONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _make_fold_options(prim: Reduce) -> dict:
    from fold.kernels.cpu.reduce import INLINE_OPERATORS

    op = recognize_binary_op(prim.body, prim.num_consts)
    return {"commutative": is_commutative(prim), "operator": op if op in INLINE_OPERATORS else None}


@numba_impls.register(Reduce)
@with_captures_as_operands(deepest=1)
def _reduce(prim: Reduce, args: list, depth: int):
    op = recognize_binary_op(prim.body, prim.num_consts)
    if depth > 1 or (op is not None and not _parallel_beats_numpy(op, args, depth)):
        return None  # NumPy's own reduction is the fast path
    if op == "logaddexp":
        total = run_kernel(prim, "logsumexp", args[-1])
        return None if total is None else [np.asarray(total)]
    setup = _operator_and_identity(prim, args)
    if setup is None:
        return None
    combine, ident, carry = setup
    shapes, k = _element_shapes(prim), len(ident)
    xs = args[prim.num_consts + prim.num_leaves:]
    if depth == 0:
        return _joined(run_kernel(prim, "reduce", combine, k, ident, _split(xs, shapes, 1), carry=carry,
                                  **fold_options(prim)), shapes)
    rows = np.broadcast_shapes(*[x.shape[:1] for x in xs])[0]  # a reduce inside a map: one fold per row
    full = [np.broadcast_to(x, (rows,) + x.shape[1:]) for x in xs]
    return _joined(run_kernel(prim, "segmented_reduce", None, combine, k, ident, _split(full, shapes, 2),
                              commutative=is_commutative(prim), carry=carry), shapes)


@numba_impls.register(SumAxes)
def _sum(prim: SumAxes, args: list, depth: int):
    """The sum of a C-contiguous float matrix over one axis, where a kernel uses two or more threads
    (NumPy's sums run on one): its row sums (the segmented kernel) for the last axis, or one map deep for a
    vector's sum; at the top level its column sums (a gradient's sum over a batch)."""
    (x,) = args
    axis = depth + prim.axes[0] if len(prim.axes) == 1 else None
    if (depth > 1 or axis is None or x.ndim != 2 or x.dtype.kind != "f" or not x.flags.c_contiguous
            or _kernels().host.num_chunks(x.size, None) < 2):
        return None
    if axis == 0:
        sums = run_kernel(prim, "column_sums", x)
        return None if sums is None else [sums]
    if widens("add", x.dtype):  # float32 row sums: summed in float64 (wide_folds.py)
        rows = run_kernel(prim, "segmented_reduce", widen(x.dtype), wide_add(), 1, (0.0,), [x], commutative=True)
        return None if rows is None else [rows[0].astype(x.dtype)]
    combine = compile_scalar_program(sum_reduce_program(x.dtype).stmts[0].prim.body)
    rows = run_kernel(prim, "segmented_reduce", None, combine, 1, (0.0,), [x], commutative=True)
    return None if rows is None else [rows[0]]


def sum_reduce_program(dtype: np.dtype) -> Program:
    """reduce(monoids.sum) of a vector of this dtype, traced once per dtype: one statement, whose operator
    the kernels compile."""
    if dtype not in _SUM_REDUCES:
        _SUM_REDUCES[dtype] = fold.trace(lambda v: fold.reduce(fold.monoids.sum, v), np.zeros(2, dtype))
    return _SUM_REDUCES[dtype]


_SUM_REDUCES: dict[np.dtype, Program] = {}


@numba_impls.register(Scan)
@with_captures_as_operands(deepest=0)
def _scan(prim: Scan, args: list, depth: int):
    """The scan kernel, at the top level. A recognised + (a cumulative sum) below COMPILE_FROM elements stays
    with NumPy's cumsum; above, the kernel runs on every thread (10^7 float64: 11 ms against cumsum's 33-41,
    float32 carried in float64 14 ms against 61 for NumPy's accumulate in float64)."""
    if depth or (recognize_binary_op(prim.body, prim.num_consts) == "add"
                 and not worth_compiling(args[-1].shape[0])):
        return None
    setup = _operator_and_identity(prim, args)
    if setup is None:
        return None
    combine, ident, carry = setup
    xs = args[prim.num_consts + prim.num_leaves:]
    columns, leaves = _allocate(xs[0].shape[0], [v.aval for v in prim.body.inputs[prim.num_consts: prim.num_consts + prim.num_leaves]])
    done = run_kernel(prim, "scan", combine, len(ident), ident, _split(xs, _element_shapes(prim), 1),
                      exclusive=prim.exclusive, reverse=prim.reverse, out=columns, carry=carry)
    return None if done is None else leaves()


@numba_impls.register(ReduceByIndex)
@with_captures_as_operands(deepest=0)
def _reduce_by_index(prim: ReduceByIndex, args: list, depth: int):
    setup = None if depth else _operator_and_identity(prim, args)
    if setup is None:
        return None
    combine, ident, carry = setup
    shapes, k = _element_shapes(prim), prim.num_leaves
    indices = np.ascontiguousarray(args[prim.num_consts + k], dtype=np.int64)
    values = _split(args[prim.num_consts + k + 1:], shapes, 1)
    return _joined(run_kernel(prim, "histogram", combine, len(ident), ident, prim.n, indices, values, carry=carry),
                   shapes)


def map_inputs(prim: Map, args: list) -> list[np.ndarray] | None:
    """The map's operands as 1-d contiguous arrays (captured scalars repeated), or None if it is no 1-d map."""
    consts, xs = args[: prim.num_consts], args[prim.num_consts:]
    if any(x.ndim != 1 for x in xs) or any(c.size != 1 for c in consts):
        return None
    n = xs[0].shape[0]
    return [np.full(n, c.reshape(()), dtype=c.dtype) for c in consts] + _contiguous(xs)


def worth_compiling(n: int) -> bool:
    """Whether n rows are enough work to repay compiling a kernel for a lambda that NumPy already runs batched
    (vector bodies, fused AD patterns): below this, compiling costs more than it could ever save in one call."""
    return n >= COMPILE_FROM


# 2 * kernels.cpu.host.MIN_CHUNK: where the kernels start to use two threads.
COMPILE_FROM = 1 << 15

# Seconds a statement may spend in its NumPy reference, summed over the calls of this process, before it is
# compiled although it is small (see reference_until_hot).
TIER_UP_SECONDS = 0.25

_reference_seconds: "weakref.WeakKeyDictionary[object, float]" = weakref.WeakKeyDictionary()


def reference_until_hot(prim, args: list, depth: int) -> list | None:
    """For a statement below COMPILE_FROM elements whose reference is much slower than its kernel (a scan
    on NumPy takes log2(n) batched steps): the reference's results, timed, until this statement has spent
    TIER_UP_SECONDS in it; then None, and the caller compiles its kernel. Compiling takes a second or
    more, so a statement called a few times (a one-off gradient, a test) stays on NumPy, and one called
    in a loop is compiled once it has cost that much: at a thousand elements, after about 200 calls of a
    pairwise reduce's gradient, which then runs 10x faster."""
    spent = _reference_seconds.get(prim, 0.0)
    if spent >= TIER_UP_SECONDS:
        return None
    start, compiling = time.perf_counter(), compile_seconds_so_far()
    outs = numpy_impls.lookup(prim)(prim, args, depth)
    # not the kernels its statements compiled on the way (the scan inside a fused map_scan's reference)
    _reference_seconds[prim] = spent + time.perf_counter() - start - (compile_seconds_so_far() - compiling)
    return outs


def _batched(prim: Map, args: list) -> list:
    """The map evaluated as on numpy (its body once, on arrays with a batch dimension), the body prepared by
    the backend's fusions: the elementwise runs of a body that captures a large value (k-means' distances
    to every centroid) become kernels over (rows, components). A body whose values are much wider than
    its results runs on blocks of rows, so that those values stay in cache (see `block_rows`)."""
    from .passes import prepare  # here: the passes' modules import this one's rule table

    body = prepare(prim.body)
    consts, xs = args[: prim.num_consts], args[prim.num_consts:]
    n = xs[0].shape[0] if xs else 0
    rows = block_rows(body, prim.num_consts, n)
    if rows >= n:
        return batched_map(prim, args, 0, body=body)
    outs: list[np.ndarray] = []
    for lo in range(0, n, rows):
        block = batched_map(prim, list(consts) + [x[lo: lo + rows] for x in xs], 0, body=body)
        if not outs:
            outs = [np.empty((n,) + b.shape[1:], b.dtype) for b in block]
        for out, b in zip(outs, block, strict=True):
            out[lo: lo + rows] = b
    return outs


def block_rows(body: Program, num_consts: int, n: int) -> int:
    """How many of the n rows a batched map body runs on at once: all of them, unless its widest value per
    row is at least WIDENING times its results per row and n rows of it would not fit BLOCK_BYTES (then
    as many as fit, at least MIN_BLOCK_ROWS). k-means' distances to 64 centroids, then their minimum: the
    (n, 64) products and distances are never written to memory. Values computed from the captured ones
    alone (a transposed weight matrix) are the same for every row, held once, and broadcasts are views:
    neither counts."""
    widest, results = _row_widths(body, num_consts)
    if widest * n <= 2 * BLOCK_BYTES or widest < WIDENING * results:
        return max(n, 1)
    return max(MIN_BLOCK_ROWS, BLOCK_BYTES // widest)


def _row_widths(body: Program, num_consts: int) -> tuple[int, int]:
    """(bytes per row of the body's widest value that varies with the row, bytes per row of its results, at
    least 1); memoised, since a blocked map asks once per call."""
    per_body = _widths.setdefault(body, {})
    found = per_body.get(num_consts)
    if found is None:
        varying = set(body.inputs[num_consts:])
        for stmt in body.stmts:
            if any(isinstance(a, Var) and a in varying for a in stmt.args):
                varying.update(stmt.outs)
        widest = max((o.aval.nbytes for stmt in body.stmts for o in stmt.outs
                      if o in varying and not isinstance(stmt.prim, BroadcastTo)), default=0)
        found = per_body[num_consts] = (widest, max(sum(a.nbytes for a in body.out_avals), 1))
    return found


_widths: "weakref.WeakKeyDictionary[Program, dict[int, tuple[int, int]]]" = weakref.WeakKeyDictionary()


# Measured on k-means' cost (10^6 points, 64 centroids, 2 cores): blocks of 8 MiB of the widest value
# (16384 rows) ran its body in 96 ms against 112 ms unblocked; 4096 rows paid more in per-block overhead.
BLOCK_BYTES = 8 << 20
MIN_BLOCK_ROWS = 4096
WIDENING = 4


def _passes_through(prim: Map) -> bool:
    """Whether the map's body has no statements and returns only elements it was given (not consts)."""
    if prim.body.stmts:
        return False
    elements = set(prim.body.inputs[prim.num_consts:])
    return all(isinstance(o, Var) and o in elements for o in prim.body.outputs)


@numba_impls.register(Loop, LoopSaving)
def _loop(prim: Loop | LoopSaving, args: list, depth: int):
    """A fold.loop at the top level (and the forward loop of its gradient, which saves states), its body
    prepared by the backend's fusions as a program on arrays of its own shapes: an elementwise step over a
    large state (Horner's rule on 10^6 points) runs as one kernel per iteration, where each of its
    statements was a NumPy pass writing a new array (16 steps: 22 -> 13 ms)."""
    if depth:
        return None
    from .passes import prepare  # here: the passes' modules import this one's rule table

    prepared = dataclasses.replace(prim, body=prepare(prim.body, whole_arrays=True))
    return numpy_impls.get(prepared)(prepared, args, depth)


@numba_impls.register(Map)
def _map(prim: Map, args: list, depth: int):
    """A map whose body can be written as a scalar function: one compiled loop over the rows, elements with
    vector fields passed as their scalar components and captured values as scalars. Maps with vector
    bodies are compiled only from COMPILE_FROM rows; bodies that cannot be written so run batched, with
    the backend's fusions applied to them. A body that returns its own element arguments computes nothing:
    the numpy backend's rule passes those arrays through (gemm_map_reduce's identity row and column maps)."""
    if depth or _passes_through(prim):
        return None
    if compile_problem(prim.body) is not None:
        return _batched(prim, args)
    consts, xs = args[: prim.num_consts], args[prim.num_consts:]
    shapes = [v.aval.shape for v in prim.body.inputs[prim.num_consts:]]
    if not xs or xs[0].shape[0] == 0 or any(x.shape[1:] != s for x, s in zip(xs, shapes, strict=True)):
        return None
    if not is_scalar_program(prim.body) and not worth_compiling(xs[0].shape[0]):
        return None
    scalars = [v for c in consts for v in np.asarray(c).reshape(-1)]
    inputs = _split(xs, shapes, 1)
    columns, leaves = _allocate(xs[0].shape[0], list(prim.body.out_avals))
    if not inputs or not columns:  # elements or results of no scalars (zero-width rows): nothing to compile
        return None
    try:
        mapper = compile_scalar_program(prim.body)
    except Exception as err:  # noqa: BLE001
        return decline(prim, f"its body does not compile: {type(err).__name__}")
    done = run_kernel(prim, "map", mapper, len(inputs), len(columns), inputs, consts=scalars, out=columns)
    return None if done is None else leaves()
