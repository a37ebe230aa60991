"""What of NumPy a traced array supports, read off the tables that make it work, so that the docs cannot go
stale: the NumPy functions registered in fold/numpy_functions.py's table (with the parameters their
handlers take), the ufuncs of fold/ops.py (a primitive, or written with them), and the public methods and
attributes of `Tracer`. The docs build (docs/_hooks/numpy_table.py) puts `markdown_table()` into
docs/language.md where `MARKER` stands; tests/test_numpy_support.py checks it lists every entry.
"""

from __future__ import annotations

import inspect
from typing import Callable

from . import ops
from .numpy_functions import _HANDLERS, public_name
from .tracing import Tracer

MARKER = "<!-- numpy-support-table -->"

# Tracer attributes that are fold's own bookkeeping, not NumPy's
_INTERNAL = {"var", "scope", "aval"}


def _summary(fn: Callable) -> str:
    """The first sentence of a docstring, on one line, with table pipes escaped."""
    doc = inspect.getdoc(fn) or ""
    return " ".join(doc.split("\n\n")[0].split()).replace("|", "\\|")


def _parameters(fn: Callable) -> str:
    names = [p.name if p.kind is not p.VAR_POSITIONAL else f"*{p.name}" for p in inspect.signature(fn).parameters.values()]
    return f"`{', '.join(names)}`"


def function_rows() -> list[tuple[str, str, str]]:
    """(np.name, the parameters it takes, what it is) for each NumPy function fold traces."""
    rows = [(f"`np.{public_name(f)}`", _parameters(h), _summary(h)) for f, h in _HANDLERS.items()]
    return sorted(rows)


def ufunc_rows() -> list[tuple[str, str]]:
    """(np.name, how it is traced) for each ufunc fold traces (called plainly: no out=, where= or methods)."""
    rows = [(u.__name__, f"the elementwise primitive `{op}`") for u, op in ops._UFUNCS.items()]
    rows += [(u.__name__, "written with the elementwise primitives") for u in ops._COMPOSITE_UFUNCS]
    rows.append(("matmul", "`fold.matmul` (1-d and 2-d operands), as `@`"))
    return [(f"`np.{name}`", how) for name, how in sorted(rows)]


def method_names() -> list[str]:
    """The public methods and attributes of a traced array."""
    return sorted(name for name in dir(Tracer) if not name.startswith("_") and name not in _INTERNAL)


def method_rows() -> list[tuple[str, str]]:
    """(x.name, what it is): a NumPy function's handler says so; other attributes their own docstring."""
    as_function = {h: f"as `np.{public_name(f)}`" for f, h in reversed(list(_HANDLERS.items()))}
    rows = []
    for name in method_names():
        attribute = inspect.getattr_static(Tracer, name)
        target = attribute.fget if isinstance(attribute, property) else attribute
        described = as_function.get(target) or (_summary(target) if callable(target) else "")
        rows.append((f"`x.{name}`", described))
    return rows


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def markdown_table() -> str:
    """The three tables (NumPy functions, ufuncs, traced arrays' methods) as Markdown."""
    return "\n\n".join([
        "**NumPy functions** (anything else raises a FoldTypeError naming it):",
        _table(("function", "takes", "notes"), function_rows()),
        "**Ufuncs**, called plainly (`out=`, `where=` and methods such as `np.add.reduce` are refused):",
        _table(("ufunc", "traced as"), ufunc_rows()),
        "**Methods and attributes of a traced array:**",
        _table(("attribute", "notes"), method_rows()),
    ])

