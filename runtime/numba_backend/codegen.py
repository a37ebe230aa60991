"""Lambdas (map bodies, reduce and scan operators, monoid operators) to Numba-compiled scalar functions,
via generated source.

A lambda whose values all have small static shapes is written as a straight-line function of scalars: every
value of shape s becomes prod(s) scalar variables (row-major), kept during generation in an object array of
their names, so that broadcasting, reshapes, transposes, static indexing and concatenation are NumPy's own
operations on those arrays, and elementwise math, matrix products and sums expand into scalar statements.
An element with vector fields (a 2 x 2 matrix, a vector of D sums) is then so many scalar leaves. A map,
reduce or scan inside the lambda runs over a static axis, so it is unrolled: its body is written once per
row. Lambdas with anything else (gathers, more than MAX_COMPONENTS scalars in one value, more than
MAX_STATEMENTS scalar statements once unrolled) cannot be written so; `compile_problem` says why, and the
backend keeps the numpy implementation for them.
"""

from __future__ import annotations

import math
import os
import re
import weakref
from typing import Callable

import numpy as np

from fold.ir import Let, Lit, Program, Var
from fold.primitives import (BroadcastTo, Concatenate, Convert, Elementwise, Iota, Map, MatMul, Reduce, Reshape, Scan,
                             StaticIndex, StopGradient, SumAxes, Transpose)
from fold.kernels.cpu import lanes, simd, vector_math
from fold.kernels.cpu.modules import file_digest, load_module
from fold.runtime.loops.scalar_language import COMPARISONS, TEMPLATES
from fold.runtime.numpy_impl.structural import index_key

from . import scalar_helpers

_TEMPLATES = TEMPLATES


MAX_COMPONENTS = 64
# Nested combinators are unrolled only over short axes (a long row is the segmented kernels' job), and a
# function of more statements than this takes Numba too long to compile.
MAX_UNROLLED_ROWS = 16
MAX_STATEMENTS = 1024
# A kernel calls an operator of k-leaf elements with 2k scalars; CPython compiles a call of more than 30
# arguments into a *args call, which Numba's inline="always" cannot inline: such a lambda is an ordinary call.
MAX_INLINED_PARAMETERS = 30
# A lane form is its program written once per lane and inlined at every call site: lambdas of more parameters
# (a monoid of many leaves) got none while each lane was a parameter of its own (4 x 7 <= 30), and giving
# them one (lanes passed as tuples) made the suite's slowest monoid check take 77 s to compile.
MAX_LANE_PARAMETERS = 7
# Numba inlines a function at its IR level, once per call site, before typing it: a kernel calling an
# operator at many sites (scan_pair_map's interleaved segments: 18) compiles its body that many times. A
# larger function is an ordinary call, which LLVM may still inline, at a fraction of the compile time.
MAX_INLINED_STATEMENTS = int(os.environ.get("FOLD_MAX_INLINED_STATEMENTS", "48"))
_COMPARISONS = COMPARISONS


def compile_problem(program: Program) -> str | None:
    """Why `program_source` cannot write this lambda as a scalar function (None: it can). Memoised per
    Program: the backend asks for every statement of every call."""
    if program not in _problems:
        _problems[program] = _find_problem(program)
    return _problems[program]


