"""The docs' code blocks run, the docstring examples hold, and the printed programs shown in docs are current."""

from __future__ import annotations

import doctest
import importlib
import pathlib
import re

import numpy as np
import pytest

import fold

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _python_blocks():
    for page in sorted(DOCS.glob("*.md")):
        for i, block in enumerate(BLOCK.findall(page.read_text())):
            yield pytest.param(block, id=f"{page.name}#{i}")


@pytest.mark.parametrize("code", list(_python_blocks()))
def test_docs_code_blocks_run(code):
    exec(compile(code, "<docs>", "exec"), {})


@pytest.mark.parametrize("module", ["fold.api", "fold.combinators", "fold.monoid", "fold.gemm", "fold.runtime.api", "fold.runtime.precompile", "fold.ad.api", "fold.ad.monoid_laws", "fold.ad.compare"])
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def _listing_after(page: str, marker: str) -> str:
    text = (DOCS / page).read_text()
    start = text.index(marker)
    return text[start:].split("```\n", 2)[1].strip()


def test_printed_program_in_language_docs_is_current():
    def sum_of_squares(x):
        return fold.reduce(fold.monoids.sum, fold.map(lambda v: v * v, x))

    assert str(fold.trace(sum_of_squares, np.ones(4))) == _listing_after("language.md", "prints")


def test_printed_gradient_program_in_docs_is_current():
    from fold import ad

    def f(xs, w):
        return fold.map(lambda x: fold.reduce(fold.monoids.logaddexp, fold.tanh(x * w)), xs)

    grad_program, _ = ad.vjp_program(fold.trace(f, np.ones((5, 3)), np.ones(3)))
    assert str(grad_program) == _listing_after("differentiation.md", "applies the logaddexp monoid's D:")
