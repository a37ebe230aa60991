"""mkdocs hooks (mkdocs.yml's `hooks:`; not part of fold):

- the benchmark plots (benchmarks/results/*.png) appear in the site as results/<name>.png, for the examples
  gallery, without a second copy of them in docs/;
- mkdocstrings reads fold's source as it installs: ad/, runtime/ and kernels/ sit at the repository's top but
  are fold.ad, fold.runtime and fold.kernels (pyproject's package-dir), which griffe cannot follow from the
  checkout. A folder build/api_source/fold of symbolic links lays them out as installed, and mkdocs.yml points
  mkdocstrings there."""

from __future__ import annotations

import os
import pathlib

from mkdocs.structure.files import File, Files

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
API_SOURCE = ROOT / "build" / "api_source" / "fold"
MAPPED = {"ad": "ad", "runtime": "runtime", "kernels": "kernels"}  # as in pyproject's [tool.setuptools.package-dir]


def _link(target: pathlib.Path, link: pathlib.Path) -> None:
    if link.is_symlink() and pathlib.Path(os.readlink(link)) == target:
        return
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def _lay_out_api_source() -> None:
    API_SOURCE.mkdir(parents=True, exist_ok=True)
    wanted = {entry.name: entry for entry in (ROOT / "fold").iterdir() if entry.name != "__pycache__"}
    wanted.update({name: ROOT / folder for name, folder in MAPPED.items()})
    for stale in API_SOURCE.iterdir():
        if stale.name not in wanted:
            stale.unlink()
    for name, target in wanted.items():
        _link(target, API_SOURCE / name)


_lay_out_api_source()  # at import: before mkdocstrings looks for the source


def on_files(files: Files, config) -> Files:
    for plot in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"results/{plot.name}", abs_src_path=str(plot)))
    return files