def _find_problem(program: Program) -> str | None:
    unsupported = sorted({stmt.prim.name for p in _programs(program) for stmt in p.stmts if type(stmt.prim) not in _EXPANSIONS})
    if unsupported:
        return f"it uses {', '.join(unsupported)}"
    large = next((v.aval.shape for p in _programs(program) for v in _values(p) if components(v.aval) > MAX_COMPONENTS), None)
    if large is not None:
        return f"it holds a value of shape {large}, more than {MAX_COMPONENTS} scalars"
    if any(_integer_power_may_be_negative(stmt) for p in _programs(program) for stmt in p.stmts):
        return "it raises integers to powers that may be negative (NumPy refuses them, a compiled ** would give 0)"
    rows = [stmt.args[-1].aval.shape[0] for p in _programs(program) for stmt in p.stmts if isinstance(stmt.prim, _COMBINATORS)]
    if 0 in rows:
        return "it nests a combinator over 0 rows"
    long_rows = max(rows, default=0)
    if long_rows > MAX_UNROLLED_ROWS:
        return f"it nests a combinator over {long_rows} rows (at most {MAX_UNROLLED_ROWS} are unrolled)"
    count = _statements(program)
    return None if count <= MAX_STATEMENTS else f"it unrolls to {count} scalar statements, more than {MAX_STATEMENTS}"


def _integer_power_may_be_negative(stmt: Let) -> bool:
    if not (isinstance(stmt.prim, Elementwise) and stmt.prim.op == "pow"):
        return False
    base, exponent = stmt.args
    if not all(np.dtype(a.aval.dtype).kind in "iub" for a in (base, exponent)):
        return False
    return not (isinstance(exponent, Lit) and bool(np.all(np.asarray(exponent.value) >= 0)))


def _programs(program: Program) -> list[Program]:
    """The program and every body nested in it."""
    return [program] + [p for stmt in program.stmts for body in stmt.prim.bodies() for p in _programs(body)]


def _values(program: Program) -> list:
    return list(program.inputs) + [v for stmt in program.stmts for v in stmt.outs] + list(program.outputs)


def _statements(program: Program) -> int:
    """About how many scalar statements the program is written as, nested combinators unrolled."""
    total = 0
    for stmt in program.stmts:
        if isinstance(stmt.prim, _COMBINATORS):
            rows = stmt.args[-1].aval.shape[0]
            total += rows * _statements(stmt.prim.body) + sum(components(v.aval) for v in stmt.outs)
        else:
            total += sum(components(v.aval) for v in stmt.outs)
    return total


def is_scalar_program(program: Program) -> bool:
    """Only 0-d values: a function of scalars with no component expansion at all."""
    return compile_problem(program) is None and all(v.aval.shape == () for v in _values(program))


def components(aval) -> int:
    """How many scalars a value of this aval is written as."""
    return aval.size


def _literal(value) -> str:
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, float) and not math.isfinite(value):
        return "math.nan" if math.isnan(value) else ("math.inf" if value > 0 else "-math.inf")
    return repr(value)


def _lit_names(lit: Lit) -> np.ndarray:
    dtype = lit.value.dtype
    wrap = (lambda v: f"np.{dtype.name}({_literal(v)})") if dtype.kind in "fiu" else (lambda v: repr(bool(v)))
    return np.vectorize(wrap, otypes=[object])(lit.value) if lit.value.shape else np.array(wrap(lit.value[()]), dtype=object)


