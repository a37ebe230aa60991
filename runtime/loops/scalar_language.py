"""The scalar language every compiled backend shares: each elementwise operation as an expression template
over its operands' expressions. The numba backend's lambdas (runtime/numba_backend/codegen.py), the cuda
backend's device functions (compiled from that text) and the loop nests (build.py) are all written in it; the
helpers it calls (`_minimum`, `_logaddexp`, ...) are each backend's (scalar_helpers.py, device_helpers.py)."""

from __future__ import annotations

from fold.primitives.elementwise import TRANSCENDENTAL

TEMPLATES = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})", "pow": "({0} ** {1})",
    "mod": "_mod({0}, {1})", "floordiv": "_floordiv({0}, {1})", "maximum": "_maximum({0}, {1})",
    "minimum": "_minimum({0}, {1})", "logaddexp": "_logaddexp({0}, {1})", "neg": "(-{0})", "abs": "abs({0})",
    "sign": "_sign({0})", "exp": "math.exp({0})", "log": "_log({0})", "log1p": "_log1p({0})",
    "expm1": "math.expm1({0})", "sin": "math.sin({0})", "cos": "math.cos({0})", "tanh": "math.tanh({0})",
    "sqrt": "_sqrt({0})", "sigmoid": "_sigmoid({0})", "lt": "({0} < {1})", "le": "({0} <= {1})",
    "gt": "({0} > {1})", "ge": "({0} >= {1})", "eq": "({0} == {1})", "ne": "({0} != {1})",
    "and": "({0} and {1})", "or": "({0} or {1})", "not": "(not {0})", "where": "({1} if {0} else {2})",
}
# operations whose results are Python bools, as NumPy's are bool: not wrapped in a cast to the result dtype
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne", "and", "or", "not")
# operations that call a function costing many adds: an array computed with one is stored before a map reads
# its elements again for every element of a result row (build.py), rather than computed at each read
TRANSCENDENTAL_CALLS = tuple(TEMPLATES[op].split("{0}")[0] for op in TRANSCENDENTAL)
