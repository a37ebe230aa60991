"""`fold.__version__`, `fold.testing` reached as an attribute, and check_monoid's error without hypothesis."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import fold


def test_version_is_a_string_from_the_metadata() -> None:
    from importlib.metadata import version

    assert isinstance(fold.__version__, str)
    assert fold.__version__ == version("fold")


def test_testing_is_an_attribute_after_import_fold() -> None:
    code = "import fold\nassert callable(fold.testing.check_grads)\nimport sys\nprint('fold.testing' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_check_monoid_without_hypothesis_names_the_test_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "hypothesis", None)  # an import of it now fails, as where it is absent
    with pytest.raises(fold.FoldTypeError, match=r"hypothesis, which is not installed.*`test` extra.*fold\[test\]"):
        fold.check_monoid(fold.monoids.sum, np.float64(1.0))