class _Writer:
    """Generates the statements of one function; `emit` names a new scalar and returns its name.

    A statement may carry a vector form, ((operation, dtype), argument names): in the function's lane form
    (_lane_source) it is then written with a rule of LANE_RULES instead of once per lane."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.statements: list[tuple[str, str, tuple[tuple[str, str], tuple[str, ...]] | None]] = []
        self.count = 0

    def emit(self, expr: str, vector: tuple[tuple[str, str], tuple[str, ...]] | None = None) -> str:
        name = f"t{self.count}"
        self.count += 1
        self.lines.append(f"    {name} = {expr}")
        self.statements.append((name, expr, vector))
        return name

    def elementwise(self, fn, arrays: list[np.ndarray], shape: tuple, vector_op: tuple[str, str] | None = None) -> np.ndarray:
        arrays = [np.broadcast_to(a, shape) for a in arrays]
        out = np.empty(shape, dtype=object)
        for index in np.ndindex(*shape):
            args = tuple(str(a[index]) for a in arrays)
            out[index] = self.emit(fn(*args), None if vector_op is None else (vector_op, args))
        return out

    def total(self, terms: list[str], dtype: np.dtype) -> str:
        if not terms:
            return self.emit(f"np.{dtype.name}(0)")
        acc = terms[0]
        for term in terms[1:]:
            acc = self.emit(f"np.{dtype.name}({acc} + {term})")
        return acc if len(terms) > 1 else self.emit(f"np.{dtype.name}({acc})")


def _elementwise(writer: _Writer, prim, args: list[np.ndarray], out) -> np.ndarray:
    template = _TEMPLATES[prim.op]
    wrap = (lambda e: e) if prim.op in _COMPARISONS else (lambda e: f"np.{out.dtype.name}({e})")
    vector_op = (prim.op, out.dtype.name) if (prim.op, out.dtype.name) in LANE_RULES else None
    return writer.elementwise(lambda *xs: wrap(template.format(*xs)), args, out.shape, vector_op)


# The lane form of a statement: WIDTH lanes of a transcendental in one call of kernels.cpu.vector_math.
# (operation, result dtype) -> (the result's name in each lane, each argument's names in each lane) ->
# lines. Each rule computes what the scalar template computes (scalar_helpers' _sigmoid and _logaddexp,
# with the same branches, taken per lane after the vector calls). float32 has the plain functions only
# (the helpers compute in float64 and round).
def _vector_call(op: str, targets: list[str], lanes: list[str], dtype: str = "float64") -> str:
    function = vector_math.function_name(op, dtype, len(lanes))
    return f"{', '.join(targets)} = {function}({', '.join(f'np.{dtype}({x})' for x in lanes)})"


def _plain_rule(op: str, dtype: str):
    return lambda targets, args: [_vector_call(op, targets, args[0], dtype)]


def _sigmoid_lanes(targets: list[str], args: list[list[str]]) -> list[str]:
    (x,) = args
    u, e = [f"{t}_u" for t in targets], [f"{t}_e" for t in targets]
    return ([f"{ul} = -abs(np.float64({xl}))" for ul, xl in zip(u, x)] + [_vector_call("exp", e, u)]
            + [f"{t} = (1.0 / (1.0 + {el})) if {xl} >= 0 else ({el} / (1.0 + {el}))" for t, el, xl in zip(targets, e, x)])


def _logaddexp_lanes(targets: list[str], args: list[list[str]]) -> list[str]:
    a, b = args
    hi, d, e, g = ([f"{t}_{suffix}" for t in targets] for suffix in "hdeg")
    return ([f"{h} = np.float64({al}) if {al} >= {bl} else np.float64({bl})" for h, al, bl in zip(hi, a, b)]
            + [f"{dl} = -abs(np.float64({al}) - np.float64({bl}))" for dl, al, bl in zip(d, a, b)]
            + [_vector_call("exp", e, d), _vector_call("log1p", g, e)]
            + [f"{t} = np.float64({al}) + {scalar_helpers.LOG2!r} if {al} == {bl} else ({h} if {h} == -math.inf else {h} + {gl})"
               for t, h, gl, al, bl in zip(targets, hi, g, a, b)])


LANE_RULES = {
    **{(op, dtype): _plain_rule(op, dtype) for op in vector_math.OPERATIONS for dtype in ("float64", "float32")},
    ("sigmoid", "float64"): _sigmoid_lanes,
    ("logaddexp", "float64"): _logaddexp_lanes,
}


def _matmul(writer: _Writer, prim, args: list[np.ndarray], out) -> np.ndarray:
    a, b = args
    names = np.empty(out.shape, dtype=object)
    for i, j in np.ndindex(*out.shape):
        terms = [writer.emit(f"np.{out.dtype.name}({a[i, k]} * {b[k, j]})") for k in range(a.shape[1])]
        names[i, j] = writer.total(terms, out.dtype)
    return names


def _sum_axes(writer: _Writer, prim, args: list[np.ndarray], out) -> np.ndarray:
    (x,) = args
    kept = [ax for ax in range(x.ndim) if ax not in prim.axes]
    moved = x.transpose(kept + list(prim.axes)).reshape(tuple(x.shape[a] for a in kept) + (-1,))
    names = np.empty(out.shape, dtype=object)
    for index in np.ndindex(*out.shape):
        names[index] = writer.total(list(moved[index]), out.dtype)
    return names


def _row(x: np.ndarray, i: int) -> np.ndarray:
    return np.asarray(x[i], dtype=object)


def _stack(rows: list[np.ndarray], shape: tuple) -> np.ndarray:
    return np.stack(rows) if rows else np.empty((0,) + shape, dtype=object)


def _map(writer: _Writer, prim: Map, args: list[np.ndarray], out) -> list[np.ndarray]:
    consts, xs = args[: prim.num_consts], args[prim.num_consts:]
    rows = [expand_program(writer, prim.body, consts + [_row(x, i) for x in xs]) for i in range(xs[0].shape[0])]
    return [_stack([r[j] for r in rows], aval.shape) for j, aval in enumerate(prim.body.out_avals)]


def _fold_rows(writer: _Writer, prim, args: list[np.ndarray], order, scanned: bool):
    """The operator folded over the rows in `order` from the identity: (final accumulator, accumulator per row)."""
    nc, k = prim.num_consts, prim.num_leaves
    consts, acc, xs = args[:nc], args[nc: nc + k], args[nc + k:]
    before, after = {}, {}
    for i in order:
        before[i] = acc
        x = [_row(a, i) for a in xs]
        acc = expand_program(writer, prim.body, consts + (x + acc if scanned and prim.reverse else acc + x))
        after[i] = acc
    return acc, before, after


def _reduce(writer: _Writer, prim: Reduce, args: list[np.ndarray], out) -> list[np.ndarray]:
    acc, _, _ = _fold_rows(writer, prim, args, range(args[-1].shape[0]), scanned=False)
    return acc


def _scan(writer: _Writer, prim: Scan, args: list[np.ndarray], out) -> list[np.ndarray]:
    n = args[-1].shape[0]
    _, before, after = _fold_rows(writer, prim, args, range(n - 1, -1, -1) if prim.reverse else range(n), scanned=True)
    per_row = before if prim.exclusive else after
    return [_stack([per_row[i][j] for i in range(n)], aval.shape) for j, aval in enumerate(prim.body.out_avals)]


# primitive -> (writer, prim, argument name arrays, first output's aval) -> the output's name array (a list
# of them for the combinators, which have several). Structural primitives are NumPy's own operations on the
# arrays of names; they emit no statement. Combinators inside a lambda are unrolled over their static rows.
_EXPANSIONS = {
    Elementwise: _elementwise,
    Convert: lambda w, prim, args, out: w.elementwise(lambda x: f"np.{out.dtype.name}({x})", args, out.shape),
    Iota: lambda w, prim, args, out: np.array([f"np.{out.dtype.name}({i})" for i in range(prim.n)], dtype=object),
    MatMul: _matmul,
    SumAxes: _sum_axes,
    BroadcastTo: lambda w, prim, args, out: np.broadcast_to(args[0], prim.shape),
    Reshape: lambda w, prim, args, out: args[0].reshape(prim.shape),
    Transpose: lambda w, prim, args, out: args[0].transpose(prim.perm),
    StopGradient: lambda w, prim, args, out: args[0],  # the value itself: only differentiation treats it apart
    StaticIndex: lambda w, prim, args, out: np.asarray(args[0][index_key(prim.index)], dtype=object),
    Concatenate: lambda w, prim, args, out: np.concatenate(args, axis=prim.axis),
    Map: _map,
    Reduce: _reduce,
    Scan: _scan,
}
_COMBINATORS = (Map, Reduce, Scan)


def expand_program(writer: _Writer, program: Program, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Write the program's statements with `writer`, its inputs being the given arrays of scalar names;
    returns the arrays of names of its outputs."""
    env: dict[Var, np.ndarray] = dict(zip(program.inputs, inputs, strict=True))

    def names_of(atom) -> np.ndarray:
        return _lit_names(atom) if isinstance(atom, Lit) else env[atom]

    for stmt in program.stmts:
        result = _EXPANSIONS[type(stmt.prim)](writer, stmt.prim, [names_of(a) for a in stmt.args], stmt.outs[0].aval)
        env.update(zip(stmt.outs, result if isinstance(result, list) else [result], strict=True))
    return [np.asarray(names_of(a), dtype=object) for a in program.outputs]


