"""The docs' table of what of NumPy a traced array supports (fold/numpy_support.py, filled into
docs/language.md by the docs build's hook docs/_hooks/numpy_table.py) lists every NumPy function registered,
every ufunc traced and every public attribute of a traced array; and the hook puts it where the page asks."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np

import fold
from fold import numpy_support, ops
from fold.numpy_functions import _HANDLERS, public_name

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _hook():
    spec = importlib.util.spec_from_file_location("numpy_table", ROOT / "docs" / "_hooks" / "numpy_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_table_lists_every_registered_function_ufunc_and_method() -> None:
    table = numpy_support.markdown_table()
    for func in _HANDLERS:
        assert f"| `np.{public_name(func)}` |" in table, public_name(func)
    for ufunc in ops._TRACED_UFUNCS:
        assert f"| `np.{ufunc.__name__}` |" in table, ufunc.__name__
    for name in ("sum", "max", "at", "reshape", "T", "shape", "cumsum"):
        assert f"| `x.{name}` |" in table, name
    for name in numpy_support.method_names():
        assert f"| `x.{name}` |" in table, name
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) == len(_HANDLERS) + len(set(ops._TRACED_UFUNCS)) + len(numpy_support.method_names())


def test_every_listed_method_works_on_a_traced_array() -> None:
    x = np.arange(6.0).reshape(2, 3)
    for name in numpy_support.method_names():
        fold.trace(lambda x: (getattr(x, name), x)[1], x)  # the attribute is there on a tracer


def test_the_docs_hook_fills_the_marker_in_the_language_page() -> None:
    page = (ROOT / "docs" / "language.md").read_text()
    assert numpy_support.MARKER in page
    filled = _hook().on_page_markdown(page)
    assert numpy_support.MARKER not in filled
    assert numpy_support.markdown_table() in filled
    assert _hook().on_page_markdown("no marker here") == "no marker here"
    assert "np.einsum" in filled and "x.at" in filled
