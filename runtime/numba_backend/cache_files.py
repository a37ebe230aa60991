"""The files of fold's kernel cache, found exactly, for `fold info` (where and how big) and `fold cache clear`
(removed, and nothing else).

fold owns: the generated modules in `$FOLD_CACHE_DIR/kernels` (`fold_gen_*.py`, kernels.cpu.modules) with
what Python and Numba cache beside them in its `__pycache__`; and Numba's cache entries (`*.nbi`, `*.nbc`) of
functions compiled from fold's own kernel sources (kernels/, runtime/numba_backend/; cache_stamp's
SOURCE_FOLDERS) and from the generated modules. Numba keeps those in the source folder's `__pycache__`, or,
when NUMBA_CACHE_DIR is set, in one folder per source folder below it, named as Numba names it
(`<folder name>_<sha1 of its path>`). Numba's cache of anything else (a user's own `@njit(cache=True)`
functions under the same NUMBA_CACHE_DIR) is not fold's and is never touched.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from fold.kernels.cpu.cache_stamp import GENERATED_PREFIX, SOURCE_FOLDERS
from fold.kernels.cpu.modules import cache_dir

NUMBA_SUFFIXES = (".nbi", ".nbc")


@dataclass(frozen=True)
class CacheFolder:
    """A folder that holds fold's cache files, and which of its files are fold's."""

    what: str
    path: Path
    generated_only: bool  # only files named fold_gen_* (the generated-modules folder); else Numba's entries

    def files(self) -> list[Path]:
        if not self.path.is_dir():
            return []
        found = []
        for folder in (self.path, self.path / "__pycache__"):
            if not folder.is_dir():
                continue
            for entry in folder.iterdir():
                if not entry.is_file() or entry.is_symlink():
                    continue
                if self.generated_only and entry.name.startswith(GENERATED_PREFIX):
                    found.append(entry)
                elif not self.generated_only and entry.suffix in NUMBA_SUFFIXES:
                    found.append(entry)
        return sorted(found)


def _numba_subpath(source_folder: Path) -> str:
    """The folder below NUMBA_CACHE_DIR where Numba caches functions of files in `source_folder`
    (numba.core.caching._CacheLocator.get_suitable_cache_subpath, for a file in that folder)."""
    path = os.path.abspath(source_folder)
    return "_".join([os.path.basename(path), hashlib.sha1(path.encode()).hexdigest()])


def _source_folders() -> list[Path]:
    folders = []
    for top in SOURCE_FOLDERS:
        folders += [top, *sorted(p for p in top.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    return folders


def cache_folders() -> list[CacheFolder]:
    """Every folder where fold's kernel cache may have files, whether it exists or not."""
    folders: list[CacheFolder] = []
    generated = cache_dir()
    if generated is not None:
        folders.append(CacheFolder("generated kernel modules (FOLD_CACHE_DIR)", generated, generated_only=True))
    numba_root = os.environ.get("NUMBA_CACHE_DIR")
    if numba_root:
        for source in _source_folders() + ([generated] if generated is not None else []):
            folders.append(CacheFolder(f"Numba's cache of {source} (NUMBA_CACHE_DIR)",
                                       Path(numba_root) / _numba_subpath(source), generated_only=False))
    else:  # beside the sources, in __pycache__ (the generated modules' folder is covered above)
        folders += [CacheFolder(f"Numba's cache beside {source}", source, generated_only=False)
                    for source in _source_folders()]
    return folders


def size(files: list[Path]) -> int:
    return sum(f.stat().st_size for f in files if f.exists())


def clear() -> tuple[int, int]:
    """Remove fold's cache files; returns (files removed, bytes freed). Empty folders are left in place."""
    files = sorted({f for folder in cache_folders() for f in folder.files()})
    freed = size(files)
    for f in files:
        f.unlink()
    return len(files), freed