def _expand(program: Program) -> tuple[_Writer, list[str], list[str]]:
    """The program written out: the writer, the scalar parameters' names, the results' names."""
    writer = _Writer()
    inputs = [np.array([f"x{i}_{c}" for c in range(components(v.aval))], dtype=object).reshape(v.aval.shape)
              for i, v in enumerate(program.inputs)]
    params = [str(n) for names in inputs for n in names.ravel()]
    outs = [str(n) for names in expand_program(writer, program, inputs) for n in names.ravel()]
    return writer, params, outs


def program_source(program: Program, name: str = "scalar_fn") -> str:
    """`def name(x0_0, x0_1, ..., x1_0, ...)`: each input's scalars in row-major order, returning every
    output's scalars (one scalar alone, else a tuple)."""
    return _scalar_source(*_expand(program), name)


def _scalar_source(writer: _Writer, params: list[str], outs: list[str], name: str) -> str:
    result = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ",)"
    return "\n".join([f"def {name}({', '.join(params)}):"] + writer.lines + [f"    return {result}"])


_SCALAR_NAME = re.compile(r"\b(?:t\d+|x\d+_\d+)\b")


def _in_lane(text: str, lane: int) -> str:
    """The text with every parameter and temporary renamed to its copy in `lane`."""
    return _SCALAR_NAME.sub(lambda match: f"{match.group(0)}__{lane}", text)


