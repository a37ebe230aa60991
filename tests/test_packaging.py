"""How fold installs: ad/, runtime/ and kernels/ sit at the repository's top level but install inside fold's
namespace, so that `pip install` claims the import name `fold` alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")


def _setuptools_table() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_installed_under_fold():
    table = _setuptools_table()
    folders = {"fold": "fold", **table["package-dir"]}
    expected = set()
    for name, folder in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            expected.add(".".join((name, *parts)))
    assert set(table["packages"]) == expected
    assert all(name == "fold" or name.startswith("fold.") for name in table["packages"])


def test_the_top_level_folders_import_as_fold_subpackages():
    import fold.ad
    import fold.kernels
    import fold.runtime

    assert Path(fold.ad.__file__).parent == ROOT / "ad"
    assert Path(fold.runtime.__file__).parent == ROOT / "runtime"
    assert Path(fold.kernels.__file__).parent == ROOT / "kernels"
    assert not {"ad", "runtime", "kernels"} & set(sys.modules)
