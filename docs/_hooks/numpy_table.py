"""mkdocs hook (mkdocs.yml's `hooks:`; not part of fold): the table of what of NumPy a traced array supports,
generated from fold's own registries (fold/numpy_support.py) and put where a page has the marker
`<!-- numpy-support-table -->` (docs/language.md), so the table cannot go stale. Imports no mkdocs, so that
tests/test_numpy_support.py can run it."""

from __future__ import annotations

from typing import Any


def on_page_markdown(markdown: str, page: Any = None, config: Any = None, files: Any = None) -> str:
    from fold.numpy_support import MARKER, markdown_table

    return markdown.replace(MARKER, markdown_table()) if MARKER in markdown else markdown