def _lane_width(writer: _Writer) -> int:
    """The lanes of the written-out program's lane form: WIDE where every vector call is of float32 (eight
    floats fill an AVX2 register), else WIDTH."""
    vectors = [vector for _, _, vector in writer.statements if vector is not None]
    return lanes.WIDE if vectors and all(dtype == "float32" for (_, dtype), _ in vectors) else lanes.WIDTH


def _lane_source(writer: _Writer, params: list[str], outs: list[str], name: str) -> str | None:
    """The written-out program's lane form (see kernels.cpu.lanes) as `def name(x0_0__lanes, x0_1__lanes, ...)`
    (each parameter's WIDTH lanes as a tuple), or None where it would not pay: no statement has a vector
    form, vector math is unavailable, or the program has more than MAX_LANE_PARAMETERS parameters."""
    width = _lane_width(writer)
    if (not vector_math.AVAILABLE or all(vector is None for _, _, vector in writer.statements)
            or len(params) > MAX_LANE_PARAMETERS):
        return None
    lines = [f"{', '.join(_in_lane(p, lane) for lane in range(width))}, = {p}__lanes" for p in params]
    for target, expr, vector in writer.statements:
        if vector is None:
            lines += [f"{_in_lane(target, lane)} = {_in_lane(expr, lane)}" for lane in range(width)]
        else:
            rule, args = vector
            lines += LANE_RULES[rule]([_in_lane(target, lane) for lane in range(width)],
                                       [[_in_lane(a, lane) for lane in range(width)] for a in args])
    lane_params = [f"{p}__lanes" for p in params]
    results = [_in_lane(out, lane) for out in outs for lane in range(width)]
    return "\n".join([f"def {name}({', '.join(lane_params)}):"] + [f"    {line}" for line in lines]
                     + [f"    return ({', '.join(results)},)"])


