"""Scalar Programs (lambdas whose inputs and outputs are 0-d) to Numba-compiled functions, via generated source.

A map body, a reduce operator or a monoid's operator on scalar elements is a straight-line program of
elementwise statements; `compile_scalar_program` writes it as a Python function of scalars and compiles it
with `numba.njit`. Programs with anything else (vectors, nested combinators) are not scalar programs, and
`is_scalar_program` says so, so the backend can keep the numpy implementation for them.
"""

from __future__ import annotations

import math
import weakref
from typing import Callable

import numpy as np

from fold.ir import Lit, Program, Var
from fold.primitives import Convert, Elementwise

_TEMPLATES = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})", "pow": "({0} ** {1})",
    "mod": "_mod({0}, {1})", "floordiv": "({0} // {1})", "maximum": "_maximum({0}, {1})", "minimum": "_minimum({0}, {1})",
    "logaddexp": "_logaddexp({0}, {1})", "neg": "(-{0})", "abs": "abs({0})", "sign": "_sign({0})",
    "exp": "math.exp({0})", "log": "_log({0})", "log1p": "_log1p({0})", "expm1": "math.expm1({0})",
    "sin": "math.sin({0})", "cos": "math.cos({0})", "tanh": "math.tanh({0})", "sqrt": "_sqrt({0})",
    "sigmoid": "_sigmoid({0})", "lt": "({0} < {1})", "le": "({0} <= {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "and": "({0} and {1})", "or": "({0} or {1})", "not": "(not {0})",
    "where": "({1} if {0} else {2})",
}


def _helpers():
    """Scalar helpers with NumPy's semantics (NaN propagation, -inf for log(0), stable logaddexp/sigmoid)."""
    import numba

    @numba.njit(inline="always")
    def _maximum(a, b):
        return a if (a >= b or a != a) else b

    @numba.njit(inline="always")
    def _minimum(a, b):
        return a if (a <= b or a != a) else b

    @numba.njit(inline="always")
    def _logaddexp(a, b):
        hi = a if a >= b else b
        if hi == -math.inf:
            return hi
        return hi + math.log1p(math.exp(-abs(a - b)))

    @numba.njit(inline="always")
    def _sigmoid(x):
        if x >= 0:
            return 1.0 / (1.0 + math.exp(-x))
        e = math.exp(x)
        return e / (1.0 + e)

    @numba.njit(inline="always")
    def _log(x):
        if x > 0:
            return math.log(x)
        return -math.inf if x == 0 else math.nan

    @numba.njit(inline="always")
    def _log1p(x):
        if x > -1:
            return math.log1p(x)
        return -math.inf if x == -1 else math.nan

    @numba.njit(inline="always")
    def _sqrt(x):
        return math.sqrt(x) if x >= 0 else math.nan

    @numba.njit(inline="always")
    def _sign(x):
        return (x > 0) - (x < 0) if x == x else x

    @numba.njit(inline="always")
    def _mod(a, b):
        return a - (a // b) * b

    return {k: v for k, v in locals().items() if k.startswith("_")}


_HELPERS: dict | None = None


def is_scalar_program(program: Program) -> bool:
    """Only 0-d values, elementwise statements and conversions: what a scalar Numba function can express."""
    if any(v.aval.shape != () for v in program.inputs) or any(a.aval.shape != () for a in program.outputs):
        return False
    for stmt in program.stmts:
        if not isinstance(stmt.prim, (Elementwise, Convert)):
            return False
        if any(a.aval.shape != () for a in stmt.args) or any(v.aval.shape != () for v in stmt.outs):
            return False
    return True


def program_source(program: Program, name: str = "scalar_fn") -> str:
    names: dict[Var, str] = {}

    def atom(a) -> str:
        if isinstance(a, Lit):
            value = a.value.item()
            if isinstance(value, float) and not math.isfinite(value):
                return "math.nan" if math.isnan(value) else ("math.inf" if value > 0 else "-math.inf")
            if a.value.dtype.kind == "f":
                return f"np.{a.value.dtype.name}({value!r})"
            if a.value.dtype.kind in "iu":
                return f"np.{a.value.dtype.name}({value!r})"
            return repr(value)
        return names[a]

    for i, v in enumerate(program.inputs):
        names[v] = f"x{i}"
    lines = [f"def {name}({', '.join(names[v] for v in program.inputs)}):"]
    for k, stmt in enumerate(program.stmts):
        out = stmt.outs[0]
        names[out] = f"t{k}"
        args = [atom(a) for a in stmt.args]
        if isinstance(stmt.prim, Convert):
            expr = f"np.{np.dtype(stmt.prim.dtype).name}({args[0]})"
        else:
            expr = _TEMPLATES[stmt.prim.op].format(*args)
            if stmt.prim.op not in ("lt", "le", "gt", "ge", "eq", "ne", "and", "or", "not"):
                expr = f"np.{out.aval.dtype.name}({expr})"
        lines.append(f"    {names[out]} = {expr}")
    outs = [atom(a) for a in program.outputs]
    lines.append(f"    return {outs[0] if len(outs) == 1 else '(' + ', '.join(outs) + ',)'}")
    return "\n".join(lines)


_compiled: "weakref.WeakKeyDictionary[Program, Callable]" = weakref.WeakKeyDictionary()


def compile_scalar_program(program: Program) -> Callable:
    """The program as an njit function of its scalar inputs (returning a scalar, or a tuple for several outputs)."""
    global _HELPERS
    fn = _compiled.get(program)
    if fn is not None:
        return fn
    import numba

    if _HELPERS is None:
        _HELPERS = _helpers()
    namespace = {"math": math, "np": np, **_HELPERS}
    exec(compile(program_source(program), f"<fold scalar program {id(program):x}>", "exec"), namespace)
    fn = numba.njit(inline="always")(namespace["scalar_fn"])
    _compiled[program] = fn
    return fn
