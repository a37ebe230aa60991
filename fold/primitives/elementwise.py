"""Elementwise primitives: one `Elementwise(op)` primitive, and a table of the scalar operations it applies.

All arguments of an elementwise statement have the output's shape (the tracer inserts explicit broadcasts)
and one dtype (it inserts conversions); 0-d literals may stand for any shape. `kind` says how argument dtypes
are promoted and what the result dtype is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dtypes import ShapedArray
from ..errors import ShapeError
from ..ir import Primitive
from ..tracing import shape_rules

# kinds: "arith" keeps the promoted dtype; "float" promotes integers and bools to float64 first;
# "compare" gives bool; "logical" takes and gives bool; "select" is where(cond, a, b).
KINDS = ("arith", "float", "compare", "logical", "select")
# operations that call a function costing many adds (computed once where they would be repeated: a loop
# nest stores an array made with one before reading it again; a map's invariant one is lifted out of it)
TRANSCENDENTAL = ("exp", "log", "log1p", "expm1", "sin", "cos", "tanh", "sqrt", "sigmoid", "logaddexp")


@dataclass(frozen=True)
class ScalarOp:
    name: str
    arity: int
    kind: str
    symbol: str | None = None  # infix symbol for the printer, if any


def _ops(*specs: tuple) -> dict[str, ScalarOp]:
    return {spec[0]: ScalarOp(*spec) for spec in specs}


SCALAR_OPS: dict[str, ScalarOp] = _ops(
    ("add", 2, "arith", "+"), ("sub", 2, "arith", "-"), ("mul", 2, "arith", "*"), ("div", 2, "float", "/"),
    ("pow", 2, "arith", "**"), ("mod", 2, "arith", "%"), ("floordiv", 2, "arith", "//"),
    ("maximum", 2, "arith"), ("minimum", 2, "arith"), ("logaddexp", 2, "float"),
    ("neg", 1, "arith"), ("abs", 1, "arith"), ("sign", 1, "arith"),
    ("exp", 1, "float"), ("log", 1, "float"), ("log1p", 1, "float"), ("expm1", 1, "float"),
    ("sin", 1, "float"), ("cos", 1, "float"), ("tanh", 1, "float"), ("sqrt", 1, "float"),
    ("sigmoid", 1, "float"),
    ("lt", 2, "compare", "<"), ("le", 2, "compare", "<="), ("gt", 2, "compare", ">"),
    ("ge", 2, "compare", ">="), ("eq", 2, "compare", "=="), ("ne", 2, "compare", "!="),
    ("and", 2, "logical", "&"), ("or", 2, "logical", "|"), ("not", 1, "logical"),
    ("where", 3, "select"),
)


@dataclass(frozen=True)
class Elementwise(Primitive):
    op: str

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.op

    @property
    def scalar(self) -> ScalarOp:
        return SCALAR_OPS[self.op]


@shape_rules.register(Elementwise)
def _elementwise_shape(prim: Elementwise, *avals: ShapedArray) -> list[ShapedArray]:
    spec = prim.scalar
    if len(avals) != spec.arity:
        raise ShapeError(f"{prim.op} takes {spec.arity} arguments, got {len(avals)}")
    shapes = {a.shape for a in avals if a.shape != ()}
    if len(shapes) > 1:
        raise ShapeError(f"{prim.op}: argument shapes differ: {[a.shape for a in avals]}")
    shape = shapes.pop() if shapes else ()
    value_avals = avals[1:] if spec.kind == "select" else avals
    dtypes = {a.dtype for a in value_avals}
    if len(dtypes) > 1:
        raise ShapeError(f"{prim.op}: argument dtypes differ: {[a.dtype.name for a in value_avals]}")
    dtype = dtypes.pop()
    if spec.kind in ("compare", "logical"):
        dtype = np.dtype(bool)
    return [ShapedArray(shape, dtype)]