# The F64x4 form of a function of float64 and boolean scalars (see kernels.cpu.simd): every value four lanes
# wide, each operation on the four at once, computing per lane what the scalar template computes (exp within
# 2 ulp; with FOLD_VECTOR_MATH=0, which asks for libm's own results, a lambda that calls exp gets no form). A
# boolean is a lane of 1.0 or 0.0, so and, or and not are *, maximum and 1 - x on them.
_F64X4_TEMPLATES = {
    "add": "add({0}, {1})", "sub": "sub({0}, {1})", "mul": "mul({0}, {1})", "div": "div({0}, {1})", "neg": "neg({0})",
    "exp": "exp({0})", "maximum": "nan_maximum({0}, {1})", "minimum": "nan_minimum({0}, {1})",
    "lt": "less({0}, {1})", "le": "less_equal({0}, {1})", "gt": "greater({0}, {1})", "ge": "greater_equal({0}, {1})",
    "eq": "equal({0}, {1})", "ne": "not_equal({0}, {1})", "where": "select({0}, {1}, {2})",
}
_F64X4_LOGICAL = {"and": "mul({0}, {1})", "or": "maximum({0}, {1})", "not": "sub(splat(np.float64(1.0)), {0})"}
_F64X4_IMPORTS = ("add", "div", "equal", "exp", "greater", "greater_equal", "less", "less_equal", "maximum", "mul",
                  "nan_maximum", "nan_minimum", "neg", "not_equal", "select", "splat", "sub")
_F64 = np.dtype(np.float64)
_BOOL = np.dtype(np.bool_)


def _f64x4_template(stmt: Let) -> str | None:
    """The F64x4 text of one statement (arguments as {0}, {1}, ...), or None where it has none."""
    arg_dtypes = {a.aval.dtype for a in stmt.args}
    if isinstance(stmt.prim, Convert):  # a boolean's 0.0 / 1.0 is its float64; a float's truth is != 0
        if stmt.prim.dtype == _F64 or arg_dtypes == {_BOOL} and stmt.prim.dtype == _BOOL:
            return "{0}"
        return "not_equal({0}, splat(np.float64(0.0)))" if stmt.prim.dtype == _BOOL else None
    if not isinstance(stmt.prim, Elementwise) or (stmt.prim.op == "exp" and not vector_math.REQUESTED):
        return None
    if stmt.prim.op in _F64X4_LOGICAL:
        return _F64X4_LOGICAL[stmt.prim.op] if arg_dtypes == {_BOOL} else None
    return _F64X4_TEMPLATES.get(stmt.prim.op)


def _f64x4_source(program: Program, name: str) -> str | None:
    """`def name(x0, x1, ...)` on F64x4 values, or None unless every value of the program is a float64 or
    boolean scalar, its results float64, and every statement has a template."""
    if not all(v.aval.shape == () and v.aval.dtype in (_F64, _BOOL) for v in _values(program) if isinstance(v, Var)):
        return None
    if not all(o.aval.dtype == _F64 for o in program.outputs):
        return None
    names: dict[Var, str] = {v: f"x{i}" for i, v in enumerate(program.inputs)}

    def atom(a) -> str | None:
        if not isinstance(a, Lit):
            return names[a]
        if a.value.shape != () or a.value.dtype not in (_F64, _BOOL):
            return None
        return f"splat(np.float64({_literal(np.float64(a.value[()]))}))"

    lines = []
    for i, stmt in enumerate(program.stmts):
        args = [atom(a) for a in stmt.args]
        template = _f64x4_template(stmt)
        if template is None or None in args or len(stmt.outs) != 1:
            return None
        names[stmt.outs[0]] = f"t{i}"
        lines.append(f"    t{i} = {template.format(*args)}")
    outs = [atom(o) for o in program.outputs]
    if None in outs:
        return None
    result = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ",)"
    return "\n".join([f"def {name}({', '.join(names[v] for v in program.inputs)}):", *lines, f"    return {result}"])


def has_f64x4_form(program: Program) -> bool:
    """Whether compile_scalar_program gives this program an F64x4 form (registered in kernels.cpu.simd)."""
    return _f64x4_source(program, "scalar_fn_f64x4") is not None


def has_lane_form(program: Program) -> bool:
    """Whether compile_scalar_program gives this program a lane form (kernels.cpu.lanes): it calls a
    function that libmvec computes WIDTH lanes at a time."""
    return _lane_source(*_expand(program), "scalar_fn_lanes") is not None


def _module_source(program: Program, expanded: tuple[_Writer, list[str], list[str]]) -> tuple[str, bool, bool]:
    """The program as the text of a module: its imports, `scalar_fn`, its lane form `scalar_fn_lanes` if any
    and its F64x4 form `scalar_fn_f64x4` if any (and whether there are those two). The helpers' own source
    is hashed into it, so the text (which names the module on disk) changes whenever what it calls changes."""
    lane_form = _lane_source(*expanded, "scalar_fn_lanes")
    f64x4_form = _f64x4_source(program, "scalar_fn_f64x4")
    vector_imports = [] if lane_form is None else [
        f"# vector math {_VECTOR_MATH_DIGEST}",
        f"from fold.kernels.cpu.vector_math import {', '.join(vector_math.NAMES)}"]
    simd_imports = [] if f64x4_form is None else [
        f"# simd {_SIMD_DIGEST}",
        f"from fold.kernels.cpu.simd import {', '.join(_F64X4_IMPORTS)}"]
    forms = [form for form in (lane_form, f64x4_form) if form is not None]
    return "\n".join([
        f"# scalar helpers {_HELPERS_DIGEST}",
        "import math",
        "import numpy as np",
        f"from fold.runtime.numba_backend.scalar_helpers import {', '.join(scalar_helpers.HELPERS)}",
        *vector_imports, *simd_imports,
        "", "", _scalar_source(*expanded, "scalar_fn"), *[part for form in forms for part in ("", "", form)], ""]), \
        lane_form is not None, f64x4_form is not None


_HELPERS_DIGEST = file_digest(scalar_helpers)
_VECTOR_MATH_DIGEST = file_digest(vector_math)
_SIMD_DIGEST = file_digest(simd)
_compiled: "weakref.WeakKeyDictionary[Program, Callable]" = weakref.WeakKeyDictionary()
_problems: "weakref.WeakKeyDictionary[Program, str | None]" = weakref.WeakKeyDictionary()


def compile_scalar_program(program: Program) -> Callable:
    """The program as an njit function of its scalar inputs (returning a scalar, or a tuple for several outputs).

    Programs with the same text share one function (and so one compiled kernel per use), in this process and,
    through the disk cache of kernels.cpu.modules, in later ones."""
    fn = _compiled.get(program)
    if fn is None:
        expanded = _expand(program)
        writer, params, _ = expanded
        inline = len(params) <= MAX_INLINED_PARAMETERS and len(writer.lines) <= MAX_INLINED_STATEMENTS
        options = {"inline": "always"} if inline else {}
        source, has_lane_form, has_vector_form = _module_source(program, expanded)
        jit = {"scalar_fn": options, **({"scalar_fn_lanes": {"inline": "always"}} if has_lane_form else {}),
               **({"scalar_fn_f64x4": {"inline": "always"}} if has_vector_form else {})}
        module = load_module(source, jit)
        fn = _compiled[program] = module.scalar_fn
        if has_lane_form:
            lanes.register(fn, module.scalar_fn_lanes, _lane_width(writer))
        if has_vector_form:
            simd.register_form(fn, module.scalar_fn_f64x4)
    return fn
